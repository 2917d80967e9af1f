"""The inbox on NATS JetStream: :func:`with_jetstream_inbox` gives a claim store a durable
inbox whose entries live in a JetStream stream (docs/stores/jetstream.md).

The claim store stays the update guards' source of truth (Telegram re-delivers for 24 h;
the broker's dedup window is minutes). Admission claims the update guard, publishes the
entry on ``<stream>.<bot_id>.<partition>`` with ``Nats-Msg-Id = <bot_id>:<update_id>``
and waits for the PubAck, and only then records the guard admitted.
"""

from telegram_idem.backends.nats._inbox import JetStreamInbox
from telegram_idem.backends.nats._store import JetStreamStore, with_jetstream_inbox

__all__ = ["JetStreamInbox", "JetStreamStore", "with_jetstream_inbox"]
