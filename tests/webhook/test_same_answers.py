"""The same request gets the same status from every webhook shell.

One table of bad (and borderline good) requests, sent as raw bytes over real HTTP on
loopback to the aiohttp shells — ``WebhookIngress``, aiogram's ``FastAckWebhook``,
python-telegram-bot's ``ptb_webhook_app`` — and as Lambda Function URL events (payload
format 2.0, as the gateway builds them from those bytes) to ``LambdaOffload.handle``.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
from aiogram import Bot, Dispatcher
from aiohttp import web
from telegram.ext import ApplicationBuilder

from telegram_idem import Idem
from telegram_idem.adapters._aiogram_webhook import FastAckWebhook
from telegram_idem.adapters.aiogram import IdempotencyMiddleware
from telegram_idem.adapters.aws_lambda import LambdaOffload
from telegram_idem.adapters.ptb import IdempotentUpdateProcessor, ptb_webhook_app
from telegram_idem.ingress import WebhookIngress, register
from telegram_idem.testing._loopback import serve_app
from telegram_idem.testing.bot_api import FakeBotAPI

TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"
BOT = 7000000001
SECRET = "same-answers-secret"
MAX_BODY = 8192
NAME = b"X-Telegram-Bot-Api-Secret-Token"

Send = Callable[[bytes, list[tuple[bytes, bytes]], bytes], Awaitable[int]]
"""``(method, headers, body) -> status``."""


def update(update_id: int, text: str = "hi") -> dict[str, Any]:
    return {
        "update_id": update_id,
        "message": {
            "message_id": update_id % 1000,
            "date": 1700000000,
            "chat": {"id": 42, "type": "private"},
            "from": {"id": 42, "is_bot": False, "first_name": "A"},
            "text": text,
        },
    }


def body_of(update_id: int, text: str = "hi", size: int | None = None) -> bytes:
    raw = json.dumps(update(update_id, text)).encode()
    return raw if size is None else raw + b" " * (size - len(raw))


@dataclass(frozen=True)
class Case:
    name: str
    status: int
    body: bytes
    headers: tuple[tuple[bytes, bytes], ...] = ((NAME, SECRET.encode()),)
    method: bytes = b"POST"


CASES = [
    Case("a good update", 200, body_of(1)),
    Case("secret header name in lower case", 200, body_of(2), ((NAME.lower(), SECRET.encode()),)),
    Case("wrong secret", 401, body_of(3), ((NAME, b"wrong"),)),
    Case("no secret header", 401, body_of(4), ()),
    Case(
        "secret with bytes that are not UTF-8",
        401,
        body_of(5),
        ((NAME, SECRET.encode() + b"\xff"),),
    ),
    Case("secret, then a wrong one", 401, body_of(6), ((NAME, SECRET.encode()), (NAME, b"x"))),
    Case("the secret twice", 401, body_of(6), ((NAME, SECRET.encode()), (NAME, SECRET.encode()))),
    Case("GET", 405, body_of(7), method=b"GET"),
    Case("PUT", 405, body_of(8), method=b"PUT"),
    Case("GET without a secret", 405, body_of(9), (), method=b"GET"),
    Case("empty body", 400, b""),
    Case("not JSON", 400, b"{not json"),
    Case("bytes that are not UTF-8", 400, b'{"update_id": 10, "x": "\xff"}'),
    Case("a JSON list", 400, b"[1, 2]"),
    Case("no update_id", 400, b'{"message": {}}'),
    Case("update_id true", 400, b'{"update_id": true, "message": {}}'),
    Case("update_id a string", 400, b'{"update_id": "11", "message": {}}'),
    Case("update_id a float", 400, b'{"update_id": 12.5, "message": {}}'),
    Case("update_id of 4400 digits", 400, b'{"update_id": ' + b"9" * 4400 + b"}"),
    Case("NaN", 400, b'{"update_id": 13, "x": NaN}'),
    Case("nesting too deep", 400, b"[" * 2000 + b"]" * 2000),
    Case("exactly max_body bytes", 200, body_of(14, size=MAX_BODY)),
    Case("max_body + 1 bytes", 413, body_of(15, size=MAX_BODY + 1)),
    Case("too large and no secret", 401, body_of(16, size=MAX_BODY + 1), ()),
    Case("a lone surrogate escape", 200, body_of(17, "\ud800")),
    Case("Korean and an emoji", 200, body_of(18, "한국어 🎉")),
]


async def raw_request(
    base: str, method: bytes, headers: list[tuple[bytes, bytes]], body: bytes
) -> int:
    """One HTTP/1.1 request written byte for byte (headers that are not UTF-8 included)."""
    where = urlsplit(base)
    assert where.hostname is not None and where.port is not None
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    try:
        head = [method + b" /webhook HTTP/1.1", b"Host: x", b"Connection: close"]
        head += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
        head += [name + b": " + value for name, value in headers]
        writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        await writer.drain()
        async with asyncio.timeout(10):
            status_line = await reader.readline()
    finally:
        writer.close()
    return int(status_line.split()[1])


def function_url_event(
    method: bytes, headers: list[tuple[bytes, bytes]], body: bytes
) -> dict[str, Any]:
    """The event a Lambda Function URL makes of the request: header names in lower case,
    values decoded as text, a body that is not UTF-8 base64-encoded."""
    names: dict[str, str] = {}
    for name, value in headers:  # repeated headers are joined with commas
        key = name.decode("latin-1").lower()
        text = value.decode("utf-8", "surrogateescape")
        names[key] = f"{names[key]},{text}" if key in names else text
    try:
        text_body, b64 = body.decode("utf-8"), False
    except UnicodeDecodeError:
        text_body, b64 = base64.b64encode(body).decode(), True
    return {
        "version": "2.0",
        "rawPath": "/",
        "headers": {"content-type": "application/json", **names},
        "requestContext": {"http": {"method": method.decode(), "path": "/"}},
        "body": text_body,
        "isBase64Encoded": b64,
    }


async def _over_http(app: web.Application, stack: AsyncExitStack) -> Send:
    runner, base = await serve_app(app)
    stack.push_async_callback(runner.cleanup)

    async def send(method: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> int:
        return await raw_request(base, method, headers, body)

    return send


async def webhook_ingress(stack: AsyncExitStack) -> Send:
    idem = Idem("memory://")
    stack.push_async_callback(idem.close)
    app = web.Application()
    register(
        app, "/webhook", WebhookIngress(idem, bot_id=BOT, secret_token=SECRET, max_body=MAX_BODY)
    )
    return await _over_http(app, stack)


async def fast_ack_webhook(stack: AsyncExitStack) -> Send:
    idem = Idem("memory://")
    stack.push_async_callback(idem.close)
    bot = Bot(TOKEN)
    stack.push_async_callback(bot.session.close)
    dp = Dispatcher()
    dp.update.outer_middleware(IdempotencyMiddleware(idem))
    app = web.Application()
    FastAckWebhook(dp, bot, idem, secret_token=SECRET, max_body=MAX_BODY).register(app, "/webhook")
    return await _over_http(app, stack)


async def ptb_webhook_shell(stack: AsyncExitStack) -> Send:
    api = await stack.enter_async_context(FakeBotAPI())
    idem = Idem("memory://")
    stack.push_async_callback(idem.close)
    application = (
        ApplicationBuilder()
        .token(TOKEN)
        .base_url(api.ptb_base_url)
        .updater(None)
        .concurrent_updates(IdempotentUpdateProcessor(idem, 2))
        .build()
    )
    app = ptb_webhook_app(application, idem, secret_token=SECRET, max_body=MAX_BODY)
    return await _over_http(app, stack)


async def lambda_handler(stack: AsyncExitStack) -> Send:
    idem = Idem("memory://")
    stack.push_async_callback(idem.close)

    async def process(_update: dict[str, Any]) -> None:
        return None

    offload = LambdaOffload(
        idem,
        process,
        bot_id=BOT,
        function_name="bot",
        secret_token=SECRET,
        max_body=MAX_BODY,
        offload_when=lambda _update: False,  # processed inline: no Lambda client needed
    )

    async def send(method: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> int:
        answer = await offload.handle(function_url_event(method, headers, body), None)
        status: int = answer["statusCode"]
        return status

    return send


SHELLS = {
    "WebhookIngress": webhook_ingress,
    "FastAckWebhook": fast_ack_webhook,
    "ptb_webhook": ptb_webhook_shell,
    "LambdaOffload": lambda_handler,
}


@pytest.fixture(params=list(SHELLS))
async def send(request: pytest.FixtureRequest) -> AsyncIterator[Send]:
    async with AsyncExitStack() as stack:
        yield await SHELLS[request.param](stack)


async def test_every_shell_answers_the_table_alike(send: Send) -> None:
    got = {case.name: await send(case.method, list(case.headers), case.body) for case in CASES}
    assert got == {case.name: case.status for case in CASES}
