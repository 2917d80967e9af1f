"""The inbox of :class:`~telegram_idem.backends.memory.MemoryStore` (one process only),
beside the store's :class:`~telegram_idem.backends.memory._state.MemoryRecords`."""

from __future__ import annotations

import itertools
from dataclasses import replace

from telegram_idem import _inbox_logic as logic
from telegram_idem._text import storable_text
from telegram_idem.backends.memory._state import MemoryRecords
from telegram_idem.inbox import EntryStatus, Inbox, InboxEntry, InboxStats, NewEntry, UnitBacklog
from telegram_idem.ledger import check_limit

__all__ = ["MemoryInbox"]


class MemoryInbox(Inbox):
    """Entries in a dict beside the store's records; every method is atomic (no await).

    Lost with the process: use it for tests and for bots that accept that.

    Args:
        records: the store's records (admission writes the update guard record there).
    """

    def __init__(self, records: MemoryRecords) -> None:
        self._records = records
        self._entries: dict[str, InboxEntry] = {}
        self._seq = itertools.count(1)

    async def admit(self, entry: NewEntry, *, retention: float) -> bool:
        now = self._records.clock()
        record = logic.admitted_record(
            self._records.read(entry.update_key), entry.update_key, now, retention
        )
        if record is None:
            return False
        self._records.write(record)
        self._entries[entry.update_key] = logic.new_entry(entry, next(self._seq), now)
        return True

    async def take(self, *, lease: float) -> InboxEntry | None:
        now = self._records.clock()
        chosen = logic.pick(self._entries.values(), now)
        if chosen is None:
            return None
        held = logic.taken(chosen, now, lease)
        self._entries[held.id] = held
        return held

    def _held(self, entry: InboxEntry) -> bool:
        current = self._entries.get(entry.id)
        return (
            current is not None
            and current.status is EntryStatus.IN_FLIGHT
            and current.token == entry.token
        )

    async def ack(self, entry: InboxEntry) -> bool:
        if not self._held(entry):
            return False
        del self._entries[entry.id]
        return True

    async def retry(
        self, entry: InboxEntry, *, delay: float, error: str, refund: bool = False
    ) -> bool:
        if not self._held(entry):
            return False
        now = self._records.clock()
        current = self._entries[entry.id]
        self._entries[entry.id] = replace(
            current,
            attempts=max(current.attempts - 1, 0) if refund else current.attempts,
            status=EntryStatus.PENDING,
            available_at=now + delay,
            lease_expires_at=0.0,
            last_error=storable_text(error),
        )
        return True

    async def bury(self, entry: InboxEntry, *, error: str) -> bool:
        if not self._held(entry):
            return False
        self._entries[entry.id] = replace(
            self._entries[entry.id], status=EntryStatus.DEAD, last_error=storable_text(error)
        )
        return True

    async def extend(self, entry: InboxEntry, *, lease: float) -> bool:
        if not self._held(entry):
            return False
        now = self._records.clock()
        self._entries[entry.id] = replace(self._entries[entry.id], lease_expires_at=now + lease)
        return True

    async def dead_letters(self, *, limit: int = 100) -> list[InboxEntry]:
        dead = [e for e in self._entries.values() if e.status is EntryStatus.DEAD]
        return sorted(dead, key=lambda e: e.seq)[:limit]

    async def redrive(self, entry_id: str) -> bool:
        entry = self._entries.get(entry_id)
        if entry is None or entry.status is not EntryStatus.DEAD:
            return False
        # Back of its chat (a new seq): a later entry of the chat may be in flight already.
        self._entries[entry_id] = replace(
            entry,
            seq=next(self._seq),
            status=EntryStatus.PENDING,
            attempts=0,
            available_at=self._records.clock(),
        )
        return True

    async def depth(self) -> int:
        return sum(1 for e in self._entries.values() if e.status is not EntryStatus.DEAD)

    async def get(self, entry_id: str) -> InboxEntry | None:
        return self._entries.get(entry_id)

    async def entries(
        self,
        *,
        status: EntryStatus | None = None,
        ordering_key: str | None = None,
        limit: int = 100,
    ) -> list[InboxEntry]:
        check_limit(limit)
        chosen = [
            e
            for e in self._entries.values()
            if (status is None or e.status is status)
            and (ordering_key is None or e.ordering_key == ordering_key)
        ]
        return sorted(chosen, key=lambda e: e.seq)[:limit]

    async def drop(self, entry_id: str) -> bool:
        entry = self._entries.get(entry_id)
        if entry is None or entry.status is not EntryStatus.DEAD:
            return False
        del self._entries[entry_id]
        return True

    async def stats(self) -> InboxStats:
        return logic.stats_of(self._entries.values(), self._records.clock())

    async def backlog(self, *, limit: int = 100) -> list[UnitBacklog]:
        check_limit(limit)
        return logic.backlog_of(self._entries.values(), limit)
