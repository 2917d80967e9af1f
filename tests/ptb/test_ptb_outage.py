"""A store outage behind the PTB processor: an update that reached the processor was
already acknowledged to Telegram (polling confirms it with the next getUpdates; PTB's
webhook server answered 200), so fail-closed keeps trying the claim until the store
answers again instead of dropping the update. Real PTB Application, a Redis of its own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from ptb_support import build, running
from telegram import Update
from telegram.ext import CommandHandler, ContextTypes

from telegram_idem import Idem
from telegram_idem.testing._delivery import load_fixture
from telegram_idem.testing.bot_api import FakeBotAPI

PrivateRedis = tuple[int, Callable[[], None], Callable[[], None]]


@pytest.fixture
async def api() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI() as fake:
        yield fake


async def test_an_update_waits_out_a_store_outage_and_runs_once(
    api: FakeBotAPI, private_redis_port: PrivateRedis
) -> None:
    port, kill, start = private_redis_port
    idem = Idem(f"redis://127.0.0.1:{port}/0?socket_timeout=0.5", lease=5.0)
    runs: list[int] = []

    async def techpost(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        runs.append(update.update_id)

    app = build(api, idem)
    app.add_handler(CommandHandler("techpost", techpost))
    payload: dict[str, Any] = load_fixture("techpost_command")
    kill()
    try:
        async with running(app):
            await app.update_queue.put(Update.de_json(payload, app.bot))
            await asyncio.sleep(1.5)
            assert runs == []  # still trying, not dropped
            start()
            async with asyncio.timeout(20):
                while not runs:
                    await asyncio.sleep(0.05)
            await app.update_queue.put(Update.de_json(payload, app.bot))  # re-read
            await app.update_queue.join()
            await asyncio.sleep(0.2)
    finally:
        await idem.close()
    assert runs == [payload["update_id"]]
