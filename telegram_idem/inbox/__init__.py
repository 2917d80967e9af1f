"""The durable inbox: fast-ack ingress writes updates here; workers process them in order.

- :class:`~telegram_idem.inbox._base.Inbox` — the contract (admit, take, ack, retry, bury,
  dead letters, re-drive), implemented next to each store that supports it.
- :class:`~telegram_idem.inbox._worker.InboxWorker` — leases entries, runs the bot's
  dispatch, retries with backoff, dead-letters after N attempts, per-chat order.
"""

from telegram_idem.inbox._base import (
    EntryStatus,
    Inbox,
    InboxEntry,
    InboxStats,
    NewEntry,
    UnitBacklog,
)
from telegram_idem.inbox._entries import new_entry, rejected_entry
from telegram_idem.inbox._worker import DEFAULT_PERMANENT_ERRORS, Dispatch, InboxWorker

__all__ = [
    "DEFAULT_PERMANENT_ERRORS",
    "Dispatch",
    "EntryStatus",
    "Inbox",
    "InboxEntry",
    "InboxStats",
    "InboxWorker",
    "NewEntry",
    "UnitBacklog",
    "new_entry",
    "rejected_entry",
]
