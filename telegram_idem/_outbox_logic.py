"""Outbox decisions as pure functions, shared by the in-process stores (memory, SQLite).

The rules are the ones of :mod:`telegram_idem.outbox._base` (its module docstring); server
stores express the same rules in their own language (SQL, Lua). Every function takes the
store's clock reading ``now`` (seconds since the epoch) and returns new entries: none
writes anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace

from telegram_idem.outbox import LIVE, REDRIVABLE, SETTLED, CallStatus, NewCall, OutboxEntry

__all__ = [
    "LIVE",
    "REDRIVABLE",
    "SETTLED",
    "collapsed",
    "expires_at",
    "extended",
    "heads",
    "is_expired",
    "is_takeable",
    "new_entry",
    "pick",
    "redriven",
    "retried",
    "settled",
    "superseded_result",
    "taken",
    "unparked",
]


def new_entry(call: NewCall, seq: int, now: float, *, parked: bool) -> OutboxEntry:
    """The entry to store for ``call``: ``PENDING`` and takeable now, or ``PARKED`` (settled
    now) when its chat is parked."""
    return OutboxEntry(
        key=call.key,
        bot_id=call.bot_id,
        seq=seq,
        method=call.method,
        params=call.params,
        ordering_key=call.unit,
        collapse_key=call.collapse_key,
        policy=call.policy,
        priority=call.priority,
        retention=call.retention,
        status=CallStatus.PARKED if parked else CallStatus.PENDING,
        attempts=0,
        token=0,
        created_at=now,
        available_at=now,
        lease_expires_at=0.0,
        settled_at=now if parked else 0.0,
    )


def superseded_result(key: str) -> bytes:
    """The ``result`` of an entry superseded by the call stored under ``key``:
    ``{"superseded_by": key}`` as compact ASCII JSON."""
    return json.dumps({"superseded_by": key}, separators=(",", ":")).encode("ascii")


def collapsed(entries: Iterable[OutboxEntry], call: NewCall, now: float) -> list[OutboxEntry]:
    """The entries ``call`` supersedes, as superseded: every ``PENDING`` one (not in flight,
    not settled) of the same bot with the same ``collapse_key``; none when ``call`` has
    no collapse key."""
    if call.collapse_key is None:
        return []
    result = superseded_result(call.key)
    return [
        replace(e, status=CallStatus.SUPERSEDED, settled_at=now, result=result)
        for e in entries
        if e.status is CallStatus.PENDING
        and e.bot_id == call.bot_id
        and e.collapse_key == call.collapse_key
        and e.key != call.key
    ]


def is_takeable(entry: OutboxEntry, now: float) -> bool:
    """Pending and due, or in flight with an ended lease (its relay died)."""
    if entry.status is CallStatus.PENDING:
        return entry.available_at <= now
    return entry.status is CallStatus.IN_FLIGHT and entry.lease_expires_at <= now


def heads(entries: Iterable[OutboxEntry]) -> dict[tuple[int, str], OutboxEntry]:
    """The oldest live entry of each ``(bot_id, unit)`` (the one whose turn it is)."""
    found: dict[tuple[int, str], OutboxEntry] = {}
    for e in entries:
        if e.status not in LIVE:
            continue
        unit = (e.bot_id, e.ordering_key)
        head = found.get(unit)
        if head is None or e.seq < head.seq:
            found[unit] = e
    return found


def pick(
    entries: Iterable[OutboxEntry],
    now: float,
    *,
    bot_id: int,
    ordering_key: str | None = None,
) -> OutboxEntry | None:
    """The entry to take for ``bot_id``: among the takeable heads of its chats (only
    ``ordering_key``'s head, when given), the lowest ``priority``, then the oldest
    (``seq``); ``None`` when no head is takeable."""
    mine = (
        e
        for e in entries
        if e.bot_id == bot_id and (ordering_key is None or e.ordering_key == ordering_key)
    )
    due = [e for e in heads(mine).values() if is_takeable(e, now)]
    return min(due, key=lambda e: (e.priority, e.seq)) if due else None


def taken(entry: OutboxEntry, now: float, lease: float) -> OutboxEntry:
    """The entry as its new taker holds it: in flight until ``now + lease``, a token
    greater than any it had, one more attempt."""
    return replace(
        entry,
        status=CallStatus.IN_FLIGHT,
        attempts=entry.attempts + 1,
        token=entry.token + 1,
        lease_expires_at=now + lease,
    )


def retried(
    entry: OutboxEntry,
    now: float,
    delay: float,
    error: str,
    *,
    params: bytes | None = None,
    ordering_key: str | None = None,
    seq: int | None = None,
) -> OutboxEntry:
    """The entry back to ``PENDING``, takeable ``delay`` seconds from ``now``, in its place
    (its ``seq`` kept, so it stays its chat's head); ``params`` and ``ordering_key``
    replace the entry's when given (a group that migrated to a supergroup). A call moved
    to another chat goes to the back of that chat: give it a new ``seq`` (see
    :func:`moves`)."""
    return replace(
        entry,
        seq=entry.seq if seq is None else seq,
        status=CallStatus.PENDING,
        available_at=now + max(delay, 0.0),
        lease_expires_at=0.0,
        last_error=error,
        params=entry.params if params is None else params,
        ordering_key=entry.ordering_key if ordering_key is None else ordering_key,
    )


def extended(entry: OutboxEntry, now: float, lease: float) -> OutboxEntry:
    """The entry with its lease ending ``lease`` seconds from ``now``."""
    return replace(entry, lease_expires_at=now + lease)


def settled(
    entry: OutboxEntry,
    status: CallStatus,
    now: float,
    *,
    result: bytes | None = None,
    error: str | None = None,
) -> OutboxEntry:
    """The entry out of its chat's turn in ``status`` (delivered, dead, unknown, parked),
    settled now; ``result`` and ``error`` replace the entry's when given."""
    return replace(
        entry,
        status=status,
        lease_expires_at=0.0,
        settled_at=now,
        result=entry.result if result is None else result,
        last_error=entry.last_error if error is None else error,
    )


def redriven(entry: OutboxEntry, seq: int, now: float) -> OutboxEntry:
    """A dead, unknown or parked entry back to ``PENDING`` at the back of its chat (the new
    ``seq``), attempts reset, takeable now."""
    return replace(
        entry,
        seq=seq,
        status=CallStatus.PENDING,
        attempts=0,
        available_at=now,
        lease_expires_at=0.0,
        settled_at=0.0,
    )


def moves(entry: OutboxEntry, ordering_key: str | None) -> bool:
    """Whether a retry with ``ordering_key`` moves the entry to another chat (it then goes
    to the back of that chat, whose call in flight must stay the only one)."""
    return ordering_key is not None and ordering_key != entry.ordering_key


def unparked(entry: OutboxEntry, now: float, seq: int) -> OutboxEntry:
    """A parked entry back to ``PENDING`` at the back of its chat (the new ``seq``; give
    a chat's entries new seqs in their old order), takeable now. Not in its old place: a
    call of the chat redriven while it was parked may be in flight."""
    return replace(
        entry,
        seq=seq,
        status=CallStatus.PENDING,
        available_at=now,
        lease_expires_at=0.0,
        settled_at=0.0,
    )


def expires_at(entry: OutboxEntry) -> float | None:
    """When a delivered or superseded entry may be deleted (``settled_at + retention``);
    ``None`` for every other status (never deleted by time)."""
    if entry.status not in SETTLED:
        return None
    return entry.settled_at + entry.retention


def is_expired(entry: OutboxEntry, now: float) -> bool:
    """Past its retention: the store holds it no longer (a replay of its key stores anew)."""
    at = expires_at(entry)
    return at is not None and at <= now
