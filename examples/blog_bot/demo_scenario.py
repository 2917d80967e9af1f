"""What the demo sends: real payloads delivered the way Telegram delivers them.

Each function builds or delivers one part of the story; :mod:`examples.blog_bot.demo`
runs them in order and :mod:`examples.blog_bot.demo_report` checks the outcome.
"""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import aiohttp

from examples.blog_bot.writer import OfflineWriter
from telegram_idem.testing import load_fixture
from telegram_idem.testing.bot_api import FakeBotAPI, SentMessage
from telegram_idem.webhook_request import SECRET_HEADER

__all__ = [
    "WRONG_SECRET",
    "BadInputResult",
    "FlakyWriter",
    "bad_inputs",
    "button_update",
    "buttons",
    "command_update",
    "next_update_id",
    "published_messages",
]

_ids = itertools.count(734_520_000)
_query_ids = itertools.count(4_382_910_027_364_600_000, 1000)  # room for double taps (+1)

WRONG_SECRET: dict[str, Any] = {
    "update_id": 999_000_001,
    "message": {"message_id": 1, "date": 0, "chat": {"id": 1, "type": "private"}},
}
"""Sent with a wrong secret token: nothing may be stored for it."""


def next_update_id() -> int:
    """A fresh update id for a synthesised update."""
    return next(_ids)


def command_update(text: str, *, template: str = "techpost_command") -> dict[str, Any]:
    """A new message update (new ``update_id`` and ``message_id``) with ``text``."""
    update = load_fixture(template)
    uid = next(_ids)
    update["update_id"] = uid
    update["message"]["message_id"] = uid % 1_000_000
    update["message"]["text"] = text
    update["message"]["entities"] = [
        {"offset": 0, "length": len(text.split()[0]), "type": "bot_command"}
    ]
    return update


def button_update(message: SentMessage, data: str) -> dict[str, Any]:
    """A tap on a button of ``message`` (shaped like callback_delete.json)."""
    update = load_fixture("callback_delete")
    uid = next(_ids)
    update["update_id"] = uid
    query = update["callback_query"]
    query["id"] = str(next(_query_ids))
    query["data"] = data
    msg = copy.deepcopy(message.message) if message.message else query["message"]
    msg["message_id"] = message.message_id
    msg["text"] = message.text
    if message.reply_markup is not None:
        msg["reply_markup"] = message.reply_markup
    query["message"] = msg
    return update


def published_messages(api: FakeBotAPI, chat_id: int) -> list[SentMessage]:
    """The bot's status messages that ended as ``✅ Published``, oldest first."""
    return [m for m in api.messages(chat_id) if (m.text or "").startswith("✅ Published")]


def buttons(message: SentMessage) -> dict[str, str]:
    """Button text → callback data of ``message``'s inline keyboard."""
    rows = (message.reply_markup or {}).get("inline_keyboard", [])
    return {b["text"]: b["callback_data"] for row in rows for b in row if "callback_data" in b}


class FlakyWriter:
    """A writer whose ``fail_call``-th translation fails once, like an LLM timing out."""

    def __init__(self, inner: OfflineWriter, *, fail_call: int) -> None:
        self.inner = inner
        self.fail_call = fail_call
        self.failures = 0

    async def title(self, topic: str) -> str:
        return await self.inner.title(topic)

    async def draft(self, title: str, topic: str) -> str:
        return await self.inner.draft(title, topic)

    async def translate(self, markdown: str, lang: str) -> str:
        if self.inner.calls["translate"] + 1 == self.fail_call and not self.failures:
            self.failures += 1
            self.inner.calls["translate"] += 1
            raise TimeoutError("simulated LLM timeout during translation")
        return await self.inner.translate(markdown, lang)


BadInputResult = tuple[str, int, int]
"""(what was sent, status expected, status received)."""


async def bad_inputs(url: str, secret: str) -> list[BadInputResult]:
    """POST malformed and hostile requests; returns expected vs received statuses."""
    good = {SECRET_HEADER: secret, "Content-Type": "application/json"}
    unknown = {"update_id": 734_529_999, "future_update_type": {"id": 1, "what": "new"}}
    cases: list[tuple[str, int, dict[str, str], bytes | str]] = [
        ("wrong secret token", 401, {**good, SECRET_HEADER: "wrong"}, json.dumps(WRONG_SECRET)),
        (
            "missing secret token",
            401,
            {"Content-Type": "application/json"},
            '{"update_id": 999000002}',
        ),
        ("non-JSON body", 400, good, b"\xff not json"),
        ("JSON without update_id", 400, good, '{"message": {"text": "hi"}}'),
        ('update_id "7" (a string)', 400, good, '{"update_id": "7"}'),
        ("2 MiB body", 413, good, b"{" + b" " * (2 * 1024 * 1024) + b"}"),
        ("unknown update type", 200, good, json.dumps(unknown)),
    ]
    out: list[BadInputResult] = []
    async with aiohttp.ClientSession() as session:
        for name, expected, headers, body in cases:
            async with session.post(url, data=body, headers=headers) as resp:
                out.append((name, expected, resp.status))
    return out
