"""The update guard as a python-telegram-bot 22 update processor.

Import it from :mod:`telegram_idem.adapters.ptb`. What it answers follows the shared
admission rule (:mod:`telegram_idem._admission`): only a completed update is dropped as a
duplicate; an update in progress elsewhere is waited for about one lease, so a dead
holder's update is run here by takeover when its lease ends.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable
from typing import Any

from telegram import Update
from telegram.ext import BaseUpdateProcessor

from telegram_idem._admission import DEFAULT_OUTAGE_WAIT, Admission, StorePolicy, StorePolicyLike
from telegram_idem._admitted import Admitted
from telegram_idem._guard import Idem
from telegram_idem._ordering import DEFAULT_ORDERING, Ordering
from telegram_idem._updates import bot_id_from_token
from telegram_idem.adapters._keyed_locks import KeyedLocks
from telegram_idem.adapters._ptb_common import (
    RUN,
    AnyApplication,
    AnyContext,
    Run,
    application_of,
    close_unrun,
    log,
    register_guard,
    update_to_dict,
)
from telegram_idem.errors import ConfigurationError, UpdateInProgressError

__all__ = ["DEFAULT_HANDLER_TIMEOUT", "TAKEOVER_MARGIN", "IdempotentUpdateProcessor"]

DEFAULT_HANDLER_TIMEOUT = 900.0
"""Seconds an update's handlers may run before they are cancelled (15 minutes): generous
for a long job, but a handler that awaits forever no longer freezes its chat."""

TAKEOVER_MARGIN = 2.0
"""Seconds added to the lease for the default ``in_progress_wait``: a dead holder's lease
has ended by then even if it was renewed just before the holder died."""


class _HandlerFailed(Exception):
    """A handler raised (PTB gave the error to the error handlers): release the claim."""


class _HandlerTimedOut(Exception):
    """The handlers ran past ``handler_timeout`` and were cancelled: release the claim."""


class IdempotentUpdateProcessor(BaseUpdateProcessor):
    """A PTB update processor that runs each update at most once per ``(bot_id, update_id)``,
    one update at a time per ordering unit (chat; callback queries in a lane of their own).

    Use with ``ApplicationBuilder().concurrent_updates(IdempotentUpdateProcessor(idem, 8))``.
    For each ``telegram.Update`` (of any type: one this version does not know is
    admitted the same way and reaches PTB untouched) it admits the update guard key
    ``{bot_id}:u:{update_id}`` (bot id: the number before ``:`` in the token) with
    :meth:`Idem.admit`, then, by the outcome (:mod:`telegram_idem._admission`):

    * ``RUN`` (new, or taken over from a holder whose lease ended): runs every handler group
      with the update bound (``@idempotent``, steps and :meth:`Idem.chat_lock` work in
      blocking handlers), then completes the claim; if a handler raised (PTB hands the
      error to the error handlers) the claim is released instead, so a re-delivery runs
      the update again;
    * ``DUPLICATE`` (completed before): the update's coroutine is closed unrun;
    * ``NOT_YET`` (another holder's lease is alive): the processor keeps looking for
      ``in_progress_wait`` seconds, so an update whose holder was killed (a restart that
      re-reads the batch within the lease) runs here once that lease ends. A holder still
      alive after the wait is logged at ERROR and an
      :class:`~telegram_idem.errors.UpdateInProgressError` goes to the error handlers:
      PTB confirms the update regardless, so it is never dropped silently;
    * ``UNAVAILABLE`` / ``UNGUARDED`` (store outage): the ``on_store_error`` policy below.

    Ordering (``ordered=True``, the default): updates with the same ordering key
    (:meth:`telegram_idem._ordering.Ordering.key` of ``ordering``, the rule the inbox
    ingresses use too; by default the chat, split by business connection and forum topic,
    else the user) run one after another in the order PTB queued them, while other keys
    run in parallel, up to ``max_concurrent_updates`` at once. Callback queries have a
    lane of their own (``<unit>:cbq``), so a button tap is processed — and can be
    answered within Telegram's ~15 s ``answerCallbackQuery`` window (Bot API,
    "answerCallbackQuery") — while a long job of its chat runs;
    ``Ordering(callback_lane=False)`` queues taps behind their chat's messages instead.
    An update waiting for its turn does not take one of the ``max_concurrent_updates``
    places, so one busy chat never stalls the others. An ordering rule that raises is
    logged (ERROR) and the update runs as a unit of its own, never dropped.

    Errors are detected through an error handler this processor registers first in
    ``application.error_handlers`` when it first sees the application (or on
    :meth:`attach`); when it is the only error handler it logs the exception as PTB would.
    Handlers with ``block=False`` run after the claim completed and are not covered by the
    release-on-error rule, nor by the ordering.

    ``do_process_update`` never raises (except cancellation): in PTB's sequential mode an
    exception would stop the update fetcher. Problems go to the application's error
    handlers and to the ``telegram_idem.ptb`` logger instead.

    Behind PTB's own webhook server (``run_webhook``) the update was answered ``200``
    before it reached the processor, so a store outage loses it: the processor logs a
    WARNING on its first update there. Use :func:`~telegram_idem.adapters.ptb.ptb_webhook`.
    Under PTB's own polling (``run_polling``) each batch is confirmed by the next
    ``getUpdates`` within milliseconds of its fetch (Bot API, ``getUpdates``), so a crash
    mid-handler loses the updates in flight (their guard records stay in progress until
    the lease ends, and nothing re-reads them): the processor logs a WARNING on its first
    update there. For updates that survive a crash use the durable inbox
    (:class:`~telegram_idem.ingress._polling.PollingIngress` +
    :func:`~telegram_idem.adapters.ptb.ptb_get_updates` +
    :class:`~telegram_idem.inbox._worker.InboxWorker`).

    A run longer than ``handler_timeout`` seconds is cancelled (its handlers get a
    ``CancelledError`` at their current ``await``), its claim released (so a re-delivery
    or a takeover may run the update again), an ERROR logged and a ``TimeoutError`` given
    to the error handlers; the next update of its ordering unit then runs.

    Args:
        idem: the guard (the caller owns it: :meth:`shutdown` does not close it).
        max_concurrent_updates: updates processed at once (≥ 1; ``ValueError`` otherwise).
        on_store_error: a :class:`~telegram_idem._admission.StorePolicy` (or its string
            value). ``"fail_closed"`` (default): the update keeps trying its claim
            for ``outage_wait`` seconds, then is not processed, an ERROR is logged and the
            :class:`StoreError` is given to the error handlers.
            With PTB's own polling or webhook server the update is acknowledged to
            Telegram regardless, so it is lost (``ptb_webhook`` answers 503 instead).
            ``"fail_open"``: processed unguarded, ERROR logged.
        bot_id: the bot's id, if updates may arrive without a bot attached (default: from
            the token of ``update.get_bot()`` or of the application's bot).
        ordered: serialise the updates of one ordering unit (see above); ``False``: no
            serialisation at all, any order.
        ordering: the ordering rule (default
            :data:`~telegram_idem._ordering.DEFAULT_ORDERING`); only with ``ordered=True``.
        in_progress_wait: seconds to keep looking at an update in progress elsewhere
            (default: ``idem.lease`` + :data:`TAKEOVER_MARGIN`); ``0`` reports it at once.
        outage_wait: with ``"fail_closed"``, seconds an update keeps trying its claim
            through a store outage before the ``StoreError`` is reported (default
            :data:`~telegram_idem._admission.DEFAULT_OUTAGE_WAIT`, 300 s): an update that
            reached the processor was already acknowledged to Telegram (polling, PTB's
            webhook server), so this process holds its only copy; the ERROR logged when it
            gives up says the update is LOST.
        handler_timeout: seconds one update's handlers may run (default
            :data:`DEFAULT_HANDLER_TIMEOUT`, 900 s); ``None``: no timeout (a handler that
            never returns then holds its ordering unit, and ``application.stop()``, for
            good). Does not cover ``block=False`` handlers.

    Raises:
        ValueError: ``max_concurrent_updates`` < 1, ``in_progress_wait`` or
            ``outage_wait`` < 0, or ``handler_timeout`` not > 0 (and not ``None``).
        ConfigurationError: ``ordering`` given together with ``ordered=False``, or an
            unknown ``on_store_error``.
    """

    __slots__ = (
        "_attached",
        "_busy",
        "_checked",
        "_handed_over",
        "_limit",
        "_order",
        "_places",
        "bot_id",
        "handler_timeout",
        "idem",
        "in_progress_wait",
        "on_store_error",
        "ordered",
        "ordering",
        "outage_wait",
    )

    def __init__(
        self,
        idem: Idem,
        max_concurrent_updates: int = 1,
        *,
        on_store_error: StorePolicyLike = StorePolicy.FAIL_CLOSED,
        bot_id: int | None = None,
        ordered: bool = True,
        ordering: Ordering | None = None,
        in_progress_wait: float | None = None,
        outage_wait: float | None = None,
        handler_timeout: float | None = DEFAULT_HANDLER_TIMEOUT,
    ) -> None:
        self._limit = max_concurrent_updates
        super().__init__(max_concurrent_updates)
        wait = idem.lease + TAKEOVER_MARGIN if in_progress_wait is None else in_progress_wait
        if wait < 0:
            raise ValueError("in_progress_wait must be >= 0 seconds")
        outage = DEFAULT_OUTAGE_WAIT if outage_wait is None else outage_wait
        if outage < 0:
            raise ValueError("outage_wait must be >= 0 seconds")
        if handler_timeout is not None and not handler_timeout > 0:
            raise ValueError("handler_timeout must be > 0 seconds, or None for no timeout")
        if ordering is not None and not ordered:
            raise ConfigurationError(
                "ordering= was given with ordered=False, which turns ordering off: drop one"
            )
        self.idem = idem
        self.on_store_error = StorePolicy.of(on_store_error)
        self.bot_id = bot_id
        self.ordered = ordered
        self.ordering: Ordering | None = (ordering or DEFAULT_ORDERING) if ordered else None
        self.in_progress_wait = wait
        self.outage_wait = outage if self.on_store_error is StorePolicy.FAIL_CLOSED else 0.0
        self.handler_timeout = handler_timeout
        self._places = asyncio.Semaphore(max_concurrent_updates)
        self._busy = 0
        self._order = KeyedLocks()
        self._handed_over: dict[tuple[int, int], Admitted] = {}
        self._attached: weakref.WeakSet[AnyApplication] = weakref.WeakSet()
        self._checked: weakref.WeakSet[AnyApplication] = weakref.WeakSet()

    @property
    def max_concurrent_updates(self) -> int:
        """Updates processed at once at most."""
        return self._limit

    @property
    def current_concurrent_updates(self) -> int:
        """Updates being processed now (a snapshot; updates waiting for their chat are not
        counted)."""
        return self._busy

    async def initialize(self) -> None:
        """Nothing to allocate (the :class:`Idem` is the caller's)."""

    async def shutdown(self) -> None:
        """Nothing to free (close the :class:`Idem` yourself after ``application.shutdown``)."""

    def attach(self, application: AnyApplication) -> None:
        """Register this guard for ``application`` (for ``idem_of`` and the PTB
        ``idempotent``) and put the failure-detecting error handler first. Done
        automatically on the first update; call it yourself (e.g. in ``post_init``) to
        use ``idem_of`` before any update arrives. Idempotent.

        Args:
            application: the PTB ``Application`` this processor serves.
        """
        if application in self._attached:
            return
        register_guard(application, self.idem)
        others = dict(application.error_handlers)
        others.pop(self._on_error, None)
        application.error_handlers.clear()
        application.error_handlers[self._on_error] = True
        application.error_handlers.update(others)
        self._attached.add(application)

    def hand_over(self, admitted: Admitted) -> None:
        """Give the processor an update admitted before it was queued (a webhook that
        admitted it before answering): that update then runs under this admission
        instead of being admitted again.

        Args:
            admitted: the admission (:meth:`telegram_idem.Idem.admit`).
        """
        self._handed_over[(admitted.bot_id, admitted.update_id)] = admitted

    async def _on_error(self, update: object, context: AnyContext) -> None:
        run = RUN.get()
        if run is not None and not run.finished:
            run.error = context.error
        if self._alone(context.application):
            # PTB logs "No error handlers are registered" only when there are none at all.
            log.error("update %r raised in a handler", update, exc_info=context.error)

    def _alone(self, application: AnyApplication) -> bool:
        handlers: dict[Any, Any] = application.error_handlers
        return len(handlers) == 1 and self._on_error in handlers

    def _check_ingress(self, application: AnyApplication) -> None:
        if application in self._checked:
            return
        self._checked.add(application)
        updater = application.updater
        # PTB keeps its running webhook server (Tornado) on the updater.
        if updater is not None and getattr(updater, "_httpd", None) is not None:
            log.warning(
                "IdempotentUpdateProcessor runs behind PTB's own webhook server "
                "(run_webhook / start_webhook), which answers Telegram 200 before the "
                "update is claimed: a store outage or a failed update is then lost. Serve "
                "telegram_idem.adapters.ptb.ptb_webhook instead (see docs/deploy-ptb.md)."
            )
        elif updater is not None and updater.running:
            log.warning(
                "IdempotentUpdateProcessor runs under PTB's own polling (run_polling / "
                "start_polling), which confirms each batch to Telegram with its next "
                "getUpdates within milliseconds: if the process dies mid-handler, the "
                "updates in flight are lost (no re-read), and a store outage longer than "
                "outage_wait loses the update too. For updates that survive a crash, use "
                "PollingIngress + ptb_get_updates + InboxWorker (see docs/deploy-ptb.md)."
            )

    def _bot_id(self, update: Update, application: AnyApplication | None) -> int:
        if self.bot_id is not None:
            return self.bot_id
        try:
            return bot_id_from_token(update.get_bot().token)
        except RuntimeError:
            if application is None:
                raise ConfigurationError(
                    "this update has no bot attached: pass bot_id= to the processor"
                ) from None
            return bot_id_from_token(application.bot.token)

    async def _report(
        self, application: AnyApplication | None, update: object, error: Exception
    ) -> None:
        if application is None or self._alone(application):
            return  # logged by the caller; nobody else to tell
        await application.process_error(update=update, error=error)

    # PTB marks ``process_update`` final; it is overridden to take the chat's turn *before*
    # a place among ``max_concurrent_updates``, so updates waiting behind their chat never
    # hold a place another chat could use. It does what PTB's does: limit, then
    # ``do_process_update``.
    async def process_update(  # type: ignore[misc]
        self, update: object, coroutine: Awaitable[Any]
    ) -> None:
        """Wait for the update's chat (``ordered``) and for a free place, then
        :meth:`do_process_update` (called by PTB).

        Args:
            update: the update PTB dequeued.
            coroutine: PTB's processing of it.
        """
        raw = update_to_dict(update) if isinstance(update, Update) else None
        key = self._ordering_key(raw)
        async with self._order.hold(key), self._places:
            self._busy += 1
            try:
                await self._process(update, raw, coroutine)
            finally:
                self._busy -= 1

    def _ordering_key(self, raw: dict[str, Any] | None) -> str | None:
        if raw is None or self.ordering is None:
            return None
        try:
            return self.ordering.key(raw)
        except Exception:
            log.exception(
                "ordering rule failed for update %s; it runs as a unit of its own",
                raw.get("update_id"),
            )
            return None

    async def do_process_update(self, update: object, coroutine: Awaitable[Any]) -> None:
        """Process one update under the update guard (see the class doc).

        Args:
            update: what PTB took from its update queue (``telegram.Update`` or anything
                else: non-updates pass through).
            coroutine: PTB's ``Application.process_update(update)``, not yet started; closed
                unrun for a duplicate, an update still in progress elsewhere, or a
                fail-closed outage.
        """
        raw = update_to_dict(update) if isinstance(update, Update) else None
        await self._process(update, raw, coroutine)

    async def _process(
        self, update: object, raw: dict[str, Any] | None, coroutine: Awaitable[Any]
    ) -> None:
        application = application_of(coroutine)
        if application is not None:
            self.attach(application)
            self._check_ingress(application)
        if not isinstance(update, Update) or raw is None:
            await coroutine
            return
        try:
            bot_id = self._bot_id(update, application)
            admitted = self._handed_over.pop((bot_id, update.update_id), None)
            if admitted is None:
                admitted = await self.idem.admit(
                    raw,
                    bot_id=bot_id,
                    wait=self.in_progress_wait,
                    outage_wait=self.outage_wait,
                    store_policy=self.on_store_error,
                )
        except Exception as exc:
            close_unrun(coroutine)
            log.error("update %s not processed", update.update_id, exc_info=exc)
            await self._report(application, update, exc)
            return
        if admitted.outcome is Admission.DUPLICATE:
            close_unrun(coroutine)  # completed before: its handlers never run again
            return
        if admitted.outcome is Admission.UNAVAILABLE:
            close_unrun(coroutine)  # fail-closed: logged by the admission (LOST)
            assert admitted.error is not None
            await self._report(application, update, admitted.error)
            return
        await self._run(update, coroutine, admitted, application)

    async def _run(
        self,
        update: Update,
        coroutine: Awaitable[Any],
        admitted: Admitted,
        application: AnyApplication | None,
    ) -> None:
        run = Run()

        async def call() -> None:
            limit = asyncio.timeout(self.handler_timeout)
            try:
                async with limit:
                    await coroutine
            except TimeoutError as exc:
                if limit.expired():  # ours, not a TimeoutError raised inside PTB
                    raise _HandlerTimedOut() from exc
                raise
            run.ran = True
            if run.error is not None:
                raise _HandlerFailed(repr(run.error)) from run.error

        reset = RUN.set(run)
        try:
            await admitted.run(call)
        except _HandlerFailed:
            log.info(
                "update %s: a handler raised; claim released so a re-delivery runs it again",
                update.update_id,
            )
        except _HandlerTimedOut:
            log.error(
                "update %s: its handlers ran longer than handler_timeout=%s s and were "
                "cancelled; claim released (a re-delivery or a takeover may run it again), "
                "its chat moves on",
                update.update_id,
                self.handler_timeout,
            )
            await self._report(
                application,
                update,
                TimeoutError(
                    f"update {update.update_id}: handlers cancelled after "
                    f"handler_timeout={self.handler_timeout} s"
                ),
            )
        except UpdateInProgressError as exc:
            close_unrun(coroutine)
            log.error(
                "update %s is still in progress elsewhere after waiting %s s: NOT processed "
                "here. PTB confirms it to Telegram regardless, so only its live holder can "
                "finish it (a second poller or replica?)",
                update.update_id,
                self.in_progress_wait,
            )
            await self._report(application, update, exc)
        except Exception as exc:
            log.error("update %s failed outside its handlers", update.update_id, exc_info=exc)
            await self._report(application, update, exc)
        finally:
            run.finished = True
            RUN.reset(reset)
