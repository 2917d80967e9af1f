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
``answerCallbackQuery``, ``setWebhook``, ``deleteWebhook``, ``getWebhookInfo``, ``getUpdates``.
Any other method is recorded in `FakeBotAPI.unknown_methods` and answers ``true`` unless
`FakeBotAPI.set_result` gave it a result. Method names are case-insensitive, as in the Bot API.

Run it for a bot in another process (prints its URL, serves until SIGINT or SIGTERM)::

    python -m telegram_idem.testing.bot_api --port 8081 [--updates updates.json]

Deliberate simplifications: ``parse_mode`` is not rendered (``text`` is echoed verbatim and
"not modified" compares text, parse mode, entities and markup as sent); message ids come from
one counter shared by all chats; inline-message edits always succeed; ``allowed_updates`` is
recorded but does not filter ``getUpdates``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import re
import signal
import sys
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

from aiohttp import web

from telegram_idem.testing._loopback import LoopbackServer

__all__ = ["Call", "FakeBotAPI", "SentMessage", "UploadedFile", "WebhookState", "main"]

NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup are "
    "exactly the same as a current content and reply markup of the message"
)
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
    }
)
_SECRET_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,256}")
_MAX_TEXT = 4096
_MAX_CALLBACK_DATA = 64

Params = dict[str, Any]
ResultFactory = Callable[[Params], Any]


@dataclass(frozen=True, slots=True)
class Call:
    """One request the fake received.

    ``method`` is the method name as the client spelled it, ``params`` the decoded parameters
    (form values JSON-decoded except known string fields; uploads as `UploadedFile`), ``at``
    the `time.monotonic` reading in seconds when the request arrived, ``token`` the bot token
    from the URL.
    """

    method: str
    params: Params
    at: float
    token: str = ""


@dataclass(frozen=True, slots=True)
class UploadedFile:
    """A file part of a multipart request (``InputFile`` in the Bot API)."""

    filename: str
    content_type: str
    data: bytes


@dataclass(slots=True)
class SentMessage:
    """Current state of a message the bot sent (after edits): text, markup, edit count."""

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

    ``dropped_updates`` counts queued updates discarded by ``drop_pending_updates=true``.
    """

    url: str = ""
    secret_token: str | None = None
    allowed_updates: list[str] | None = None
    max_connections: int | None = None
    dropped_updates: int = 0


@dataclass(slots=True)
class _Fault:
    status: int
    description: str
    retry_after: int | None


class _APIError(Exception):
    def __init__(self, status: int, description: str, retry_after: int | None = None) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.retry_after = retry_after


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

    ``bot_first_name``/``bot_username`` shape the ``getMe`` user (the id is the number before
    ``:`` in each token; defaults match the shipped fixtures). ``long_poll_cap`` bounds, in
    seconds, how long ``getUpdates`` waits for an update whatever ``timeout`` the client asked.
    """

    def __init__(
        self,
        *,
        bot_first_name: str = "Blog Bot",
        bot_username: str = "example_blog_bot",
        long_poll_cap: float = 1.0,
    ) -> None:
        super().__init__()
        self.bot_first_name = bot_first_name
        self.bot_username = bot_username
        self.long_poll_cap = long_poll_cap
        self.calls: list[Call] = []
        self.unknown_methods: list[str] = []
        self.webhook = WebhookState()
        self._messages: dict[tuple[int | str, int], SentMessage] = {}
        self._chats: dict[int | str, dict[str, Any]] = {}
        self._next_message_id = 1
        self._updates: list[dict[str, Any]] = []
        self._updates_changed = asyncio.Event()
        self._answered: list[str] = []
        self._faults: dict[str, deque[_Fault]] = {}
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
        }

    # ----------------------------------------------------------------- lifecycle

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=50 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
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
        a callback query). Raises `ValueError` without an int ``update_id``.
        """
        update_id = update.get("update_id")
        if not isinstance(update_id, int) or isinstance(update_id, bool):
            raise ValueError("an update needs an integer update_id")
        stored = copy.deepcopy(dict(update))
        for value in stored.values():
            if isinstance(value, dict):
                self._learn(value)
        self._updates.append(stored)
        self._wake_pollers()

    def seed_message(self, message: Mapping[str, Any]) -> SentMessage:
        """Make a Message (Bot API "Message" shape) exist, as if the bot had sent it earlier."""
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
        """
        if times < 1:
            raise ValueError("times must be >= 1")
        if description is None:
            if status == 429:
                description = f"Too Many Requests: retry after {retry_after}"
            else:
                description = HTTPStatus(status).phrase
        fault = _Fault(status, description, retry_after if status == 429 else None)
        queue = self._faults.setdefault(method.lower(), deque())
        queue.extend(fault for _ in range(times))

    def set_result(self, method: str, result: Any) -> None:
        """Answer ``method`` with ``result``, or ``result(params)`` if callable.

        For methods the fake does not model (``sendPhoto`` needs a Message, not ``true``).
        """
        factory: ResultFactory = result if callable(result) else (lambda _p: result)
        self._handlers.pop(method.lower(), None)
        self._results[method.lower()] = factory

    # ----------------------------------------------------------------- inspection

    def calls_of(self, method: str) -> list[Call]:
        """Recorded calls of ``method`` (case-insensitive), oldest first."""
        wanted = method.lower()
        return [call for call in self.calls if call.method.lower() == wanted]

    def messages(self, chat_id: int | str) -> list[SentMessage]:
        """Messages the bot sent (or `seed_message`) to ``chat_id`` and has not deleted,
        by ``message_id``, in their current state after edits."""
        key = _chat_key(chat_id)
        found = [m for (c, _), m in self._messages.items() if c == key and not m.deleted]
        return sorted(found, key=lambda m: m.message_id)

    def message(self, chat_id: int | str, message_id: int) -> SentMessage | None:
        """One message's current state (deleted ones included), or None."""
        return self._messages.get((_chat_key(chat_id), message_id))

    def answered_callback_ids(self) -> list[str]:
        """``callback_query_id`` of every successful ``answerCallbackQuery``, in order, repeats
        kept (calls failed by `fail_next` are not answers)."""
        return list(self._answered)

    @property
    def pending_updates(self) -> list[dict[str, Any]]:
        """Queued updates not yet confirmed by a ``getUpdates`` offset."""
        return list(self._updates)

    # ----------------------------------------------------------------- HTTP plumbing

    async def _handle(self, request: web.Request) -> web.Response:
        token = request.match_info["token"]
        method = request.match_info["method"]
        try:
            params = await self._read_params(request)
        except _APIError as err:
            return self._error(err)
        self.calls.append(Call(method, params, time.monotonic(), token))
        try:
            bot_id = self._bot_id(token)
            faults = self._faults.get(method.lower())
            if faults:
                fault = faults.popleft()
                raise _APIError(fault.status, fault.description, fault.retry_after)
            handler = self._handlers.get(method.lower())
            if handler is not None:
                result = await handler(str(bot_id), params)
            elif (factory := self._results.get(method.lower())) is not None:
                result = factory(params)
            else:
                self.unknown_methods.append(method)
                result = True
        except _APIError as err:
            return self._error(err)
        return web.json_response({"ok": True, "result": result})

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

    @staticmethod
    def _error(err: _APIError) -> web.Response:
        body: dict[str, Any] = {
            "ok": False,
            "error_code": err.status,
            "description": err.description,
        }
        if err.retry_after is not None:
            body["parameters"] = {"retry_after": err.retry_after}
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
            raise _APIError(
                400,
                "Bad Request: query is too old and response timeout expired or query ID is invalid",
            )
        self._answered.append(str(query_id))
        return True

    async def _get_me(self, bot_id: str, params: Params) -> Any:
        user = self._bot_user(int(bot_id))
        user.update(can_join_groups=True, can_read_all_group_messages=False)
        user.update(supports_inline_queries=False)
        return user

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
        if isinstance(offset, int) and offset < 0:
            del self._updates[: max(0, len(self._updates) + offset)]
        elif isinstance(offset, int) and offset > 0:
            self._updates = [u for u in self._updates if u["update_id"] >= offset]
        if not self._updates and timeout > 0 and not self._closing.is_set():
            changed = self._updates_changed
            try:
                await asyncio.wait_for(changed.wait(), min(timeout, self.long_poll_cap))
            except TimeoutError:
                pass
        return copy.deepcopy(self._updates[:limit])


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
