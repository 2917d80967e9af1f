"""What the aiogram webhook paths say: when an update fails after its 200, the state of its
claim as the store says it (never a release that did not happen); a missing secret, in
the name of the class the user built. A real Redis server of the
test's own is stopped mid-handler for the outage; a real aiogram Dispatcher and aiohttp
server on loopback."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiogram import Bot, Dispatcher
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.types import Message
from aiohttp import web

from telegram_idem import ConfigurationError, Idem, Outcome
from telegram_idem.adapters._aiogram_webhook import FastAckWebhook, IdempotentRequestHandler
from telegram_idem.adapters.aiogram import IdempotencyMiddleware
from telegram_idem.testing._delivery import load_fixture
from telegram_idem.testing._loopback import serve_app
from telegram_idem.testing.bot_api import FakeBotAPI

TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"
SECRET = "failure-log-secret"
PrivateRedis = tuple[int, Callable[[], None], Callable[[], None]]


@pytest.fixture
async def bot() -> AsyncIterator[Bot]:
    async with FakeBotAPI() as api:
        session = AiohttpSession(api=TelegramAPIServer.from_base(api.url))
        async with Bot(token=TOKEN, session=session) as client:
            yield client


async def deliver_failing(idem: Idem, bot: Bot, before_raising: Callable[[], None]) -> None:
    dp = Dispatcher()
    dp.update.outer_middleware(IdempotencyMiddleware(idem))

    @dp.message()
    async def on_message(message: Message) -> None:
        before_raising()
        raise RuntimeError("handler bug")

    hook = FastAckWebhook(dp, bot, idem, secret_token=SECRET)
    app = web.Application()
    app.router.add_post("/webhook", hook.handle)
    runner, base = await serve_app(app)
    headers: dict[str, Any] = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
    try:
        body = json.dumps(load_fixture("techpost_command")).encode()
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{base}/webhook", data=body, headers=headers) as resp,
        ):
            assert resp.status == 200
        await hook.drain(limit=20)
    finally:
        await runner.cleanup()


def failure_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "failed after its 200" in r.getMessage()]


async def test_a_failure_during_a_store_outage_does_not_claim_a_release(
    private_redis_port: PrivateRedis, bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    port, kill, _start = private_redis_port
    idem = Idem(f"redis://127.0.0.1:{port}/0?socket_timeout=0.5", heartbeat=False)
    caplog.set_level(logging.WARNING, logger="telegram_idem")
    try:
        await deliver_failing(idem, bot, before_raising=kill)
    finally:
        await idem.close()
    assert any("could not release" in r.getMessage() for r in caplog.records)
    [line] = failure_lines(caplog)
    assert "could not be released" in line and "frees when its lease ends" in line
    assert "is released" not in line and "was released" not in line


async def test_a_failure_with_the_store_up_says_the_claim_is_released(
    tmp_path: Any, bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    idem = Idem(f"sqlite:///{tmp_path / 'bot.db'}")
    caplog.set_level(logging.WARNING, logger="telegram_idem")
    try:
        await deliver_failing(idem, bot, before_raising=lambda: None)
        key = idem.keys.update(bot.id, load_fixture("techpost_command")["update_id"])
        again = await idem.store.claim(key, lease=60, retention=60)
        assert again.outcome is Outcome.ACQUIRED  # truly released
    finally:
        await idem.close()
    [line] = failure_lines(caplog)
    assert "its claim is released" in line


async def test_idempotent_request_handler_without_a_secret_names_itself(
    tmp_path: Any, bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    idem = Idem(f"sqlite:///{tmp_path / 'bot.db'}")
    try:
        with pytest.raises(ConfigurationError) as raised:
            IdempotentRequestHandler(dispatcher=Dispatcher(), bot=bot, idem=idem)
        assert str(raised.value).startswith("IdempotentRequestHandler: a secret_token")
        assert "FastAckWebhook" not in str(raised.value)
        caplog.set_level(logging.WARNING, logger="telegram_idem")
        IdempotentRequestHandler(
            dispatcher=Dispatcher(), bot=bot, idem=idem, allow_unauthenticated=True
        )
        [warning] = [r.getMessage() for r in caplog.records if "without a secret" in r.getMessage()]
        assert warning.startswith("IdempotentRequestHandler accepts requests")
    finally:
        await idem.close()
