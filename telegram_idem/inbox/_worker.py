"""Workers: take inbox entries with a lease, run the bot's dispatch, ack.

Many chats run in parallel (``concurrency`` tasks); the inbox guarantees at most one entry
per ordering unit is in flight, in admission order. A failure is retried with exponential
backoff (``backoff_base * 2**(attempt-1)`` seconds, at most ``backoff_max``); after
``max_attempts`` the entry becomes a dead letter an operator can list and re-drive.
A failure that carries a Bot API ``retry_after`` (a 429, Telegram's flood control; see
:func:`retry_after_of`) waits at least that long and does not count as an attempt
(``Inbox.retry(..., refund=True)``): an update is never dead-lettered only because
Telegram asked the bot to wait. Likewise an :class:`~telegram_idem.errors.InProgressError`
(an ``@idempotent`` action's or the update's claim is held elsewhere, its lease alive: a
worker killed mid-handler, a store paused longer than the entry's lease) says nothing
about the update: the take is refunded and the entry waits until that claim's lease ends
(at least ``IN_PROGRESS_MIN_DELAY`` = 1 s, at most ``backoff_max``), logged once per
entry as a wait, not a failure. Then the holder has finished (the action replays) or its
claim is taken over.

Nothing runs forever and nothing loops forever:

- a dispatch that does not finish within ``handler_timeout`` is cancelled and counts as a
  failed attempt;
- an error that no retry can fix (``permanent_errors``: the framework cannot parse the
  update, a rejected entry) makes a dead letter at once, so its chat does not wait;
- a worker that dies (or blocks its event loop past the lease) leaves its entry in flight
  until the lease ends; then another takes it. Attempts are counted at take, so an entry
  whose lease keeps running out is buried by the taker once it has been taken more than
  ``max_attempts`` times, instead of being run again;
- a heartbeat extends the lease every ``lease / 3`` s; when it could not run for more
  than half the lease (the event loop was blocked: ``time.sleep``, CPU work) the worker
  logs an ERROR, since another worker may have taken the entry meanwhile.

While the inbox cannot answer (a store outage) each task waits with exponential backoff
(from ``poll_interval`` up to ``outage_backoff_max`` s); the worker logs one line when the
outage starts, one per ``outage_log_interval`` while it lasts, and one when it ends.
Graceful shutdown (:meth:`InboxWorker.stop`) finishes in-flight entries within a grace
period and returns the rest to the inbox.

Lifecycle: ``async with worker:`` starts the worker on entry and stops it gracefully on
exit (``stop(grace=shutdown_grace)``), however the block ends;
:func:`telegram_idem.ingress.register` does the same for an aiohttp application's life.
A worker runs at most once at a time: starting a running worker raises ``RuntimeError``;
stopping one that is not running (never started, or stopped already) does nothing. A
stopped worker may be started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Self

from telegram_idem._outage import OutageLog
from telegram_idem.errors import (
    InProgressError,
    MalformedUpdateError,
    PermanentUpdateError,
    SendFailedError,
    StoreError,
    UnknownOutcomeError,
)
from telegram_idem.flood import retry_after_of
from telegram_idem.inbox._base import Inbox, InboxEntry
from telegram_idem.inbox._entries import decode_payload

__all__ = ["DEFAULT_PERMANENT_ERRORS", "Dispatch", "InboxWorker", "retry_after_of"]

log = logging.getLogger("telegram_idem.worker")

Dispatch = Callable[[dict[str, Any]], Awaitable[Any]]
"""Processes one update (a Bot API update dict); raising means "retry"."""

Sleep = Callable[[float], Awaitable[None]]

IN_PROGRESS_MIN_DELAY = 1.0
"""Seconds an entry that met a claim in progress elsewhere waits at least, so a lease
that ends in a moment (or clocks a little apart) does not make a busy loop of takes."""

_WAITING = "waiting for a claim in progress elsewhere"
"""How the ``last_error`` of such an entry begins: the next take knows it was reported."""


def _in_progress_of(exc: BaseException) -> InProgressError | None:
    """The :class:`InProgressError` ``exc`` is, or was raised from, or ``None``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, InProgressError):
            return current
        current = current.__cause__ or current.__context__
    return None


def _default_permanent() -> tuple[type[BaseException], ...]:
    found: list[type[BaseException]] = [
        PermanentUpdateError,
        MalformedUpdateError,
        # An outbox call the handler made is held as unknown, or was refused for good
        # (a dead letter, a parked chat): running the update again replays the same
        # answer until an operator settles the call, so retrying only burns attempts.
        UnknownOutcomeError,
        SendFailedError,
    ]
    try:  # aiogram parses updates with pydantic; a ValidationError never heals
        from pydantic import ValidationError
    except ImportError:  # pragma: no cover - pydantic comes with aiogram
        pass
    else:
        found.append(ValidationError)
    return tuple(found)


DEFAULT_PERMANENT_ERRORS: tuple[type[BaseException], ...] = _default_permanent()
"""Errors that dead-letter an entry at once: :class:`~telegram_idem.errors.PermanentUpdateError`,
:class:`~telegram_idem.errors.MalformedUpdateError`, pydantic's ``ValidationError``
(aiogram cannot parse the update) when pydantic is installed, and the outbox's
:class:`~telegram_idem.errors.UnknownOutcomeError` and
:class:`~telegram_idem.errors.SendFailedError` (with :class:`~telegram_idem.errors.ChatParkedError`):
a call the handler made is unknown or refused, and running the update again replays that
answer until the call is settled (``resolve``/``redrive``/``unpark`` it, then redrive the
update)."""


class _Beat:
    """When the heartbeat of one run last ran, and whether its lateness was reported."""

    __slots__ = ("last", "reported")

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.reported = False


class InboxWorker:
    """A pool of tasks draining one inbox.

    Args:
        inbox: the inbox to drain: ``idem.store.inbox()`` (memory, SQLite, PostgreSQL,
            Redis).
        dispatch: ``async (update: dict) -> Any``, processes one Bot API update;
            raising means "retry". aiogram:
            :func:`telegram_idem.adapters.aiogram.inbox_dispatch` ``(dp, bot)``; PTB:
            :func:`telegram_idem.adapters.ptb.inbox_dispatch` ``(application, idem)``.
        concurrency: worker tasks, so entries of up to this many ordering units run at
            once (≥ 1).
        lease: seconds a worker holds a taken entry before another may take it; a
            heartbeat extends it every ``lease / 3`` seconds while the dispatch runs (> 0).
            Best equal to the ``Idem`` lease: a shorter one makes a killed worker's entry
            be taken over while its action claims still live, and the taker waits for
            them (without spending attempts).
        max_attempts: takes before an entry becomes a dead letter (≥ 1); also the cap on
            takes of an entry whose lease keeps running out. A take that failed with a
            Bot API ``retry_after`` (flood control) is not counted, nor one that failed
            with :class:`~telegram_idem.errors.InProgressError` (an action's or the
            update's claim is held elsewhere, its lease alive): that entry waits until the
            claim's lease ends (at least 1 s, at most ``backoff_max``) and runs then, so
            it never becomes a dead letter only because a killed worker's claim outlives
            this ``lease``.
        backoff_base: seconds before the first retry of a failed entry; each further
            retry waits twice as long (``backoff_base * 2 ** (attempts - 1)``), and at
            least the ``retry_after`` of a Telegram 429 the handler raised.
        backoff_max: seconds the retry delay grows to at most.
        poll_interval: seconds to wait when the inbox is empty (or until :meth:`notify`);
            also the first delay of the outage backoff.
        handler_timeout: seconds one dispatch may run before it is cancelled and counted
            as a failed attempt (default 15 min); ``None`` for no limit.
        permanent_errors: exception types that dead-letter an entry at once, without
            retries (default :data:`DEFAULT_PERMANENT_ERRORS`: ``PermanentUpdateError``,
            ``MalformedUpdateError``, pydantic's ``ValidationError`` when pydantic is
            installed, and the outbox's ``UnknownOutcomeError`` and ``SendFailedError``
            with ``ChatParkedError``: an unknown or refused call waits for an operator).
        outage_backoff_max: longest wait, seconds, between takes while the inbox is down.
        outage_log_interval: seconds between "still unavailable" lines during an outage.
        sleep: how the outage backoff waits (tests inject one).
        shutdown_grace: seconds in-flight entries may take to finish when an ``async
            with worker:`` block (or :func:`telegram_idem.ingress.register`'s
            application) ends; then they are cancelled and returned to the inbox.

    Raises:
        ValueError: ``concurrency`` or ``max_attempts`` < 1, ``lease`` ≤ 0,
            ``handler_timeout`` ≤ 0, ``outage_log_interval`` ≤ 0, or ``shutdown_grace`` < 0.
    """

    def __init__(
        self,
        inbox: Inbox,
        dispatch: Dispatch,
        *,
        concurrency: int = 8,
        lease: float = 60.0,
        max_attempts: int = 5,
        backoff_base: float = 1.0,
        backoff_max: float = 300.0,
        poll_interval: float = 0.5,
        handler_timeout: float | None = 900.0,
        permanent_errors: tuple[type[BaseException], ...] = DEFAULT_PERMANENT_ERRORS,
        outage_backoff_max: float = 30.0,
        outage_log_interval: float = 60.0,
        sleep: Sleep = asyncio.sleep,
        shutdown_grace: float = 30.0,
    ) -> None:
        if concurrency < 1 or max_attempts < 1 or lease <= 0:
            raise ValueError("concurrency and max_attempts must be ≥ 1 and lease > 0")
        if handler_timeout is not None and handler_timeout <= 0:
            raise ValueError("handler_timeout must be > 0 seconds (or None for no limit)")
        if shutdown_grace < 0:
            raise ValueError("shutdown_grace must be ≥ 0 seconds")
        if not outage_log_interval > 0:
            raise ValueError("outage_log_interval must be > 0 seconds")
        self.inbox = inbox
        self.dispatch = dispatch
        self.concurrency = concurrency
        self.lease = lease
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.poll_interval = poll_interval
        self.handler_timeout = handler_timeout
        self.permanent_errors = permanent_errors
        self.outage_backoff_max = outage_backoff_max
        self.outage_log_interval = outage_log_interval
        self.sleep = sleep
        self.shutdown_grace = shutdown_grace
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._in_flight: dict[asyncio.Task[Any], InboxEntry] = {}
        self._outage = OutageLog(
            log,
            "inbox",
            every=outage_log_interval,
            noun="failed polls",
            recovered_level=logging.WARNING,
        )
        self.processed = 0
        self.failures = 0

    def notify(self) -> None:
        """Wake idle workers now (ingress calls it after admitting an update)."""
        self._wake.set()

    def backoff(self, attempts: int) -> float:
        """Seconds to wait before attempt ``attempts + 1``.

        Args:
            attempts: the attempts made so far (≥ 1 after a failure).

        Returns:
            ``backoff_base * 2 ** (attempts - 1)`` seconds, at most ``backoff_max``.
        """
        return float(min(self.backoff_base * 2 ** max(attempts - 1, 0), self.backoff_max))

    def outage_backoff(self, failed_polls: int) -> float:
        """Seconds to wait after ``failed_polls`` takes in a row found the inbox down.

        Args:
            failed_polls: takes in a row that found the inbox down (≥ 1).

        Returns:
            ``poll_interval`` doubled per failed take after the first, at most
            ``outage_backoff_max`` seconds.
        """
        exponent = min(max(failed_polls - 1, 0), 32)
        return float(min(self.poll_interval * 2**exponent, self.outage_backoff_max))

    @property
    def inbox_down_since(self) -> float | None:
        """Seconds since the epoch when the current outage began, or ``None``."""
        return self._outage.since

    async def run_once(self) -> bool:
        """Take and process one entry; ``False`` if none was takeable.

        Raises:
            StoreError: the inbox could not answer.
        """
        # A take cancelled mid-flight (shutdown) may still commit in the store: finish it
        # and hand the entry straight back, so it does not wait out a lease.
        taking = asyncio.ensure_future(self.inbox.take(lease=self.lease))
        try:
            entry = await asyncio.shield(taking)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                taken = await taking
                if taken is not None:
                    await self.inbox.retry(taken, delay=0.0, error="worker shut down")
            raise
        if entry is None:
            return False
        taken_at = time.monotonic()
        if entry.attempts > self.max_attempts:
            await self._bury_overtaken(entry)
            return True
        task = asyncio.create_task(self._process(entry, taken_at))
        self._in_flight[task] = entry
        try:
            await asyncio.shield(task)
        finally:
            self._in_flight.pop(task, None)
        return True

    async def _bury_overtaken(self, entry: InboxEntry) -> None:
        error = (
            f"taken {entry.attempts} times without finishing: its lease kept running out "
            "(a handler blocking the event loop longer than the lease, or workers dying "
            f"mid-run); last error: {entry.last_error}"
        )
        log.error("entry %s dead-lettered: %s", entry.id, error)
        self.failures += 1
        await self.inbox.bury(entry, error=error)

    async def _process(self, entry: InboxEntry, taken_at: float) -> None:
        beat = _Beat()
        beating = asyncio.create_task(self._heartbeat(entry, beat))
        scope = asyncio.timeout(self.handler_timeout)
        try:
            async with scope:
                await self.dispatch(decode_payload(entry.payload))
        except Exception as exc:
            held = _in_progress_of(exc)
            if held is not None and not isinstance(exc, self.permanent_errors):
                await self._wait_for_holder(entry, held, taken_at)
                return
            self.failures += 1
            if isinstance(exc, TimeoutError) and scope.expired():
                error = f"HandlerTimeout: the handler ran longer than {self.handler_timeout} s"
                await self._failed(entry, error, permanent=False)
            else:
                error = f"{type(exc).__name__}: {exc}"
                await self._failed(
                    entry,
                    error,
                    permanent=isinstance(exc, self.permanent_errors),
                    retry_after=retry_after_of(exc),
                )
            return
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
            self._check_beat(entry, beat)
        self.processed += 1
        if not await self.inbox.ack(entry):
            log.warning("entry %s finished after its lease was taken over", entry.id)

    async def _wait_for_holder(
        self, entry: InboxEntry, exc: InProgressError, taken_at: float
    ) -> None:
        """Put back an entry whose run met a claim held elsewhere, refunding the take:
        the update is fine, its holder may still finish, or its lease ends."""
        record = exc.record
        if record is None:
            delay = self.backoff(1)
        else:
            # The store's clock now: the entry's lease was taken as now + lease (store
            # clock), plus the time the run took; the worker's clock if the store gave none.
            if entry.lease_expires_at > 0:
                now = entry.lease_expires_at - self.lease + (time.monotonic() - taken_at)
            else:
                now = time.time()
            delay = record.lease_expires_at - now
        delay = min(max(delay, IN_PROGRESS_MIN_DELAY), max(self.backoff_max, IN_PROGRESS_MIN_DELAY))
        error = f"{_WAITING} ({exc.key}): {type(exc).__name__}: {exc}"
        reported = (entry.last_error or "").startswith(_WAITING)
        log.log(
            logging.DEBUG if reported else logging.WARNING,
            "entry %s waits %.1f s for %s, in progress elsewhere (attempt %d, not counted): "
            "its holder may still finish, or its lease ends",
            entry.id,
            delay,
            exc.key,
            entry.attempts,
        )
        await self.inbox.retry(entry, delay=delay, error=error, refund=True)

    async def _failed(
        self, entry: InboxEntry, error: str, *, permanent: bool, retry_after: float | None = None
    ) -> None:
        if permanent:
            log.error("entry %s dead-lettered at once (cannot succeed): %s", entry.id, error)
            await self.inbox.bury(entry, error=error)
        elif retry_after is not None:
            # Telegram's flood control asked the bot to wait: the update is fine, the take
            # is refunded (it never counts toward max_attempts) and no earlier retry is
            # served, so the delay is at least retry_after.
            delay = max(self.backoff(entry.attempts), retry_after)
            log.warning(
                "entry %s hit flood control (attempt %d, not counted), retry in %.1f s: %s",
                entry.id,
                entry.attempts,
                delay,
                error,
            )
            await self.inbox.retry(entry, delay=delay, error=error, refund=True)
        elif entry.attempts >= self.max_attempts:
            log.error(
                "entry %s dead-lettered after %d attempts: %s", entry.id, entry.attempts, error
            )
            await self.inbox.bury(entry, error=error)
        else:
            delay = self.backoff(entry.attempts)
            log.warning(
                "entry %s failed (attempt %d), retry in %.1f s: %s",
                entry.id,
                entry.attempts,
                delay,
                error,
            )
            await self.inbox.retry(entry, delay=delay, error=error)

    def _check_beat(self, entry: InboxEntry, beat: _Beat) -> None:
        """ERROR once per run when the heartbeat could not run for over half a lease."""
        now = time.monotonic()
        gap = now - beat.last
        beat.last = now
        if gap > self.lease / 3 + self.lease / 2 and not beat.reported:
            beat.reported = True
            log.error(
                "heartbeat of entry %s could not run for %.1f s (lease %.1f s): the event "
                "loop was blocked (time.sleep, CPU-bound work?); another worker may have "
                "taken the entry over",
                entry.id,
                gap,
                self.lease,
            )

    async def _heartbeat(self, entry: InboxEntry, beat: _Beat) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            self._check_beat(entry, beat)
            try:
                if not await self.inbox.extend(entry, lease=self.lease):
                    log.error("lease of entry %s lost", entry.id)
                    return
            except StoreError:
                log.warning("heartbeat of entry %s failed", entry.id, exc_info=True)

    def _inbox_down(self, exc: StoreError) -> float:
        """Record a failed poll; log as the module says; the seconds to wait."""
        self._outage.failed(exc)
        return self.outage_backoff(self._outage.failures)

    async def _outage_pause(self, delay: float) -> None:
        """Wait out the outage backoff, or less: :meth:`notify` (an ingress just admitted
        an update, so the store answers again) or a sibling that took an entry ends it."""
        self._wake.clear()
        sleeping = asyncio.ensure_future(self.sleep(delay))
        waking = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeping, waking}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (sleeping, waking):
                waiter.cancel()
            await asyncio.gather(sleeping, waking, return_exceptions=True)

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            # Cleared before looking, not after: a notify() that arrives while this take
            # finds nothing must still wake the wait below (the entry it announces was
            # committed after the take looked).
            self._wake.clear()
            try:
                took = await self.run_once()
            except StoreError as exc:
                await self._outage_pause(self._inbox_down(exc))
                continue
            self._outage.succeeded()
            if not took:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_interval):
                        await self._wake.wait()
            else:
                self._wake.set()  # there may be more: let idle siblings look too

    @property
    def running(self) -> bool:
        """Whether the worker was started and not stopped since."""
        return bool(self._tasks)

    def start(self) -> None:
        """Start ``concurrency`` worker tasks in the running loop (not a coroutine).

        Raises:
            RuntimeError: the worker is running already (one started twice would run
                two pools and stop only the second), or no event loop is running.
        """
        if self._tasks:
            raise RuntimeError(
                "InboxWorker is running already: start it once (async with worker:, or "
                "telegram_idem.ingress.register(..., worker=worker), which starts it)"
            )
        self._stopping.clear()
        self._tasks = [asyncio.create_task(self._loop()) for _ in range(self.concurrency)]

    async def __aenter__(self) -> Self:
        """Start the worker (:meth:`start`); raises ``RuntimeError`` as it does."""
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Stop the worker gracefully: ``stop(grace=shutdown_grace)``."""
        await self.stop(grace=self.shutdown_grace)

    async def stop(self, *, grace: float = 30.0) -> None:
        """Stop taking entries; let in-flight ones finish for ``grace`` seconds, then
        cancel them and return their entries to the inbox (retry without delay).

        A worker that is not running (never started, or stopped already) is left as it
        is: stopping it again does nothing.

        Args:
            grace: seconds in-flight entries may take to finish before they are
                cancelled (``async with`` passes ``shutdown_grace``).
        """
        self._stopping.set()
        self._wake.set()
        if self._in_flight:
            await asyncio.wait(list(self._in_flight), timeout=grace)
        for task, entry in list(self._in_flight.items()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            with contextlib.suppress(StoreError):
                await self.inbox.retry(entry, delay=0.0, error="worker shut down")
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def drain(self, *, limit: float = 60.0) -> None:
        """Process until the inbox has nothing takeable (tests and demos), at most
        ``limit`` seconds.

        Args:
            limit: seconds to process at most.

        Raises:
            TimeoutError: entries remain after ``limit`` seconds.
        """
        async with asyncio.timeout(limit):
            while await self.inbox.depth() > 0 or self._in_flight:
                if not self._tasks and not await self.run_once():
                    await asyncio.sleep(0.01)
                elif self._tasks:
                    await asyncio.sleep(0.01)
