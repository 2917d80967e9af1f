"""python-telegram-bot 22 rate limiters: every Bot API call through the outbox, or paced
by flood control alone.

::

    ApplicationBuilder().token(TOKEN).rate_limiter(OutboxRateLimiter(outbound)).build()
    ApplicationBuilder().token(TOKEN).rate_limiter(FloodRateLimiter(flood)).build()

PTB hands its ``BaseRateLimiter`` each request after it built the parameters (defaults
applied, ``None`` dropped) and before it serialises them (``ExtBot._do_post``), so
``await context.bot.send_message(...)`` and ``await update.message.reply_text(...)`` go
through the limiter unchanged and PTB still builds its own objects from the result.
``getUpdates`` never reaches a rate limiter (PTB's rule).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine, Mapping
from enum import Enum
from typing import Any

from telegram import InputFile
from telegram.error import (
    BadRequest,
    Conflict,
    Forbidden,
    InvalidToken,
    TelegramError,
)
from telegram.ext import BaseRateLimiter
from telegram.request._requestparameter import RequestParameter  # PTB's own serialiser

from telegram_idem.adapters._outbound_common import (
    DEFAULT_MAX_RETRIES,
    goes_direct,
    paced,
)
from telegram_idem.errors import ChatParkedError, SendFailedError
from telegram_idem.flood import FloodControl, retry_after_of
from telegram_idem.outbox import FileRef, Outbound

__all__ = ["FloodRateLimiter", "OutboxRateLimiter", "request_params", "to_ptb_error"]

JSON = bool | dict[str, Any] | list[dict[str, Any]]
Callback = Callable[..., Coroutine[Any, Any, JSON]]


def _file_ref(file: InputFile) -> FileRef:
    content = file.input_file_content
    name = getattr(content, "name", None)
    if not isinstance(content, bytes) and isinstance(name, str) and os.path.isfile(name):
        return FileRef(os.path.abspath(name))
    raise TypeError(
        "the outbox keeps calls by reference and cannot store a file's bytes: PTB read "
        f"{file.filename!r} into memory. Pass InputFile(open(path, 'rb'), "
        "read_file_handle=False) (PTB keeps the path), a URL or a file_id instead"
    )


def _clean(value: Any, refs: Mapping[str, FileRef]) -> Any:
    """Plain JSON: enums (PTB's ``StringEnum`` stays in ``to_dict``) as their values,
    ``attach://`` references of local files as their :class:`FileRef`."""
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, str):
        return refs.get(value, value)
    if isinstance(value, dict):
        return {k: _clean(v, refs) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v, refs) for v in value]
    return value


def request_params(data: Mapping[str, Any]) -> dict[str, Any]:
    """PTB's request parameters (the ``data`` a rate limiter gets) as a Bot API JSON
    object, by PTB's own serialisation (``RequestParameter.from_input``: objects as dicts,
    datetimes as Unix time, enums as values), files as
    :class:`~telegram_idem.outbox.FileRef` where the upload is a local file PTB kept open
    by path (``InputFile(open(path, "rb"), read_file_handle=False)``), in place of their
    ``attach://`` reference in media groups.

    Args:
        data: the ``data`` PTB gives a rate limiter.

    Raises:
        TypeError: a file PTB read into memory (a ``Path``, a file object or bytes given
            to a send method): the outbox stores calls, and cannot store bytes.
    """
    out: dict[str, Any] = {}
    for key, value in data.items():
        parameter = RequestParameter.from_input(key, value)
        files = parameter.input_files or []
        if not files:
            if parameter.value is not None:
                out[key] = _clean(parameter.value, {})
            continue
        if parameter.value is None:  # one file sent as the parameter itself
            out[key] = _file_ref(files[0])
            continue
        refs = {f.attach_uri: _file_ref(f) for f in files if f.attach_uri is not None}
        out[key] = _clean(parameter.value, refs)
    return out


def _both(ours: type[SendFailedError], ptb_error: type[TelegramError]) -> type[SendFailedError]:
    doc = (
        f"An outbox dead letter seen as PTB's ``{ptb_error.__name__}``; also a "
        f":class:`~telegram_idem.errors.{ours.__name__}` (``key``, ``error_code``, "
        "``description``)."
    )
    # ours first: SendError's __init__ chains to TelegramError's (message), which chains
    # to Exception's.
    return type(f"Outbox{ptb_error.__name__}", (ours, ptb_error), {"__doc__": doc})


_BY_CODE: dict[int, type[TelegramError]] = {
    400: BadRequest,
    401: InvalidToken,
    403: Forbidden,
    404: InvalidToken,
    409: Conflict,
}
_FAILED = {code: _both(SendFailedError, cls) for code, cls in _BY_CODE.items()}
_FAILED_OTHER = _both(SendFailedError, TelegramError)
_PARKED = _both(ChatParkedError, Forbidden)


def to_ptb_error(err: SendFailedError) -> Exception:
    """A dead letter (or a parked chat) as the exception PTB raises for the same answer,
    which is *also* the given error type: ``except BadRequest`` and
    ``except SendFailedError`` both catch a 400 refused through the outbox.

    400 → ``BadRequest``, 401 and 404 → ``InvalidToken``, 403 and a parked chat
    (:class:`~telegram_idem.errors.ChatParkedError`) → ``Forbidden``, 409 → ``Conflict``,
    anything else → ``TelegramError`` (PTB's ``BaseRequest.post`` rules; Bot API "Making
    requests").

    Args:
        err: the outbox's failure (:class:`~telegram_idem.errors.SendFailedError` or
            :class:`~telegram_idem.errors.ChatParkedError`).
    """
    if isinstance(err, ChatParkedError):
        cls = _PARKED
    else:
        cls = _FAILED.get(err.error_code or 0, _FAILED_OTHER)
    return cls(
        err.description or str(err),
        key=err.key,
        error_code=err.error_code,
        description=err.description,
    )


class OutboxRateLimiter(BaseRateLimiter[int]):
    """Route every Bot API call of a PTB application through the outbox:
    ``ApplicationBuilder().rate_limiter(OutboxRateLimiter(outbound))``.

    Each request becomes ``(endpoint, request_params(data))`` and goes to
    ``outbound.call``: inside an ``@idempotent`` callback or step it is a durable,
    send-once call (a retried action gets the first call's answer and sends nothing
    again); outside one it is sent at once, paced by flood control. The JSON ``result``
    goes back to PTB, which builds its objects from it. ``answerCallbackQuery`` names no
    chat, so it is a unit of its own and never waits behind a chat's queue. Reads and the
    bot's session methods (``get*``, ``setWebhook``, ``deleteWebhook``, ``logOut``,
    ``close``) go to PTB's own request unchanged. ``rate_limit_args`` (an ``int``) is the
    call's priority (0 replies … 10 bulk).

    Args:
        outbound: the outbox's sender (``telegram_idem.outbox.Outbound``), running its
            relay (``async with outbound``).
        wait: seconds a call waits for its delivery before
            :class:`~telegram_idem.errors.DeliveryTimeoutError` (the framework needs the
            answer, so there is always a limit).

    Raises (from a call made through the bot):
        BadRequest, Forbidden, ...: Telegram refused the call for good; the exception is
            also a :class:`~telegram_idem.errors.SendFailedError` (a
            :class:`~telegram_idem.errors.ChatParkedError` for a parked chat), see
            :func:`to_ptb_error`.
        UnknownOutcomeError: the answer was lost and the call is held (policy ``hold``);
            it is not sent again by itself.
        DeliveryTimeoutError: not delivered within ``wait``; the outbox still sends it.
        StoreError: the store could not answer.
        TypeError: a file PTB read into memory (see :func:`request_params`).
        ValueError: inside an action, params that hold the bot token (a Bot API file
            download URL ``.../file/bot<token>/...`` as the document): send its
            ``file_id`` instead; nothing is stored (see ``Outbound.call``).
    """

    __slots__ = ("outbound", "wait")

    def __init__(self, outbound: Outbound, *, wait: float = 60.0) -> None:
        self.outbound = outbound
        self.wait = wait

    async def initialize(self) -> None:
        """Nothing to set up: the outbound runs its relay on its own."""

    async def shutdown(self) -> None:
        """Nothing to release: the outbound's owner stops it."""

    async def process_request(
        self,
        callback: Callback,
        args: Any,
        kwargs: dict[str, Any],
        endpoint: str,
        data: dict[str, Any],
        rate_limit_args: int | None,
    ) -> JSON:
        """Send the request through the outbox (see the class docstring); the JSON
        ``result`` PTB expects from ``callback``.

        Args:
            callback: PTB's coroutine function making the request.
            args: its positional arguments (PTB's).
            kwargs: its keyword arguments (PTB's).
            endpoint: the Bot API method called.
            data: the request's parameters, as PTB passes them.
            rate_limit_args: the call's priority, an ``int`` given as ``rate_limit_args=`` (0
                replies … 10 bulk; ``None``: the default).
        """
        if goes_direct(endpoint):
            return await callback(*args, **kwargs)
        try:
            result: JSON = await self.outbound.call(
                endpoint, request_params(data), priority=rate_limit_args, wait=self.wait
            )
        except SendFailedError as err:
            raise to_ptb_error(err) from err
        return result


class FloodRateLimiter(BaseRateLimiter[int]):
    """Pace every Bot API call of a PTB application by flood control shared by every
    process of the bot (no outbox):
    ``ApplicationBuilder().rate_limiter(FloodRateLimiter(flood))``.

    Before each request it waits for the call's turn (``flood.wait_turn``: the bot's
    pause gate, the global, chat and group budgets). On ``RetryAfter`` (a 429) it pauses
    the whole bot for ``retry_after`` seconds in the store (``flood.retry_after``: every
    process waits) and sends the request again once the pause ends, at most
    ``max_retries`` times; a 429 means Telegram did not apply the call.
    ``rate_limit_args`` (an ``int``) is the call's priority (0 replies … 10 bulk).

    Args:
        flood: the shared flood control (``telegram_idem.flood.FloodControl``).
        max_retries: sends after a 429 before the ``RetryAfter`` is raised.

    Raises (from a call made through the bot):
        RetryAfter: still 429 after ``max_retries`` sends.
        StoreError: flood control's store could not answer.
        TelegramError: whatever else PTB raises, unchanged.
    """

    __slots__ = ("flood", "max_retries")

    def __init__(self, flood: FloodControl, *, max_retries: int = DEFAULT_MAX_RETRIES) -> None:
        self.flood = flood
        self.max_retries = max_retries

    async def initialize(self) -> None:
        """Nothing to set up: flood control lives in the store."""

    async def shutdown(self) -> None:
        """Nothing to release."""

    async def process_request(
        self,
        callback: Callback,
        args: Any,
        kwargs: dict[str, Any],
        endpoint: str,
        data: dict[str, Any],
        rate_limit_args: int | None,
    ) -> JSON:
        """Wait for the call's turn, send it, and send it again after a 429 (see the
        class docstring); the JSON ``result`` of ``callback``.

        Args:
            callback: PTB's coroutine function making the request.
            args: its positional arguments (PTB's).
            kwargs: its keyword arguments (PTB's).
            endpoint: the Bot API method called.
            data: the request's parameters, as PTB passes them.
            rate_limit_args: the call's priority, an ``int`` given as ``rate_limit_args=`` (0
                replies … 10 bulk; ``None``: the default).
        """
        hints = {
            "chat_id": data.get("chat_id"),
            "allow_paid_broadcast": data.get("allow_paid_broadcast") is True,
        }
        return await paced(
            self.flood,
            endpoint,
            hints,
            lambda: callback(*args, **kwargs),
            retry_after_of,
            priority=rate_limit_args if isinstance(rate_limit_args, int) else None,
            max_retries=self.max_retries,
        )
