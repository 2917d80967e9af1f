"""The fast-ack webhook with the durable inbox on SQLite (``python -m examples.webhook_inbox``)."""
