"""Flood control shared by every process of a bot: GCRA budgets kept in the store.

- :class:`~telegram_idem.flood._base.FloodBudget` — the store contract (atomic
  reservations over buckets, gates paused by a 429's ``retry_after``).
- :class:`~telegram_idem.flood._base.Bucket` — one budget; :func:`decide` the rule.
"""

from telegram_idem.flood._base import Bucket, FloodBudget, decide

__all__ = ["Bucket", "FloodBudget", "decide"]
