"""Wiring mistakes that used to guard nothing, silently, now raise ConfigurationError
(real aiogram Dispatcher and Router, updates fed with feed_raw_update)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiogram import Bot, Dispatcher, F, Router
from aiogram.types import CallbackQuery, Message

from telegram_idem import ConfigurationError, Idem, idempotent
from telegram_idem.adapters.aiogram import IdempotencyMiddleware
from telegram_idem.testing._delivery import load_fixture


@pytest.fixture
async def bot() -> AsyncIterator[Bot]:
    bot = Bot("7000000001:AAwiring")
    yield bot
    await bot.session.close()


async def test_the_middleware_on_another_observer_raises(bot: Bot) -> None:
    idem = Idem("memory://")
    dp = Dispatcher()
    dp.callback_query.outer_middleware(IdempotencyMiddleware(idem))  # not dp.update
    taps: list[str] = []

    @dp.callback_query()
    async def on_tap(query: CallbackQuery) -> None:
        taps.append(query.id)

    with pytest.raises(ConfigurationError, match=r"dp\.update"):
        await dp.feed_raw_update(bot, load_fixture("callback_delete"))
    assert taps == []  # never run unguarded
    await idem.close()


async def test_idempotent_above_the_router_decorator_raises(bot: Bot) -> None:
    idem = Idem("memory://")
    dp = Dispatcher()
    dp.update.outer_middleware(IdempotencyMiddleware(idem))
    router = Router()
    dp.include_router(router)
    runs: list[int] = []

    @idempotent(key="post:{chat_id}:{message_id}")  # wraps what the router returned...
    @router.message(F.text)  # ...which registered the bare handler
    async def on_post(message: Message) -> None:
        runs.append(message.message_id)

    for _ in range(2):
        with pytest.raises(ConfigurationError, match="on_post"):
            await dp.feed_raw_update(bot, load_fixture("techpost_command"))
    assert runs == []
    await idem.close()


async def test_the_documented_order_passes_the_check(bot: Bot) -> None:
    idem = Idem("memory://")
    dp = Dispatcher()
    dp.update.outer_middleware(IdempotencyMiddleware(idem))
    runs: list[int] = []

    @dp.message(F.text)
    @idempotent(key="post:{chat_id}:{message_id}")
    async def on_post(message: Message) -> None:
        runs.append(message.message_id)

    update = load_fixture("techpost_command")
    await dp.feed_raw_update(bot, update)
    await dp.feed_raw_update(bot, {**update, "update_id": update["update_id"] + 1})
    assert runs == [4121]  # a second update, same message: the action replays
    await idem.close()
