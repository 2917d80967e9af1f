"""``IdempotencyMiddleware.setup(dp)`` checks the wiring when the dispatcher starts, before
any update is taken: behind an answer-first handler the first update would already be
answered 200 and lost. Real aiogram Dispatchers, a real ``start_polling`` against the fake
Bot API, real aiohttp apps started on loopback by aiogram's ``setup_application``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from aiogram import Bot, Dispatcher, F, Router
from aiogram.types import CallbackQuery, Message
from aiogram.webhook.aiohttp_server import SimpleRequestHandler, setup_application
from aiohttp import web

from telegram_idem import ConfigurationError, Idem, idempotent
from telegram_idem.adapters._aiogram_webhook import IdempotentRequestHandler
from telegram_idem.adapters.aiogram import IdempotencyMiddleware
from telegram_idem.testing._delivery import load_fixture
from telegram_idem.testing._loopback import serve_app
from telegram_idem.testing.bot_api import FakeBotAPI

TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"
SECRET = "startup-secret"


@pytest.fixture
async def idem() -> AsyncIterator[Idem]:
    guard = Idem("memory://")
    yield guard
    await guard.close()


def misplaced_dispatcher(idem: Idem, runs: list[int]) -> Dispatcher:
    dp = Dispatcher()
    IdempotencyMiddleware(idem).setup(dp)
    router = Router()
    dp.include_router(router)

    @idempotent(key="post:{chat_id}:{message_id}")  # wraps what the router returned...
    @router.message(F.text)  # ...which registered the bare handler
    async def on_post(message: Message) -> None:
        runs.append(message.message_id)

    return dp


async def test_idempotent_above_the_router_decorator_raises_at_startup(
    idem: Idem, bot: Bot
) -> None:
    runs: list[int] = []
    dp = misplaced_dispatcher(idem, runs)
    with pytest.raises(ConfigurationError, match="on_post"):
        await dp.emit_startup(bot=bot, dispatcher=dp)
    assert runs == []


async def test_start_polling_fails_before_taking_an_update(
    idem: Idem, api: FakeBotAPI, bot: Bot
) -> None:
    runs: list[int] = []
    dp = misplaced_dispatcher(idem, runs)
    api.queue_update(load_fixture("techpost_command"))
    async with asyncio.timeout(10):  # without the start-up check it would poll on
        with pytest.raises(ConfigurationError, match="on_post"):
            await dp.start_polling(bot, handle_signals=False, close_bot_session=False)
    assert api.calls_of("getUpdates") == []  # nothing was read, so nothing was confirmed
    assert len(api.pending_updates) == 1
    assert runs == []


async def test_the_middleware_on_another_observer_raises_at_startup(idem: Idem, bot: Bot) -> None:
    dp = Dispatcher()
    IdempotencyMiddleware(idem).setup(dp)
    dp.callback_query.outer_middleware(IdempotencyMiddleware(idem))  # guards nothing there

    @dp.callback_query()
    async def on_tap(query: CallbackQuery) -> None: ...

    with pytest.raises(ConfigurationError, match=r"dp\.callback_query\.outer_middleware"):
        await dp.emit_startup(bot=bot, dispatcher=dp)


async def test_the_documented_order_starts_and_runs(idem: Idem, bot: Bot) -> None:
    dp = Dispatcher()
    IdempotencyMiddleware(idem).setup(dp)
    runs: list[int] = []

    @dp.message(F.text)
    @idempotent(key="post:{chat_id}:{message_id}")
    async def on_post(message: Message) -> None:
        runs.append(message.message_id)

    await dp.emit_startup(bot=bot, dispatcher=dp)
    update = load_fixture("techpost_command")
    await dp.feed_raw_update(bot, update)
    await dp.feed_raw_update(bot, update)  # the same update again: not run
    assert runs == [4121]


async def test_naive_simple_request_handler_is_warned_about_at_app_startup(
    idem: Idem, bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    """The WARNING comes when the aiohttp app starts, before any update is posted."""
    dp = Dispatcher()
    IdempotencyMiddleware(idem).setup(dp)
    app = web.Application()
    SimpleRequestHandler(dispatcher=dp, bot=bot, secret_token=SECRET).register(app, path="/webhook")
    setup_application(app, dp, bot=bot)
    caplog.set_level(logging.WARNING, logger="telegram_idem.aiogram")
    runner, _ = await serve_app(app)  # runs the app's on_startup, hence dp's startup
    try:
        warnings = [r for r in caplog.records if "handle_in_background=True" in r.message]
        assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
        assert "/webhook" in warnings[0].message
    finally:
        await runner.cleanup()


async def test_handlers_that_decide_first_are_not_warned_about(
    idem: Idem, bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    dp = Dispatcher()
    IdempotencyMiddleware(idem).setup(dp)
    app = web.Application()
    IdempotentRequestHandler(dispatcher=dp, bot=bot, idem=idem, secret_token=SECRET).register(
        app, path="/webhook"
    )
    SimpleRequestHandler(
        dispatcher=dp, bot=bot, secret_token=SECRET, handle_in_background=False
    ).register(app, path="/webhook-sync")
    setup_application(app, dp, bot=bot)
    caplog.set_level(logging.WARNING, logger="telegram_idem.aiogram")
    runner, _ = await serve_app(app)
    await runner.cleanup()
    assert [r for r in caplog.records if "handle_in_background" in r.message] == []
