"""Webhook and polling ingress into the inbox, with aiogram behind a worker."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiogram import Bot, Dispatcher
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.types import Message
from aiohttp import web

from telegram_idem import ConfigurationError, Idem, MalformedUpdateError, idempotent
from telegram_idem.adapters.aiogram import (
    IdempotencyMiddleware,
    aiogram_get_updates,
    inbox_dispatch,
)
from telegram_idem.inbox._worker import InboxWorker
from telegram_idem.ingress._polling import PollingIngress
from telegram_idem.ingress._webhook import WebhookIngress
from telegram_idem.testing._delivery import TelegramDelivery, load_fixture
from telegram_idem.testing._loopback import serve_app
from telegram_idem.testing.bot_api import FakeBotAPI

TOKEN = "7000000001:AAingress"
SECRET = "ingress-secret"


async def _serve(handler: Any) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/webhook", handler)
    runner, base = await serve_app(app)
    return runner, f"{base}/webhook"


@pytest.fixture
async def idem(tmp_path: Path) -> AsyncIterator[Idem]:
    guard = Idem(f"sqlite:///{tmp_path / 'bot.db'}")
    yield guard
    await guard.close()


async def test_20_concurrent_deliveries_make_one_entry_and_one_run(idem: Idem) -> None:
    bodies: list[int] = []
    async with FakeBotAPI() as api:
        bot = Bot(TOKEN, session=AiohttpSession(api=TelegramAPIServer.from_base(api.url)))
        dp = Dispatcher()
        dp.update.outer_middleware(IdempotencyMiddleware(idem))

        @dp.message()
        @idempotent(key="post:{chat_id}:{message_id}")
        async def on_message(message: Message) -> int:
            bodies.append(message.message_id)
            return message.message_id

        worker = InboxWorker(idem.store.inbox(), inbox_dispatch(dp, bot), poll_interval=0.01)
        ingress = WebhookIngress(
            idem, bot_id=bot.id, secret_token=SECRET, on_admitted=worker.notify
        )
        runner, url = await _serve(ingress.handle)
        worker.start()
        try:
            async with TelegramDelivery(url, secret_token=SECRET) as tg:
                reports = await tg.deliver_concurrently(load_fixture("techpost_command"), 20)
            assert all(r.statuses == [200] for r in reports)
            assert (ingress.admitted, ingress.duplicates) == (1, 19)
            await worker.drain(limit=30)
        finally:
            await worker.stop()
            await runner.cleanup()
            await bot.session.close()
    assert bodies == [4121]


@pytest.mark.parametrize(
    ("headers", "body", "status"),
    [
        ({"X-Telegram-Bot-Api-Secret-Token": "nope"}, b'{"update_id": 9}', 401),
        ({}, b'{"update_id": 9}', 401),
        (None, b"{not json", 400),
        (None, b'{"update_id": 1.5}', 400),
        (None, b"x" * (1024 * 1024 + 1), 413),
        (None, b'{"update_id": 9, "from_the_future": {}}', 200),
    ],
)
async def test_bad_requests_are_refused_and_store_nothing(
    idem: Idem, headers: dict[str, str] | None, body: bytes, status: int
) -> None:
    ingress = WebhookIngress(idem, bot_id=7, secret_token=SECRET)
    runner, url = await _serve(ingress.handle)
    try:
        sent = {"X-Telegram-Bot-Api-Secret-Token": SECRET} if headers is None else headers
        async with aiohttp.ClientSession() as s, s.post(url, data=body, headers=sent) as resp:
            assert resp.status == status
    finally:
        await runner.cleanup()
    expected_depth = 1 if status == 200 else 0
    assert await idem.store.inbox().depth() == expected_depth


async def test_store_outage_fails_closed_with_503(tmp_path: Path) -> None:
    broken = Idem(f"sqlite:///{tmp_path}")  # a directory: the database cannot open
    ingress = WebhookIngress(broken, bot_id=7, allow_unauthenticated=True)
    runner, url = await _serve(ingress.handle)
    try:
        async with TelegramDelivery(url, max_attempts=1) as tg:
            report = await tg.deliver(load_fixture("techpost_command"))
        assert report.statuses == [503]
    finally:
        await runner.cleanup()
        await broken.close()


async def test_store_outage_fail_open_dispatches_and_answers_200(tmp_path: Path) -> None:
    broken = Idem(f"sqlite:///{tmp_path}")
    seen: list[int] = []

    async def dispatch(update: dict[str, Any]) -> None:
        seen.append(update["update_id"])

    ingress = WebhookIngress(
        broken,
        bot_id=7,
        on_store_error="fail_open",
        fail_open_dispatch=dispatch,
        allow_unauthenticated=True,
    )
    runner, url = await _serve(ingress.handle)
    try:
        async with TelegramDelivery(url, max_attempts=1) as tg:
            report = await tg.deliver(load_fixture("techpost_command"))
        assert report.statuses == [200]
        async with asyncio.timeout(5):
            while not seen:
                await asyncio.sleep(0.01)
        assert seen == [734519001]
    finally:
        await runner.cleanup()
        await broken.close()


async def test_polling_refetch_after_a_crash_duplicates_nothing(idem: Idem) -> None:
    async with FakeBotAPI(long_poll_cap=0.05) as api:
        bot = Bot(TOKEN, session=AiohttpSession(api=TelegramAPIServer.from_base(api.url)))
        try:
            for name in ("techpost_command", "techpost_no_title", "inline_query"):
                api.queue_update(load_fixture(name))
            first = PollingIngress(idem, aiogram_get_updates(bot), bot_id=bot.id, poll_timeout=0)
            assert await first.poll_once() == 3
            assert first.admitted == 3
            # The process dies before the next getUpdates confirmed the batch: a new poller
            # starts without an offset and Telegram sends the same batch again.
            second = PollingIngress(idem, aiogram_get_updates(bot), bot_id=bot.id, poll_timeout=0)
            assert await second.poll_once() == 3
            assert (second.admitted, second.duplicates) == (0, 3)
            assert await idem.store.inbox().depth() == 3
            assert second.offset == 734519050 + 1
            assert await second.poll_once() == 0  # the offset confirmed the batch
        finally:
            await bot.session.close()


async def test_an_update_aiogram_cannot_parse_never_stalls_aiogram_polling(idem: Idem) -> None:
    """``bot.get_updates`` parses the whole batch with pydantic: one update aiogram cannot
    parse (a message without ``date`` or ``chat``) failed every fetch and the offset never
    moved. Fetched raw, it is admitted and dead-lettered at its first take, and the valid
    update after it runs."""
    seen: list[int] = []
    dp = Dispatcher()

    @dp.message()
    async def on_message(message: Message) -> None:
        seen.append(message.message_id)

    valid = load_fixture("techpost_command")
    async with FakeBotAPI(long_poll_cap=0.05) as api:
        bot = Bot(TOKEN, session=AiohttpSession(api=TelegramAPIServer.from_base(api.url)))
        try:
            api.queue_update({"update_id": 9001, "message": {"text": "\ud800"}})
            api.queue_update({**valid, "update_id": 9002})
            ingress = PollingIngress(idem, aiogram_get_updates(bot), bot_id=bot.id, poll_timeout=0)
            assert await ingress.poll_once() == 2
            assert ingress.offset == 9003
            assert await ingress.poll_once() == 0  # the offset confirmed both
            inbox = idem.store.inbox()
            worker = InboxWorker(inbox, inbox_dispatch(dp, bot), backoff_base=5, poll_interval=0.01)
            worker.start()
            await worker.drain(limit=30)
            await worker.stop()
        finally:
            await bot.session.close()
    assert seen == [valid["message"]["message_id"]]
    dead = await inbox.dead_letters()
    assert [d.id for d in dead] == [idem.keys.update(bot.id, 9001)]
    assert dead[0].attempts == 1  # at once: no retry can parse it
    assert "\\ud800" in dead[0].payload.decode()  # the bytes kept as sent


async def test_a_body_arriving_in_pieces_is_read_whole(idem: Idem) -> None:
    ingress = WebhookIngress(idem, bot_id=7, secret_token=SECRET)
    runner, url = await _serve(ingress.handle)
    body = json.dumps(load_fixture("techpost_command"), ensure_ascii=False).encode()

    async def pieces() -> AsyncIterator[bytes]:
        yield body[: len(body) // 2]
        await asyncio.sleep(0.05)  # the rest arrives in a later TCP segment
        yield body[len(body) // 2 :]

    try:
        async with (
            aiohttp.ClientSession() as s,
            s.post(url, data=pieces(), headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}) as resp,
        ):
            assert resp.status == 200
        deep = b"[" * 100_000 + b"]" * 100_000
        async with (
            aiohttp.ClientSession() as s,
            s.post(url, data=deep, headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}) as resp,
        ):
            assert resp.status == 400
    finally:
        await runner.cleanup()
    assert await idem.store.inbox().depth() == 1


# ------------------------------------------------------------- secrets (item 14)


def test_a_secret_is_required_unless_opted_out(
    idem: Idem, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ConfigurationError, match="secret_token is required"):
        WebhookIngress(idem, bot_id=7)
    with pytest.raises(ConfigurationError, match="secret_token is required"):
        WebhookIngress(idem, bot_id=7, secret_token=[])
    with pytest.raises(ConfigurationError, match="1-256"):
        WebhookIngress(idem, bot_id=7, secret_token=[SECRET, "has spaces"])
    with pytest.raises(ConfigurationError, match="contradicts"):
        WebhookIngress(idem, bot_id=7, secret_token=SECRET, allow_unauthenticated=True)
    caplog.set_level(logging.WARNING, logger="telegram_idem.webhook")
    WebhookIngress(idem, bot_id=7, allow_unauthenticated=True)
    assert [r.levelno for r in caplog.records if "without a secret" in r.message] == [
        logging.WARNING
    ]


async def test_two_secrets_are_accepted_while_rotating(idem: Idem) -> None:
    ingress = WebhookIngress(idem, bot_id=7, secret_token=["old-secret", "new-secret"])
    runner, url = await _serve(ingress.handle)
    statuses: list[int] = []
    try:
        async with aiohttp.ClientSession() as s:
            for update_id, secret in enumerate(("old-secret", "new-secret", "other", ""), 1):
                body = json.dumps({"update_id": update_id, "message": {}}).encode()
                headers = {"X-Telegram-Bot-Api-Secret-Token": secret}
                async with s.post(url, data=body, headers=headers) as resp:
                    statuses.append(resp.status)
    finally:
        await runner.cleanup()
    assert statuses == [200, 200, 401, 401]
    assert await idem.store.inbox().depth() == 2


# ------------------------------------------------- a body that never ends (item 17)


async def test_a_body_that_never_finishes_is_answered_408_within_the_read_timeout(
    idem: Idem,
) -> None:
    ingress = WebhookIngress(idem, bot_id=7, secret_token=SECRET, read_timeout=0.5)
    runner, url = await _serve(ingress.handle)
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"X-Telegram-Bot-Api-Secret-Token: " + SECRET.encode() + b"\r\n"
            b"Content-Length: 1000\r\n\r\n" + b'{"update_id": 1, "mess'
        )
        await writer.drain()  # ... and the rest never comes
        async with asyncio.timeout(10):  # bounded: the server must answer on its own
            status_line = await reader.readline()
    finally:
        writer.close()
        await runner.cleanup()
    assert status_line.split()[1] == b"408"
    assert await idem.store.inbox().depth() == 0


# ------------------------------------- an update aiogram cannot parse (item 15)


async def test_an_update_aiogram_cannot_parse_is_admitted_and_its_dispatch_says_why(
    idem: Idem,
) -> None:
    """JSON with an integer update_id is acknowledged (a re-send could never parse); the
    worker's dispatch raises MalformedUpdateError, a non-retryable error."""
    ingress = WebhookIngress(idem, bot_id=7, secret_token=SECRET)
    runner, url = await _serve(ingress.handle)
    broken = {"update_id": 77, "message": {"text": "no chat, no date"}}
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                url,
                data=json.dumps(broken).encode(),
                headers={"X-Telegram-Bot-Api-Secret-Token": SECRET},
            ) as resp,
        ):
            assert resp.status == 200
    finally:
        await runner.cleanup()
    assert await idem.store.inbox().depth() == 1
    async with FakeBotAPI() as api:
        bot = Bot(TOKEN, session=AiohttpSession(api=TelegramAPIServer.from_base(api.url)))
        try:
            dispatch = inbox_dispatch(Dispatcher(), bot)
            with pytest.raises(MalformedUpdateError, match="does not parse"):
                await dispatch(broken)
        finally:
            await bot.session.close()
