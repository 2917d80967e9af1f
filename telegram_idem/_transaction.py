"""``async with idem.transaction(conn)``: actions and steps recorded inside the bot's own
database transaction (the claim, the completion and a step's record commit or roll back
with the bot's writes and its outbox entries).

The bot opens the transaction and commits it; :func:`transaction` only joins it: it asks
the guard's store for its record primitives on ``conn``
(:func:`~telegram_idem.backends.joined_of`), lets them check the connection (its
database, an open transaction), and binds the :class:`JoinedTransaction` for the block.
``Idem.run`` then hands every action or step of that store to :func:`run_joined`:

| claim in the transaction | what ``run_joined`` does |
|---|---|
| acquired (new key, retention over, or a dead holder's lease ended) | runs ``fn`` (steps inside it join too); completes in the transaction |
| replay (committed by an earlier transaction) | returns the stored result, ``fn`` not run |
| failed (a stored failure) | raises :class:`~telegram_idem.errors.StoredFailureError` |
| conflict | raises :class:`~telegram_idem.errors.ConflictError` |
| in progress (held outside any transaction, lease alive) | raises :class:`~telegram_idem.errors.InProgressError` |
| ``fn`` raises | releases (or stores the failure, ``on_error="store"``) in the transaction, re-raises |

A concurrent duplicate in another transaction blocks on the key until this one ends,
then replays what it committed, or acquires after a rollback. Nothing is marked completed
unless ``fn`` returned and the bot commits. The ``once=`` options of a step or action do
not apply here: the record commits with the effect, so a database effect is exactly once
whatever they say. No heartbeat runs: the open transaction holds the key's row.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from telegram_idem._context import bind_action, bound_update
from telegram_idem._joined import JoinedRecords, JoinedTransaction, bind_transaction
from telegram_idem._records import Outcome, Record
from telegram_idem.backends import joined_of
from telegram_idem.errors import (
    ConflictError,
    InProgressError,
    LostClaimError,
    ResultEncodingError,
    StoredFailureError,
    StoreError,
)
from telegram_idem.events import emit_decision

if TYPE_CHECKING:
    from telegram_idem._guard import Idem

__all__ = ["Checked", "run_joined", "transaction"]

T = TypeVar("T")

log = logging.getLogger("telegram_idem")


class Checked(Protocol):
    """Joined records that check their connection when the block is entered (the
    built-in stores' do: its database, its open transaction): :func:`transaction` awaits
    their ``check()`` if they have one."""

    async def check(self) -> None:
        """Accept the connection, or raise
        :class:`~telegram_idem.errors.ConfigurationError` saying why not."""
        ...


@asynccontextmanager
async def transaction(idem: Idem, conn: object) -> AsyncIterator[JoinedTransaction]:
    """:meth:`telegram_idem.Idem.transaction` (see the module docstring).

    Raises:
        ConfigurationError: the store cannot join a transaction, ``conn`` is of a kind
            it cannot join, on another database, or outside a transaction.
        StoreError: the database could not answer the check.
    """
    store = idem.store
    # joined_of's protocol checks cost tens of µs a block: asked once per store.
    records = store.joined(conn) if store in _joinable else _first_join(store, conn)
    check = getattr(records, "check", None)
    if check is not None:
        await check()
    with bind_transaction(JoinedTransaction(idem.store, conn, records)) as joined:
        yield joined


_joinable: weakref.WeakSet[object] = weakref.WeakSet()
"""The stores :func:`~telegram_idem.backends.joined_of` accepted once."""


def _first_join(store: object, conn: object) -> JoinedRecords:
    records = joined_of(store, conn)
    with contextlib.suppress(TypeError):  # a store that cannot be weakly referenced
        _joinable.add(store)
    return records


async def run_joined(
    idem: Idem,
    joined: JoinedTransaction,
    key: str,
    fn: Callable[[], Awaitable[T]],
    *,
    fingerprint: str | None,
    on_error: Literal["release", "store"],
    lease: float,
    retention: float,
    handler: str | None,
    boundary: Literal["action", "step"],
    options: Any = None,
) -> T:
    """:meth:`telegram_idem.Idem.run` for a key whose store is joined to the bound
    transaction (the table of the module docstring). ``options`` (the run's ``once=``
    and error classes) are ignored: the record commits with the effect.

    Raises:
        ConflictError: same key, different fingerprint.
        InProgressError: a holder outside any transaction has the key, its lease alive.
        StoredFailureError: replay of a stored failure.
        LostClaimError: the completion found another token (cannot happen while the
            transaction holds the row; checked all the same).
        ResultEncodingError: the result cannot be stored (the failure is stored).
        StoreError: the database could not answer (the transaction is then usually
            aborted: roll it back).
        Exception: whatever ``fn`` raised.
    """
    records = joined.records
    ctx = bound_update()
    update, bot_id = (ctx.update, ctx.bot_id) if ctx is not None else (None, None)
    started = time.perf_counter()
    claim = await records.claim(key, fingerprint=fingerprint, lease=lease, retention=retention)
    outcome = claim.outcome
    emit_decision(
        boundary=boundary,
        key=key,
        decision=outcome.value,
        update=update,
        handler=handler,
        fencing_token=claim.token,
        elapsed_ms=(time.perf_counter() - started) * 1000,
        bot_id=bot_id,
    )
    if outcome is Outcome.REPLAY:
        assert claim.record.result is not None
        return idem.codec.decode(claim.record.result)  # type: ignore[no-any-return]
    if outcome is Outcome.FAILED:
        raise _stored_failure(claim.record)
    if outcome is Outcome.CONFLICT:
        raise ConflictError(
            f"{key} was first used with a different payload fingerprint",
            key=key,
            record=claim.record,
        )
    if outcome is Outcome.IN_PROGRESS:
        raise InProgressError(
            f"{key} is in progress elsewhere (outside this transaction)",
            key=key,
            record=claim.record,
        )
    token = claim.token
    try:
        with bind_action(key, token, idem):
            value = await fn()
    except Exception as exc:
        await _settle_failure(records, key, token, exc, on_error, retention)
        raise
    try:
        data = idem.codec.encode(value)
    except ResultEncodingError as exc:
        await records.fail(key, token, _failure(exc), retention=retention)
        raise
    if not await records.complete(key, token, data, retention=retention):
        raise LostClaimError(
            f"{key}: fencing token {token} was taken over; result not stored", key=key
        )
    return value


async def _settle_failure(
    records: JoinedRecords,
    key: str,
    token: int,
    exc: Exception,
    on_error: Literal["release", "store"],
    retention: float,
) -> None:
    """Release the key (or store the failure) in the transaction after ``fn`` raised.

    The transaction may be aborted by then (a failed statement of ``fn``): the write
    then fails too, and is only logged, since ``fn``'s own error is the one to see and
    the bot's rollback takes the claim away with everything else.
    """
    try:
        if on_error == "store":
            await records.fail(key, token, _failure(exc), retention=retention)
        else:
            await records.release(key, token)
    except StoreError as error:
        log.debug("%s: not settled in the transaction after a failure: %s", key, error)


# The stored failure's shape is the guard's (``_guard._failure``); written here too since
# the guard imports this module.
def _failure(exc: BaseException) -> bytes:
    return json.dumps({"type": type(exc).__name__, "message": str(exc)}).encode()


def _stored_failure(record: Record) -> StoredFailureError:
    info: dict[str, Any] = {}
    with contextlib.suppress(ValueError, TypeError):
        info = json.loads(record.result or b"{}")
    return StoredFailureError(
        f"{record.key} failed before and its failure was stored: "
        f"{info.get('type', '?')}: {info.get('message', '')}",
        key=record.key,
        record=record,
        error_type=str(info.get("type", "")),
        error_message=str(info.get("message", "")),
    )
