"""Inbox decisions as pure functions, shared by the in-process stores (memory, SQLite).

Server stores express the same rules in their own language (SQL, Lua).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from telegram_idem import machine
from telegram_idem._records import Outcome, Record
from telegram_idem.inbox import EntryStatus, InboxEntry, InboxStats, NewEntry, UnitBacklog

__all__ = [
    "admitted_record",
    "is_takeable",
    "new_entry",
    "ordering_unit",
    "pick",
    "taken",
]


def admitted_record(
    existing: Record | None, key: str, now: float, retention: float
) -> Record | None:
    """The update guard record to write when admitting ``key``, or ``None`` (refused).

    An admitted update is "seen" at once (completed): from then on the inbox owns it.
    The claim rules are the update guard's (:func:`telegram_idem.machine.decide_claim`):
    no record, a record past its retention, or a claim in progress whose lease has ended
    (its holder died) is admitted, the last by takeover (fencing token + 1, so the dead
    holder can no longer complete it). A completed or failed record, or a claim in
    progress under a live lease, refuses;
    :func:`telegram_idem._admission.refused_admission` says which.
    """
    claim, new = machine.decide_claim(
        existing, key=key, fingerprint=None, now=now, lease=retention, retention=retention
    )
    if claim.outcome is not Outcome.ACQUIRED or new is None:
        return None
    return machine.do_complete(
        new, token=new.fencing_token, result=b"null", now=now, retention=retention
    )


def ordering_unit(entry: NewEntry) -> str:
    """The ordering key, or the entry's own id when the update has none."""
    return entry.ordering_key or entry.update_key


def new_entry(entry: NewEntry, seq: int, now: float) -> InboxEntry:
    """A pending entry, takeable now."""
    return InboxEntry(
        id=entry.update_key,
        seq=seq,
        ordering_key=ordering_unit(entry),
        payload=entry.payload,
        status=EntryStatus.PENDING,
        attempts=0,
        token=0,
        available_at=now,
        lease_expires_at=0.0,
        admitted_at=now,
    )


def stats_of(entries: Iterable[InboxEntry], now: float) -> InboxStats:
    """:meth:`Inbox.stats` over entries held in memory."""
    counts = dict.fromkeys(EntryStatus, 0)
    oldest: dict[EntryStatus, float] = {}
    for e in entries:
        counts[e.status] += 1
        if e.status not in oldest or e.admitted_at < oldest[e.status]:
            oldest[e.status] = e.admitted_at
    return InboxStats(counts=counts, oldest_admitted_at=oldest, now=now)


def backlog_of(entries: Iterable[InboxEntry], limit: int) -> list[UnitBacklog]:
    """:meth:`Inbox.backlog` over entries held in memory."""
    units: dict[str, UnitBacklog] = {}
    for e in entries:
        if e.status is EntryStatus.DEAD:
            continue
        u = units.get(e.ordering_key) or UnitBacklog(e.ordering_key, 0, 0, e.admitted_at)
        units[e.ordering_key] = UnitBacklog(
            e.ordering_key,
            u.pending + (e.status is EntryStatus.PENDING),
            u.in_flight + (e.status is EntryStatus.IN_FLIGHT),
            min(u.oldest_admitted_at, e.admitted_at),
        )
    ranked = sorted(
        units.values(), key=lambda u: (-(u.pending + u.in_flight), u.oldest_admitted_at)
    )
    return ranked[:limit]


def is_takeable(entry: InboxEntry, now: float) -> bool:
    """Pending and due, or in flight with an ended lease (its worker died)."""
    if entry.status is EntryStatus.PENDING:
        return entry.available_at <= now
    return entry.status is EntryStatus.IN_FLIGHT and entry.lease_expires_at <= now


def pick(entries: Iterable[InboxEntry], now: float) -> InboxEntry | None:
    """The entry to take: the oldest takeable head of its ordering key (dead letters do
    not count as heads)."""
    heads: dict[str, InboxEntry] = {}
    for e in entries:
        if e.status is EntryStatus.DEAD:
            continue
        head = heads.get(e.ordering_key)
        if head is None or e.seq < head.seq:
            heads[e.ordering_key] = e
    due = [e for e in heads.values() if is_takeable(e, now)]
    return min(due, key=lambda e: e.seq) if due else None


def taken(entry: InboxEntry, now: float, lease: float) -> InboxEntry:
    """The entry as its new taker holds it: a new token, one more attempt."""
    return replace(
        entry,
        status=EntryStatus.IN_FLIGHT,
        attempts=entry.attempts + 1,
        token=entry.token + 1,
        lease_expires_at=now + lease,
    )
