"""The memory store: the decision loop of :class:`~telegram_idem.backends._local.LocalStore`
over :class:`~telegram_idem.backends.memory._state.MemoryRecords`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from telegram_idem._clock import Clock, system_clock
from telegram_idem._records import Record
from telegram_idem.backends._local import LocalStore, RecordAccess
from telegram_idem.backends._url import StoreURL
from telegram_idem.backends.memory._browse import MemoryBrowsing
from telegram_idem.backends.memory._flood import MemoryFloodBudget
from telegram_idem.backends.memory._inbox import MemoryInbox
from telegram_idem.backends.memory._ledger import MemoryLedger
from telegram_idem.backends.memory._outbox import MemoryOutbox
from telegram_idem.backends.memory._state import MemoryRecords

__all__ = ["MemoryStore"]

T = TypeVar("T")


class MemoryStore(MemoryBrowsing, LocalStore):
    """Records in a dict; every primitive is atomic (no await inside). Serves
    ``memory://``. Lists, counts and deletes records by key prefix and answers a health
    check (:class:`~telegram_idem.backends.memory._browse.MemoryBrowsing`).

    Args:
        clock: seconds since the epoch; decides leases and expiry.
        max_items: most records kept (> 0).
        eviction_log_interval: seconds (of ``clock``) between two WARNING lines about
            live records evicted because the store is full (≥ 0; the first eviction is
            logged at once).

    Raises:
        ConfigurationError: ``max_items`` ≤ 0 or a negative ``eviction_log_interval``.
    """

    driver_errors = ()

    def __init__(
        self,
        *,
        clock: Clock = system_clock,
        max_items: int = 100_000,
        eviction_log_interval: float = 60.0,
    ) -> None:
        super().__init__(clock=clock)
        self._records = MemoryRecords(
            clock=clock, max_items=max_items, eviction_log_interval=eviction_log_interval
        )
        self._inbox: MemoryInbox | None = None
        self._outbox: MemoryOutbox | None = None
        self._flood: MemoryFloodBudget | None = None
        self._ledger: MemoryLedger | None = None

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> MemoryStore:
        """``memory://[?max_items=N]`` (``N`` an integer > 0).

        Raises:
            ConfigurationError: another scheme, a malformed or non-positive
                ``max_items``, or an unknown option.
        """
        parsed = StoreURL.parse(url, schemes=cls.schemes)
        max_items = parsed.take_int("max_items", 100_000, minimum=1)
        parsed.finish()
        assert max_items is not None
        return cls(clock=clock or system_clock, max_items=max_items)

    @property
    def evicted_live(self) -> int:
        """Live records evicted because the store was full, since it was made."""
        return self._records.evicted_live

    def peek(self, key: str) -> Record | None:
        """The stored record of ``key``, expired or not.

        Args:
            key: the full key.
        """
        return self._records.read(key)

    def put(self, record: Record) -> None:
        """Store ``record`` as is (evicting as a write does).

        Args:
            record: the record (its ``key`` says where).
        """
        self._records.write(record)

    def inbox(self) -> MemoryInbox:
        """The inbox living beside these records (created on first use)."""
        if self._inbox is None:
            self._inbox = MemoryInbox(self._records)
        return self._inbox

    def outbox(self) -> MemoryOutbox:
        """The outbox living beside these records, on the store's clock (created on
        first use)."""
        if self._outbox is None:
            self._outbox = MemoryOutbox(self._records.clock)
        return self._outbox

    def flood_budget(self) -> MemoryFloodBudget:
        """The flood budget of this store, on its clock, shared by the tasks of this
        process (created on first use)."""
        if self._flood is None:
            self._flood = MemoryFloodBudget(self._records.clock)
        return self._flood

    def ledger(self) -> MemoryLedger:
        """The effect ledger of this store, on its clock (created on first use)."""
        if self._ledger is None:
            self._ledger = MemoryLedger(self._records.clock)
        return self._ledger

    def __len__(self) -> int:
        return len(self._records)

    in_loop = True  # a dict of this event loop: a body without await is atomic

    def _records_now(self) -> tuple[RecordAccess, float]:
        return self._records, self._local_clock()

    async def _transaction(self, body: Callable[[RecordAccess, float], T]) -> T:
        return body(self._records, self._local_clock())

    async def _read(self, key: str) -> Record | None:
        return self._records.read(key)
