"""The outbox of :class:`~telegram_idem.backends.memory.MemoryStore` (one process only):
the rules of :mod:`telegram_idem._outbox_logic` over a dict."""

from __future__ import annotations

import heapq
import itertools
from typing import Literal

from telegram_idem import _outbox_logic as logic
from telegram_idem._clock import Clock
from telegram_idem._text import storable_text
from telegram_idem.outbox import CallStatus, NewCall, Outbox, OutboxEntry

__all__ = ["MemoryOutbox"]


class MemoryOutbox(Outbox):
    """Entries in a dict; every method is atomic (no await inside), so concurrent tasks of
    one event loop see each step whole.

    Lost with the process: use it for tests and for bots that accept that. A take looks
    at the live entries only (pending and in flight), so settled entries kept for their
    retention cost memory, not time. Delivered and superseded entries are deleted once
    their retention has ended on ``clock``.

    Args:
        clock: seconds since the epoch (the store's clock); decides leases, delays and
            retention.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._entries: dict[str, OutboxEntry] = {}
        self._live: set[str] = set()
        self._parked: set[tuple[int, str]] = set()
        self._expiry: list[tuple[float, str]] = []
        self._seq = itertools.count(1)

    # ------------------------------------------------------------------ state

    def _now(self) -> float:
        """The clock, after deleting the entries whose retention ended by then."""
        now = self._clock()
        while self._expiry and self._expiry[0][0] <= now:
            at, key = heapq.heappop(self._expiry)
            entry = self._entries.get(key)
            if entry is not None and logic.expires_at(entry) == at:
                del self._entries[key]
        return now

    def _put(self, entry: OutboxEntry) -> None:
        self._entries[entry.key] = entry
        if entry.status in logic.LIVE:
            self._live.add(entry.key)
        else:
            self._live.discard(entry.key)
        at = logic.expires_at(entry)
        if at is not None:
            heapq.heappush(self._expiry, (at, entry.key))

    def _live_entries(self) -> list[OutboxEntry]:
        return [self._entries[k] for k in self._live]

    def _held(self, entry: OutboxEntry) -> OutboxEntry | None:
        """The stored entry if ``entry.token`` still holds it (in flight, same token; a
        holder past its lease still holds it until another relay takes it over)."""
        self._now()
        current = self._entries.get(entry.key)
        if (
            current is None
            or current.status is not CallStatus.IN_FLIGHT
            or current.token != entry.token
        ):
            return None
        return current

    # ------------------------------------------------------------------ relay side

    async def enqueue(self, call: NewCall) -> tuple[OutboxEntry, bool]:
        now = self._now()
        stored = self._entries.get(call.key)
        if stored is not None:
            return stored, False
        for old in logic.collapsed(self._live_entries(), call, now):
            self._put(old)
        parked = (call.bot_id, call.unit) in self._parked
        entry = logic.new_entry(call, next(self._seq), now, parked=parked)
        self._put(entry)
        return entry, True

    async def take(
        self, *, bot_id: int, lease: float, ordering_key: str | None = None
    ) -> OutboxEntry | None:
        now = self._now()
        chosen = logic.pick(self._live_entries(), now, bot_id=bot_id, ordering_key=ordering_key)
        if chosen is None:
            return None
        held = logic.taken(chosen, now, lease)
        self._put(held)
        return held

    async def deliver(self, entry: OutboxEntry, *, result: bytes) -> bool:
        current = self._held(entry)
        if current is None:
            return False
        self._put(logic.settled(current, CallStatus.DELIVERED, self._now(), result=result))
        return True

    async def retry(
        self,
        entry: OutboxEntry,
        *,
        delay: float,
        error: str,
        params: bytes | None = None,
        ordering_key: str | None = None,
    ) -> bool:
        current = self._held(entry)
        if current is None:
            return False
        now = self._now()
        seq = next(self._seq) if logic.moves(current, ordering_key) else None
        self._put(
            logic.retried(
                current,
                now,
                delay,
                storable_text(error),
                params=params,
                ordering_key=ordering_key,
                seq=seq,
            )
        )
        return True

    async def settle(
        self,
        entry: OutboxEntry,
        *,
        status: Literal[CallStatus.DEAD, CallStatus.UNKNOWN],
        error: str,
    ) -> bool:
        current = self._held(entry)
        if current is None:
            return False
        self._put(logic.settled(current, status, self._now(), error=storable_text(error)))
        return True

    async def park(self, entry: OutboxEntry, *, error: str) -> bool:
        current = self._held(entry)
        if current is None:
            return False
        now = self._now()
        unit = (current.bot_id, current.ordering_key)
        self._parked.add(unit)
        text = storable_text(error)
        self._put(logic.settled(current, CallStatus.PARKED, now, error=text))
        for e in self._live_entries():
            if (e.bot_id, e.ordering_key) == unit and e.status is CallStatus.PENDING:
                self._put(logic.settled(e, CallStatus.PARKED, now))
        return True

    async def extend(self, entry: OutboxEntry, *, lease: float) -> bool:
        current = self._held(entry)
        if current is None:
            return False
        self._put(logic.extended(current, self._now(), lease))
        return True

    # ------------------------------------------------------------------ operator side

    async def get(self, key: str) -> OutboxEntry | None:
        self._now()
        return self._entries.get(key)

    async def entries(
        self, *, status: CallStatus, bot_id: int | None = None, limit: int = 100
    ) -> list[OutboxEntry]:
        self._now()
        found = [
            e
            for e in self._entries.values()
            if e.status is status and (bot_id is None or e.bot_id == bot_id)
        ]
        return sorted(found, key=lambda e: e.seq)[: max(limit, 0)]

    async def redrive(self, key: str) -> bool:
        now = self._now()
        entry = self._entries.get(key)
        if entry is None or entry.status not in logic.REDRIVABLE:
            return False
        self._put(logic.redriven(entry, next(self._seq), now))
        return True

    async def resolve(self, key: str, *, result: bytes) -> bool:
        now = self._now()
        entry = self._entries.get(key)
        if entry is None or entry.status is not CallStatus.UNKNOWN:
            return False
        self._put(logic.settled(entry, CallStatus.DELIVERED, now, result=result))
        return True

    async def unpark(self, *, bot_id: int, ordering_key: str) -> int:
        now = self._now()
        self._parked.discard((bot_id, ordering_key))
        back = sorted(
            (
                e
                for e in self._entries.values()
                if e.status is CallStatus.PARKED
                and e.bot_id == bot_id
                and e.ordering_key == ordering_key
            ),
            key=lambda e: e.seq,
        )
        for e in back:
            self._put(logic.unparked(e, now, next(self._seq)))
        return len(back)

    async def parked_units(self, *, bot_id: int | None = None) -> list[tuple[int, str]]:
        return sorted(u for u in self._parked if bot_id is None or u[0] == bot_id)

    async def counts(self, *, bot_id: int | None = None) -> dict[CallStatus, int]:
        self._now()
        counts: dict[CallStatus, int] = {}
        for e in self._entries.values():
            if bot_id is None or e.bot_id == bot_id:
                counts[e.status] = counts.get(e.status, 0) + 1
        return counts

    def __len__(self) -> int:
        return len(self._entries)
