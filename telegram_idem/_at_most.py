"""Running an acquired key at most once: the effect ledger's protocol
(:mod:`telegram_idem.ledger`, its table) around the record's claim.

The guard (:meth:`telegram_idem.Idem.run` with ``once="at_most"``) has claimed the key
with fencing token ``t``; here the ledger row is written before the effect runs and
removed only once the record says what happened, so a crash between two writes errs
towards *unknown*, never towards a second run:

- no row: ``start`` (``STARTED``), run the effect, then by its outcome: success →
  complete, ``finish``; not applied → ``finish``, release; permanent → fail,
  ``finish``; ambiguous or cancelled → ``mark_unknown``, release, raise
  :class:`~telegram_idem.errors.UnknownOutcomeError`;
- a ``STARTED`` or ``UNKNOWN`` row (an earlier holder was interrupted, or failed
  ambiguously): ``mark_unknown`` with ``t``, release, raise
  :class:`~telegram_idem.errors.UnknownOutcomeError` naming the step or action;
- a ``SETTLED`` row (a resolver stopped before applying its resolution): apply it —
  replay ``result`` (complete the record with it) or, ``not_applied``, ``finish`` the
  row and run the effect.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from telegram_idem._admitted import release_quietly
from telegram_idem._context import bound_update
from telegram_idem._effects import EffectPolicy, Meaning, classify
from telegram_idem._host import EffectHost
from telegram_idem._settled import failure_bytes
from telegram_idem.errors import LostClaimError, ResultEncodingError, UnknownOutcomeError
from telegram_idem.events import emit_decision
from telegram_idem.ledger import Ledger, LedgerEntry, LedgerState

__all__ = ["describe_unknown", "run_at_most", "unknown_error"]

T = TypeVar("T")


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def describe_unknown(kind: str, name: str | None, entry: LedgerEntry) -> str:
    """The message of an :class:`UnknownOutcomeError` for ``entry``: what, when, by
    whom, how many holders met it, and how to settle it. Never raises."""
    what = f"{kind} {name!r} ({entry.key})" if name else f"{kind} {entry.key}"
    known = f"; known: {entry.detail}" if entry.detail else ""
    return (
        f"{what} may or may not have taken effect: it started at {_when(entry.started_at)} "
        f"(store clock) by {entry.holder or 'an unnamed holder'} and no outcome was recorded; "
        f"{entry.attempts} holder(s) have met it{known}. It is not run again until it is "
        f"settled: idem.resolve({entry.key!r}, result=...) if it took effect, or "
        f"idem.resolve({entry.key!r}, not_applied=True) if it did not "
        f"(idem.unresolved() lists it)"
    )


def unknown_error(
    kind: str, name: str | None, entry: LedgerEntry, cause: BaseException | None = None
) -> UnknownOutcomeError:
    """The :class:`UnknownOutcomeError` for ``entry`` (``kind`` is ``"step"`` or
    ``"action"``). Never raises."""
    error = UnknownOutcomeError(describe_unknown(kind, name, entry), key=entry.key, entry=entry)
    if cause is not None:
        error.__cause__ = cause
    return error


def _emit(
    boundary: Literal["action", "step"], key: str, decision: str, handler: str | None, token: int
) -> None:
    ctx = bound_update()
    emit_decision(
        boundary=boundary,
        key=key,
        decision=decision,
        update=ctx.update if ctx is not None else None,
        handler=handler,
        fencing_token=token,
        bot_id=ctx.bot_id if ctx is not None else None,
    )


DETAIL_CHARS = 1000
"""Most characters of an error's text kept as a ledger row's ``detail`` (a provider's
error page can be megabytes; the operator needs its first lines)."""


def _detail(exc: BaseException) -> str:
    text = str(exc)
    if len(text) > DETAIL_CHARS:
        text = f"{text[:DETAIL_CHARS]}… ({len(text)} characters)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def run_at_most(
    idem: EffectHost,
    ledger: Ledger,
    key: str,
    token: int,
    fn: Callable[[], Awaitable[T]],
    *,
    policy: EffectPolicy,
    retention: float,
    binding: contextlib.AbstractContextManager[Any],
    heartbeat: Callable[[], contextlib.AbstractContextManager[Any]],
    boundary: Literal["action", "step"],
    handler: str | None,
) -> T:
    """Run the acquired key ``key`` (fencing token ``token``) at most once.

    Args:
        idem: the guard (its store, codec and holder name).
        ledger: the store's ledger.
        key: the step's or action's full key, claimed.
        token: the claim's fencing token.
        fn: the effect.
        policy: its error classes.
        retention: seconds the completed (or failed) record is kept.
        binding: the action binding to run ``fn`` in.
        heartbeat: makes the heartbeat to run ``fn`` under.
        boundary: ``"action"`` or ``"step"``.
        handler: its name, for messages and events.

    Raises:
        UnknownOutcomeError: the key has an unsettled row (an earlier holder was
            interrupted), or ``fn`` failed ambiguously or was cancelled (chained).
        LostClaimError: ``fn`` finished after its lease was taken over (the row stays:
            the next holder or a resolver decides).
        ResultEncodingError: the result cannot be stored (stored as a failure).
        StoreError: the store could not answer (the row stays ``STARTED``: unknown).
        Exception: what ``fn`` raised when it was not applied or failed for good.
    """
    try:
        found = await ledger.start(key, token=token, holder=idem.holder)
    except BaseException:
        await release_quietly(idem.store, key, token)  # the effect has not run
        raise
    if found is not None:
        settled = await _apply_found(idem, ledger, key, token, found, retention, boundary, handler)
        if settled is not _RUN:
            return settled  # type: ignore[no-any-return]
    try:
        with binding, heartbeat():
            value = await fn()
    except Exception as exc:
        meaning = classify(exc, policy)
        if meaning is Meaning.NOT_APPLIED:
            # Nothing happened: the row goes first, so a crash before the release
            # leaves nothing that looks unknown.
            await ledger.finish(key, token=token)
            await release_quietly(idem.store, key, token)
            raise
        if meaning is Meaning.PERMANENT:
            if await idem.store.fail(key, token, failure_bytes(exc), retention=retention):
                await ledger.finish(key, token=token)
            raise
        raise await _unknown(idem, ledger, key, token, _detail(exc), boundary, handler) from exc
    except BaseException as exc:  # cancellation: it may have happened
        await _unknown(idem, ledger, key, token, f"interrupted ({_detail(exc)})", boundary, handler)
        raise
    try:
        data = idem.codec.encode(value)
    except ResultEncodingError as exc:
        if await idem.store.fail(key, token, failure_bytes(exc), retention=retention):
            await ledger.finish(key, token=token)
        raise
    if not await idem.store.complete(key, token, data, retention=retention):
        raise LostClaimError(
            f"{key}: fencing token {token} was taken over; result not stored (the effect "
            "ran: its ledger row stays for the next holder or a resolver)",
            key=key,
        )
    await ledger.finish(key, token=token)
    return value


class _Run:
    """Marker: the found row lets the effect run."""


_RUN: Any = _Run()


async def _apply_found(
    idem: EffectHost,
    ledger: Ledger,
    key: str,
    token: int,
    row: LedgerEntry,
    retention: float,
    boundary: Literal["action", "step"],
    handler: str | None,
) -> Any:
    """Act on the row ``start`` found: the settled result, :data:`_RUN`, or raise."""
    if row.state is LedgerState.SETTLED and row.not_applied:
        # Settled as "did not happen": remove the row, start afresh, run.
        await ledger.finish(key, token=row.token)
        again = await ledger.start(key, token=token, holder=idem.holder)
        if again is None:
            _emit(boundary, key, "resolved", handler, token)
            return _RUN
        row = again
    if row.state is LedgerState.SETTLED and row.result is not None:
        value = idem.codec.decode(row.result)
        if not await idem.store.complete(key, token, row.result, retention=retention):
            raise LostClaimError(
                f"{key}: fencing token {token} was taken over while applying its resolution",
                key=key,
            )
        await ledger.finish(key, token=row.token)
        _emit(boundary, key, "resolved", handler, token)
        return value
    detail = row.detail or "interrupted: its holder stopped before recording an outcome"
    after = await ledger.mark_unknown(key, token=token, detail=detail)
    await release_quietly(idem.store, key, token)
    _emit(boundary, key, "unknown", handler, token)
    raise unknown_error(boundary, handler, after or row)


async def _unknown(
    idem: EffectHost,
    ledger: Ledger,
    key: str,
    token: int,
    detail: str,
    boundary: Literal["action", "step"],
    handler: str | None,
) -> UnknownOutcomeError:
    """Mark the running key unknown after an ambiguous end, release it, and return the
    error to raise."""
    entry = await ledger.mark_unknown(key, token=token, detail=detail)
    await release_quietly(idem.store, key, token)
    _emit(boundary, key, "unknown", handler, token)
    if entry is None:  # the row vanished (a resolver finished it): say what we know
        entry = LedgerEntry(key, LedgerState.UNKNOWN, token, 0.0, idem.holder, detail=detail)
    return unknown_error(boundary, handler, entry)
