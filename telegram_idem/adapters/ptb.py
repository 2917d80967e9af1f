"""python-telegram-bot 22 adapter: the update guard as an update processor (recommended)
or as a group ``-1`` handler, and ``@idempotent`` for PTB callbacks.

**The processor** wraps each update's whole processing (every handler group)::

    idem = Idem("sqlite:///bot.db")
    app = (
        ApplicationBuilder()
        .token(TOKEN)
        .concurrent_updates(IdempotentUpdateProcessor(idem, 8))
        .build()
    )
    app.add_handler(CommandHandler("techpost", techpost))
    app.run_polling()          # or app.run_webhook(listen=..., port=..., secret_token=...)

A duplicate update (same ``(bot_id, update_id)``) never reaches a handler; a handler that
raises releases the claim, so a re-delivery of the update runs again; the update is bound
for the action guard while its handlers run.

**The group -1 handler**, for applications that keep PTB's default processor::

    install_update_guard(app, idem)

claims the update in handler group ``-1`` and raises ``ApplicationHandlerStop`` for a
duplicate. PTB has no hook that runs after the last handler group, so this guard
*completes the claim at once*: the update counts as seen before its handlers run. A
handler that fails, or a process that dies mid-update, then loses any re-delivery of that
update (it is a duplicate); the action guard still protects what the handlers do. Prefer
the processor when a failed update must be retried.

**The action guard** on a PTB callback ``(update, context)``::

    @idempotent(key="approve:{callback_query.message.message_id}:{callback_query.from.id}")
    async def approve(update: Update, context: ContextTypes.DEFAULT_TYPE) -> str: ...

Templates are rooted at the Bot API JSON of the update (``from``, not ``from_user``), the
same templates as with aiogram.

Both ``run_polling`` and ``run_webhook`` feed updates through the application's update
queue, so the processor and the handler work with either, unchanged. Note that PTB's
built-in webhook server answers Telegram ``200`` as soon as the update is queued: a store
outage or a failed handler cannot make Telegram re-send (Bot API, ``setWebhook``: only a
non-2xx answer or a timeout does). For "answer only once claimed" use a webhook that claims
before answering (see :mod:`telegram_idem.adapters.aws_lambda` or the aiogram
``FastAckWebhook``).

Updates of a type this version does not know (PTB keeps unknown fields in
``Update.api_kwargs``; Bot API, "Update": new types appear over time) and objects that are
not a ``telegram.Update`` (custom ``update_queue`` items) are passed to PTB untouched and
unguarded.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

from telegram import Update
from telegram.ext import (
    Application,
    ApplicationHandlerStop,
    BaseUpdateProcessor,
    CallbackContext,
    TypeHandler,
)

from telegram_idem.context import UpdateContext, bind_update, current_update
from telegram_idem.decorator import FingerprintSource
from telegram_idem.decorator import idempotent as _idempotent
from telegram_idem.errors import ConfigurationError, StoreError
from telegram_idem.guard import ErrorPolicy, Idem, InProgressPolicy
from telegram_idem.keys import KeySource
from telegram_idem.records import Claim, Outcome
from telegram_idem.updates import KNOWN_UPDATE_TYPES, bot_id_from_token

__all__ = [
    "IDEM_KEY",
    "IdempotentUpdateProcessor",
    "StorePolicy",
    "idem_of",
    "idempotent",
    "inbox_dispatch",
    "install_update_guard",
    "update_to_dict",
]

log = logging.getLogger("telegram_idem.ptb")

StorePolicy = Literal["fail_closed", "fail_open"]
"""What to do when the store cannot answer a claim (:class:`StoreError`)."""

IDEM_KEY = "idem"
"""``context.bot_data`` key that :func:`idem_of` also reads (an :class:`Idem` you put
there yourself). The adapter does not write ``bot_data``: PTB persistence would try to
pickle or JSON-encode the guard."""

AnyApplication = Application[Any, Any, Any, Any, Any, Any]
AnyContext = CallbackContext[Any, Any, Any, Any]

P = ParamSpec("P")
T = TypeVar("T")
C = TypeVar("C", bound=AnyContext)

# Applications the processor or the installer attached to, and their guard.
_GUARDS: weakref.WeakKeyDictionary[AnyApplication, Idem] = weakref.WeakKeyDictionary()

# Message fields that are ``True`` or absent in the Bot API but that PTB serialises as
# ``false`` when absent (Bot API, "Message": "Optional. Service message: ...").
_PTB_FALSE_DEFAULTS = frozenset(
    {"delete_chat_photo", "group_chat_created", "supergroup_chat_created", "channel_chat_created"}
)


def update_to_dict(update: Update) -> dict[str, Any]:
    """The update as Bot API JSON: ``from`` (not ``from_user``), dates as Unix seconds,
    unknown fields (``api_kwargs``) included, and PTB's ``false`` defaults for the
    ``*_chat_created`` / ``delete_chat_photo`` service flags left out, as Telegram sends it.

    For the shipped fixtures the result equals the received JSON.
    """
    data: dict[str, Any] = _strip_false_defaults(update.to_dict())
    return data


def _strip_false_defaults(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _strip_false_defaults(v)
            for k, v in value.items()
            if not (k in _PTB_FALSE_DEFAULTS and v is False)
        }
    if isinstance(value, list):
        return [_strip_false_defaults(v) for v in value]
    return value


def _is_known(update: Mapping[str, Any]) -> bool:
    return any(kind in update for kind in KNOWN_UPDATE_TYPES)


def idem_of(context: AnyContext) -> Idem:
    """The :class:`Idem` guarding ``context.application``.

    Found where :class:`IdempotentUpdateProcessor` (after its first update, or
    :meth:`~IdempotentUpdateProcessor.attach`) or :func:`install_update_guard` registered
    it, else ``context.bot_data["idem"]`` if you put one there.

    Raises:
        ConfigurationError: neither.
    """
    found = _GUARDS.get(context.application)
    if found is not None:
        return found
    data = context.bot_data
    if isinstance(data, Mapping) and isinstance(data.get(IDEM_KEY), Idem):
        guard: Idem = data[IDEM_KEY]
        return guard
    raise ConfigurationError(
        "no Idem for this application: build it with "
        "ApplicationBuilder().concurrent_updates(IdempotentUpdateProcessor(idem, n)), call "
        "install_update_guard(application, idem), or set context.bot_data['idem']"
    )


# ------------------------------------------------------------------ the processor


class _Run:
    """One guarded update's processing, seen by the error handler through a context var."""

    __slots__ = ("error", "finished", "ran")

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.ran = False
        self.finished = False


_RUN: ContextVar[_Run | None] = ContextVar("telegram_idem_ptb_run", default=None)


class _HandlerFailed(Exception):
    """A handler raised (PTB gave the error to the error handlers): release the claim."""


def _close(coroutine: Awaitable[Any]) -> None:
    close = getattr(coroutine, "close", None)
    if callable(close):
        close()


def _application_of(coroutine: Awaitable[Any]) -> AnyApplication | None:
    """The application whose ``process_update(update)`` coroutine this is (PTB passes
    exactly that to ``BaseUpdateProcessor.process_update``), read from the unstarted
    coroutine's arguments."""
    if not inspect.iscoroutine(coroutine):
        return None
    owner = inspect.getcoroutinelocals(coroutine).get("self")
    return owner if isinstance(owner, Application) else None


class IdempotentUpdateProcessor(BaseUpdateProcessor):
    """A PTB update processor that runs each update at most once per ``(bot_id, update_id)``.

    Use with ``ApplicationBuilder().concurrent_updates(IdempotentUpdateProcessor(idem, 8))``.
    For each ``telegram.Update`` of a known type it claims the update guard key
    ``{bot_id}:u:{update_id}`` (bot id: the number before ``:`` in the token), then:

    * acquired: runs every handler group with the update bound (``@idempotent``, steps and
      :meth:`Idem.chat_lock` work in blocking handlers), then completes the claim; if a
      handler raised (PTB hands the error to the error handlers) the claim is released
      instead, so a re-delivery runs the update again;
    * duplicate (in progress elsewhere, or done): the update's coroutine is closed unrun;
    * store outage: the ``on_store_error`` policy below.

    Errors are detected through an error handler this processor registers first in
    ``application.error_handlers`` when it first sees the application (or on
    :meth:`attach`); when it is the only error handler it logs the exception as PTB would.
    Handlers with ``block=False`` run after the claim completed and are not covered by the
    release-on-error rule.

    ``do_process_update`` never raises (except cancellation): in PTB's sequential mode an
    exception would stop the update fetcher. Problems go to the application's error
    handlers and to the ``telegram_idem.ptb`` logger instead.

    Args:
        idem: the guard (the caller owns it: :meth:`shutdown` does not close it).
        max_concurrent_updates: updates processed at once (≥ 1; ``ValueError`` otherwise).
        on_store_error: ``"fail_closed"`` (default): the update is not processed, an
            ERROR is logged and the :class:`StoreError` is given to the error handlers.
            PTB acknowledges the update to Telegram regardless (its webhook answered
            ``200``; polling confirms it with the next ``getUpdates`` offset), so it is
            lost. ``"fail_open"``: processed unguarded, ERROR logged.
        bot_id: the bot's id, if updates may arrive without a bot attached (default: from
            the token of ``update.get_bot()`` or of the application's bot).
    """

    __slots__ = ("_attached", "bot_id", "idem", "on_store_error")

    def __init__(
        self,
        idem: Idem,
        max_concurrent_updates: int = 1,
        *,
        on_store_error: StorePolicy = "fail_closed",
        bot_id: int | None = None,
    ) -> None:
        super().__init__(max_concurrent_updates)
        self.idem = idem
        self.on_store_error: StorePolicy = on_store_error
        self.bot_id = bot_id
        self._attached: weakref.WeakSet[AnyApplication] = weakref.WeakSet()

    async def initialize(self) -> None:
        """Nothing to allocate (the :class:`Idem` is the caller's)."""

    async def shutdown(self) -> None:
        """Nothing to free (close the :class:`Idem` yourself after ``application.shutdown``)."""

    def attach(self, application: AnyApplication) -> None:
        """Register this guard for ``application`` (for :func:`idem_of` and
        :func:`idempotent`) and put the failure-detecting error handler first. Done
        automatically on the first update; call it yourself (e.g. in ``post_init``) to
        use :func:`idem_of` before any update arrives. Idempotent."""
        if application in self._attached:
            return
        _GUARDS[application] = self.idem
        others = dict(application.error_handlers)
        others.pop(self._on_error, None)
        application.error_handlers.clear()
        application.error_handlers[self._on_error] = True
        application.error_handlers.update(others)
        self._attached.add(application)

    async def _on_error(self, update: object, context: AnyContext) -> None:
        run = _RUN.get()
        if run is not None and not run.finished:
            run.error = context.error
        if self._alone(context.application):
            # PTB logs "No error handlers are registered" only when there are none at all.
            log.error("update %r raised in a handler", update, exc_info=context.error)

    def _alone(self, application: AnyApplication) -> bool:
        handlers: dict[Any, Any] = application.error_handlers
        return len(handlers) == 1 and self._on_error in handlers

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

    async def do_process_update(self, update: object, coroutine: Awaitable[Any]) -> None:
        """Process one update under the update guard (called by PTB; see the class doc).

        Args:
            update: what PTB took from its update queue (``telegram.Update`` or anything
                else: non-updates pass through).
            coroutine: PTB's ``Application.process_update(update)``, not yet started; closed
                unrun for a duplicate or a fail-closed outage.
        """
        application = _application_of(coroutine)
        if application is not None:
            self.attach(application)
        if not isinstance(update, Update):
            await coroutine
            return
        raw = update_to_dict(update)
        if not _is_known(raw):
            await coroutine
            return
        try:
            bot_id = self._bot_id(update, application)
            claim = await self.idem.claim_update(raw, bot_id=bot_id)
        except StoreError as exc:
            if self.on_store_error == "fail_open":
                log.error(
                    "store outage: update %s processed unguarded (fail_open)", update.update_id
                )
                await coroutine
                return
            _close(coroutine)
            log.error(
                "store outage: update %s not processed (fail_closed): %s", update.update_id, exc
            )
            await self._report(application, update, exc)
            return
        except Exception as exc:
            _close(coroutine)
            log.error("update %s not processed", update.update_id, exc_info=exc)
            await self._report(application, update, exc)
            return
        if claim.outcome is not Outcome.ACQUIRED:
            _close(coroutine)  # a duplicate: its handlers never run
            return
        await self._run_claimed(update, raw, coroutine, bot_id, claim, application)

    async def _run_claimed(
        self,
        update: Update,
        raw: dict[str, Any],
        coroutine: Awaitable[Any],
        bot_id: int,
        claim: Claim,
        application: AnyApplication | None,
    ) -> None:
        run = _Run()

        async def call() -> None:
            await coroutine
            run.ran = True
            if run.error is not None:
                raise _HandlerFailed(repr(run.error)) from run.error

        reset = _RUN.set(run)
        try:
            await self.idem.process_update(raw, call, bot_id=bot_id, claim=claim)
        except _HandlerFailed:
            log.info(
                "update %s: a handler raised; claim released so a re-delivery runs it again",
                update.update_id,
            )
        except Exception as exc:
            if run.ran:
                log.error(
                    "update %s was processed but its completion was not stored (%s); a "
                    "re-delivery after the lease (%s s) would run it again",
                    update.update_id,
                    exc,
                    self.idem.lease,
                )
            else:
                log.error("update %s failed outside its handlers", update.update_id, exc_info=exc)
            await self._report(application, update, exc)
        finally:
            run.finished = True
            _RUN.reset(reset)


# ------------------------------------------------------------- the group -1 handler


def install_update_guard(
    application: AnyApplication,
    idem: Idem,
    *,
    group: int = -1,
    on_store_error: StorePolicy = "fail_closed",
) -> TypeHandler[Update, Any, None]:
    """Add the update guard as a ``TypeHandler(Update)`` in ``group`` (default ``-1``, before
    your handlers), for applications keeping PTB's default update processor.

    A duplicate update raises ``ApplicationHandlerStop``: no later group sees it. A new
    update's claim is **completed immediately** (PTB offers no hook after the last
    group), so its handlers run after the update is recorded as seen: a handler failure or
    a crash loses re-deliveries of that update. Use :class:`IdempotentUpdateProcessor` if
    it must be retried. ``@idempotent`` from this module works in the later groups (it binds
    the update itself; context vars set in one callback do not reliably reach the next).

    Args:
        application: the PTB application (before ``run_polling`` / ``run_webhook``).
        idem: the guard; registered for :func:`idem_of` / :func:`idempotent`.
        group: the handler group; must be lower than every group with your handlers.
        on_store_error: ``"fail_closed"`` (default): an ERROR is logged, the
            :class:`StoreError` goes to the error handlers, and ``ApplicationHandlerStop``
            stops the update (raising would let PTB go on to the next group unguarded).
            ``"fail_open"``: ERROR logged, the update is processed unguarded.

    Returns:
        The handler (pass it to ``application.remove_handler(handler, group)`` to undo).
    """
    _GUARDS[application] = idem

    async def guard_update(update: Update, context: AnyContext) -> None:
        if _RUN.get() is not None:
            return  # IdempotentUpdateProcessor already holds this update's claim
        raw = update_to_dict(update)
        if not _is_known(raw):
            return
        bot_id = bot_id_from_token(context.bot.token)
        try:
            claim = await idem.claim_update(raw, bot_id=bot_id)
        except StoreError as exc:
            if on_store_error == "fail_open":
                log.error(
                    "store outage: update %s processed unguarded (fail_open)", update.update_id
                )
                return
            log.error(
                "store outage: update %s not processed (fail_closed): %s", update.update_id, exc
            )
            await context.application.process_error(update=update, error=exc)
            raise ApplicationHandlerStop from exc
        if claim.outcome is not Outcome.ACQUIRED:
            raise ApplicationHandlerStop
        try:
            await idem.process_update(raw, _nothing, bot_id=bot_id, claim=claim)
        except StoreError as exc:
            # The claim stays in progress until its lease ends: duplicates meanwhile are
            # still dropped, so go on processing.
            log.warning(
                "update %s: could not mark it completed (%s); it stays claimed for %s s",
                update.update_id,
                exc,
                idem.lease,
            )

    handler: TypeHandler[Update, Any, None] = TypeHandler(Update, guard_update, block=True)
    application.add_handler(handler, group=group)
    return handler


async def _nothing() -> None:
    return None


# ----------------------------------------------------------------- the action guard


@contextlib.contextmanager
def _bound(update: object, context: AnyContext) -> Iterator[UpdateContext]:
    if not isinstance(update, Update):
        raise ConfigurationError(
            f"@idempotent (PTB) needs a telegram.Update as first argument, got {update!r}"
        )
    bot_id = bot_id_from_token(context.bot.token)
    bound: UpdateContext | None = None
    with contextlib.suppress(ConfigurationError):
        bound = current_update()
    if (
        bound is not None
        and bound.bot_id == bot_id
        and bound.update.get("update_id") == update.update_id
    ):
        yield bound  # bound by IdempotentUpdateProcessor for this very update
        return
    with bind_update(update_to_dict(update), bot_id=bot_id, idem=idem_of(context)) as ctx:
        yield ctx


def idempotent(
    *,
    key: KeySource,
    fingerprint_fields: FingerprintSource | None = None,
    in_progress: InProgressPolicy = "raise",
    on_error: ErrorPolicy = "release",
    lease: float | None = None,
    retention: float | None = None,
    wait_timeout: float | None = None,
) -> Callable[
    [Callable[Concatenate[Update, C, P], Awaitable[T]]],
    Callable[Concatenate[Update, C, P], Coroutine[Any, Any, T]],
]:
    """:func:`telegram_idem.idempotent` for PTB callbacks ``(update, context, ...)``.

    Binds the callback's ``update`` (as :func:`update_to_dict`) with the :class:`Idem` of
    :func:`idem_of` for the call, so the key template is rendered against the update
    whichever way the guard was installed (processor, group ``-1`` handler, or neither
    if ``context.bot_data["idem"]`` is set). Parameters are those of
    :func:`telegram_idem.idempotent`; the result (e.g. a ``ConversationHandler`` state)
    is stored and replayed, so it must be storable by the codec (JSON by default).

    Raises (at call time):
        ConfigurationError: the first argument is not a ``telegram.Update``, or no
            :class:`Idem` is registered for the application.
        KeyTemplateError, ConflictError, InProgressError, StoredFailureError,
            LostClaimError, StoreError: as :func:`telegram_idem.idempotent`.

    Raises (at decoration):
        TypeError: the callback is not an ``async def``.
    """
    guard = _idempotent(
        key=key,
        fingerprint_fields=fingerprint_fields,
        in_progress=in_progress,
        on_error=on_error,
        lease=lease,
        retention=retention,
        wait_timeout=wait_timeout,
    )

    def decorate(
        fn: Callable[Concatenate[Update, C, P], Awaitable[T]],
    ) -> Callable[Concatenate[Update, C, P], Coroutine[Any, Any, T]]:
        guarded = guard(fn)

        @functools.wraps(fn)
        async def wrapper(update: Update, context: C, /, *args: P.args, **kwargs: P.kwargs) -> T:
            with _bound(update, context):
                return await guarded(update, context, *args, **kwargs)

        return wrapper

    return decorate


# ------------------------------------------------------------------ the inbox


def inbox_dispatch(
    application: AnyApplication, idem: Idem, *, bot_id: int | None = None
) -> Callable[[dict[str, Any]], Awaitable[None]]:
    """The :class:`~telegram_idem.inbox.worker.InboxWorker` dispatch for PTB.

    Feeds each admitted update to ``application.process_update`` with the update bound
    (so ``@idempotent`` works) and raises when a handler raised — PTB hands handler
    errors to its error handlers instead of raising, so a first error handler records
    them — so the worker retries or dead-letters the entry. Call after
    ``await application.initialize()``.

    Args:
        application: the PTB application.
        idem: the guard whose store holds the inbox.
        bot_id: the bot's id (default: from ``application.bot.token``).

    Raises (from the returned coroutine function):
        Exception: the handler's exception, re-raised after PTB's error handlers ran.
    """
    _GUARDS[application] = idem
    bot = bot_id if bot_id is not None else bot_id_from_token(application.bot.token)

    async def record_error(update: object, context: AnyContext) -> None:
        run = _RUN.get()
        if run is not None and not run.finished:
            run.error = context.error

    others = dict(application.error_handlers)
    application.error_handlers.clear()
    application.error_handlers[record_error] = True
    application.error_handlers.update(others)

    async def dispatch(update: dict[str, Any]) -> None:
        run = _Run()
        reset = _RUN.set(run)
        try:
            with bind_update(update, bot_id=bot, idem=idem):
                await application.process_update(Update.de_json(update, application.bot))
        finally:
            run.finished = True
            _RUN.reset(reset)
        if run.error is not None:
            raise run.error

    return dispatch
