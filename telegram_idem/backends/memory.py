"""In-process store (``memory://``) for tests and single-process bots.

Bounded: records past their retention are evicted, and when ``max_items`` is reached the
records closest to expiry go first. Evicting a live record can let a duplicate through,
so each is counted (:attr:`MemoryStore.evicted_live`) and a WARNING says so: at most one
line per ``eviction_log_interval`` seconds, with the count since the previous line (not
one line per record). URL: ``memory://?max_items=100000``.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable

from telegram_idem import machine
from telegram_idem.backends.base import Store
from telegram_idem.backends.url import reject_unknown, url_options
from telegram_idem.clock import Clock, system_clock
from telegram_idem.errors import ConfigurationError
from telegram_idem.inbox.base import Inbox
from telegram_idem.records import Claim, Record

__all__ = ["MemoryStore"]

log = logging.getLogger("telegram_idem.store.memory")


class MemoryStore(Store):
    """Records in a dict; every primitive is atomic (no await inside).

    Args:
        clock: seconds since the epoch; decides leases and expiry.
        max_items: most records kept (> 0).
        eviction_log_interval: seconds (of ``clock``) between two WARNING lines about
            live records evicted because the store is full (≥ 0; the first eviction is
            logged at once).

    Raises:
        ConfigurationError: ``max_items`` ≤ 0 or a negative ``eviction_log_interval``.
    """

    schemes = ("memory",)
    driver_errors = ()

    def __init__(
        self,
        *,
        clock: Clock = system_clock,
        max_items: int = 100_000,
        eviction_log_interval: float = 60.0,
    ) -> None:
        if max_items <= 0:
            raise ConfigurationError("max_items must be > 0")
        if not eviction_log_interval >= 0:
            raise ConfigurationError(
                f"eviction_log_interval must be ≥ 0 seconds, got {eviction_log_interval}"
            )
        self._log_interval = eviction_log_interval
        self._unreported = 0
        self._last_report: float | None = None
        self.evicted_live = 0
        """Live records evicted because the store was full, since it was made."""
        self._clock = clock
        self._max = max_items
        self._records: dict[str, Record] = {}
        self._expiry: list[tuple[float, str]] = []
        self._inbox: Inbox | None = None

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> MemoryStore:
        """``memory://[?max_items=N]``.

        Raises:
            ConfigurationError: a malformed ``max_items``.
        """
        options = url_options(url)
        try:
            max_items = int(options.pop("max_items", "100000"))
        except ValueError:
            raise ConfigurationError(f"max_items must be an integer in {url!r}") from None
        reject_unknown(url, options)
        return cls(clock=clock or system_clock, max_items=max_items)

    @property
    def clock(self) -> Clock:
        """The clock deciding leases and expiry."""
        return self._clock

    def peek(self, key: str) -> Record | None:
        """The stored record of ``key``, expired or not (for the inbox)."""
        return self._records.get(key)

    def put(self, record: Record) -> None:
        """Store ``record`` as is (for the inbox's admission)."""
        self._put(record)

    def inbox(self) -> Inbox:
        """The inbox living beside these records (created on first use)."""
        if self._inbox is None:
            from telegram_idem.backends.memory_inbox import MemoryInbox

            self._inbox = MemoryInbox(self)
        return self._inbox

    def __len__(self) -> int:
        return len(self._records)

    def _live(self, key: str) -> Record | None:
        record = self._records.get(key)
        return record if machine.is_live(record, self._clock()) else None

    def _put(self, record: Record) -> None:
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
            self._max,
            self._unreported,
            self.evicted_live,
        )
        self._last_report = now
        self._unreported = 0

    def _evict(self) -> None:
        now = self._clock()
        while self._expiry and (self._expiry[0][0] <= now or len(self._records) > self._max):
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
        if len(self._expiry) > 4 * self._max + 64:
            self._expiry = [(r.expires_at, k) for k, r in self._records.items()]
            heapq.heapify(self._expiry)

    def _apply(self, key: str, fn: Callable[[Record | None, float], Record | None]) -> bool:
        new = fn(self._records.get(key), self._clock())
        if new is None:
            return False
        self._put(new)
        return True

    async def _claim(
        self, key: str, fingerprint: str | None, lease: float, retention: float
    ) -> Claim:
        claim, new = machine.decide_claim(
            self._records.get(key),
            key=key,
            fingerprint=fingerprint,
            now=self._clock(),
            lease=lease,
            retention=retention,
        )
        if new is not None:
            self._put(new)
        return claim

    async def _complete(self, key: str, token: int, result: bytes, retention: float) -> bool:
        return self._apply(
            key,
            lambda r, now: machine.do_complete(
                r, token=token, result=result, now=now, retention=retention
            ),
        )

    async def _fail(self, key: str, token: int, error: bytes, retention: float) -> bool:
        return self._apply(
            key,
            lambda r, now: machine.do_fail(
                r, token=token, error=error, now=now, retention=retention
            ),
        )

    async def _release(self, key: str, token: int) -> bool:
        return self._apply(key, lambda r, now: machine.do_release(r, token=token, now=now))

    async def _extend(self, key: str, token: int, lease: float) -> bool:
        return self._apply(
            key, lambda r, now: machine.do_extend(r, token=token, now=now, lease=lease)
        )

    async def _get(self, key: str) -> Record | None:
        return self._live(key)

    async def _now(self) -> float:
        return self._clock()
