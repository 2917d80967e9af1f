"""python-telegram-bot 22 adapter: the update guard as an update processor, a webhook that
claims before it answers, ``@idempotent`` for PTB callbacks, and the inbox hooks.

**The processor** wraps each update's whole processing (every handler group)::

    idem = Idem("sqlite:///bot.db")
    app = (
        ApplicationBuilder()
        .token(TOKEN)
        .concurrent_updates(IdempotentUpdateProcessor(idem, 8))
        .build()
    )
    app.add_handler(CommandHandler("techpost", techpost))
    app.run_polling()

A completed update (same ``(bot_id, update_id)``) never reaches a handler again; a handler
that raises releases the claim, so a re-delivery runs the update again; an update in
progress elsewhere is waited for about one lease and taken over if its holder died
(:mod:`telegram_idem._admission`); updates of one chat run one at a time, in order, by the
ordering rule every ingress shape shares (:mod:`telegram_idem._ordering`: callback queries
in a lane of their own, so a tap is answered while a long job of its chat runs).

PTB's own polling (``run_polling``) confirms a batch with its next ``getUpdates`` at
once, so a crash mid-handler loses the updates in flight; the durable shape is the inbox
below. A run past ``handler_timeout`` (default 900 s) is cancelled and its claim released,
so a hung handler never freezes its chat.

**The webhook**: PTB's own ``run_webhook`` answers ``200`` before anything is claimed, so
a store outage loses the update. Serve :func:`ptb_webhook` (aiohttp) instead, which
answers 503 until the update is claimed::

    web.run_app(ptb_webhook_app(app, idem, secret_token=SECRET), port=8443)

**The action guard** on a PTB callback ``(update, context)``::

    @idempotent(key="approve:{callback_query.message.message_id}:{callback_query.from.id}")
    async def approve(update: Update, context: ContextTypes.DEFAULT_TYPE) -> str: ...

Templates are rooted at the Bot API JSON of the update (``from``, not ``from_user``), the
same templates as with aiogram.

**The inbox**: :func:`ptb_get_updates` feeds
:class:`~telegram_idem.ingress._polling.PollingIngress`, :func:`inbox_dispatch` runs the
admitted updates through the application for an
:class:`~telegram_idem.inbox._worker.InboxWorker`.

The group ``-1`` handler of earlier versions (``install_update_guard``) is gone: PTB runs
nothing after the last handler group, so it had to record an update as done before its
handlers ran, and a failed update was never retried. Calling it raises a
:class:`~telegram_idem.errors.ConfigurationError` that names the processor.

Updates of a type this version does not know (PTB keeps unknown fields in
``Update.api_kwargs``; Bot API, "Update": new types appear over time) are admitted like any
other and passed to PTB untouched; objects that are not a ``telegram.Update`` (custom
``update_queue`` items) are passed to PTB unguarded.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, Concatenate, NoReturn, ParamSpec, TypeVar

from telegram import Bot, Update
from telegram.warnings import PTBUserWarning

from telegram_idem._admission import StorePolicy
from telegram_idem._context import UpdateContext, bind_update, current_update
from telegram_idem._decorator import FingerprintSource
from telegram_idem._decorator import idempotent as _idempotent
from telegram_idem._effects import ErrorTypes
from telegram_idem._guard import ErrorPolicy, Idem, InProgressPolicy, Once
from telegram_idem._keys import KeySource
from telegram_idem._updates import bot_id_from_token
from telegram_idem.adapters._ptb_common import (
    IDEM_KEY,
    RUN,
    AnyApplication,
    AnyContext,
    Run,
    idem_of,
    register_guard,
    update_to_dict,
)
from telegram_idem.adapters._ptb_outbound import (
    FloodRateLimiter,
    OutboxRateLimiter,
    request_params,
    to_ptb_error,
)
from telegram_idem.adapters._ptb_processor import (
    DEFAULT_HANDLER_TIMEOUT,
    TAKEOVER_MARGIN,
    IdempotentUpdateProcessor,
)
from telegram_idem.adapters._ptb_webhook import ptb_webhook, ptb_webhook_app
from telegram_idem.errors import ConfigurationError, PermanentUpdateError

__all__ = [
    "DEFAULT_HANDLER_TIMEOUT",
    "IDEM_KEY",
    "TAKEOVER_MARGIN",
    "FloodRateLimiter",
    "IdempotentUpdateProcessor",
    "OutboxRateLimiter",
    "StorePolicy",
    "idem_of",
    "idempotent",
    "inbox_dispatch",
    "install_update_guard",
    "ptb_get_updates",
    "ptb_webhook",
    "ptb_webhook_app",
    "request_params",
    "to_ptb_error",
    "update_to_dict",
]

P = ParamSpec("P")
T = TypeVar("T")
C = TypeVar("C", bound=AnyContext)


def install_update_guard(application: AnyApplication, idem: Idem, **_: Any) -> NoReturn:
    """Removed: use :class:`IdempotentUpdateProcessor`.

    The group ``-1`` handler had to complete the update's claim before the handlers ran
    (PTB has no hook after the last handler group), so an update whose handler raised was
    never run again.

    Args:
        application: ignored (the function is removed).
        idem: ignored.

    Raises:
        ConfigurationError: always, naming the replacement.
    """
    raise ConfigurationError(
        "install_update_guard was removed: a group -1 handler records the update as done "
        "before its handlers run, so a failed update is never retried. Build the "
        "application with ApplicationBuilder().concurrent_updates("
        "IdempotentUpdateProcessor(idem, n)) instead"
    )


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
    window: float | None = None,
    once: Once = "at_least",
    not_applied: ErrorTypes = (),
    permanent: ErrorTypes = (),
    ambiguous: ErrorTypes = (),
) -> Callable[
    [Callable[Concatenate[Update, C, P], Awaitable[T]]],
    Callable[Concatenate[Update, C, P], Coroutine[Any, Any, T]],
]:
    """:func:`telegram_idem.idempotent` for PTB callbacks ``(update, context, ...)``.

    Binds the callback's ``update`` (as :func:`update_to_dict`) with the :class:`Idem` of
    :func:`idem_of` for the call, so the key template is rendered against the update
    whether the processor guards the application or only ``context.bot_data["idem"]``
    is set. Parameters are those of :func:`telegram_idem.idempotent` (all of them, e.g.
    ``window=`` seconds, the double-tap window of a navigation button: a repeat tap within
    ``window`` seconds after the run finished replays, a later one acts again; ``once=``
    and the error lists ``not_applied=``, ``permanent=``, ``ambiguous=``); the result
    (e.g. a ``ConversationHandler`` state) is stored and replayed, so it must be storable
    by the codec (JSON by default).

    Raises (at call time):
        ConfigurationError: the first argument is not a ``telegram.Update``, or no
            :class:`Idem` is registered for the application.
        KeyTemplateError, ConflictError, InProgressError, StoredFailureError,
            UnknownOutcomeError, LostClaimError, StoreError: as
            :func:`telegram_idem.idempotent`.

    Raises (at decoration):
        TypeError: the callback is not an ``async def``.
        ConfigurationError: ``window`` given with ``retention``, or not > 0; a bad
            ``once``, ``on_error`` or error list.

    Args:
        key: as :func:`telegram_idem.idempotent` (a template over the update, or a
            callable).
        fingerprint_fields: as :func:`telegram_idem.idempotent`.
        in_progress: as :func:`telegram_idem.idempotent` (``"raise"``, ``"wait"``,
            ``"drop"``).
        on_error: as :func:`telegram_idem.idempotent` (``"release"`` or ``"store"``).
        lease: seconds the claim's lease lasts (default the guard's).
        retention: seconds the result is kept (default the guard's ``action_retention``).
        wait_timeout: seconds ``in_progress="wait"`` waits (default the lease).
        window: seconds a finished run is replayed (the double-tap window); not with
            ``retention``.
        once: as :func:`telegram_idem.idempotent` (``"at_least"`` or ``"at_most"``).
        not_applied: as :func:`telegram_idem.idempotent`.
        permanent: as :func:`telegram_idem.idempotent`.
        ambiguous: as :func:`telegram_idem.idempotent`.
    """
    guard = _idempotent(
        key=key,
        fingerprint_fields=fingerprint_fields,
        in_progress=in_progress,
        on_error=on_error,
        lease=lease,
        retention=retention,
        wait_timeout=wait_timeout,
        window=window,
        once=once,
        not_applied=not_applied,
        permanent=permanent,
        ambiguous=ambiguous,
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
    """The :class:`~telegram_idem.inbox._worker.InboxWorker` dispatch for PTB.

    Feeds each admitted update to ``application.process_update`` with the update bound
    as admitted (:meth:`telegram_idem.Idem.adopt`, so ``@idempotent`` works) and raises when a handler raised — PTB hands handler
    errors to its error handlers instead of raising, so a first error handler records
    them — so the worker retries or dead-letters the entry. Call after
    ``await application.initialize()``.

    Args:
        application: the PTB application.
        idem: the guard whose store holds the inbox.
        bot_id: the bot's id (default: from ``application.bot.token``).

    Raises (from the returned coroutine function):
        PermanentUpdateError: PTB cannot parse the update (``Update.de_json`` raised); the
            worker dead-letters the entry at once, no retry can parse it.
        Exception: the handler's exception, re-raised after PTB's error handlers ran.
    """
    register_guard(application, idem)
    bot = bot_id if bot_id is not None else bot_id_from_token(application.bot.token)

    async def record_error(update: object, context: AnyContext) -> None:
        run = RUN.get()
        if run is not None and not run.finished:
            run.error = context.error

    others = dict(application.error_handlers)
    application.error_handlers.clear()
    application.error_handlers[record_error] = True
    application.error_handlers.update(others)

    async def dispatch(update: dict[str, Any]) -> None:
        try:
            parsed = Update.de_json(update, application.bot)
        except Exception as exc:
            raise PermanentUpdateError(
                f"python-telegram-bot cannot parse update {update.get('update_id')}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        run = Run()
        reset = RUN.set(run)
        try:  # the inbox owns the update: run it bound as admitted, no claim
            await idem.adopt(update, bot_id=bot).run(lambda: application.process_update(parsed))
        finally:
            run.finished = True
            RUN.reset(reset)
        if run.error is not None:
            raise run.error

    return dispatch


# ------------------------------------------------------------------ polling


def ptb_get_updates(
    bot: Bot,
) -> Callable[[int | None, int, float], Awaitable[list[dict[str, Any]]]]:
    """``getUpdates`` through a PTB ``Bot``, as the Bot API JSON Telegram sent, for
    :class:`~telegram_idem.ingress._polling.PollingIngress`.

    The updates are fetched raw (``Bot.do_api_request("getUpdates", return_type=None)``),
    not parsed by PTB: ``Bot.get_updates`` parses the whole batch, so one update PTB cannot
    parse would fail every fetch, the offset would never move and polling would stop for
    good. Raw, such an update is admitted like any other and :func:`inbox_dispatch`
    dead-letters it at its first take (``PermanentUpdateError``), while the rest of the
    batch runs. The request goes through the bot's ``getUpdates`` connection pool (the
    ``get_updates_request`` of ``ApplicationBuilder``), as PTB's own polling does; PTB's
    hint to use ``Bot.getUpdates`` for it is silenced.

    Call ``await bot.initialize()`` first (``Application.initialize`` does it). The
    webhook must be deleted first: Telegram refuses ``getUpdates`` while one is set (Bot
    API, ``getUpdates``).

    Args:
        bot: the PTB ``Bot``, initialised.

    Returns:
        ``get_updates(offset, limit, timeout_seconds)``, giving the batch's update dicts
        (Bot API, "Update"); it raises what ``Bot.do_api_request`` raises
        (``telegram.error.TelegramError`` and subclasses), and ``TypeError`` when the
        result is not a list.
    """
    _silence_get_updates_hint()

    async def get_updates(offset: int | None, limit: int, wait: float) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit, "timeout": int(wait)}
        if offset is not None:
            params["offset"] = offset
        result = await bot.do_api_request(
            "getUpdates", api_kwargs=params, return_type=None, read_timeout=wait + 10
        )
        if not isinstance(result, list):
            raise TypeError(f"getUpdates answered {type(result).__name__}, not a list")
        return result

    return get_updates


def _silence_get_updates_hint() -> None:
    """``do_api_request("getUpdates")`` warns "Please use 'Bot.getUpdates'"; the raw call
    is deliberate here (the endpoint name must stay ``getUpdates`` so PTB picks its
    polling connection pool)."""
    warnings.filterwarnings(
        "ignore", message=r"Please use 'Bot\.getUpdates'", category=PTBUserWarning
    )
