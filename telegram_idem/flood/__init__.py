"""Flood control shared by every process of a bot: GCRA budgets kept in the store.

- :class:`~telegram_idem.flood._base.FloodBudget` — the store contract (atomic
  reservations over buckets, gates paused by a 429's ``retry_after``).
- :class:`~telegram_idem.flood._base.Bucket` — one budget; :func:`decide` the rule.
- :class:`~telegram_idem.flood._limits.Limits` — Telegram's limits as budgets;
  :func:`buckets_for` — which budgets one call spends.
- :class:`~telegram_idem.flood._control.FloodControl` — paces one bot's calls through
  its store's budget (``wait_turn``) and pauses the whole bot on a 429 (``retry_after``).
- :func:`~telegram_idem.flood._priority.priority` — the priority of the calls made in a
  block (``with priority(BULK):``), for senders with no per-call argument (aiogram).
"""

from telegram_idem.flood._base import Bucket, FloodBudget, decide
from telegram_idem.flood._control import FloodControl
from telegram_idem.flood._limits import (
    BULK,
    HEADROOM_JITTER,
    REPLY,
    Limits,
    Rate,
    buckets_for,
    is_group_chat,
    is_message,
)
from telegram_idem.flood._priority import current_priority, priority
from telegram_idem.flood._retry_after import retry_after_of

__all__ = [
    "BULK",
    "HEADROOM_JITTER",
    "REPLY",
    "Bucket",
    "FloodBudget",
    "FloodControl",
    "Limits",
    "Rate",
    "buckets_for",
    "current_priority",
    "decide",
    "is_group_chat",
    "is_message",
    "priority",
    "retry_after_of",
]
