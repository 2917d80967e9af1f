"""Reconciliation: what may or may not have happened, and settling it
(:meth:`telegram_idem.Idem.unresolved`, :meth:`~telegram_idem.Idem.resolve`,
:meth:`~telegram_idem.Idem.oldest_unresolved_age`).

Unresolved are the at-most-once steps and actions whose outcome nobody recorded (the
effect ledger's ``UNKNOWN`` rows, and its ``STARTED`` rows whose holder is gone: the
record's lease ended, or the record itself is gone) and the outbox's ``UNKNOWN`` calls.
A ``STARTED`` row whose record completed or failed is stale (its holder stopped between
recording the outcome and removing the row): it is removed here, not listed.

``resolve`` follows the ledger's protocol (:mod:`telegram_idem.ledger`, last row
of its table): the resolver claims the key's record (a fencing token above every
earlier holder's, so a late holder's completion fails with
:class:`~telegram_idem.errors.LostClaimError`), settles the row (the first resolution
stands), then completes the record with the result (or releases it, ``not_applied``)
and removes the row. A resolver that stops half-way leaves a ``SETTLED`` row that the
next holder of the key applies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from telegram_idem._admitted import release_quietly
from telegram_idem._context import bound_update
from telegram_idem._host import EffectHost
from telegram_idem._locks import is_poll_cursor
from telegram_idem._records import Outcome, Status
from telegram_idem.backends import has_ledger, has_outbox, ledger_of, outbox_of
from telegram_idem.errors import ConfigurationError, ResolveError
from telegram_idem.events import emit_decision
from telegram_idem.ledger import LedgerEntry, LedgerState
from telegram_idem.outbox import CallStatus, OutboxEntry

__all__ = ["Unresolved", "kind_of", "oldest_unresolved_age", "resolve", "unresolved"]

Kind = Literal["step", "action", "send"]


@dataclass(frozen=True, slots=True)
class Unresolved:
    """One effect that may or may not have happened.

    Attributes:
        key: its full key (give it to :meth:`telegram_idem.Idem.resolve`).
        kind: ``"step"``, ``"action"`` (at-most-once effects) or ``"send"`` (an
            outbox call whose answer was lost).
        state: ``"unknown"`` (a holder met it, or it failed ambiguously; always so for
            a send) or ``"started"`` (its holder stopped before recording an outcome and
            nobody has met it since).
        started_at: seconds since the epoch (store clock) when it started (a send: when
            it was enqueued).
        holder: who started it (``"host:pid"`` or the guard's ``holder=``; a send:
            ``"bot <id>"``).
        attempts: how many holders have met it (a send: how many times it was taken).
        detail: what is known (the ambiguous error, how it was found; a send: its
            method and last error).
        age: seconds (store clock) since ``started_at``.
    """

    key: str
    kind: Kind
    state: str
    started_at: float
    holder: str
    attempts: int
    detail: str
    age: float


def kind_of(key: str) -> Literal["step", "action"]:
    """``"step"`` for a step key (``…:s:<name>``), else ``"action"``. Never raises."""
    return "step" if ":s:" in key else "action"


def _from_row(row: LedgerEntry, now: float) -> Unresolved:
    return Unresolved(
        key=row.key,
        kind=kind_of(row.key),
        state=row.state.value,
        started_at=row.started_at,
        holder=row.holder,
        attempts=row.attempts,
        detail=row.detail,
        age=max(now - row.started_at, 0.0),
    )


def _from_send(entry: OutboxEntry, now: float) -> Unresolved:
    error = entry.last_error or ""
    # entries recorded before the relay dropped the method from the transport's text
    error = error.removeprefix(f"{entry.method}: ")
    detail = entry.method + (f": {error}" if error else "")
    return Unresolved(
        key=entry.key,
        kind="send",
        state=entry.status.value,
        started_at=entry.created_at,
        holder=f"bot {entry.bot_id}",
        attempts=entry.attempts,
        detail=detail,
        age=max(now - entry.created_at, 0.0),
    )


async def _open(idem: EffectHost, row: LedgerEntry, now: float) -> bool:
    """Whether ``row`` is unresolved; a stale ``STARTED`` row is removed. A poll
    leader's offset row (:func:`~telegram_idem._locks.is_poll_cursor`) is no effect."""
    if is_poll_cursor(row.key):
        return False
    if row.state is LedgerState.UNKNOWN:
        return True
    record = await idem.store.get(row.key)
    if record is None:
        return True  # the record is gone: nobody will record an outcome
    if record.status is not Status.IN_PROGRESS:
        await ledger_of(idem.store).finish(row.key, token=row.token)  # stale
        return False
    return record.lease_expires_at <= now  # a live lease: it is running


async def _rows(idem: EffectHost, prefix: str, limit: int, now: float) -> list[Unresolved]:
    if not has_ledger(idem.store):
        return []
    ledger = ledger_of(idem.store)
    fetch = limit
    while True:
        rows = await ledger.entries(prefix=prefix, limit=fetch)
        found = [_from_row(r, now) for r in rows if await _open(idem, r, now)]
        if len(found) >= limit or len(rows) < fetch:
            return found[:limit]
        fetch *= 4  # some were skipped (running, or stale): look further


async def _sends(idem: EffectHost, prefix: str, limit: int, now: float) -> list[Unresolved]:
    if not has_outbox(idem.store):
        return []
    # Outbox.entries has no key prefix: read enough to find ``limit`` under one.
    entries = await outbox_of(idem.store).entries(
        status=CallStatus.UNKNOWN, limit=limit if not prefix else max(limit, 1000)
    )
    return [_from_send(e, now) for e in entries if e.key.startswith(prefix)][:limit]


async def unresolved(idem: EffectHost, *, prefix: str, limit: int) -> list[Unresolved]:
    """:meth:`telegram_idem.Idem.unresolved`."""
    if limit < 1:
        raise ConfigurationError(f"limit must be ≥ 1, got {limit}")
    now = await idem.store.now()
    items = await _rows(idem, prefix, limit, now) + await _sends(idem, prefix, limit, now)
    items.sort(key=lambda u: (u.started_at, u.key))
    return items[:limit]


async def oldest_unresolved_age(idem: EffectHost) -> float | None:
    """:meth:`telegram_idem.Idem.oldest_unresolved_age`."""
    oldest = await unresolved(idem, prefix="", limit=1)
    return oldest[0].age if oldest else None


def _emit(key: str, token: int | None) -> None:
    ctx = bound_update()
    emit_decision(
        boundary="step" if kind_of(key) == "step" else "action",
        key=key,
        decision="resolved",
        update=ctx.update if ctx is not None else None,
        fencing_token=token,
        bot_id=ctx.bot_id if ctx is not None else None,
    )


async def resolve(idem: EffectHost, key: str, *, result: Any, not_applied: bool) -> None:
    """:meth:`telegram_idem.Idem.resolve` (arguments checked by it)."""
    row = await ledger_of(idem.store).get(key) if has_ledger(idem.store) else None
    if row is None or row.state is LedgerState.SETTLED:
        if await _resolve_send(idem, key, result=result, not_applied=not_applied):
            return
        why = "it was settled already" if row is not None else "nothing under it is unresolved"
        raise ResolveError(f"cannot resolve {key!r}: {why}", key=key)
    await _resolve_row(idem, key, row, result=result, not_applied=not_applied)


async def _resolve_send(idem: EffectHost, key: str, *, result: Any, not_applied: bool) -> bool:
    if not has_outbox(idem.store):
        return False
    outbox = outbox_of(idem.store)
    entry = await outbox.get(key)
    if entry is None or entry.status is not CallStatus.UNKNOWN:
        return False
    if not_applied:
        done = await outbox.redrive(key)
    else:
        data = json.dumps(result, separators=(",", ":"), ensure_ascii=True).encode()
        done = await outbox.resolve(key, result=data)
    if done:
        _emit(key, entry.token)
    return done


async def _resolve_row(
    idem: EffectHost, key: str, row: LedgerEntry, *, result: Any, not_applied: bool
) -> None:
    data = None if not_applied else idem.codec.encode(result)  # before anything is written
    ledger = ledger_of(idem.store)
    claim = await idem.store.claim(key, lease=idem.lease, retention=idem.action_retention)
    if claim.outcome is not Outcome.ACQUIRED:
        if claim.outcome in (Outcome.REPLAY, Outcome.FAILED):
            if row.state is LedgerState.STARTED:
                await ledger.finish(key, token=row.token)  # stale: the outcome is recorded
            raise ResolveError(
                f"cannot resolve {key!r}: its outcome is recorded already "
                f"({claim.record.status.value})",
                key=key,
            )
        left = max(claim.record.lease_expires_at - await idem.store.now(), 0.0)
        raise ResolveError(
            f"cannot resolve {key!r}: a holder's lease is alive (it is running; "
            f"{left:.1f} s left): it is not unresolved yet",
            key=key,
        )
    token = claim.token
    if not await ledger.settle(key, token=token, result=data, not_applied=not_applied):
        await release_quietly(idem.store, key, token)
        raise ResolveError(f"cannot resolve {key!r}: it was settled already", key=key)
    if not_applied:
        await ledger.finish(key, token=token)  # nothing happened: the row goes first
        await release_quietly(idem.store, key, token)
    else:
        assert data is not None
        if await idem.store.complete(key, token, data, retention=idem.action_retention):
            await ledger.finish(key, token=token)
    _emit(key, token)
