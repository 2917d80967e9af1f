"""A python-telegram-bot 22 bot whose replies go through the outbox: sent once, paced by shared flood control (``python -m examples.ptb_outbound``)."""
