"""A 429 from the Bot API (flood control) makes the inbox worker wait the
``retry_after`` Telegram asked for before the next attempt, not its own shorter backoff,
and such an attempt is not counted: a run of 429s never dead-letters an update.
Real aiogram and PTB bots against the fake Bot API over loopback."""

from __future__ import annotations

import logging
import re
import warnings
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
from telegram_idem._clock import ManualClock
from telegram_idem.adapters.aiogram import inbox_dispatch
from telegram_idem.adapters.ptb import inbox_dispatch as ptb_inbox_dispatch
from telegram_idem.inbox._entries import new_entry
from telegram_idem.inbox._worker import Dispatch, InboxWorker, retry_after_of
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


FLOOD_RUN = 10  # 429s in a row, far more than max_attempts


async def drive_through_flood(idem: Idem, clock: ManualClock, dispatch: Dispatch) -> InboxWorker:
    """Run the worker one take at a time, moving the store's clock past each delay."""
    inbox = idem.store.inbox()
    worker = InboxWorker(inbox, dispatch, max_attempts=3, backoff_base=1.0)
    takes = 0
    while await inbox.depth() and takes < FLOOD_RUN + 5:
        if await worker.run_once():
            takes += 1
        clock.advance(1.0)
    return worker


async def assert_flood_survived(idem: Idem, api: FakeBotAPI, worker: InboxWorker) -> None:
    inbox = idem.store.inbox()
    assert await inbox.dead_letters() == []
    assert await inbox.depth() == 0
    assert worker.processed == 1 and worker.failures == FLOOD_RUN
    sends = api.calls_of("sendMessage")
    assert len(sends) == FLOOD_RUN + 1
    assert [m.text for m in api.messages(sends[-1].params["chat_id"])] == ["hello"]


async def test_aiogram_a_run_of_429s_is_never_dead_lettered(api: FakeBotAPI) -> None:
    clock = ManualClock()
    idem = Idem("memory://", clock=clock)
    dp = Dispatcher()

    @dp.message()
    async def reply(message: Message) -> None:
        await message.answer("hello")

    api.fail_next("sendMessage", status=429, retry_after=1, times=FLOOD_RUN)
    session = AiohttpSession(api=TelegramAPIServer.from_base(api.url))
    async with Bot(token=TOKEN, session=session) as bot:
        await admit_one(idem, "/start")
        worker = await drive_through_flood(idem, clock, inbox_dispatch(dp, bot))
    await assert_flood_survived(idem, api, worker)
    await idem.close()


async def test_ptb_a_run_of_429s_is_never_dead_lettered(api: FakeBotAPI) -> None:
    clock = ManualClock()
    idem = Idem("memory://", clock=clock)
    app = ApplicationBuilder().token(TOKEN).base_url(api.ptb_base_url).build()

    async def reply(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.effective_message is not None
        await update.effective_message.reply_text("hello")

    app.add_handler(CommandHandler("start", reply))
    api.fail_next("sendMessage", status=429, retry_after=1, times=FLOOD_RUN)
    await app.initialize()
    try:
        await admit_one(idem, "/start")
        worker = await drive_through_flood(idem, clock, ptb_inbox_dispatch(app, idem))
    finally:
        await app.shutdown()
    await assert_flood_survived(idem, api, worker)
    await idem.close()


async def test_other_failures_still_count_toward_max_attempts(api: FakeBotAPI) -> None:
    clock = ManualClock()
    idem = Idem("memory://", clock=clock)
    dp = Dispatcher()

    @dp.message()
    async def reply(message: Message) -> None:
        await message.answer("hello")

    api.fail_next("sendMessage", status=500, times=FLOOD_RUN)
    session = AiohttpSession(api=TelegramAPIServer.from_base(api.url))
    async with Bot(token=TOKEN, session=session) as bot:
        await admit_one(idem, "/start")
        inbox = idem.store.inbox()
        worker = InboxWorker(inbox, inbox_dispatch(dp, bot), max_attempts=3)
        for _ in range(3):
            assert await worker.run_once()
            clock.advance(60.0)
    [dead] = await inbox.dead_letters()
    assert dead.attempts == 3 and len(api.calls_of("sendMessage")) == 3
    await idem.close()


def test_ptb_retry_after_is_read_without_a_deprecation_warning() -> None:
    error = RetryAfter(timedelta(seconds=2.5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert retry_after_of(error) == 2.5
