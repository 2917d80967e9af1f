"""A fake Telegram Bot API server on loopback, for tests that must never call Telegram.

`FakeBotAPI` is an aiohttp web server bound to ``127.0.0.1`` on a free port. It answers
``/bot<token>/<method>`` the way https://core.telegram.org/bots/api does ("Making requests":
``{"ok": true, "result": ...}`` or ``{"ok": false, "error_code": ..., "description": ...}``),
closely enough for aiogram 3 and python-telegram-bot to parse every answer into their models.
It reads query strings, JSON bodies, ``application/x-www-form-urlencoded`` bodies and
``multipart/form-data`` bodies; in form bodies non-string values arrive JSON-encoded (aiogram 3
and python-telegram-bot both send that way) and are decoded back.

Point a client at it::

    async with FakeBotAPI() as api:
        bot = Bot(token, session=AiohttpSession(api=TelegramAPIServer.from_base(api.url)))
        # python-telegram-bot: Bot(token, base_url=api.ptb_base_url)

Every request is recorded as a `Call`. Methods with built-in behaviour: ``getMe``,
``sendMessage``, ``editMessageText``, ``editMessageReplyMarkup``, ``deleteMessage``,
``answerCallbackQuery``, ``setWebhook``, ``deleteWebhook``, ``getWebhookInfo``, ``getUpdates``,
and Telegram Stars payments: ``sendInvoice``, ``answerPreCheckoutQuery`` (within its 10 s
deadline), ``refundStarPayment`` (``CHARGE_ALREADY_REFUNDED`` the second time), kept in
`FakeBotAPI.payments` (`telegram_idem.testing._payments`).
Any other method is recorded in `FakeBotAPI.unknown_methods` and answers ``true`` unless
`FakeBotAPI.set_result` gave it a result. Method names are case-insensitive, as in the Bot API.

Faults, answered exactly as Telegram does (`Fault`: 429 ``retry_after`` for a method, a
chat or the whole bot; accept-then-drop and late answers, the ambiguous sends; 5xx applied
or not; 403 blocked; 400 not modified, query too old, migrated to a supergroup)::

    api.inject(Fault.retry_after(5, chat_id=42, times=3))
    api.inject(Fault.drop(method="sendMessage"))      # stored and counted, never answered
    api.inject(Fault.blocked(42))                     # until api.clear_faults(chat_id=42)

``FakeBotAPI(limits=Limits())`` enforces flood limits with the library's own rule
(`telegram_idem.flood.buckets_for` + `telegram_idem.flood.decide`): a call over them is
answered 429 with ``retry_after`` = the wait, rounded up. Assertions for a bot's tests:
`FakeBotAPI.assert_sent_once`, `FakeBotAPI.assert_no_429`,
`FakeBotAPI.assert_no_repeated_text`, `FakeBotAPI.sent_texts`.

Another process controls the fake over HTTP on the same port: ``POST /_fake/faults``
(a fault's JSON form), ``DELETE /_fake/faults[?method=&chat_id=]``, ``GET /_fake/state``
(calls, messages, sent texts, error answers as JSON); `FakeBotAPIControl` is the client.

Run it for a bot in another process (prints its URL, serves until SIGINT or SIGTERM)::

    python -m telegram_idem.testing.bot_api --port 8081 [--updates updates.json] [--limits]

Deliberate simplifications: ``parse_mode`` is not rendered (``text`` is echoed verbatim and
"not modified" compares text, parse mode, entities and markup as sent); message ids come from
one counter shared by all chats; inline-message edits always succeed; ``allowed_updates`` is
recorded but does not filter ``getUpdates``; as on Telegram, one long poll per bot at
a time: a ``getUpdates`` arriving while another of the same bot waits (its client still
connected) ends that one with 409 "Conflict: terminated by other getUpdates request"
(`FakeBotAPI.poll_conflicts` counts them); faults are per fake, not per bot token (flood
budgets are per bot); ``callback_answer_window`` counts from when the update was queued.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import copy
import dataclasses
import json
import math
import re
import signal
import sys
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from telegram_idem.flood import Limits, buckets_for, decide
from telegram_idem.testing._faults import (
    BLOCKED,
    MIGRATED,
    NOT_MODIFIED,
    QUERY_TOO_OLD,
    Fault,
    FaultKind,
)
from telegram_idem.testing._loopback import LoopbackServer
from telegram_idem.testing._payments import (
    PRE_CHECKOUT_DEADLINE,
    Charge,
    Payments,
    PreCheckoutAnswer,
    SentInvoice,
)
from telegram_idem.testing._payments import PaymentError as _PaymentError
from telegram_idem.testing._sent import check_no_429, check_no_repeated_text, check_sent_once

__all__ = [
    "BLOCKED",
    "MIGRATED",
    "NOT_MODIFIED",
    "QUERY_TOO_OLD",
    "Call",
    "Charge",
    "ErrorAnswer",
    "FakeBotAPI",
    "FakeBotAPIControl",
    "Fault",
    "FaultKind",
    "Payments",
    "PreCheckoutAnswer",
    "SentInvoice",
    "SentMessage",
    "UploadedFile",
    "WebhookState",
    "main",
]

EDIT_NOT_FOUND = "Bad Request: message to edit not found"

# Fields whose values are strings even when they look like JSON ("123", "true").
_STRING_FIELDS = frozenset(
    {
        "text",
        "caption",
        "parse_mode",
        "callback_query_id",
        "inline_query_id",
        "pre_checkout_query_id",
        "shipping_query_id",
        "inline_message_id",
        "business_connection_id",
        "message_effect_id",
        "url",
        "secret_token",
        "ip_address",
        "error_message",
        "title",
        "description",
        "payload",
        "currency",
        "emoji",
        "question",
        "phone_number",
        "first_name",
        "last_name",
        "name",
        "short_description",
        "next_offset",
        "start_parameter",
        "provider_token",
        "telegram_payment_charge_id",
    }
)
_SECRET_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,256}")
_MAX_TEXT = 4096
_MAX_CALLBACK_DATA = 64

Params = dict[str, Any]
ResultFactory = Callable[[Params], Any]


@dataclass(frozen=True, slots=True)
class Call:
    """One request the fake received (``FakeBotAPI.calls``, in arrival order).

    Attributes:
        method: the method name as the client spelled it (``sendMessage``, or
            ``sendmessage``: the Bot API's names are case-insensitive).
        params: the decoded parameters, from the query string, a JSON body, a form or a
            multipart body: form values JSON-decoded except the known string fields
            (``text``, ``caption``…); uploads as :class:`UploadedFile`.
        at: the ``time.monotonic()`` reading, seconds, when the request arrived (compare
            two calls' ``at`` for the pacing between them).
        token: the bot token from the URL (``/bot<token>/<method>``); ``""`` when made by
            hand.
    """

    method: str
    params: Params
    at: float
    token: str = ""


@dataclass(frozen=True, slots=True)
class UploadedFile:
    """A file part of a multipart request (``InputFile`` in the Bot API).

    Attributes:
        filename: the part's file name, as the client sent it.
        content_type: the part's ``Content-Type``.
        data: the file's bytes.
    """

    filename: str
    content_type: str
    data: bytes


@dataclass(slots=True)
class SentMessage:
    """Current state of a message the bot sent (after edits): text, markup, edit count.

    Attributes:
        chat_id: the chat it was sent to, as the call gave it (a number or ``@username``).
        message_id: its id in that chat (the fake numbers them from 1 per chat).
        text: its text (or caption), as last edited; ``None`` for media without one.
        reply_markup: its inline keyboard, as last set; ``None`` when it has none.
        parse_mode: the ``parse_mode`` it was sent (or last edited) with.
        entities: the ``entities`` it was sent (or last edited) with.
        edits: how many edits changed it (an edit to the same content is refused with
            "message is not modified" and not counted).
        deleted: ``deleteMessage`` removed it.
        message: the whole Bot API ``Message`` the fake answered with, as last edited.
    """

    chat_id: int | str
    message_id: int
    text: str | None
    reply_markup: dict[str, Any] | None = None
    parse_mode: str | None = None
    entities: list[Any] | None = None
    edits: int = 0
    deleted: bool = False
    message: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class WebhookState:
    """What ``setWebhook``/``deleteWebhook`` left behind (Bot API "setWebhook").

    Attributes:
        url: the webhook URL set; ``""`` when none is (``getUpdates`` then works).
        secret_token: the ``secret_token`` given to ``setWebhook``, or ``None``.
        allowed_updates: the update types asked for, or ``None`` (all but the defaults
            Telegram leaves out).
        max_connections: the ``max_connections`` given, or ``None``.
        dropped_updates: how many queued updates ``drop_pending_updates=true`` discarded,
            over every call.
        ip_address: what ``getWebhookInfo`` reports as the webhook's IP address while
            one is set (Bot API "WebhookInfo"); a test sets it (``None``: not reported).
        last_error_date: when delivery to the webhook last failed, Unix time in seconds,
            as ``getWebhookInfo`` reports it; a test sets it to show a failing webhook
            (``None``: not reported).
        last_error_message: why it failed, as ``getWebhookInfo`` reports it (``None``:
            not reported).
    """

    url: str = ""
    secret_token: str | None = None
    allowed_updates: list[str] | None = None
    max_connections: int | None = None
    dropped_updates: int = 0
    ip_address: str | None = None
    last_error_date: int | None = None
    last_error_message: str | None = None


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """An error the fake answered instead of a result.

    Attributes:
        call: the call it answered.
        error_code: the HTTP status and ``error_code``.
        description: the ``description``.
        parameters: the ``ResponseParameters`` sent (``retry_after``,
            ``migrate_to_chat_id``), or ``None``.
        source: ``"fault"`` (injected), ``"limits"`` (flood limits enforced),
            ``"conflict"`` (a long poll ended by a newer ``getUpdates`` of the same bot)
            or ``"api"`` (the fake's own checks: not modified, message not found, ...).
    """

    call: Call
    error_code: int
    description: str
    parameters: dict[str, Any] | None
    source: str


@dataclass(slots=True)
class _Active:
    """An injected fault and how many more calls it hits (``None``: until cleared)."""

    fault: Fault
    left: int | None


@dataclass(slots=True)
class _Poll:
    """A ``getUpdates`` long poll in progress, and how to end it with 409."""

    request: web.Request
    terminated: asyncio.Event = field(default_factory=asyncio.Event)

    def connected(self) -> bool:
        transport = self.request.transport
        return transport is not None and not transport.is_closing()


_REQUEST: contextvars.ContextVar[web.Request | None] = contextvars.ContextVar(
    "fake_bot_api_request", default=None
)
"""The request being answered (each aiohttp handler runs in its own task)."""

CONFLICT_TERMINATED = (
    "Conflict: terminated by other getUpdates request; "
    "make sure that only one bot instance is running"
)
"""The 409 description Telegram gives a long poll that a newer ``getUpdates`` of the
same bot ended."""


class _APIError(Exception):
    def __init__(
        self,
        status: int,
        description: str,
        retry_after: int | None = None,
        *,
        parameters: dict[str, Any] | None = None,
        source: str = "api",
    ) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        if retry_after is not None:
            parameters = {**(parameters or {}), "retry_after": retry_after}
        self.parameters = parameters
        self.source = source


def _chat_key(value: Any) -> int | str:
    if isinstance(value, bool):
        raise _APIError(400, "Bad Request: chat not found")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value:
        try:
            return int(value)
        except ValueError:
            return value
    raise _APIError(400, "Bad Request: chat_id is empty")


def _chat_of(params: Params) -> int | str | None:
    """The chat a call addresses, or ``None`` (no or unusable ``chat_id``)."""
    try:
        return _chat_key(params["chat_id"]) if "chat_id" in params else None
    except _APIError:
        return None


def _fail_next_fault(
    method: str, status: int, retry_after: int, description: str | None, times: int
) -> Fault:
    """`FakeBotAPI.fail_next`'s fault (shared with `FakeBotAPIControl.fail_next`)."""
    if times < 1:
        raise ValueError("times must be >= 1")
    if status == 429:
        fault = Fault.retry_after(retry_after, method=method, times=times)
        if description is not None:
            fault = Fault.error(
                429, description, method=method, times=times, parameters=fault.parameters
            )
        return fault
    return Fault.error(status, description, method=method, times=times)


def _jsonable(value: Any) -> Any:
    if isinstance(value, UploadedFile):
        return {
            "filename": value.filename,
            "content_type": value.content_type,
            "size": len(value.data),
        }
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _decode(name: str, value: str) -> Any:
    if name in _STRING_FIELDS:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _normalize_markup(markup: Any) -> dict[str, Any] | None:
    """Inline keyboards as Telegram stores them; other keyboards are not part of a Message."""
    if isinstance(markup, str):
        markup = json.loads(markup) if markup else None
    if not isinstance(markup, dict) or not markup.get("inline_keyboard"):
        return None
    rows: list[list[dict[str, Any]]] = []
    for row in markup["inline_keyboard"]:
        buttons = []
        for button in row:
            clean = {k: v for k, v in button.items() if v is not None}
            data = clean.get("callback_data")
            if data is not None and not 1 <= len(str(data).encode()) <= _MAX_CALLBACK_DATA:
                raise _APIError(400, "Bad Request: BUTTON_DATA_INVALID")
            buttons.append(clean)
        rows.append(buttons)
    return {"inline_keyboard": rows}


class FakeBotAPI(LoopbackServer):
    """Loopback stand-in for ``https://api.telegram.org`` (Bot API "Making requests").

    Args:
        bot_first_name: the ``first_name`` of the ``getMe`` user (its id is the number
            before ``:`` in each token; the default matches the shipped fixtures).
        bot_username: the ``username`` of the ``getMe`` user (the default matches the
            shipped fixtures).
        long_poll_cap: seconds ``getUpdates`` waits at most for an update, whatever
            ``timeout`` the client asked.
        limits: flood limits to enforce (`telegram_idem.flood.Limits`), or ``None`` (the
            default: no limits). A call over them is answered 429 ``"Too Many Requests:
            retry after N"`` with ``parameters.retry_after`` = N, the wait in seconds
            rounded up, and spends nothing. Limits are checked first: a call within them
            spends its budgets even when an injected fault then hits it, and a call over
            them uses up no fault. Method names are read as the Bot API spells them
            (``sendMessage``).
        callback_answer_window: seconds after a callback query was queued
            (`queue_update`) within which ``answerCallbackQuery`` succeeds; later it is
            answered 400 "query is too old" (Telegram's window is about 15 s). ``None``
            (the default): no window.
        pre_checkout_answer_window: seconds after a pre-checkout query was made known
            (`queue_update`, `learn_update`) within which ``answerPreCheckoutQuery``
            succeeds (default Telegram's 10 s); later it is answered 400 "query is too
            old". ``None``: no window.
    """

    def __init__(
        self,
        *,
        bot_first_name: str = "Blog Bot",
        bot_username: str = "example_blog_bot",
        long_poll_cap: float = 1.0,
        limits: Limits | None = None,
        callback_answer_window: float | None = None,
        pre_checkout_answer_window: float | None = PRE_CHECKOUT_DEADLINE,
    ) -> None:
        super().__init__()
        self.bot_first_name = bot_first_name
        self.bot_username = bot_username
        self.long_poll_cap = long_poll_cap
        self.limits = limits
        self.callback_answer_window = callback_answer_window
        self.calls: list[Call] = []
        self.unknown_methods: list[str] = []
        self.webhook = WebhookState()
        self.errors: list[ErrorAnswer] = []
        """Every error answer, in order (injected, enforced limits, the fake's checks)."""
        self.dropped: list[Call] = []
        """Calls whose connection a ``drop`` fault closed without an answer."""
        self.payments = Payments(pre_checkout_answer_window=pre_checkout_answer_window)
        """Invoices sent, pre-checkout answers, charges and their refunds."""
        self._sent: list[tuple[int | str, int, str]] = []
        self._tats: dict[str, float] = {}
        self._callbacks_queued: dict[str, float] = {}
        self._messages: dict[tuple[int | str, int], SentMessage] = {}
        self._chats: dict[int | str, dict[str, Any]] = {}
        self._next_message_id = 1
        self._updates: list[dict[str, Any]] = []
        self._updates_changed = asyncio.Event()
        self._polls: dict[str, _Poll] = {}
        self._answered: list[str] = []
        self._faults: list[_Active] = []
        self._results: dict[str, ResultFactory] = {}
        self._closing = asyncio.Event()
        self._handlers: dict[str, Callable[[str, Params], Awaitable[Any]]] = {
            "getme": self._get_me,
            "sendmessage": self._send_message,
            "editmessagetext": self._edit_message_text,
            "editmessagereplymarkup": self._edit_message_reply_markup,
            "deletemessage": self._delete_message,
            "answercallbackquery": self._answer_callback_query,
            "setwebhook": self._set_webhook,
            "deletewebhook": self._delete_webhook,
            "getwebhookinfo": self._get_webhook_info,
            "getupdates": self._get_updates,
            "sendinvoice": self._send_invoice,
            "answerprecheckoutquery": self._answer_pre_checkout_query,
            "refundstarpayment": self._refund_star_payment,
        }

    # ----------------------------------------------------------------- lifecycle

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=50 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        app.router.add_post("/_fake/faults", self._control_inject)
        app.router.add_delete("/_fake/faults", self._control_clear)
        app.router.add_get("/_fake/state", self._control_state)
        self._closing.clear()
        return app

    async def before_close(self) -> None:
        """Pending ``getUpdates`` long polls answer ``[]`` before the server stops."""
        self._closing.set()
        self._updates_changed.set()

    @property
    def ptb_base_url(self) -> str:
        """``base_url`` for python-telegram-bot's ``Bot`` (the token is appended to it)."""
        return f"{self.url}/bot"

    # ----------------------------------------------------------------- test controls

    def queue_update(self, update: Mapping[str, Any]) -> None:
        """Queue an Update (a JSON-shaped mapping with an int ``update_id``) for ``getUpdates``.

        Chats and bot messages inside it become known (so the bot can edit the message under
        a callback query).

        Args:
            update: the Bot API ``Update`` (copied; later changes to it are not seen).

        Raises:
            ValueError: ``update`` has no int ``update_id``.
        """
        update_id = update.get("update_id")
        if not isinstance(update_id, int) or isinstance(update_id, bool):
            raise ValueError("an update needs an integer update_id")
        stored = copy.deepcopy(dict(update))
        self.learn_update(stored)
        self._updates.append(stored)
        self._wake_pollers()

    def learn_update(self, update: Mapping[str, Any]) -> None:
        """Know what ``update`` shows without queuing it (for an update fed to the bot
        directly): its chats and the bot's messages in it, a callback query's or a
        pre-checkout query's answer window starts now, and a ``successful_payment``'s
        charge becomes refundable. `queue_update` does this too.

        Args:
            update: the Bot API ``Update`` (copied).
        """
        stored = copy.deepcopy(dict(update))
        for value in stored.values():
            if isinstance(value, dict):
                self._learn(value)
        query = stored.get("callback_query")
        if isinstance(query, dict) and query.get("id") is not None:
            self._callbacks_queued.setdefault(str(query["id"]), time.monotonic())
        self.payments.learn(stored)

    def invoices(self, chat_id: int | str) -> list[SentInvoice]:
        """Invoices ``sendInvoice`` sent to ``chat_id``, in sending order.

        Args:
            chat_id: the chat (a number or ``@username``; compared as text).
        """
        return [i for i in self.payments.invoices if str(i.chat_id) == str(chat_id)]

    def seed_message(self, message: Mapping[str, Any]) -> SentMessage:
        """Make a Message (Bot API "Message" shape) exist, as if the bot had sent it earlier.

        Args:
            message: the Bot API ``Message``; needs ``chat`` (with its ``id``) and
                ``message_id`` (later messages the fake sends are numbered past it).

        Returns:
            The message's state, as :meth:`message` returns it.
        """
        chat = dict(message["chat"])
        key = _chat_key(chat["id"])
        self._chats.setdefault(key, chat)
        message_id = int(message["message_id"])
        sent = SentMessage(
            chat_id=key,
            message_id=message_id,
            text=message.get("text"),
            reply_markup=_normalize_markup(message.get("reply_markup")),
            entities=message.get("entities"),
            message=copy.deepcopy(dict(message)),
        )
        self._messages[(key, message_id)] = sent
        self._next_message_id = max(self._next_message_id, message_id + 1)
        return sent

    def fail_next(
        self,
        method: str,
        status: int = 429,
        retry_after: int = 1,
        *,
        description: str | None = None,
        times: int = 1,
    ) -> None:
        """Make the next ``times`` calls of ``method`` fail with HTTP ``status``.

        429 answers mirror Bot API flood control: ``"Too Many Requests: retry after N"`` with
        ``parameters.retry_after`` = ``retry_after`` seconds (aiogram raises
        ``TelegramRetryAfter``). Other statuses carry ``description`` or the HTTP reason
        phrase and no ``parameters``. The failed call is still recorded in `calls`.
        Shorthand for `inject` with `Fault.retry_after` / `Fault.error`.

        Args:
            method: the Bot API method (case-insensitive), e.g. ``"sendMessage"``.
            status: the HTTP status (and ``error_code``) of the answer; default 429.
            retry_after: seconds the 429 answer asks to wait (``parameters.retry_after``);
                only for ``status=429``.
            description: the answer's ``description`` (default: the HTTP reason phrase, or
                the flood-control text for 429).
            times: how many calls in a row it fails (≥ 1).

        Raises:
            ValueError: ``times`` < 1.
        """
        self.inject(_fail_next_fault(method, status, retry_after, description, times))

    def inject(self, fault: Fault) -> None:
        """Add ``fault``: the calls it hits (its method, its chat, or every call) get it
        instead of their answer until it is used up (``fault.times``) or cleared. When
        several faults hit a call, the oldest answers it (and only it is used).

        Args:
            fault: what to answer and which calls it hits (:class:`Fault`).
        """
        self._faults.append(_Active(fault, fault.times))

    def clear_faults(self, *, method: str | None = None, chat_id: int | str | None = None) -> int:
        """Remove the injected faults for ``method`` and/or ``chat_id`` (each ``None``:
        any); returns how many were removed. ``clear_faults()`` removes them all.

        Args:
            method: only the faults of this method (case-insensitive); ``None``: any.
            chat_id: only the faults of this chat; ``None``: any.

        Returns:
            How many faults were removed.
        """

        def removed(active: _Active) -> bool:
            fault = active.fault
            if method is not None and (fault.method or "").lower() != method.lower():
                return False
            return chat_id is None or str(fault.chat_id) == str(chat_id)

        before = len(self._faults)
        self._faults = [a for a in self._faults if not removed(a)]
        return before - len(self._faults)

    @property
    def faults(self) -> list[Fault]:
        """The faults still active, oldest first, ``times`` as many as they have left."""
        return [dataclasses.replace(a.fault, times=a.left) for a in self._faults]

    def set_result(self, method: str, result: Any) -> None:
        """Answer ``method`` with ``result``, or ``result(params)`` if callable.

        For methods the fake does not model (``sendPhoto`` needs a Message, not ``true``).

        Args:
            method: the Bot API method (case-insensitive); replaces the fake's own
                handling of it.
            result: the ``result`` of every answer, or a callable from the call's
                decoded parameters to it.
        """
        factory: ResultFactory = result if callable(result) else (lambda _p: result)
        self._handlers.pop(method.lower(), None)
        self._results[method.lower()] = factory

    # ----------------------------------------------------------------- inspection

    def calls_of(self, method: str) -> list[Call]:
        """Recorded calls of ``method`` (case-insensitive), oldest first.

        Args:
            method: the Bot API method, e.g. ``"sendMessage"``.
        """
        wanted = method.lower()
        return [call for call in self.calls if call.method.lower() == wanted]

    def messages(self, chat_id: int | str) -> list[SentMessage]:
        """Messages the bot sent (or `seed_message`) to ``chat_id`` and has not deleted,
        by ``message_id``, in their current state after edits.

        Args:
            chat_id: the chat (a number or ``@username``).
        """
        key = _chat_key(chat_id)
        found = [m for (c, _), m in self._messages.items() if c == key and not m.deleted]
        return sorted(found, key=lambda m: m.message_id)

    def message(self, chat_id: int | str, message_id: int) -> SentMessage | None:
        """One message's current state (deleted ones included), or None.

        Args:
            chat_id: the chat (a number or ``@username``).
            message_id: the message's id in that chat.
        """
        return self._messages.get((_chat_key(chat_id), message_id))

    def answered_callback_ids(self) -> list[str]:
        """``callback_query_id`` of every successful ``answerCallbackQuery``, in order, repeats
        kept (calls failed by `fail_next` are not answers)."""
        return list(self._answered)

    @property
    def pending_updates(self) -> list[dict[str, Any]]:
        """Queued updates not yet confirmed by a ``getUpdates`` offset."""
        return list(self._updates)

    def sent_texts(self, chat_id: int | str) -> list[str]:
        """Texts of every message ``sendMessage`` stored for ``chat_id``, in sending
        order, as sent (later edits and deletes do not change them; a call a fault
        dropped after it took effect counts, as on Telegram).

        Args:
            chat_id: the chat (a number or ``@username``).
        """
        key = _chat_key(chat_id)
        return [text for chat, _, text in self._sent if str(chat) == str(key)]

    @property
    def limit_429s(self) -> int:
        """How many calls the enforced flood limits answered 429."""
        return sum(1 for e in self.errors if e.source == "limits")

    @property
    def poll_conflicts(self) -> int:
        """How many long polls a newer ``getUpdates`` of the same bot ended with 409
        "Conflict: terminated by other getUpdates request" (two pollers at once)."""
        return sum(1 for e in self.errors if e.source == "conflict")

    def assert_sent_once(self, chat_id: int | str, text: str) -> None:
        """``text`` was sent to ``chat_id`` exactly once.

        Args:
            chat_id: the chat (a number or ``@username``).
            text: the text, compared exactly.

        Raises:
            AssertionError: it was sent 0 or several times (the message lists what was).
        """
        check_sent_once(self.sent_texts(chat_id), chat_id, text)

    def assert_no_repeated_text(self, chat_id: int | str) -> None:
        """No text was sent twice to ``chat_id``.

        Args:
            chat_id: the chat (a number or ``@username``).

        Raises:
            AssertionError: some text was (named, with everything sent to the chat).
        """
        check_no_repeated_text(self.sent_texts(chat_id), chat_id)

    def assert_no_429(self) -> None:
        """No call was answered 429, injected or by the enforced limits.

        Raises:
            AssertionError: some were (each listed: method, chat, retry_after, source).
        """
        check_no_429(
            [
                _describe_429(e.call.method, e.call.params, e.parameters, e.source)
                for e in self.errors
                if e.error_code == 429
            ]
        )

    def state(self) -> dict[str, Any]:
        """Everything recorded, as JSON (what ``GET /_fake/state`` answers): ``calls``,
        ``messages`` (current state), ``sent`` (``[chat_id, message_id, text]`` as sent),
        ``errors``, ``dropped`` (indexes into ``calls``), ``answered_callback_ids``,
        ``faults``, ``limit_429s`` and ``payments`` (``invoices``: chat, message id,
        payload, currency, total; ``pre_checkout_answers``; ``charges``: id, user, total,
        refunds, refund attempts)."""
        index = {id(c): i for i, c in enumerate(self.calls)}
        return {
            "calls": [
                {"method": c.method, "params": _jsonable(c.params), "at": c.at, "token": c.token}
                for c in self.calls
            ],
            "messages": [
                {
                    "chat_id": m.chat_id,
                    "message_id": m.message_id,
                    "text": m.text,
                    "reply_markup": m.reply_markup,
                    "edits": m.edits,
                    "deleted": m.deleted,
                }
                for m in sorted(self._messages.values(), key=lambda m: m.message_id)
            ],
            "sent": [[chat, mid, text] for chat, mid, text in self._sent],
            "errors": [
                {
                    "call": index.get(id(e.call)),
                    "method": e.call.method,
                    "chat_id": _jsonable(e.call.params.get("chat_id")),
                    "error_code": e.error_code,
                    "description": e.description,
                    "parameters": e.parameters,
                    "source": e.source,
                }
                for e in self.errors
            ],
            "dropped": [index.get(id(c)) for c in self.dropped],
            "answered_callback_ids": list(self._answered),
            "faults": [f.to_json() for f in self.faults],
            "limit_429s": self.limit_429s,
            "payments": {
                "invoices": [
                    {
                        "chat_id": i.chat_id,
                        "message_id": i.message_id,
                        "payload": i.payload,
                        "currency": i.currency,
                        "total_amount": i.total_amount,
                    }
                    for i in self.payments.invoices
                ],
                "pre_checkout_answers": [
                    dataclasses.asdict(a) for a in self.payments.pre_checkout_answers
                ],
                "charges": [
                    {
                        "charge_id": c.charge_id,
                        "user_id": c.user_id,
                        "total_amount": c.total_amount,
                        "refunds": c.refunds,
                        "refund_attempts": c.refund_attempts,
                    }
                    for c in self.payments.charges.values()
                ],
            },
        }

    # ----------------------------------------------------------------- HTTP plumbing

    async def _handle(self, request: web.Request) -> web.Response:
        token = request.match_info["token"]
        method = request.match_info["method"]
        try:
            params = await self._read_params(request)
        except _APIError as err:
            return self._error(err)
        call = Call(method, params, time.monotonic(), token)
        self.calls.append(call)
        _REQUEST.set(request)
        try:
            bot_id = self._bot_id(token)
            self._spend(bot_id, method, params)
            fault = self._take_fault(method, _chat_of(params))
            if fault is not None and not fault.applied:
                if fault.kind is not FaultKind.SLOW:
                    return self._fault_answer(fault, call, request)
                await asyncio.sleep(fault.delay)  # late, then it takes effect
            result = await self._run(bot_id, method, params)
            if fault is not None and fault.applied:
                if fault.kind is not FaultKind.SLOW:
                    return self._fault_answer(fault, call, request)
                await asyncio.sleep(fault.delay)  # took effect, answers late
        except _APIError as err:
            return self._error(err, call)
        return web.json_response({"ok": True, "result": result})

    async def _run(self, bot_id: int, method: str, params: Params) -> Any:
        handler = self._handlers.get(method.lower())
        if handler is not None:
            return await handler(str(bot_id), params)
        if (factory := self._results.get(method.lower())) is not None:
            return factory(params)
        self.unknown_methods.append(method)
        return True

    def _spend(self, bot_id: int, method: str, params: Params) -> None:
        """Reserve the call in the enforced flood budgets; raises the 429 when over."""
        if self.limits is None:
            return
        buckets = buckets_for(method, params, limits=self.limits, key=lambda s: f"{bot_id}:{s}")
        now = time.monotonic()
        wait, new = decide([self._tats.get(b.key) for b in buckets], buckets, now)
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            raise _APIError(
                429, f"Too Many Requests: retry after {seconds}", seconds, source="limits"
            )
        for bucket, tat in zip(buckets, new, strict=True):
            self._tats[bucket.key] = tat

    def _take_fault(self, method: str, chat: int | str | None) -> Fault | None:
        """The oldest active fault that hits this call, one use spent."""
        for active in self._faults:
            if active.fault.hits(method, chat):
                if active.left is not None:
                    active.left -= 1
                    if active.left <= 0:
                        self._faults.remove(active)
                return active.fault
        return None

    def _fault_answer(self, fault: Fault, call: Call, request: web.Request) -> web.Response:
        """An error fault's answer, or a drop's closed connection."""
        if fault.kind is FaultKind.DROP:
            self.dropped.append(call)
            if request.transport is not None:
                request.transport.abort()  # no answer: the client sees a disconnect
            return web.Response(status=204)  # never reaches the client
        err = _APIError(
            fault.status, fault.description, parameters=fault.parameters, source="fault"
        )
        return self._error(err, call)

    # ----------------------------------------------------------------- control endpoint

    async def _control_inject(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
            if not isinstance(data, dict):
                raise ValueError("a fault is a JSON object")
            fault = Fault.from_json(data)
        except ValueError as exc:
            return web.json_response({"ok": False, "description": str(exc)}, status=400)
        self.inject(fault)
        return web.json_response({"ok": True})

    async def _control_clear(self, request: web.Request) -> web.Response:
        chat: int | str | None = request.query.get("chat_id")
        if isinstance(chat, str) and chat.lstrip("-").isdigit():
            chat = int(chat)
        removed = self.clear_faults(method=request.query.get("method"), chat_id=chat)
        return web.json_response({"ok": True, "removed": removed})

    async def _control_state(self, request: web.Request) -> web.Response:
        return web.json_response(self.state())

    @staticmethod
    async def _read_params(request: web.Request) -> Params:
        params: Params = {k: _decode(k, v) for k, v in request.query.items()}
        if not request.body_exists:
            return params
        if request.content_type == "application/json":
            try:
                body = await request.json()
            except ValueError as err:
                raise _APIError(400, "Bad Request: can't parse JSON") from err
            if not isinstance(body, dict):
                raise _APIError(400, "Bad Request: JSON object expected")
            params.update(body)
            return params
        form = await request.post()
        for name, value in form.items():
            if isinstance(value, web.FileField):
                params[name] = UploadedFile(value.filename, value.content_type, value.file.read())
            elif isinstance(value, str):
                params[name] = _decode(name, value)
            else:
                params[name] = value
        return params

    def _error(self, err: _APIError, call: Call | None = None) -> web.Response:
        body: dict[str, Any] = {
            "ok": False,
            "error_code": err.status,
            "description": err.description,
        }
        if err.parameters:
            body["parameters"] = dict(err.parameters)
        if call is not None:
            self.errors.append(
                ErrorAnswer(call, err.status, err.description, err.parameters, err.source)
            )
        return web.json_response(body, status=err.status)

    @staticmethod
    def _bot_id(token: str) -> int:
        head, sep, tail = token.partition(":")
        if not sep or not tail or not head.isdigit():
            raise _APIError(401, "Unauthorized")
        return int(head)

    def _bot_user(self, bot_id: int) -> dict[str, Any]:
        return {
            "id": bot_id,
            "is_bot": True,
            "first_name": self.bot_first_name,
            "username": self.bot_username,
        }

    def _learn(self, payload: dict[str, Any]) -> None:
        chat = payload.get("chat")
        if isinstance(chat, dict) and "id" in chat:
            self._chats.setdefault(_chat_key(chat["id"]), dict(chat))
        inner = payload.get("message")
        if isinstance(inner, dict) and "chat" in inner and "message_id" in inner:
            sender = inner.get("from")
            if isinstance(sender, dict) and sender.get("is_bot"):
                if (_chat_key(inner["chat"]["id"]), inner["message_id"]) not in self._messages:
                    self.seed_message(inner)
            else:
                self._learn(inner)

    def _wake_pollers(self) -> None:
        self._updates_changed.set()
        self._updates_changed = asyncio.Event()

    def _chat(self, key: int | str) -> dict[str, Any]:
        known = self._chats.get(key)
        if known is not None:
            return dict(known)
        if isinstance(key, str):  # "@channelusername"
            fake_id = -1000000000000 - zlib.crc32(key.encode()) % 10**9
            return {"id": fake_id, "type": "channel", "title": key.lstrip("@")}
        if key > 0:
            return {"id": key, "type": "private", "first_name": "User"}
        if key <= -1000000000000:
            return {"id": key, "type": "supergroup", "title": "Group"}
        return {"id": key, "type": "group", "title": "Group"}

    # ----------------------------------------------------------------- methods

    async def _answer_callback_query(self, bot_id: str, params: Params) -> Any:
        query_id = params.get("callback_query_id")
        if not query_id:
            raise _APIError(400, QUERY_TOO_OLD)
        queued = self._callbacks_queued.get(str(query_id))
        window = self.callback_answer_window
        if window is not None and queued is not None and time.monotonic() - queued > window:
            raise _APIError(400, QUERY_TOO_OLD)
        self._answered.append(str(query_id))
        return True

    async def _get_me(self, bot_id: str, params: Params) -> Any:
        user = self._bot_user(int(bot_id))
        user.update(can_join_groups=True, can_read_all_group_messages=False)
        user.update(supports_inline_queries=False)
        return user

    async def _send_invoice(self, bot_id: str, params: Params) -> Any:
        key = _chat_key(params.get("chat_id"))
        markup = _normalize_markup(params.get("reply_markup"))
        message: dict[str, Any] = {
            "message_id": self._next_message_id,
            "from": self._bot_user(int(bot_id)),
            "chat": self._chat(key),
            "date": int(time.time()),
        }
        if markup is not None:
            message["reply_markup"] = markup
        try:
            self.payments.send_invoice(params, message)
        except _PaymentError as err:
            raise _APIError(400, err.description) from None
        self._next_message_id += 1
        self._messages[(key, message["message_id"])] = SentMessage(
            chat_id=key,
            message_id=message["message_id"],
            text=None,
            reply_markup=markup,
            message=message,
        )
        return copy.deepcopy(message)

    async def _answer_pre_checkout_query(self, bot_id: str, params: Params) -> Any:
        try:
            return self.payments.answer_pre_checkout_query(params)
        except _PaymentError as err:
            raise _APIError(400, err.description) from None

    async def _refund_star_payment(self, bot_id: str, params: Params) -> Any:
        try:
            return self.payments.refund_star_payment(params)
        except _PaymentError as err:
            raise _APIError(400, err.description) from None

    async def _send_message(self, bot_id: str, params: Params) -> Any:
        key = _chat_key(params.get("chat_id"))
        text = params.get("text")
        if not isinstance(text, str) or not text.strip():
            raise _APIError(400, "Bad Request: message text is empty")
        if len(text) > _MAX_TEXT:
            raise _APIError(400, "Bad Request: message is too long")
        markup = _normalize_markup(params.get("reply_markup"))
        message: dict[str, Any] = {
            "message_id": self._next_message_id,
            "from": self._bot_user(int(bot_id)),
            "chat": self._chat(key),
            "date": int(time.time()),
            "text": text,
        }
        self._next_message_id += 1
        if isinstance(params.get("message_thread_id"), int):
            message["message_thread_id"] = params["message_thread_id"]
            message["is_topic_message"] = True
        if params.get("entities"):
            message["entities"] = params["entities"]
        if markup is not None:
            message["reply_markup"] = markup
        self._messages[(key, message["message_id"])] = SentMessage(
            chat_id=key,
            message_id=message["message_id"],
            text=text,
            reply_markup=markup,
            parse_mode=params.get("parse_mode"),
            entities=params.get("entities"),
            message=message,
        )
        self._sent.append((key, message["message_id"], text))
        return message

    def _target(self, params: Params) -> SentMessage | None:
        """The message an edit addresses; None for inline messages (always accepted)."""
        if params.get("inline_message_id"):
            return None
        key = _chat_key(params.get("chat_id"))
        message_id = params.get("message_id")
        stored = self._messages.get((key, message_id)) if isinstance(message_id, int) else None
        if stored is None or stored.deleted:
            raise _APIError(400, EDIT_NOT_FOUND)
        return stored

    @staticmethod
    def _render(stored: SentMessage) -> dict[str, Any]:
        message = copy.deepcopy(stored.message)
        message["text"] = stored.text
        message.pop("reply_markup", None)
        message.pop("entities", None)
        if stored.reply_markup is not None:
            message["reply_markup"] = stored.reply_markup
        if stored.entities:
            message["entities"] = stored.entities
        if stored.edits:
            message["edit_date"] = int(time.time())
        return message

    async def _edit_message_text(self, bot_id: str, params: Params) -> Any:
        text = params.get("text")
        if not isinstance(text, str) or not text.strip():
            raise _APIError(400, "Bad Request: message text is empty")
        if len(text) > _MAX_TEXT:
            raise _APIError(400, "Bad Request: message is too long")
        # An edit without reply_markup removes the inline keyboard, as on Telegram.
        markup = _normalize_markup(params.get("reply_markup"))
        stored = self._target(params)
        if stored is None:
            return True
        before = (stored.text, stored.parse_mode, stored.entities, stored.reply_markup)
        after = (text, params.get("parse_mode"), params.get("entities"), markup)
        if before == after:
            raise _APIError(400, NOT_MODIFIED)
        stored.text, stored.parse_mode, stored.entities, stored.reply_markup = after
        stored.edits += 1
        return self._render(stored)

    async def _edit_message_reply_markup(self, bot_id: str, params: Params) -> Any:
        markup = _normalize_markup(params.get("reply_markup"))
        stored = self._target(params)
        if stored is None:
            return True
        if stored.reply_markup == markup:
            raise _APIError(400, NOT_MODIFIED)
        stored.reply_markup = markup
        stored.edits += 1
        return self._render(stored)

    async def _delete_message(self, bot_id: str, params: Params) -> Any:
        key = _chat_key(params.get("chat_id"))
        message_id = params.get("message_id")
        stored = self._messages.get((key, message_id)) if isinstance(message_id, int) else None
        if stored is not None:
            stored.deleted = True
        return True

    async def _set_webhook(self, bot_id: str, params: Params) -> Any:
        url = params.get("url") or ""
        secret = params.get("secret_token")
        if secret is not None and not _SECRET_TOKEN.fullmatch(str(secret)):
            raise _APIError(400, "Bad Request: secret token contains unallowed characters")
        self._drop_if_asked(params)
        self.webhook.url = str(url)
        self.webhook.secret_token = str(secret) if secret is not None else None
        self.webhook.allowed_updates = params.get("allowed_updates")
        self.webhook.max_connections = params.get("max_connections")
        return True

    async def _delete_webhook(self, bot_id: str, params: Params) -> Any:
        self._drop_if_asked(params)
        self.webhook.url = ""
        self.webhook.secret_token = None
        return True

    def _drop_if_asked(self, params: Params) -> None:
        if params.get("drop_pending_updates") is True:
            self.webhook.dropped_updates += len(self._updates)
            self._updates.clear()

    async def _get_webhook_info(self, bot_id: str, params: Params) -> Any:
        info: dict[str, Any] = {
            "url": self.webhook.url,
            "has_custom_certificate": False,
            "pending_update_count": len(self._updates),
        }
        if self.webhook.url:
            info["max_connections"] = self.webhook.max_connections or 40
            if self.webhook.allowed_updates is not None:
                info["allowed_updates"] = self.webhook.allowed_updates
            for name in ("ip_address", "last_error_date", "last_error_message"):
                if (value := getattr(self.webhook, name)) is not None:
                    info[name] = value
        return info

    async def _get_updates(self, bot_id: str, params: Params) -> Any:
        if self.webhook.url:
            raise _APIError(
                409,
                "Conflict: can't use getUpdates method while webhook is active; "
                "use deleteWebhook to delete the webhook first",
            )
        offset = params.get("offset")
        limit = params.get("limit") or 100
        limit = max(1, min(100, int(limit)))
        timeout = float(params.get("timeout") or 0)
        # One long poll per bot, as on Telegram: a newer getUpdates ends the one in
        # progress (its client still connected) with 409.
        earlier = self._polls.get(bot_id)
        if earlier is not None and earlier.connected():
            earlier.terminated.set()
        request = _REQUEST.get()
        poll = _Poll(request) if request is not None else None
        if poll is not None:
            self._polls[bot_id] = poll
        try:
            if isinstance(offset, int) and offset < 0:
                del self._updates[: max(0, len(self._updates) + offset)]
            elif isinstance(offset, int) and offset > 0:
                self._updates = [u for u in self._updates if u["update_id"] >= offset]
            if not self._updates and timeout > 0 and not self._closing.is_set():
                waits = [asyncio.ensure_future(self._updates_changed.wait())]
                if poll is not None:
                    waits.append(asyncio.ensure_future(poll.terminated.wait()))
                try:
                    await asyncio.wait(
                        waits,
                        timeout=min(timeout, self.long_poll_cap),
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    for wait in waits:
                        wait.cancel()
            if poll is not None and poll.terminated.is_set():
                raise _APIError(409, CONFLICT_TERMINATED, source="conflict")
            return copy.deepcopy(self._updates[:limit])
        finally:
            if poll is not None and self._polls.get(bot_id) is poll:
                del self._polls[bot_id]


def _describe_429(
    method: str, params: Mapping[str, Any], parameters: Mapping[str, Any] | None, source: str
) -> str:
    chat = params.get("chat_id")
    where = f" to chat {chat}" if chat is not None else ""
    wait = (parameters or {}).get("retry_after")
    return f"{method}{where} (retry_after {wait}, {source})"


# --------------------------------------------------------------------- control client


class FakeBotAPIControl:
    """Control a `FakeBotAPI` served by another process (or this one) over HTTP: the same
    faults, state and assertions as the fake's own methods, through its ``/_fake/``
    endpoints. Each method is one request (a new ``aiohttp`` session; no lifecycle).

    Args:
        url: the fake's base URL (``FakeBotAPI.url``, or what the CLI printed).
        timeout: seconds each request may take in all (``aiohttp``'s total timeout).

    Every method raises ``aiohttp.ClientError`` when the fake cannot be reached, and
    `RuntimeError` when it refuses the request (the fault it answered is in the text).
    """

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    async def _request(self, verb: str, path: str, **kwargs: Any) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.request(verb, self.url + path, **kwargs) as response:
                body = await response.json()
        if not isinstance(body, dict) or response.status != 200:
            raise RuntimeError(f"{verb} {path} refused ({response.status}): {body}")
        return body

    async def inject(self, fault: Fault) -> None:
        """`FakeBotAPI.inject` over HTTP (``POST /_fake/faults``).

        Args:
            fault: as `FakeBotAPI.inject`.
        """
        await self._request("POST", "/_fake/faults", json=fault.to_json())

    async def fail_next(
        self,
        method: str,
        status: int = 429,
        retry_after: int = 1,
        *,
        description: str | None = None,
        times: int = 1,
    ) -> None:
        """`FakeBotAPI.fail_next` over HTTP.

        Args:
            method: as `FakeBotAPI.fail_next`.
            status: as `FakeBotAPI.fail_next`.
            retry_after: seconds, as `FakeBotAPI.fail_next`.
            description: as `FakeBotAPI.fail_next`.
            times: as `FakeBotAPI.fail_next`.

        Raises:
            ValueError: ``times`` < 1.
        """
        await self.inject(_fail_next_fault(method, status, retry_after, description, times))

    async def clear_faults(
        self, *, method: str | None = None, chat_id: int | str | None = None
    ) -> int:
        """`FakeBotAPI.clear_faults` over HTTP; returns how many were removed.

        Args:
            method: as `FakeBotAPI.clear_faults`.
            chat_id: as `FakeBotAPI.clear_faults`.
        """
        query = {k: str(v) for k, v in (("method", method), ("chat_id", chat_id)) if v is not None}
        body = await self._request("DELETE", "/_fake/faults", params=query)
        return int(body["removed"])

    async def state(self) -> dict[str, Any]:
        """`FakeBotAPI.state`: everything the fake recorded, as JSON."""
        return await self._request("GET", "/_fake/state")

    async def calls(self, method: str | None = None) -> list[dict[str, Any]]:
        """Recorded calls (``method``, ``params``, ``at``, ``token``), of ``method`` only
        when given (case-insensitive): the fields of :class:`Call`, as JSON.

        Args:
            method: only this method's calls; ``None``: every call.
        """
        calls: list[dict[str, Any]] = (await self.state())["calls"]
        return [c for c in calls if method is None or c["method"].lower() == method.lower()]

    async def sent_texts(self, chat_id: int | str) -> list[str]:
        """`FakeBotAPI.sent_texts` over HTTP.

        Args:
            chat_id: as `FakeBotAPI.sent_texts`.
        """
        return _texts_for((await self.state())["sent"], chat_id)

    async def assert_sent_once(self, chat_id: int | str, text: str) -> None:
        """`FakeBotAPI.assert_sent_once` over HTTP.

        Args:
            chat_id: as `FakeBotAPI.assert_sent_once`.
            text: as `FakeBotAPI.assert_sent_once`.

        Raises:
            AssertionError: as `FakeBotAPI.assert_sent_once`.
        """
        check_sent_once(await self.sent_texts(chat_id), chat_id, text)

    async def assert_no_repeated_text(self, chat_id: int | str) -> None:
        """`FakeBotAPI.assert_no_repeated_text` over HTTP.

        Args:
            chat_id: as `FakeBotAPI.assert_no_repeated_text`.

        Raises:
            AssertionError: as `FakeBotAPI.assert_no_repeated_text`.
        """
        check_no_repeated_text(await self.sent_texts(chat_id), chat_id)

    async def assert_no_429(self) -> None:
        """`FakeBotAPI.assert_no_429`. Raises `AssertionError` as it does."""
        errors = (await self.state())["errors"]
        check_no_429(
            [
                _describe_429(e["method"], {"chat_id": e["chat_id"]}, e["parameters"], e["source"])
                for e in errors
                if e["error_code"] == 429
            ]
        )


def _texts_for(sent: list[list[Any]], chat_id: int | str) -> list[str]:
    return [str(text) for chat, _, text in sent if str(chat) == str(chat_id)]


# --------------------------------------------------------------------- entry point


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m telegram_idem.testing.bot_api",
        description="Serve FakeBotAPI, a fake Telegram Bot API, until SIGINT or SIGTERM. "
        "Prints its base URL (give it to aiogram's TelegramAPIServer.from_base, or "
        "URL + '/bot' to python-telegram-bot's base_url).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (0: a free one)")
    parser.add_argument("--bot-first-name", default="Blog Bot", help="getMe's first_name")
    parser.add_argument("--bot-username", default="example_blog_bot", help="getMe's username")
    parser.add_argument(
        "--long-poll-cap",
        type=float,
        default=1.0,
        help="longest getUpdates wait, seconds, whatever timeout the client asks (1.0)",
    )
    parser.add_argument(
        "--limits",
        action="store_true",
        help="enforce Telegram's flood limits (telegram_idem.flood.Limits()): 429 when over",
    )
    parser.add_argument(
        "--updates",
        type=Path,
        action="append",
        default=[],
        help="a JSON file with one update or a list of updates, queued for getUpdates (repeatable)",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be 0-65535, not {args.port}")
    return args


def _load_updates(paths: list[Path]) -> list[dict[str, Any]]:
    """The updates of ``--updates`` files, in order. Raises `ValueError` (a file that is
    not JSON, or holds something other than an update or a list of updates)."""
    updates: list[dict[str, Any]] = []
    for path in paths:
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from exc
        items = loaded if isinstance(loaded, list) else [loaded]
        for item in items:  # queue_update's rule, checked before the port is bound
            update_id = item.get("update_id") if isinstance(item, dict) else None
            if not isinstance(update_id, int) or isinstance(update_id, bool):
                raise ValueError(f"{path}: expected updates with an integer update_id")
        updates.extend(items)
    return updates


async def _serve(args: argparse.Namespace, updates: list[dict[str, Any]]) -> None:
    fake = FakeBotAPI(
        bot_first_name=args.bot_first_name,
        bot_username=args.bot_username,
        long_poll_cap=args.long_poll_cap,
        limits=Limits() if args.limits else None,
    )
    for update in updates:
        fake.queue_update(update)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(fake.make_app(), shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        host, port = runner.addresses[0][:2]
        print(f"http://{host}:{port}", flush=True)
        await stop.wait()
        await fake.before_close()  # pending long polls answer [] before the server stops
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    """``python -m telegram_idem.testing.bot_api``: serve a :class:`FakeBotAPI` on
    ``--host`` (default ``127.0.0.1``) and ``--port`` (default 0: a free port), print its
    base URL on one line of stdout, and serve until SIGINT or SIGTERM. Returns the exit
    status: 0 after a signal, 2 for bad arguments or ``--updates`` files, 1 when the port
    cannot be bound.

    Args:
        argv: the command-line arguments; ``None``: ``sys.argv[1:]``.
    """
    args = _parse_args(argv)
    try:
        updates = _load_updates(args.updates)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(args, updates))
    except OSError as exc:
        print(f"error: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
