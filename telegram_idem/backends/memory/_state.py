"""The records of one memory store, shared by the store and its inbox."""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable

from telegram_idem._clock import Clock
from telegram_idem._records import Record
from telegram_idem.errors import ConfigurationError

__all__ = ["MemoryRecords"]

log = logging.getLogger("telegram_idem.store.memory")


class MemoryRecords:
    """Records in a dict, bounded; no method awaits, so each is atomic in its event loop.

    Implements :class:`~telegram_idem.backends._local.RecordAccess` (``read``, ``write``).

    Args:
        clock: seconds since the epoch; decides expiry (and the store's leases).
        max_items: most records kept (> 0).
        eviction_log_interval: seconds (of ``clock``) between two WARNING lines about
            live records evicted because the records are full (≥ 0; the first eviction
            is logged at once).

    Raises:
        ConfigurationError: ``max_items`` ≤ 0 or a negative ``eviction_log_interval``.
    """

    def __init__(self, *, clock: Clock, max_items: int, eviction_log_interval: float) -> None:
        if max_items <= 0:
            raise ConfigurationError("max_items must be > 0")
        if not eviction_log_interval >= 0:
            raise ConfigurationError(
                f"eviction_log_interval must be ≥ 0 seconds, got {eviction_log_interval}"
            )
        self.clock = clock
        """The clock deciding expiry."""
        self.max_items = max_items
        """Most records kept."""
        self.evicted_live = 0
        """Live records evicted because the records were full, since they were made."""
        self._log_interval = eviction_log_interval
        self._unreported = 0
        self._last_report: float | None = None
        self._records: dict[str, Record] = {}
        self._expiry: list[tuple[float, str]] = []
        self.read: Callable[[str], Record | None] = self._records.get
        """``read(key)``: the stored record of ``key``, expired or not (the dict's own
        ``get``: no Python frame on the store's hot path)."""

    def __len__(self) -> int:
        return len(self._records)

    def stored(self) -> list[Record]:
        """Every stored record, expired or not (a copy: safe to delete while iterating)."""
        return list(self._records.values())

    def delete(self, key: str) -> bool:
        """Forget ``key``'s record; ``False`` if there was none (its expiry heap entry
        goes stale and is skipped).

        Args:
            key: the record's full key.
        """
        return self._records.pop(key, None) is not None

    def write(self, record: Record) -> None:
        """Store ``record`` as is, then evict: the expired records, and the ones closest
        to expiry while more than ``max_items`` remain.

        Args:
            record: the record (its ``key`` says where).
        """
        self._records[record.key] = record
        heapq.heappush(self._expiry, (record.expires_at, record.key))
        self._evict()

    def _report_evictions(self, now: float) -> None:
        if self._last_report is not None and now - self._last_report < self._log_interval:
            return
        log.warning(
            "memory store full (max_items=%d): evicted %d live record(s) since the last "
            "report (%d in all); a duplicate of an evicted update can run again: raise "
            "max_items or use a server store",
            self.max_items,
            self._unreported,
            self.evicted_live,
        )
        self._last_report = now
        self._unreported = 0

    def _evict(self) -> None:
        now = self.clock()
        while self._expiry and (self._expiry[0][0] <= now or len(self._records) > self.max_items):
            at, key = heapq.heappop(self._expiry)
            record = self._records.get(key)
            if record is None or record.expires_at != at:
                continue  # stale heap entry
            if at > now:
                self.evicted_live += 1
                self._unreported += 1
            del self._records[key]
        if self._unreported:
            self._report_evictions(now)
        if len(self._expiry) > 4 * self.max_items + 64:
            self._expiry = [(r.expires_at, k) for k, r in self._records.items()]
            heapq.heapify(self._expiry)
