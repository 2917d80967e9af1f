"""python-telegram-bot behind the durable inbox: a failing handler is retried by the
worker, and @idempotent replays what already ran."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from telegram import Update
from telegram.ext import ApplicationBuilder, CommandHandler, ContextTypes, TypeHandler

from telegram_idem import Idem
from telegram_idem.adapters import ptb
from telegram_idem.inbox._worker import InboxWorker
from telegram_idem.ingress._polling import PollingIngress
from telegram_idem.ingress._webhook import new_entry
from telegram_idem.testing._delivery import load_fixture
from telegram_idem.testing.bot_api import FakeBotAPI

TOKEN = "7000000001:AAptb-inbox"
BOT = 7000000001


@pytest.fixture
async def idem(tmp_path: Path) -> AsyncIterator[Idem]:
    guard = Idem(f"sqlite:///{tmp_path / 'ptb.db'}")
    yield guard
    await guard.close()


async def test_a_failed_update_is_retried_and_its_action_runs_once(idem: Idem) -> None:
    bodies: list[int] = []
    attempts: list[int] = []

    @ptb.idempotent(key="post:{chat_id}:{message_id}")
    async def publish(update: Update, context: ContextTypes.DEFAULT_TYPE) -> int:
        bodies.append(update.effective_message.message_id)  # type: ignore[union-attr]
        return len(bodies)

    async def techpost(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        await publish(update, context)
        attempts.append(1)
        if len(attempts) == 1:
            raise TimeoutError("the reply timed out after the action ran")

    async with FakeBotAPI() as api:
        app: Any = ApplicationBuilder().token(TOKEN).base_url(api.ptb_base_url).build()
        app.add_handler(CommandHandler("techpost", techpost))
        await app.initialize()
        try:
            inbox = idem.store.inbox()
            worker = InboxWorker(
                inbox, ptb.inbox_dispatch(app, idem), backoff_base=0.01, poll_interval=0.01
            )
            update = load_fixture("techpost_command")
            assert await inbox.admit(new_entry(idem, update, bot_id=7000000001), retention=60)
            assert not await inbox.admit(new_entry(idem, update, bot_id=7000000001), retention=60)
            worker.start()
            await worker.drain(limit=30)
            await worker.stop()
        finally:
            await app.shutdown()
    assert attempts == [1, 1]  # the worker retried the failed update
    assert bodies == [4121]  # the action ran once; the retry replayed it
    assert await inbox.dead_letters() == []


async def test_polling_into_the_inbox_through_a_ptb_bot_duplicates_nothing(idem: Idem) -> None:
    """``ptb_get_updates`` feeds ``PollingIngress`` as ``aiogram_get_updates`` does: a batch
    re-fetched after a crash (no offset confirmed it) is admitted once, and the worker runs
    each update once through the PTB application."""
    seen: list[int] = []

    async def on_any(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        seen.append(update.update_id)

    async with FakeBotAPI(long_poll_cap=0.05) as api:
        app: Any = ApplicationBuilder().token(TOKEN).base_url(api.ptb_base_url).build()
        app.add_handler(TypeHandler(Update, on_any))
        await app.initialize()
        try:
            names = ("techpost_command", "techpost_no_title", "inline_query")
            for name in names:
                api.queue_update(load_fixture(name))
            first = PollingIngress(idem, ptb.ptb_get_updates(app.bot), bot_id=BOT, poll_timeout=0)
            assert await first.poll_once() == 3
            assert first.admitted == 3
            # The process dies before the next getUpdates confirmed the batch.
            second = PollingIngress(idem, ptb.ptb_get_updates(app.bot), bot_id=BOT, poll_timeout=0)
            assert await second.poll_once() == 3
            assert (second.admitted, second.duplicates) == (0, 3)
            assert second.offset == 734519050 + 1
            assert await second.poll_once() == 0  # the offset confirmed the batch
            inbox = idem.store.inbox()
            worker = InboxWorker(
                inbox, ptb.inbox_dispatch(app, idem), backoff_base=0.01, poll_interval=0.01
            )
            worker.start()
            await worker.drain(limit=30)
            await worker.stop()
        finally:
            await app.shutdown()
    assert sorted(seen) == sorted(load_fixture(n)["update_id"] for n in names)
    assert await inbox.dead_letters() == []


async def test_an_update_ptb_cannot_parse_is_a_dead_letter_and_polling_goes_on(
    idem: Idem,
) -> None:
    """``Bot.get_updates`` parses the whole batch: one update PTB cannot parse (a message
    without ``date``) failed every fetch and the offset never moved. Fetched raw, it is
    admitted, dead-lettered at its first take, and the valid update after it runs."""
    seen: list[int] = []

    async def on_any(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        seen.append(update.update_id)

    valid = load_fixture("techpost_command")
    async with FakeBotAPI(long_poll_cap=0.05) as api:
        app: Any = ApplicationBuilder().token(TOKEN).base_url(api.ptb_base_url).build()
        app.add_handler(TypeHandler(Update, on_any))
        await app.initialize()
        try:
            api.queue_update({"update_id": 9001, "message": {"text": "\ud800"}})
            api.queue_update({**valid, "update_id": 9002})
            ingress = PollingIngress(idem, ptb.ptb_get_updates(app.bot), bot_id=BOT, poll_timeout=0)
            assert await ingress.poll_once() == 2
            assert ingress.offset == 9003
            assert await ingress.poll_once() == 0  # the offset confirmed both
            inbox = idem.store.inbox()
            worker = InboxWorker(
                inbox, ptb.inbox_dispatch(app, idem), backoff_base=0.01, poll_interval=0.01
            )
            worker.start()
            await worker.drain(limit=30)
            await worker.stop()
        finally:
            await app.shutdown()
    assert seen == [9002]
    dead = await inbox.dead_letters()
    assert [d.id for d in dead] == [idem.keys.update(BOT, 9001)]
    assert dead[0].attempts == 1  # at once: no retry can parse it
    assert "cannot parse" in (dead[0].last_error or "")
