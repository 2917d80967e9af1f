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
unless ``fn`` returned and the bot commits. The record commits with the effect, so a
database effect is exactly once without ``once=``; ``once="at_most"`` is refused inside
the block (``Idem.run`` raises :class:`~telegram_idem.errors.ConfigurationError`), since
its record would roll back while an effect outside the database stays. Error classes do
not apply either: the bot's transaction decides what stays. No heartbeat runs: the open
transaction holds the key's row.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Literal, Protocol, TypeVar

from telegram_idem._context import bind_action, current_action
from telegram_idem._host import EffectHost
from telegram_idem._joined import JoinedRecords, JoinedTransaction, bind_transaction
from telegram_idem._keys import bounded_key
from telegram_idem._records import Outcome
from telegram_idem._settled import (
    SETTLED,
    emit_claim,
    emit_claim_error,
    failure_bytes,
    settled_answer,
)
from telegram_idem.backends import joined_of
from telegram_idem.errors import (
    ConfigurationError,
    InProgressError,
    LostClaimError,
    ResultEncodingError,
    StoreError,
)

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
async def transaction(idem: EffectHost, conn: object) -> AsyncIterator[JoinedTransaction]:
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

_running: dict[int, list[str]] = {}
"""``id(joined transaction)`` → the keys of the runs on its connection now, outermost
first (a nested step's run above its action's)."""


@contextlib.contextmanager
def _one_at_a_time(joined: JoinedTransaction, key: str) -> Iterator[None]:
    """Let runs use one joined connection one at a time: a run may start when none is
    on the connection, or nested in the innermost one (a step of the running action,
    also from a task it awaits: ``asyncio.wait_for``, ``shield`` or a one-step
    ``gather``, whose context carries the action). Two runs side by side (a ``gather``
    of actions, or of two steps of one action) would interleave statements on the one
    connection, which asyncpg refuses with a raw ``InterfaceError`` and SQLite would
    serialise into a half-done transaction.

    Raises:
        ConfigurationError: another run is on the connection now, and this one is not
            nested in it.
    """
    slot = id(joined)
    key = bounded_key(key)  # as the record's key, which the action's context carries
    stack = _running.setdefault(slot, [])
    parent = current_action()
    if stack and (parent is None or parent.key != stack[-1]):
        raise ConfigurationError(
            f"{key}: another action or step ({stack[-1]}) is running on this joined "
            "transaction's connection (asyncio.gather inside idem.transaction?): one "
            "connection runs one statement at a time, so run the actions and steps of one "
            "transaction one after another"
        )
    stack.append(key)
    try:
        yield
    finally:
        stack.remove(key)
        if not stack:
            _running.pop(slot, None)


def _first_join(store: object, conn: object) -> JoinedRecords:
    records = joined_of(store, conn)
    with contextlib.suppress(TypeError):  # a store that cannot be weakly referenced
        _joinable.add(store)
    return records


async def run_joined(
    idem: EffectHost,
    joined: JoinedTransaction,
    key: str,
    fn: Callable[[], Awaitable[T]],
    *,
    fingerprint: str | None,
    on_error: Literal["release", "store"],
    lease: float,
    retention: float,
    kept: float | None = None,
    handler: str | None,
    boundary: Literal["action", "step"],
) -> T:
    """:meth:`telegram_idem.Idem.run` for a key whose store is joined to the bound
    transaction (the table of the module docstring): claimed with ``retention`` seconds,
    completed with ``kept`` seconds (a ``window=`` action's window; default
    ``retention``). The run binds the action like the store's own runs do
    (:meth:`~telegram_idem._context.bind_action.of_record`), so its steps' keys carry the
    run and their records are kept no longer than its own.

    Raises:
        ConflictError: same key, different fingerprint.
        InProgressError: a holder outside any transaction has the key, its lease alive.
        StoredFailureError: replay of a stored failure.
        LostClaimError: the completion found another token (cannot happen while the
            transaction holds the row; checked all the same).
        ResultEncodingError: the result cannot be stored (the failure is stored).
        StoreError: the database could not answer (the transaction is then usually
            aborted: roll it back).
        ConfigurationError: another task's joined run is on the same connection now
            (``asyncio.gather`` of actions inside one ``idem.transaction`` block).
        Exception: whatever ``fn`` raised.
    """
    with _one_at_a_time(joined, key):
        return await _run_joined(
            idem,
            joined,
            key,
            fn,
            fingerprint=fingerprint,
            on_error=on_error,
            lease=lease,
            retention=retention,
            kept=kept,
            handler=handler,
            boundary=boundary,
        )


async def _run_joined(
    idem: EffectHost,
    joined: JoinedTransaction,
    key: str,
    fn: Callable[[], Awaitable[T]],
    *,
    fingerprint: str | None,
    on_error: Literal["release", "store"],
    lease: float,
    retention: float,
    kept: float | None,
    handler: str | None,
    boundary: Literal["action", "step"],
) -> T:
    records = joined.records
    started = time.perf_counter()
    try:
        claim = await records.claim(key, fingerprint=fingerprint, lease=lease, retention=retention)
    except StoreError:
        emit_claim_error(boundary=boundary, key=key, handler=handler, started=started)
        raise
    outcome = claim.outcome
    emit_claim(claim, boundary=boundary, key=key, handler=handler, started=started)
    if outcome in SETTLED:
        return settled_answer(claim, idem.codec)  # type: ignore[no-any-return]
    if outcome is Outcome.IN_PROGRESS:
        raise InProgressError(
            f"{key} is in progress elsewhere (outside this transaction)",
            key=key,
            record=claim.record,
        )
    token = claim.token
    try:
        with bind_action.of_record(
            claim.record, idem, lease=lease, name=handler or "", kept=kept or retention
        ):
            value = await fn()
    except Exception as exc:
        await _settle_failure(records, key, token, exc, on_error, retention)
        raise
    try:
        data = idem.codec.encode(value)
    except ResultEncodingError as exc:
        await records.fail(key, token, failure_bytes(exc), retention=retention)
        raise
    if not await records.complete(key, token, data, retention=kept or retention):
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
            await records.fail(key, token, failure_bytes(exc), retention=retention)
        else:
            await records.release(key, token)
    except StoreError as error:
        log.debug("%s: not settled in the transaction after a failure: %s", key, error)
