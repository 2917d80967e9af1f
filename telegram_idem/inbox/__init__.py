"""The durable inbox: fast-ack ingress writes updates here; workers process them in order.

- :class:`~telegram_idem.inbox.base.Inbox` — the contract (admit, take, ack, retry, bury,
  dead letters, re-drive), implemented next to each store that supports it.
- :class:`~telegram_idem.inbox.worker.InboxWorker` — leases entries, runs the bot's
  dispatch, retries with backoff, dead-letters after N attempts, per-chat order.
"""

from telegram_idem.inbox.base import Inbox, InboxEntry, NewEntry

__all__ = ["Inbox", "InboxEntry", "NewEntry"]
