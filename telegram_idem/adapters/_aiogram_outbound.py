"""aiogram 3 session middlewares: every Bot API call through the outbox, or paced by
flood control alone.

::

    bot.session.middleware(OutboxSessionMiddleware(outbound))   # send-once + paced
    bot.session.middleware(FloodControlMiddleware(flood))       # paced only

Both are aiogram ``BaseRequestMiddleware`` objects: aiogram hands them each
``TelegramMethod`` before its session serialises it, so ``await bot.send_message(...)``
and ``await message.answer(...)`` go through them unchanged and still return aiogram's
objects (a ``Message`` bound to the bot).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from enum import Enum
from typing import Any, cast

from aiogram import Bot
from aiogram.client.default import Default
from aiogram.client.session.middlewares.base import (
    BaseRequestMiddleware,
    NextRequestMiddlewareType,
)
from aiogram.exceptions import (
    TelegramAPIError,
    TelegramBadRequest,
    TelegramConflictError,
    TelegramEntityTooLarge,
    TelegramForbiddenError,
    TelegramNotFound,
    TelegramUnauthorizedError,
)
from aiogram.methods import Response, TelegramMethod
from aiogram.methods.base import TelegramType
from aiogram.types import (
    BufferedInputFile,
    FSInputFile,
    InputFile,
    TelegramObject,
    URLInputFile,
)

from telegram_idem.adapters._outbound_common import (
    DEFAULT_MAX_RETRIES,
    goes_direct,
    paced,
)
from telegram_idem.errors import ChatParkedError, SendFailedError
from telegram_idem.flood import FloodControl, retry_after_of
from telegram_idem.outbox import FileRef, Outbound

__all__ = [
    "FloodControlMiddleware",
    "OutboxSessionMiddleware",
    "method_params",
    "returned",
    "to_aiogram_error",
]


def _plain(value: Any, bot: Bot) -> Any:
    """One value of a method as Bot API JSON (aiogram's ``BaseSession.prepare_value``
    without the form encoding): ``Default`` resolved from ``bot.default``, files by
    reference, dates as Unix time, objects as dicts; ``None`` stays ``None`` (dropped by
    the caller)."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, Default):
        return _plain(bot.default[value.name], bot)
    if isinstance(value, InputFile):
        return _file(value)
    if isinstance(value, Mapping):
        return {k: v for k, item in value.items() if (v := _plain(item, bot)) is not None}
    if isinstance(value, list | tuple):
        return [v for item in value if (v := _plain(item, bot)) is not None]
    if isinstance(value, datetime.timedelta):
        now = datetime.datetime.now()  # aiogram's own rule: now + delta
        return round((now + value).timestamp())
    if isinstance(value, datetime.datetime):
        return round(value.timestamp())
    if isinstance(value, Enum):
        return _plain(value.value, bot)
    if isinstance(value, TelegramObject):
        return _plain(value.model_dump(warnings=False), bot)
    return value


def _file(value: InputFile) -> Any:
    if isinstance(value, FSInputFile):
        return FileRef(str(value.path))
    if isinstance(value, URLInputFile):
        return value.url  # Bot API "Sending files": Telegram fetches an HTTP URL itself
    kind = "BufferedInputFile" if isinstance(value, BufferedInputFile) else type(value).__name__
    raise TypeError(
        f"the outbox keeps calls by reference and cannot store a {kind}'s bytes: send an "
        "FSInputFile (a local path), a URL or a file_id instead"
    )


def method_params(bot: Bot, method: TelegramMethod[Any]) -> dict[str, Any]:
    """The parameters aiogram would send for ``method``, as a Bot API JSON object.

    The same fields aiogram's session serialises (``method.model_dump``), with
    ``bot.default`` properties (``parse_mode``, ``link_preview_options``, ...) applied
    where the method left them default, ``None`` dropped, ``FSInputFile`` as a
    :class:`~telegram_idem.outbox.FileRef` of its path and ``URLInputFile`` as its URL
    (Bot API "Sending files"), datetimes as Unix time (seconds) and aiogram objects as
    their JSON dicts.

    Args:
        bot: the aiogram ``Bot`` making the call (its ``default`` properties).
        method: the aiogram ``TelegramMethod``.

    Raises:
        TypeError: a ``BufferedInputFile`` (or another in-memory ``InputFile``): the
            outbox stores calls, and cannot store bytes.
    """
    params = _plain(method.model_dump(warnings=False), bot)
    assert isinstance(params, dict)
    return params


def returned(bot: Bot, method: TelegramMethod[TelegramType], result: Any) -> TelegramType:
    """Telegram's ``result`` JSON as the object aiogram returns for ``method``
    (``method.__returning__``, validated with ``bot`` in the context, so a ``Message``
    is bound to the bot and ``message.answer()`` works on it).

    Args:
        bot: the aiogram ``Bot`` the result is bound to.
        method: the aiogram method object that was called.
        result: Telegram's ``result`` JSON.

    Raises:
        pydantic.ValidationError: ``result`` is not what the method returns.
    """
    response_type = Response[method.__returning__]  # type: ignore[name-defined]
    response = response_type.model_validate({"ok": True, "result": result}, context={"bot": bot})
    return cast(TelegramType, response.result)


def _both(aiogram_error: type[TelegramAPIError], ours: type[SendFailedError]) -> type[Exception]:
    name = f"Outbox{aiogram_error.__name__}"

    def __init__(self: Any, method: TelegramMethod[Any], err: SendFailedError) -> None:
        aiogram_error.__init__(self, method=method, message=err.description or str(err))
        self.key = err.key
        self.error_code = err.error_code
        self.description = err.description

    doc = (
        f"An outbox dead letter seen as aiogram's ``{aiogram_error.__name__}``; also a "
        f":class:`~telegram_idem.errors.{ours.__name__}` (``key``, ``error_code``, "
        "``description``)."
    )
    return type(name, (aiogram_error, ours), {"__init__": __init__, "__doc__": doc})


_BY_CODE: dict[int, type[TelegramAPIError]] = {
    400: TelegramBadRequest,
    401: TelegramUnauthorizedError,
    403: TelegramForbiddenError,
    404: TelegramNotFound,
    409: TelegramConflictError,
    413: TelegramEntityTooLarge,
}
_FAILED = {code: _both(cls, SendFailedError) for code, cls in _BY_CODE.items()}
_FAILED_OTHER = _both(TelegramAPIError, SendFailedError)
_PARKED = _both(TelegramForbiddenError, ChatParkedError)


def to_aiogram_error(err: SendFailedError, method: TelegramMethod[Any]) -> Exception:
    """A dead letter (or a parked chat) as the exception aiogram raises for the same
    answer, which is *also* the given error type: ``except TelegramBadRequest`` and
    ``except SendFailedError`` both catch a 400 refused through the outbox.

    400 → ``TelegramBadRequest``, 401 → ``TelegramUnauthorizedError``, 403 and a parked
    chat (:class:`~telegram_idem.errors.ChatParkedError`) → ``TelegramForbiddenError``,
    404 → ``TelegramNotFound``, 409 → ``TelegramConflictError``, 413 →
    ``TelegramEntityTooLarge``, anything else → ``TelegramAPIError`` (aiogram's
    ``BaseSession.check_response`` rules; Bot API "Making requests").

    Args:
        err: the outbox's failure (:class:`~telegram_idem.errors.SendFailedError` or
            :class:`~telegram_idem.errors.ChatParkedError`).
        method: the aiogram method object that was called.
    """
    if isinstance(err, ChatParkedError):
        cls = _PARKED
    else:
        cls = _FAILED.get(err.error_code or 0, _FAILED_OTHER)
    return cls(method, err)


class OutboxSessionMiddleware(BaseRequestMiddleware):
    """Route every Bot API call of an aiogram ``Bot`` through the outbox:
    ``bot.session.middleware(OutboxSessionMiddleware(outbound))``.

    Each call becomes ``(method.__api_method__, method_params(bot, method))`` and goes to
    ``outbound.call``: inside an ``@idempotent`` action or step it is a durable, send-once
    call (a retried action gets the first call's answer and sends nothing again); outside
    one it is sent at once, paced by flood control. The answer comes back as the object
    aiogram returns (:func:`returned`). ``answerCallbackQuery`` names no chat, so it is a
    unit of its own and never waits behind a chat's queue. Reads and the bot's session
    methods (:func:`~telegram_idem.adapters._outbound_common.goes_direct`: ``get*``,
    ``setWebhook``, ``deleteWebhook``, ``logOut``, ``close``) go to aiogram's own session
    unchanged.

    Args:
        outbound: the outbox's sender (``telegram_idem.outbox.Outbound``), running its
            relay (``async with outbound``).
        wait: seconds a call waits for its delivery before
            :class:`~telegram_idem.errors.DeliveryTimeoutError` (the framework needs the
            answer, so there is always a limit).
        priority: the priority of every call (0 replies … 10 bulk), or ``None``: each
            call's enclosing ``with telegram_idem.flood.priority(BULK):`` block's, else 0
            (aiogram's methods have no argument for it).

    Raises (from a call made through the bot):
        TelegramBadRequest, TelegramForbiddenError, ...: Telegram refused the call for
            good; the exception is also a :class:`~telegram_idem.errors.SendFailedError`
            (a :class:`~telegram_idem.errors.ChatParkedError` for a parked chat), see
            :func:`to_aiogram_error`.
        UnknownOutcomeError: the answer was lost and the call is held (policy ``hold``);
            it is not sent again by itself.
        DeliveryTimeoutError: not delivered within ``wait``; the outbox still sends it.
        StoreError: the store could not answer.
        TypeError: a ``BufferedInputFile`` (the outbox cannot store bytes).
        ValueError: inside an action, params that hold the bot token (a
            ``URLInputFile`` of a Bot API file download URL ``.../file/bot<token>/...``):
            send its ``file_id`` instead; nothing is stored (see ``Outbound.call``).
    """

    def __init__(
        self, outbound: Outbound, *, wait: float = 60.0, priority: int | None = None
    ) -> None:
        self.outbound = outbound
        self.wait = wait
        self.priority = priority

    async def __call__(
        self,
        make_request: NextRequestMiddlewareType[TelegramType],
        bot: Bot,
        method: TelegramMethod[TelegramType],
    ) -> Response[TelegramType]:
        name = method.__api_method__
        if goes_direct(name):
            return await make_request(bot, method)
        params = method_params(bot, method)
        try:
            result = await self.outbound.call(name, params, priority=self.priority, wait=self.wait)
        except SendFailedError as err:
            raise to_aiogram_error(err, method) from err
        # aiogram's session chain returns the result itself, not the Response wrapper
        # (BaseSession.__call__ casts it): so does this middleware.
        return cast(Response[TelegramType], returned(bot, method, result))


class FloodControlMiddleware(BaseRequestMiddleware):
    """Pace every Bot API call of an aiogram ``Bot`` by flood control shared by every
    process of the bot (no outbox): ``bot.session.middleware(FloodControlMiddleware(flood))``.

    Before each call it waits for the call's turn (``flood.wait_turn``: the bot's pause
    gate, the global, chat and group budgets). On ``TelegramRetryAfter`` (a 429) it
    pauses the whole bot for ``retry_after`` seconds in the store (``flood.retry_after``:
    every process waits) and sends the call again once the pause ends, at most
    ``max_retries`` times; a 429 means Telegram did not apply the call. ``getUpdates``
    is never paced (a long poll is no send).

    Args:
        flood: the shared flood control (``telegram_idem.flood.FloodControl``).
        max_retries: sends after a 429 before the ``TelegramRetryAfter`` is raised.
        priority: the priority of every call (0 replies … 10 bulk), or ``None``: each
            call's enclosing ``with telegram_idem.flood.priority(BULK):`` block's, else 0.

    Raises (from a call made through the bot):
        TelegramRetryAfter: still 429 after ``max_retries`` sends.
        StoreError: flood control's store could not answer.
        TelegramAPIError: whatever else aiogram raises, unchanged.
    """

    def __init__(
        self,
        flood: FloodControl,
        *,
        max_retries: int = DEFAULT_MAX_RETRIES,
        priority: int | None = None,
    ) -> None:
        self.flood = flood
        self.max_retries = max_retries
        self.priority = priority

    async def __call__(
        self,
        make_request: NextRequestMiddlewareType[TelegramType],
        bot: Bot,
        method: TelegramMethod[TelegramType],
    ) -> Response[TelegramType]:
        name = method.__api_method__
        if name == "getUpdates":
            return await make_request(bot, method)
        # What flood control reads: the chat (its budget) and paid broadcasts.
        hints = {
            "chat_id": _plain(getattr(method, "chat_id", None), bot),
            "allow_paid_broadcast": getattr(method, "allow_paid_broadcast", None) is True,
        }
        return await paced(
            self.flood,
            name,
            hints,
            lambda: make_request(bot, method),
            retry_after_of,
            priority=self.priority,
            max_retries=self.max_retries,
        )
