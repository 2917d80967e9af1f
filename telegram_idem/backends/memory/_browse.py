"""The memory store's browsing and health check (the
:class:`~telegram_idem.backends.Browsable` and :class:`~telegram_idem.backends.Checkable`
abilities), over its :class:`~telegram_idem.backends.memory.MemoryRecords`.

Every call is atomic: no ``await`` between reading the dict and answering.
"""

from __future__ import annotations

import heapq
import platform

from telegram_idem._records import Record
from telegram_idem.backends._browse import check_limit, stored_prefix
from telegram_idem.backends._health import StoreHealth
from telegram_idem.backends.memory._state import MemoryRecords

__all__ = ["MemoryBrowsing"]


class MemoryBrowsing:
    """Mixed into :class:`~telegram_idem.backends.memory.MemoryStore`: records by key
    prefix, in code point order, and a health check with nothing to check."""

    _records: MemoryRecords

    def _under(self, prefix: str) -> list[Record]:
        start = stored_prefix(prefix)
        return [r for r in self._records.stored() if r.key.startswith(start)]

    async def records(self, *, prefix: str, limit: int = 100) -> list[Record]:
        """The live records whose key starts with ``prefix``, the first ``limit`` in key
        order (:class:`~telegram_idem.backends.Browsable`).

        Raises:
            ConfigurationError: ``limit`` < 1.
        """
        check_limit(limit)
        now = self._records.clock()
        live = (r for r in self._under(prefix) if r.expires_at > now)
        return heapq.nsmallest(limit, live, key=lambda r: r.key)

    async def count_records(self, *, prefix: str, expired: bool = False) -> int:
        """How many records are stored under ``prefix`` (with ``expired``: only those
        past retention, which the store evicts on its next write)."""
        under = self._under(prefix)
        if not expired:
            return len(under)
        now = self._records.clock()
        return sum(1 for r in under if r.expires_at <= now)

    async def delete_records(self, *, prefix: str, limit: int = 1000) -> int:
        """Delete up to ``limit`` records stored under ``prefix``; returns how many.

        Raises:
            ConfigurationError: ``limit`` < 1.
        """
        check_limit(limit)
        doomed = heapq.nsmallest(limit, (r.key for r in self._under(prefix)))
        return sum(1 for key in doomed if self._records.delete(key))

    async def health(self) -> StoreHealth:
        """Nothing to check: the records are a dict of this process (the server is
        this Python)."""
        return StoreHealth(
            server=f"memory (Python {platform.python_version()}, this process)",
            compared="nothing (records in a dict of this process; no tables)",
        )
