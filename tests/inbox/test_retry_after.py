"""A 429 from the Bot API (flood control) makes the inbox worker wait the
``retry_after`` Telegram asked for before the next attempt, not its own shorter backoff.
Real aiogram and PTB bots against the fake Bot API over loopback."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from aiogram import Bot, Dispatcher
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.types import Message
from telegram import Update
from telegram.error import RetryAfter
from telegram.ext import ApplicationBuilder, CommandHandler, ContextTypes

from telegram_idem import Idem
from telegram_idem.adapters.aiogram import inbox_dispatch
from telegram_idem.adapters.ptb import inbox_dispatch as ptb_inbox_dispatch
from telegram_idem.inbox._entries import new_entry
from telegram_idem.inbox._worker import InboxWorker, retry_after_of
from telegram_idem.testing._factories import UpdateFactory
from telegram_idem.testing.bot_api import FakeBotAPI

TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"
BOT = 7000000001


@pytest.fixture
async def api() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI() as fake:
        yield fake


def retry_delays(caplog: pytest.LogCaptureFixture) -> list[float]:
    found = [re.search(r"retry in ([\d.]+) s", r.getMessage()) for r in caplog.records]
    return [float(m.group(1)) for m in found if m]


async def admit_one(idem: Idem, text: str) -> None:
    update = UpdateFactory().command(text)
    inbox = idem.store.inbox()
    assert await inbox.admit(new_entry(idem, update, bot_id=BOT), retention=3600)


async def test_aiogram_retry_after_sets_the_next_attempt(
    api: FakeBotAPI, caplog: pytest.LogCaptureFixture
) -> None:
    idem = Idem("memory://")
    dp = Dispatcher()

    @dp.message()
    async def reply(message: Message) -> None:
        await message.answer("hello")

    api.fail_next("sendMessage", status=429, retry_after=7)
    session = AiohttpSession(api=TelegramAPIServer.from_base(api.url))
    async with Bot(token=TOKEN, session=session) as bot:
        await admit_one(idem, "/start")
        worker = InboxWorker(idem.store.inbox(), inbox_dispatch(dp, bot), backoff_base=1.0)
        caplog.set_level(logging.WARNING, logger="telegram_idem.worker")
        assert await worker.run_once()
    assert retry_delays(caplog) == [7.0]  # not the 1 s of its own backoff
    await idem.close()


async def test_ptb_retry_after_sets_the_next_attempt(
    api: FakeBotAPI, caplog: pytest.LogCaptureFixture
) -> None:
    idem = Idem("memory://")
    app = ApplicationBuilder().token(TOKEN).base_url(api.ptb_base_url).build()

    async def reply(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.effective_message is not None
        await update.effective_message.reply_text("hello")

    app.add_handler(CommandHandler("start", reply))
    api.fail_next("sendMessage", status=429, retry_after=9)
    await app.initialize()
    try:
        await admit_one(idem, "/start")
        dispatch = ptb_inbox_dispatch(app, idem)
        worker = InboxWorker(idem.store.inbox(), dispatch, backoff_base=1.0)
        caplog.set_level(logging.WARNING, logger="telegram_idem.worker")
        assert await worker.run_once()
    finally:
        await app.shutdown()
    assert retry_delays(caplog) == [9.0]
    await idem.close()


def test_retry_after_is_read_from_the_error_or_its_cause() -> None:
    class Wrapped(Exception):
        pass

    def chained() -> BaseException:
        try:
            try:
                raise RetryAfter(timedelta(seconds=4))
            except RetryAfter as inner:
                raise Wrapped("handler failed") from inner
        except Wrapped as outer:
            return outer

    assert retry_after_of(chained()) == 4.0
    assert retry_after_of(ValueError("no flood control")) is None
    holder: Any = Exception("429")
    holder.retry_after = 3
    assert retry_after_of(holder) == 3.0
