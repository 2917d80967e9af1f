"""python-telegram-bot behind the durable inbox: a failing handler is retried by the
worker, and @idempotent replays what already ran."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from telegram import Update
from telegram.ext import ApplicationBuilder, CommandHandler, ContextTypes

from telegram_idem import Idem
from telegram_idem.adapters import ptb
from telegram_idem.inbox.worker import InboxWorker
from telegram_idem.ingress.webhook import new_entry
from telegram_idem.testing.bot_api import FakeBotAPI
from telegram_idem.testing.delivery import load_fixture

TOKEN = "7000000001:AAptb-inbox"


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
