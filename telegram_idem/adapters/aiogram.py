"""aiogram 3 adapter: the update guard as an outer middleware on ``dp.update``.

::

    idem = Idem("sqlite:///bot.db")
    dp = Dispatcher()
    IdempotencyMiddleware(idem).setup(dp)

``setup(dp)`` registers the middleware on ``dp.update`` and checks the wiring when the
dispatcher starts (``start_polling``, aiogram's ``setup_application``, ``emit_startup``),
before any update is taken: a wiring mistake raises
:class:`~telegram_idem.errors.ConfigurationError` there, and a webhook route that answers
before the guard decides is logged as a WARNING. Registered with
``dp.update.outer_middleware(...)`` directly, the same checks run at the first update.

The middleware admits each update with :meth:`telegram_idem.Idem.admit` and translates
the outcome (:mod:`telegram_idem._admission`): ``RUN`` runs the handlers (the update bound,
its claim completed after them, released if they raise); ``DUPLICATE`` (same
``(bot.id, update_id)``, completed before) never reaches a handler: the middleware
returns ``UNHANDLED`` and, on a webhook, aiogram answers 200 so Telegram stops
re-sending. An update *in progress elsewhere* (another holder's lease is alive, e.g. a
killed run) is not a duplicate: the middleware waits up to ``in_progress_wait`` seconds
for that lease to end (then takes it over and runs the update, or finds it completed),
and raises :class:`~telegram_idem.errors.UpdateInProgressError` (``NOT_YET``) if it is
still held, so a webhook that answers from the result answers non-2xx and Telegram
re-sends. A store outage raises :class:`~telegram_idem.errors.StoreError`
(``UNAVAILABLE``, fail-closed) or runs the handlers without the guard (``UNGUARDED``,
fail-open). Handlers get ``idem`` (the :class:`~telegram_idem.Idem`) and ``idem_tokens``
(the :class:`~telegram_idem.CallbackTokens`, if given) in their data, and
``@idempotent`` works on them with templates rooted at the update. Updates of a type
this version does not know (Bot API "Update") are admitted like any other and passed to
aiogram untouched.

An update that an outer shape already admitted and runs (``FastAckWebhook``, the Lambda
worker, the inbox worker through :func:`inbox_dispatch`: the update is bound, admitted,
by :meth:`telegram_idem._admitted.Admitted.run`) is not admitted again: the middleware
passes it to the handlers.

Works with ``feed_update``, ``feed_raw_update``, ``feed_webhook_update``, polling and
aiogram's ``SimpleRequestHandler(handle_in_background=False)``. aiogram's default
``handle_in_background=True`` answers 200 before this middleware runs, so a store outage
or an update in progress elsewhere is lost: the middleware logs a WARNING the first time
it runs there; use :class:`~telegram_idem.adapters._aiogram_webhook.IdempotentRequestHandler`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from functools import partial
from typing import Any, Self

from aiogram import BaseMiddleware, Bot, Dispatcher
from aiogram.dispatcher.event.bases import UNHANDLED
from aiogram.methods import TelegramMethod
from aiogram.types import TelegramObject, Update
from aiogram.webhook.aiohttp_server import BaseRequestHandler
from aiohttp import web
from pydantic import ValidationError

from telegram_idem._admission import DEFAULT_OUTAGE_WAIT, Admission, StorePolicy, StorePolicyLike
from telegram_idem._admitted import Admitted
from telegram_idem._callbacks import CallbackTokens
from telegram_idem._context import bound_update
from telegram_idem._guard import Idem
from telegram_idem.adapters._aiogram_outbound import (
    FloodControlMiddleware,
    OutboxSessionMiddleware,
    method_params,
    returned,
    to_aiogram_error,
)
from telegram_idem.adapters._aiogram_webhook import FastAckWebhook, IdempotentRequestHandler
from telegram_idem.adapters._aiogram_wiring import (
    answering_first_routes,
    check_event,
    check_handlers,
    check_observers,
)
from telegram_idem.errors import MalformedUpdateError

__all__ = [
    "FastAckWebhook",
    "FloodControlMiddleware",
    "IdempotencyMiddleware",
    "IdempotentRequestHandler",
    "LazyUpdate",
    "OutboxSessionMiddleware",
    "StorePolicy",
    "aiogram_get_updates",
    "idem_of",
    "inbox_dispatch",
    "method_params",
    "returned",
    "to_aiogram_error",
    "update_to_dict",
]

log = logging.getLogger("telegram_idem.aiogram")


def update_to_dict(update: Update) -> dict[str, Any]:
    """The update as Bot API JSON (``from``, not ``from_user``), fields as received.

    Args:
        update: the aiogram ``Update``.
    """
    return update.model_dump(mode="json", exclude_unset=True, exclude_none=True, by_alias=True)


class LazyUpdate(Mapping[str, Any]):
    """An aiogram ``Update`` seen as its Bot API dict, converted only when a field other
    than ``update_id`` is read (a key template, a fingerprint, the decision log), so the
    update guard alone never pays for the conversion.

    Args:
        event: the aiogram ``Update``.
    """

    __slots__ = ("_data", "_event")

    def __init__(self, event: Update) -> None:
        self._event = event
        self._data: dict[str, Any] | None = None

    def _full(self) -> dict[str, Any]:
        if self._data is None:
            self._data = update_to_dict(self._event)
        return self._data

    def __getitem__(self, key: str) -> Any:
        if key == "update_id":
            return self._event.update_id
        return self._full()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._full())

    def __len__(self) -> int:
        return len(self._full())


_ANSWERS_FIRST = (
    "IdempotencyMiddleware runs behind aiogram's SimpleRequestHandler with "
    "handle_in_background=True%s, which answers 200 before the update guard decides: an "
    "update refused for a store outage, or in progress elsewhere, is lost. Use "
    "telegram_idem.adapters._aiogram_webhook.IdempotentRequestHandler (or FastAckWebhook) "
    "instead"
)


class IdempotencyMiddleware(BaseMiddleware):
    """The update guard for an aiogram ``Dispatcher``: install with
    ``IdempotencyMiddleware(idem).setup(dp)`` (checks the wiring at start-up), or register
    with ``dp.update.outer_middleware(...)`` (checks it at the first update).

    Args:
        idem: the guard.
        tokens: callback tokens to inject as ``idem_tokens``.
        on_store_error: a :class:`~telegram_idem._admission.StorePolicy` (or its string
            value): ``"fail_closed"`` (default) raises
            :class:`~telegram_idem.errors.StoreError`, so the update is not processed
            unguarded (a webhook answering from the result gets a 5xx and Telegram
            re-sends); ``"fail_open"`` processes the update without the guard and logs
            an error.
        in_progress_wait: seconds to wait while the update is in progress elsewhere
            before raising :class:`~telegram_idem.errors.UpdateInProgressError`. ``None``
            (default): ``idem.lease + 1`` where nothing can make Telegram re-send the
            update — polling (``start_polling``: the next ``getUpdates`` confirms it) and
            aiogram's ``SimpleRequestHandler`` background task (already answered 200) —
            and ``0`` elsewhere (``feed_webhook_update``, ``feed_update``: the answer waits
            for the result, so raising makes it non-2xx). Waiting runs in the update's own
            task (aiogram polls with ``handle_as_tasks=True`` by default), so it does not
            hold other updates back.
        outage_wait: with ``"fail_closed"``, seconds to keep trying the claim through a
            store outage (with backoff, 0.5 s doubling to 10 s) before raising
            :class:`~telegram_idem.errors.StoreError`. ``None`` (default):
            :data:`~telegram_idem._admission.DEFAULT_OUTAGE_WAIT` (300 s) where nothing can make Telegram re-send the update
            (the same shapes as ``in_progress_wait``: the update's task is then its only
            copy), ``0`` elsewhere (the StoreError makes the answer non-2xx). One WARNING
            when the wait starts and one when the store answers again.

    Raises:
        ConfigurationError: an unknown ``on_store_error``.
    """

    def __init__(
        self,
        idem: Idem,
        *,
        tokens: CallbackTokens | None = None,
        on_store_error: StorePolicyLike = StorePolicy.FAIL_CLOSED,
        in_progress_wait: float | None = None,
        outage_wait: float | None = None,
    ) -> None:
        self.idem = idem
        self.tokens = tokens
        self.on_store_error = StorePolicy.of(on_store_error)
        self.in_progress_wait = in_progress_wait
        self.outage_wait = outage_wait
        self._warned_answers_first = False

    def setup(self, dispatcher: Dispatcher) -> Self:
        """Register this middleware as the outer middleware of ``dispatcher.update`` and
        check the wiring when the dispatcher starts (its ``startup`` event:
        ``start_polling``, aiogram's ``setup_application``, ``emit_startup``), before it
        takes any update. Returns the middleware.

        At start-up:

        - a handler registered without its ``@idempotent`` wrapper (the decorator placed
          above the router's), or this middleware type registered on another observer
          than ``dp.update``, raises :class:`~telegram_idem.errors.ConfigurationError`, so
          ``start_polling`` / the aiohttp app's start-up fails;
        - when started by ``setup_application(app, dp, ...)``, a route of ``app`` served
          by aiogram's ``SimpleRequestHandler`` with ``handle_in_background=True`` is
          logged as a WARNING on ``telegram_idem.aiogram`` (it answers 200 before the
          guard decides).

        Raises (at start-up, from the dispatcher's ``emit_startup``):
            ConfigurationError: a wiring mistake above.

        Args:
            dispatcher: the aiogram ``Dispatcher``.
        """
        dispatcher.update.outer_middleware(self)

        async def check_wiring(**data: Any) -> None:
            self.check_wiring(dispatcher, app=data.get("app"))

        dispatcher.startup.register(check_wiring)
        return self

    def check_wiring(self, dispatcher: Dispatcher, *, app: web.Application | None = None) -> None:
        """The start-up checks of :meth:`setup` (``app``: the aiohttp application serving
        the webhook, if any).

        Args:
            dispatcher: the aiogram ``Dispatcher``.
            app: the aiohttp application serving the webhook, if any.

        Raises:
            ConfigurationError: a handler runs without its ``@idempotent`` wrapper, or the
                middleware is registered on another observer than ``dp.update``.
        """
        check_observers(dispatcher, IdempotencyMiddleware)
        check_handlers(dispatcher, fresh=True)
        if isinstance(app, web.Application):
            paths = answering_first_routes(app, dispatcher)
            if paths:
                self._warned_answers_first = True
                log.warning(_ANSWERS_FIRST, f" (route {', '.join(paths)})")

    def _resendable(self, data: Mapping[str, Any]) -> bool:
        """Whether a failed answer makes Telegram re-send this update (not polling, not a
        handler that answered before the guard ran)."""
        answered_first = _answering_first() is not None
        if answered_first and not self._warned_answers_first:
            self._warned_answers_first = True
            log.warning(_ANSWERS_FIRST, "")
        polling = "bots" in data  # start_polling's workflow data
        return not (polling or answered_first)

    async def _admit(self, update: LazyUpdate, bot_id: int, data: Mapping[str, Any]) -> Admitted:
        """The admission, waiting out a live holder (``in_progress_wait``) and,
        fail-closed, a store outage (``outage_wait``) where Telegram would not re-send."""
        resendable = self._resendable(data)
        wait = self.in_progress_wait
        if wait is None:
            wait = 0.0 if resendable else self.idem.lease + 1.0
        outage = self.outage_wait
        if outage is None:
            outage = 0.0 if resendable else DEFAULT_OUTAGE_WAIT
        return await self.idem.admit(
            update,
            bot_id=bot_id,
            wait=wait,
            outage_wait=outage,
            store_policy=self.on_store_error,
        )

    async def __call__(
        self,
        handler: Callable[[TelegramObject, dict[str, Any]], Awaitable[Any]],
        event: TelegramObject,
        data: dict[str, Any],
    ) -> Any:
        if not isinstance(event, Update):
            check_event(event)  # wiring mistakes raise instead of guarding nothing
        data["idem"] = self.idem
        if self.tokens is not None:
            data["idem_tokens"] = self.tokens
        check_handlers(data.get("dispatcher"))
        assert isinstance(event, Update)
        bot_id: int = data["bot"].id
        bound = bound_update()
        if bound is not None and bound.admitted(bot_id, event.update_id):
            # Admitted and run by an outer shape (a webhook, a worker, or this middleware
            # registered twice): not admitted again.
            return await handler(event, data)
        admitted = await self._admit(LazyUpdate(event), bot_id, data)
        if admitted.outcome is Admission.DUPLICATE:
            return UNHANDLED
        # NOT_YET raises UpdateInProgressError, UNAVAILABLE the StoreError.
        return await admitted.run(partial(handler, event, data))


def _answering_first() -> BaseRequestHandler | None:
    """The aiogram request handler whose background task runs this update, if the update
    came through ``SimpleRequestHandler(handle_in_background=True)`` (already answered)."""
    task = asyncio.current_task()
    coro = task.get_coro() if task is not None else None
    frame = getattr(coro, "cr_frame", None)
    if frame is None or getattr(coro, "__name__", "") != "_background_feed_update":
        return None
    owner = frame.f_locals.get("self")
    if isinstance(owner, BaseRequestHandler) and owner.handle_in_background:
        return owner
    return None


def idem_of(dispatcher: Dispatcher) -> Idem | None:
    """The :class:`~telegram_idem.Idem` of the :class:`IdempotencyMiddleware` registered
    on ``dispatcher.update``, or ``None``.

    Args:
        dispatcher: the aiogram ``Dispatcher``.
    """
    for middleware in dispatcher.update.outer_middleware:
        if isinstance(middleware, IdempotencyMiddleware):
            return middleware.idem
    return None


def inbox_dispatch(
    dispatcher: Dispatcher, bot: Bot, *, idem: Idem | None = None
) -> Callable[[dict[str, Any]], Awaitable[Any]]:
    """The :class:`~telegram_idem.inbox._worker.InboxWorker` dispatch for aiogram: feeds
    each update the inbox admitted, bound as admitted (:meth:`telegram_idem.Idem.adopt`),
    so the middleware runs it without claiming it again and ``@idempotent`` works.
    Handler exceptions propagate, so the worker retries.

    Args:
        dispatcher: the aiogram dispatcher.
        bot: the bot the updates are for.
        idem: the guard whose store holds the inbox (default: the one of the
            :class:`IdempotencyMiddleware` registered on ``dispatcher.update``; without
            either the update is fed unbound).

    Raises (from the returned dispatch):
        MalformedUpdateError: aiogram cannot parse the update (a retry never could: the
            worker buries it as a dead letter).
        Exception: whatever a handler raised.
    """

    async def dispatch(update: dict[str, Any]) -> Any:
        try:
            parsed = Update.model_validate(update, context={"bot": bot})
        except ValidationError as exc:
            raise MalformedUpdateError(
                f"update {update.get('update_id')} does not parse in aiogram: {exc}"
            ) from exc
        guard = idem if idem is not None else idem_of(dispatcher)
        if guard is None:
            return await dispatcher.feed_update(bot, parsed)
        admitted = guard.adopt(update, bot_id=bot.id)
        return await admitted.run(lambda: dispatcher.feed_update(bot, parsed))

    return dispatch


class _RawGetUpdates(TelegramMethod[list[dict[str, Any]]]):
    """``getUpdates`` answered as the Bot API's JSON objects, not parsed into aiogram
    ``Update`` objects: one update aiogram cannot parse must not fail its whole batch."""

    __returning__ = list[dict[str, Any]]
    __api_method__ = "getUpdates"

    offset: int | None = None
    limit: int | None = None
    timeout: int | None = None


def aiogram_get_updates(
    bot: Bot,
) -> Callable[[int | None, int, float], Awaitable[list[dict[str, Any]]]]:
    """``getUpdates`` through an aiogram ``Bot``, as Bot API dicts (for
    :class:`~telegram_idem.ingress._polling.PollingIngress`).

    The batch is fetched with the bot's session (its timeouts and errors, e.g.
    ``TelegramRetryAfter`` for a 429) but not parsed by aiogram: an update aiogram cannot
    parse reaches ``PollingIngress`` as it was sent, is admitted and dead-lettered by the
    worker (``inbox_dispatch`` raises ``MalformedUpdateError``), and the offset moves past
    it (Bot API, ``getUpdates``: an update is confirmed by a later call with a higher
    ``offset``).

    Args:
        bot: the aiogram ``Bot``.
    """

    async def get_updates(offset: int | None, limit: int, wait: float) -> list[dict[str, Any]]:
        method = _RawGetUpdates(offset=offset, limit=limit, timeout=int(wait))
        return await bot(method, request_timeout=int(wait) + 10)

    return get_updates
