"""Registering the middleware twice (as a reader following the quickstart top to bottom
might) must not drop every update."""

from __future__ import annotations

from aiogram import Bot, Dispatcher
from aiogram.types import Message

from telegram_idem import Idem
from telegram_idem.adapters.aiogram import IdempotencyMiddleware
from telegram_idem.testing._delivery import load_fixture


async def test_a_second_registration_passes_the_update_through() -> None:
    idem = Idem("memory://")
    dp = Dispatcher()
    dp.update.outer_middleware(IdempotencyMiddleware(idem))
    dp.update.outer_middleware(IdempotencyMiddleware(idem))
    runs: list[int] = []

    @dp.message()
    async def on_message(message: Message) -> None:
        runs.append(message.message_id)

    bot = Bot("7000000001:AAtwice")
    try:
        await dp.feed_raw_update(bot, load_fixture("techpost_command"))
        await dp.feed_raw_update(bot, load_fixture("techpost_command"))
    finally:
        await bot.session.close()
    assert runs == [4121]
