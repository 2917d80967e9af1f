"""The guards: one :class:`Idem` object holds a store and the defaults, and runs the
update guard, the action guard, side-effect steps and locks over it.

The decisions themselves live in :mod:`telegram_idem.machine` (and natively in server
stores); this module turns them into behaviour: run, replay, raise, wait or drop. The
update guard's admission (:meth:`Idem.admit`) is :mod:`telegram_idem._admitted`'s; what an
effect's failure means is :mod:`telegram_idem._effects`'s, the at-most-once protocol
:mod:`telegram_idem._at_most`'s, reconciliation (:meth:`Idem.unresolved`,
:meth:`Idem.resolve`) :mod:`telegram_idem._unresolved`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from telegram_idem._admission import Admission, StorePolicy, StorePolicyLike
from telegram_idem._admitted import Admitted, admit, adopt, claim_update, release_quietly
from telegram_idem._at_most import run_at_most
from telegram_idem._clock import Clock, system_clock
from telegram_idem._codec import JsonCodec, ResultCodec
from telegram_idem._context import (
    bind_action,
    bound_update,
    current_action,
    current_update,
    effect_context,
)
from telegram_idem._effects import (
    AT_LEAST,
    EffectPolicy,
    ErrorTypes,
    Meaning,
    Once,
    classify,
    effect_policy,
)
from telegram_idem._heartbeat import heartbeat
from telegram_idem._inbox_admission import admit_to_inbox
from telegram_idem._joined import JoinedTransaction, bound_transaction
from telegram_idem._keys import KeyBuilder
from telegram_idem._locks import acquire_lock
from telegram_idem._records import Claim, Outcome
from telegram_idem._settled import (
    SETTLED,
    emit_claim,
    emit_claim_error,
    failure_bytes,
    settled_answer,
)
from telegram_idem._transaction import run_joined, transaction
from telegram_idem._unresolved import Unresolved, oldest_unresolved_age, resolve, unresolved
from telegram_idem._updates import ordering_key
from telegram_idem.backends import Store, ledger_of, store_from_url
from telegram_idem.errors import (
    ConfigurationError,
    InProgressError,
    LockHeldError,
    LostClaimError,
    ResultEncodingError,
    StoreError,
)
from telegram_idem.events import emit_decision
from telegram_idem.inbox import Inbox, NewEntry

__all__ = ["ErrorPolicy", "Idem", "InProgressPolicy", "Once"]

T = TypeVar("T")
InProgressPolicy = Literal["raise", "wait", "drop"]
ErrorPolicy = Literal["release", "store"]
Sleep = Callable[[float], Awaitable[None]]

log = logging.getLogger("telegram_idem")

_MISSING: Any = object()
"""``Idem.resolve``'s "no result given"."""


def default_holder() -> str:
    """``"<hostname>:<pid>"``: who runs an at-most-once effect, for the operator."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Idem:
    """Idempotency for one bot (or several: keys carry the bot id).

    Args:
        store: a :class:`Store` or a store URL (``sqlite:///bot.db``, ``memory://``, …).
        keys: the key builder (its ``prefix`` namespaces every key).
        codec: how results are stored (default JSON, which replays falsy values exactly).
        lease: seconds a holder's lease lasts; a heartbeat extends it every ``lease / 3``
            seconds while the work runs.
        update_retention: seconds an update id is remembered (default 48 h; Telegram keeps
            undelivered updates at most 24 h — Bot API, "Getting updates").
        action_retention: seconds an action's result is kept for replay (default 24 h).
        clock: seconds since the epoch, for callback token expiry; also given to a store
            made from a URL (``None``: the store's own time source, the server's clock
            for server stores). Leases, lock expiry and ``retry_after`` are always
            judged by the store's clock.
        sleep: awaited between polls of the ``wait`` policy (inject in tests).
        heartbeat: extend leases while work runs.
        lock_retention: seconds a lock's record is kept after its ttl, so fencing tokens
            keep rising across holders (records purged after retention restart at 1).
        holder: who this guard's process is, written beside every at-most-once effect
            it starts and shown by :meth:`unresolved` (default ``"<hostname>:<pid>"``,
            read when the effect starts, so a forked worker names itself).
    """

    def __init__(
        self,
        store: Store | str,
        *,
        keys: KeyBuilder | None = None,
        codec: ResultCodec | None = None,
        lease: float = 60.0,
        update_retention: float = 48 * 3600.0,
        action_retention: float = 24 * 3600.0,
        clock: Clock | None = None,
        sleep: Sleep = asyncio.sleep,
        heartbeat: bool = True,
        lock_retention: float = 24 * 3600.0,
        holder: str | None = None,
    ) -> None:
        self._holder = holder
        self.store = store_from_url(store, clock=clock) if isinstance(store, str) else store
        self.keys = keys or KeyBuilder()
        self.codec: ResultCodec = codec or JsonCodec()
        self.lease = lease
        self.update_retention = update_retention
        self.action_retention = action_retention
        self.clock: Clock = clock or system_clock
        self.sleep = sleep
        self.heartbeat = heartbeat
        self.lock_retention = lock_retention

    @property
    def holder(self) -> str:
        """Who runs this guard's at-most-once effects (``holder=``, or
        ``"<hostname>:<pid>"``)."""
        return self._holder or default_holder()

    async def close(self) -> None:
        """Close the store."""
        await self.store.close()

    # ------------------------------------------------------------------ leases

    def _heartbeat(
        self, key: str, token: int, lease: float
    ) -> contextlib.AbstractContextManager[None]:
        return heartbeat(
            lambda: self.store.extend(key, token, lease=lease),
            interval=lease / 3,
            name=key,
            enabled=self.heartbeat,
        )

    async def _finish_ok(self, key: str, token: int, value: Any, retention: float) -> None:
        try:
            data = self.codec.encode(value)
        except ResultEncodingError as exc:
            # The work is done; store the failure so it is not run again, then tell.
            await self.store.fail(key, token, failure_bytes(exc), retention=retention)
            raise
        if not await self.store.complete(key, token, data, retention=retention):
            raise LostClaimError(
                f"{key}: fencing token {token} was taken over; result not stored", key=key
            )

    # ------------------------------------------------------------ update guard

    async def claim_update(self, update: Mapping[str, Any], *, bot_id: int) -> Claim:
        """Claim the update guard key ``{bot_id}:u:{update_id}`` once, with no policy:
        the primitive under :meth:`admit` (a test uses it to play a holder that dies).

        Raises:
            MalformedUpdateError: no integer ``update_id``.
            StoreError: the store could not answer.
        """
        return await claim_update(self, update, bot_id=bot_id)

    async def admit(
        self,
        update: Mapping[str, Any],
        *,
        bot_id: int,
        wait: float = 0.0,
        outage_wait: float = 0.0,
        store_policy: StorePolicyLike = StorePolicy.FAIL_CLOSED,
    ) -> Admitted:
        """Admit one delivery of ``update``: the one admission decision every ingress
        shape translates into its answer.

        The update guard key ``{prefix}:{bot_id}:u:{update_id}`` is claimed; a claim in
        progress is looked at again with backoff (50 ms doubling to 1 s) until it is
        acquired (its holder died and the lease ended: takeover), completed (replay), or
        ``wait`` seconds have passed. A store that cannot answer
        (:class:`~telegram_idem.errors.StoreError`) is tried again, fail-closed, for
        ``outage_wait`` seconds (backoff 0.5 s doubling to 10 s; one WARNING when it
        stops answering, one when it answers again). Every update type is admitted the
        same way, types this version does not know included (they are passed to the
        framework untouched).

        | situation | outcome | webhook answer | polling | inbox (:meth:`admit_to_inbox`) |
        |---|---|---|---|---|
        | new, or a dead holder's lease ended (takeover) | ``RUN`` | 200 (processed, or queued) | processed | one entry: 200 / offset moves |
        | completed before, or a stored failure | ``DUPLICATE`` | 200, not run | confirmed, not run | no entry: 200 / confirmed |
        | in progress, the holder's lease alive | ``NOT_YET`` | 503: Telegram re-sends | waited for (``wait`` ≈ one lease), then ``RUN`` by takeover or ``DUPLICATE`` | no entry: 503 / offset kept |
        | store outage, ``fail_closed`` | ``UNAVAILABLE`` | 503: Telegram re-sends | tried for ``outage_wait``, then not run (ERROR: lost) | 503 / offset kept |
        | store outage, ``fail_open`` | ``UNGUARDED`` | 200, run without a claim | run without a claim | 200, dispatched in-process |

        A webhook passes ``wait=0`` and ``outage_wait=0`` (its non-2xx makes Telegram
        re-send); a shape Telegram will not re-send to (polling, or after a 200) passes
        about one lease as ``wait`` and :data:`~telegram_idem._admission.DEFAULT_OUTAGE_WAIT`
        as ``outage_wait``, since this process holds the update's only copy.

        Args:
            update: the Bot API update dict.
            bot_id: the receiving bot's id.
            wait: seconds to keep looking while another holder's lease is alive.
            outage_wait: seconds to keep trying while the store raises ``StoreError``
                (fail-closed only: fail-open runs unguarded at once).
            store_policy: ``StorePolicy.FAIL_CLOSED`` (default) or ``FAIL_OPEN`` (or
                their string values).

        Returns:
            The :class:`~telegram_idem._admitted.Admitted`: its ``outcome``, and
            ``run(call)`` for ``RUN`` and ``UNGUARDED``.

        Raises:
            MalformedUpdateError: no integer ``update_id``.
            ConfigurationError: an unknown ``store_policy``.
        """
        return await admit(
            self,
            update,
            bot_id=bot_id,
            wait=wait,
            outage_wait=outage_wait,
            store_policy=store_policy,
        )

    async def admit_to_inbox(
        self,
        entries: Sequence[NewEntry],
        updates: Sequence[Mapping[str, Any] | None],
        *,
        bot_id: int,
        store_policy: StorePolicyLike = StorePolicy.FAIL_CLOSED,
        inbox: Inbox | None = None,
    ) -> list[Admitted]:
        """Admit deliveries into the durable inbox: the update guard claim and the entry
        are written together (one round trip for the batch), so from its first
        admission the inbox owns the update (:meth:`admit`'s table, last column).

        ``Inbox.admit`` answers only "admitted or not"; a refused entry's record is read
        back (one more round trip, refused deliveries only) to tell a duplicate
        (completed or failed) from an update another shape sharing the store holds in
        progress under a live lease (``NOT_YET``: never acknowledge it). Outcomes:
        ``RUN`` (queued: the worker runs it, :attr:`Admitted.queued`), ``DUPLICATE``,
        ``NOT_YET``; a store outage gives ``UNAVAILABLE`` (``fail_closed``) or
        ``UNGUARDED`` (``fail_open``: run it in-process without the inbox; an entry
        without an update stays ``UNAVAILABLE``); an outage while reading a refused
        record back gives ``UNAVAILABLE`` whatever the policy (a refused update is not
        new, so it is never run unguarded).

        Args:
            entries: the entries (:func:`telegram_idem.inbox._entries.new_entry`).
            updates: the update of each entry, in order, or ``None`` for an entry that
                keeps something that is not an update (a rejected entry).
            bot_id: the receiving bot's id.
            store_policy: the outage policy (default fail-closed).
            inbox: the inbox (default ``self.store.inbox()``).

        Returns:
            One :class:`~telegram_idem._admitted.Admitted` per entry, in order.

        Raises:
            ConfigurationError: the store has no inbox, or an unknown ``store_policy``.
            ValueError: ``entries`` and ``updates`` differ in length.
        """
        return await admit_to_inbox(
            self,
            entries,
            updates,
            bot_id=bot_id,
            inbox=inbox if inbox is not None else self.store.inbox(),
            store_policy=store_policy,
        )

    def adopt(
        self,
        update: Mapping[str, Any],
        *,
        bot_id: int,
        outcome: Admission = Admission.RUN,
    ) -> Admitted:
        """The admission of an update admitted elsewhere, to run it here: ``RUN`` for an
        update the durable inbox owns (its worker runs it), ``UNGUARDED`` for one a
        webhook admitted fail-open (the Lambda worker). ``run(call)`` binds the update
        and runs ``call``, with no claim to record.

        Raises:
            MalformedUpdateError: no integer ``update_id``.
            ConfigurationError: another outcome.
        """
        return adopt(self, update, bot_id=bot_id, outcome=outcome)

    async def _release_quietly(self, key: str, token: int) -> None:
        await release_quietly(self.store, key, token)

    # ------------------------------------------------------------ action guard

    async def run(
        self,
        key: str,
        fn: Callable[[], Awaitable[T]],
        *,
        fingerprint: str | None = None,
        in_progress: InProgressPolicy = "raise",
        on_error: ErrorPolicy = "release",
        lease: float | None = None,
        retention: float | None = None,
        wait_timeout: float | None = None,
        handler: str | None = None,
        boundary: Literal["action", "step"] = "action",
        window: float | None = None,
        once: Once = "at_least",
        not_applied: ErrorTypes = (),
        permanent: ErrorTypes = (),
        ambiguous: ErrorTypes = (),
    ) -> T:
        """Run ``fn`` once per ``key``; later calls get its stored result.

        What "once" means is ``once``: ``"at_least"`` (the default) runs ``fn`` again
        when a holder crashed before recording its outcome; ``"at_most"`` writes a
        ledger row before running ``fn``, and a holder that finds the row of a crashed
        predecessor raises :class:`UnknownOutcomeError` instead of running it again
        (until :meth:`resolve` settles it). What an exception of ``fn`` means (not
        applied, permanent, ambiguous) is decided by :mod:`telegram_idem._effects`:
        the marker errors, then ``not_applied`` / ``permanent`` / ``ambiguous``, then
        the library's and the frameworks' Bot API errors, then ``on_error``.

        | ``fn``'s end | ``at_least`` | ``at_most`` |
        |---|---|---|
        | returns | completed (replayed) | completed (replayed) |
        | not applied | released: a retry runs | released: a retry runs |
        | permanent | failure stored: retries raise :class:`StoredFailureError` | the same |
        | ambiguous | released: a retry runs | unknown: this call and every retry raise :class:`UnknownOutcomeError` |
        | unclassified | ``on_error`` (``"release"``: not applied) | ambiguous (``on_error="store"``: permanent) |
        | cancelled, or the process dies | released (a dead holder: its lease ends), a retry runs | unknown |

        Args:
            key: the full idempotency key (see :class:`KeyBuilder`).
            fn: the work; its result must be storable by the codec.
            fingerprint: payload fingerprint; a different one under the same key is a
                conflict.
            in_progress: when another holder runs the key: ``"raise"``
                :class:`InProgressError`, ``"wait"`` for its result (at most
                ``wait_timeout`` seconds, default the lease), or ``"drop"`` (return
                ``None`` without running).
            on_error: what an exception no rule classifies means: ``"release"`` the
                claim (a retry runs again; under ``at_most`` such an exception is
                ambiguous instead), or ``"store"`` the failure (a retry raises
                :class:`StoredFailureError`).
            lease: seconds (default the guard's).
            retention: seconds the result is kept (default ``action_retention``).
            handler: name for the decision log.
            window: seconds the outcome is replayed after the work *finishes*, instead
                of ``retention`` (a dedup window for navigation buttons: a repeat within
                ``window`` seconds replays, a later one runs again). The lease is not
                affected: a repeat while the work runs is in progress, however long it
                runs. ``None`` (default): ``retention`` applies.
            once: ``"at_least"`` or ``"at_most"`` (needs a store with an effect ledger:
                memory, SQLite, PostgreSQL, Redis, DynamoDB).
            not_applied, permanent, ambiguous: exception classes with that meaning.

        Raises:
            ConfigurationError: ``window`` is not a positive finite number, or is given
                together with ``retention``; an unknown ``once`` or ``on_error``; an
                error list holding anything but exception classes, or one class in two
                lists; ``once="at_most"`` on a store without an effect ledger (the
                message names the store).
            ConflictError: same key, different fingerprint.
            InProgressError: policy ``raise``, or ``wait`` timed out.
            StoredFailureError: replay of a stored failure.
            UnknownOutcomeError: ``at_most`` only: an earlier holder was interrupted
                after it started ``fn``, or ``fn`` failed ambiguously or was cancelled
                (chained from its error); the message names the key, when and by whom
                it started, the attempts, and how to settle it.
            LostClaimError: ``fn`` finished after its lease was taken over; the new
                holder's record stands.
            ResultEncodingError: the result cannot be stored (stored as a failure).
            StoreError: the store could not answer.
            Exception: whatever ``fn`` raised (not applied or permanent).
        """
        policy = (
            AT_LEAST
            if once == "at_least"
            and on_error == "release"
            and not (not_applied or permanent or ambiguous)
            else effect_policy(
                once=once,
                not_applied=not_applied,
                permanent=permanent,
                ambiguous=ambiguous,
                on_error=on_error,
            )
        )
        lease = lease or self.lease
        if window is not None:
            if retention is not None:
                raise ConfigurationError("give an action a window= or a retention=, not both")
            if not (window > 0 and math.isfinite(window)):
                raise ConfigurationError(f"window must be > 0 seconds, got {window}")
            # The record must outlive the lease while in progress; once done, the window.
            retention, kept = max(lease, window), window
        else:
            retention = kept = retention or self.action_retention
        parent = current_action() if boundary == "step" else None
        if parent is not None:
            # A step's record never outlives its action's (its key carries the run too).
            retention = kept = _capped(kept, lease, parent.retention_left())
            kept = min(kept, parent.kept)  # and never past its action's window
        joined = bound_transaction()
        if joined is not None and joined.store is self.store:
            if policy.at_most:
                raise ConfigurationError(
                    f"{key}: once='at_most' cannot run inside idem.transaction(...): its "
                    "record would roll back with your transaction while an effect outside "
                    "the database stays, so a retry would run it again. Run the "
                    "at-most-once step before or after the transaction; a database-only "
                    "effect needs no once= there (the transaction makes it exactly once)"
                )
            return await run_joined(
                self,
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
        if policy.at_most:
            ledger_of(self.store)  # a clear error before anything is claimed
        deadline = time.monotonic() + (wait_timeout if wait_timeout is not None else lease)
        delay = 0.02
        waited = False
        while True:
            started = time.perf_counter()
            try:
                claim = await self.store.claim(
                    key, fingerprint=fingerprint, lease=lease, retention=retention
                )
            except StoreError:
                emit_claim_error(boundary=boundary, key=key, handler=handler, started=started)
                raise
            outcome = claim.outcome
            emit_claim(claim, boundary=boundary, key=key, handler=handler, started=started)
            if outcome is Outcome.ACQUIRED:
                if parent is not None:
                    # The store's time at the claim is exact: cap the completion by it.
                    claimed_at = claim.record.lease_expires_at - lease
                    left = parent.retention_left(claimed_at)
                    kept = min(_capped(kept, lease, left), parent.kept)
                return await self._run_acquired(
                    claim, fn, policy, lease, kept, handler=handler, boundary=boundary
                )
            if outcome in SETTLED:
                return settled_answer(claim, self.codec)  # type: ignore[no-any-return]
            if in_progress == "drop":
                return None  # type: ignore[return-value]
            # "wait" looks again at least once, however slow the first claim was.
            if in_progress == "raise" or (waited and time.monotonic() >= deadline):
                raise InProgressError(
                    f"{key} is in progress elsewhere", key=key, record=claim.record
                )
            await self.sleep(min(delay, max(deadline - time.monotonic(), 0.001)))
            waited = True
            delay = min(delay * 2, 1.0)

    async def _run_acquired(
        self,
        claim: Claim,
        fn: Callable[[], Awaitable[T]],
        policy: EffectPolicy,
        lease: float,
        retention: float,
        *,
        handler: str | None = None,
        boundary: Literal["action", "step"] = "action",
    ) -> T:
        record = claim.record
        key, token = record.key, claim.token

        binding = bind_action.of_record(
            record, self, lease=lease, once=policy.once, name=handler or "", kept=retention
        )
        if policy.at_most:
            return await run_at_most(
                self,
                ledger_of(self.store),
                key,
                token,
                fn,
                policy=policy,
                retention=retention,
                binding=binding,
                heartbeat=lambda: self._heartbeat(key, token, lease),
                boundary=boundary,
                handler=handler,
            )
        try:
            with binding, self._heartbeat(key, token, lease):
                value = await fn()
        except Exception as exc:
            if classify(exc, policy) is Meaning.PERMANENT:
                await self.store.fail(key, token, failure_bytes(exc), retention=retention)
            else:  # not applied, or ambiguous: at least once runs it again
                await self._release_quietly(key, token)
            raise
        except BaseException:  # cancellation: let a retry run
            await self._release_quietly(key, token)
            raise
        await self._finish_ok(key, token, value, retention)
        return value

    # ---------------------------------------------------- joined transactions

    def transaction(
        self, conn: object
    ) -> contextlib.AbstractAsyncContextManager[JoinedTransaction]:
        """Record the actions and steps run inside the block in the bot's own database
        transaction on ``conn``: each one's claim and completion (or a step's record)
        commit or roll back together with the bot's writes and its outbox entries, so a
        crash anywhere leaves all of them or none, and a concurrent duplicate blocks on
        the key until this transaction ends, then replays.

        The bot opens and commits the transaction; the block must run inside it::

            async with pool.acquire() as conn, conn.transaction():
                async with idem.transaction(conn):
                    await credit(conn, ...)   # inside an @idempotent action or a step

        Args:
            conn: an asyncpg ``Connection``, an SQLAlchemy ``AsyncConnection`` or
                ``AsyncSession``, a ``sqlite3.Connection`` or an ``aiosqlite.Connection``,
                connected to the database that holds this guard's store.

        Raises:
            ConfigurationError: the store's records live outside the bot's database
                (memory, Redis, DynamoDB), ``conn`` is of another kind, or it is
                connected to another database.
        """
        return transaction(self, conn)

    # --------------------------------------------------------------- steps

    async def step(
        self,
        name: str,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        key: str | None = None,
        once: Once = "at_least",
        on_error: ErrorPolicy = "release",
        not_applied: ErrorTypes = (),
        permanent: ErrorTypes = (),
        ambiguous: ErrorTypes = (),
        context: bool = False,
        **kwargs: Any,
    ) -> T:
        """Run the side-effect step ``name`` once inside the current action.

        A retried action skips steps that completed and gets their stored results.
        Inside an action, the step is recorded by the :class:`Idem` running the action
        (next to the action's own record), whichever :class:`Idem` it is called on.
        The step's record belongs to its action's run: its key carries the run's epoch
        (``<action key>:s:<name>`` in the key's first run, ``<action key>:r<n>:s:<name>``
        in a later one) and it is kept no longer than the action's record, so a step
        recorded by an earlier run of the action key (after its retention or ``window``)
        is never replayed into a new run. An at-most-once step (``once="at_most"``) keeps
        the first run's key in every run: an unknown outcome stays unknown for every
        later run of the action (``UnknownOutcomeError``, never a second effect) until it
        is resolved, and its idempotency key stays the same. Steps have names, not
        positions: steps run concurrently (``asyncio.gather``) keep their identities.

        ``once``, ``on_error`` and the error lists are :meth:`run`'s; under
        ``once="at_most"`` a retried action whose step was interrupted gets
        :class:`UnknownOutcomeError` from this call (catch it to decide, or let it
        propagate: the operator sees it in :meth:`unresolved`).

        Args:
            name: the step's name, unique within its action.
            fn: the effect; called as ``fn(*args, **kwargs)``, or as
                ``fn(ctx, *args, **kwargs)`` with ``context=True``.
            key: a full key to use instead of the action's step key (for a step outside
                an action).
            once: ``"at_least"`` (default) or ``"at_most"``.
            on_error: ``"release"`` (default) or ``"store"``: what an unclassified
                exception means (see :meth:`run`).
            not_applied, permanent, ambiguous: exception classes with that meaning.
            context: pass the step's :class:`EffectContext` (a stable
                ``idempotency_key`` for a provider, the ``fencing_token``) as ``fn``'s
                first argument.

        Raises:
            ConfigurationError: no action is running and no ``key`` was given; a bad
                ``once``, ``on_error`` or error list, or ``at_most`` on a store without
                an effect ledger.
            UnknownOutcomeError: ``at_most``: the step was interrupted before (or now
                failed ambiguously); it is not run again until it is resolved.
            InProgressError, StoredFailureError, LostClaimError, ResultEncodingError,
                StoreError: as :meth:`run`; and whatever ``fn`` raised.
        """
        action = current_action()
        if action is not None and action.idem is not self:
            return await action.idem.step(
                name,
                fn,
                *args,
                key=key,
                once=once,
                on_error=on_error,
                not_applied=not_applied,
                permanent=permanent,
                ambiguous=ambiguous,
                context=context,
                **kwargs,
            )
        if key is None:
            if action is None:
                raise ConfigurationError(
                    f"step {name!r} needs a running @idempotent action, or an explicit key="
                )
            # An at-most-once step's key does not carry the run: its unknown outcome (a
            # ledger row that never expires) must stop every later run of the action too,
            # not only retries of this one; its completed record still expires with the
            # action's (the retention cap in run).
            key = self.keys.step(action.key, name, action.epoch if once == "at_least" else 0)

        def call() -> Awaitable[T]:
            if context:
                return fn(effect_context(), *args, **kwargs)
            return fn(*args, **kwargs)

        return await self.run(
            key,
            call,
            in_progress="wait",
            handler=name,
            boundary="step",
            once=once,
            on_error=on_error,
            not_applied=not_applied,
            permanent=permanent,
            ambiguous=ambiguous,
        )

    # -------------------------------------------------------- reconciliation

    async def unresolved(self, *, prefix: str = "", limit: int = 100) -> list[Unresolved]:
        """The effects that may or may not have happened, oldest first: at-most-once
        steps and actions whose outcome is unknown (``UNKNOWN`` ledger rows, and
        ``STARTED`` rows whose holder's lease ended or whose record is gone), and the
        outbox's unknown sends (:attr:`~telegram_idem.outbox.CallStatus.UNKNOWN`).

        A ``STARTED`` row whose record completed or failed is stale (its holder stopped
        between the two writes): it is removed and not listed. A row whose holder's
        lease is alive is running, not listed.

        Args:
            prefix: only keys starting with it (e.g. an action's key: its steps too).
            limit: at most this many (≥ 1).

        Returns:
            :class:`Unresolved` items, oldest ``started_at`` first.

        Raises:
            ConfigurationError: ``limit`` < 1.
            StoreError: the store could not answer.
        """
        return await unresolved(self, prefix=prefix, limit=limit)

    async def oldest_unresolved_age(self) -> float | None:
        """Seconds (store clock) since the oldest unresolved effect started, or
        ``None`` when nothing is unresolved: the number to alert on.

        Raises:
            StoreError: the store could not answer.
        """
        return await oldest_unresolved_age(self)

    async def resolve(self, key: str, *, result: Any = _MISSING, not_applied: bool = False) -> None:
        """Settle the unresolved effect ``key`` (an item of :meth:`unresolved`): it took
        effect with ``result`` (the next run of the key replays it: a step's action
        gets it as the step's result), or it did not (``not_applied=True``: the next
        run runs it).

        Fenced: the resolver claims the key's record first (a fencing token above every
        earlier holder's), so a late holder that wakes up afterwards cannot overwrite
        the resolution (its completion raises :class:`LostClaimError`), and the first
        resolution stands. An unknown send (an outbox call) is settled in the outbox:
        ``result`` is Telegram's ``result`` (stored as JSON,
        ``Outbox.resolve``), ``not_applied`` puts it back to be sent
        (``Outbox.redrive``).

        Args:
            key: the unresolved key, as :meth:`unresolved` lists it.
            result: the effect's result (storable by the codec; for a send, JSON).
            not_applied: the effect did not happen.

        Raises:
            ConfigurationError: neither or both of ``result`` and ``not_applied``.
            ResolveError: ``key`` has nothing to settle: no unknown step, action or
                send, settled already, completed, or its holder's lease is still alive
                (it is running: not unresolved yet).
            ResultEncodingError: ``result`` cannot be stored by the codec.
            StoreError: the store could not answer.
        """
        if (result is _MISSING) == (not not_applied):
            raise ConfigurationError(
                f"resolve({key!r}) needs exactly one of result=... or not_applied=True"
            )
        await resolve(
            self, key, result=None if result is _MISSING else result, not_applied=not_applied
        )

    # --------------------------------------------------------------- locks

    @contextlib.asynccontextmanager
    async def lock(
        self,
        name: str,
        *,
        bot_id: int | None = None,
        ttl: float = 120.0,
        wait: float = 0.0,
    ) -> AsyncIterator[Claim]:
        """Hold the lock ``name`` for the block; released in ``finally``.

        While the block runs, a heartbeat renews the lock every ``ttl / 3`` seconds (if
        the guard's ``heartbeat`` is on), so a holder may work longer than ``ttl``;
        ``ttl`` only bounds how long a holder that *crashed* keeps others out. Expiry
        and ``retry_after`` are judged by the store's clock (see
        :mod:`telegram_idem._locks`).

        Inside an action, the action owns the lock: if the action is taken over after its
        holder died, the new holder takes the lock over too instead of waiting ``ttl``.
        The lock is then kept in the store of the :class:`Idem` running the action,
        whichever :class:`Idem` this is called on.

        Args:
            name: what the lock guards (e.g. ``"post:chat:42"``).
            bot_id: default: the bound update's bot.
            ttl: seconds after which a holder that stopped renewing (a crash) loses it.
            wait: seconds to keep trying while another holder has it, polling with
                backoff (20 ms doubling to 1 s, never past the holder's lease end or the
                deadline); ``0`` (default) tries once.

        Raises:
            LockHeldError: another holder still has it after ``wait`` seconds
                (``retry_after`` = seconds left of its lease, by the store's clock).
            ConfigurationError: ``ttl`` not > 0, ``wait`` negative or not finite, or no
                ``bot_id`` and no update bound.
            StoreError: the store could not answer.
        """
        action = current_action()
        if action is not None and action.idem is not self:
            async with action.idem.lock(name, bot_id=bot_id, ttl=ttl, wait=wait) as claim:
                yield claim
            return
        if not (wait >= 0 and math.isfinite(wait)):
            raise ConfigurationError(f"lock wait must be ≥ 0 seconds, got {wait}")
        bot = bot_id if bot_id is not None else current_update().bot_id
        key = self.keys.lock(bot, name)
        claim = await self._acquire_lock(
            key, ttl=ttl, wait=wait, owner=action.key if action is not None else None
        )
        try:
            with self._heartbeat(key, claim.token, ttl):
                yield claim
        finally:
            await self._release_quietly(key, claim.token)

    async def _acquire_lock(self, key: str, *, ttl: float, wait: float, owner: str | None) -> Claim:
        deadline = time.monotonic() + wait
        delay = 0.02
        while True:
            try:
                # The record outlives the lock (a tombstone after release) so its fencing
                # token keeps rising: a stalled holder never matches a later holder's.
                claim = await acquire_lock(
                    self.store,
                    key,
                    ttl=ttl,
                    retention=max(ttl, self.lock_retention),
                    owner=owner,
                )
            except LockHeldError as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    _emit_lock(key, "held", exc.record.fencing_token if exc.record else None)
                    raise
                await self.sleep(max(min(delay, left, exc.retry_after), 0.001))
                delay = min(delay * 2, 1.0)
                continue
            _emit_lock(key, "acquired", claim.token)
            return claim

    def chat_lock(
        self, *, ttl: float = 120.0, name: str = "", wait: float = 0.0
    ) -> contextlib.AbstractAsyncContextManager[Claim]:
        """The per-chat lock of the bound update (user for chat-less updates).

        The same lock as ``lock(f"{name}:chat:{chat_id}")``, or ``lock(f"chat:{chat_id}")``
        with the default ``name=""`` (``user:{user_id}`` for chat-less updates), so
        the two forms exclude each other. ``ttl`` and ``wait`` are :meth:`lock`'s.

        Raises:
            ConfigurationError: no update bound, or it has neither chat nor user.
            LockHeldError: another holder still has this chat's lock after ``wait``.
        """
        ctx = current_update()
        unit = ordering_key(ctx.update)
        if unit is None:
            raise ConfigurationError("this update has neither a chat nor a user to lock")
        return self.lock(f"{name}:{unit}" if name else unit, bot_id=ctx.bot_id, ttl=ttl, wait=wait)


def _emit_lock(key: str, decision: str, token: int | None) -> None:
    ctx = bound_update()
    emit_decision(
        boundary="lock",
        key=key,
        decision=decision,
        update=ctx.update if ctx is not None else None,
        fencing_token=token,
        bot_id=ctx.bot_id if ctx is not None else None,
    )


def _capped(retention: float, lease: float, left: float) -> float:
    """A step's retention: ``retention``, but no longer than what is ``left`` of its
    action's record (never less than the lease: the store needs that much while it
    runs, and a heartbeat keeps a running action's record at least that long)."""
    return min(retention, max(left, lease))
