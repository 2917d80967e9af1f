"""A store outage under aiogram polling: the update's task is its only copy (the next
``getUpdates`` confirms it), so the fail-closed middleware keeps trying the claim until
the store answers again, instead of dropping the update with an error log. A webhook
shape still fails at once, so its answer is non-2xx and Telegram re-sends."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from aiogram import Bot, Dispatcher, Router
from aiogram.types import Message, Update

from telegram_idem import Idem, StoreError
from telegram_idem.adapters.aiogram import IdempotencyMiddleware
from telegram_idem.testing._delivery import load_fixture

TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"

PrivateRedis = tuple[int, Callable[[], None], Callable[[], None]]


def dispatcher(idem: Idem, runs: list[int], **options: Any) -> Dispatcher:
    dp = Dispatcher()
    dp.update.outer_middleware(IdempotencyMiddleware(idem, **options))
    router = Router()

    @router.message()
    async def on_message(message: Message) -> None:
        runs.append(message.message_id)

    dp.include_router(router)
    return dp


async def test_a_polled_update_waits_out_a_store_outage_and_runs_once(
    private_redis_port: PrivateRedis, bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    port, kill, start = private_redis_port
    idem = Idem(f"redis://127.0.0.1:{port}/0?socket_timeout=0.5", lease=5.0)
    runs: list[int] = []
    dp = dispatcher(idem, runs)
    update = Update.model_validate(load_fixture("techpost_command"), context={"bot": bot})
    caplog.set_level(logging.WARNING, logger="telegram_idem")
    kill()
    try:
        # What start_polling does with each update: feed it in a task, with "bots" in
        # the workflow data; the offset has moved on already.
        task = asyncio.create_task(dp.feed_update(bot, update, bots=[bot]))
        await asyncio.sleep(1.5)
        assert not task.done() and runs == []  # still trying, not dropped
        start()
        async with asyncio.timeout(20):
            await task
        assert runs == [update.message.message_id]  # type: ignore[union-attr]
        again = await dp.feed_update(bot, update, bots=[bot])  # a re-read: a duplicate
        assert runs == [update.message.message_id]  # type: ignore[union-attr]
        assert again is not None
    finally:
        await idem.close()
    messages = [r.getMessage() for r in caplog.records if r.name == "telegram_idem"]
    assert sum("store unavailable" in m for m in messages) == 1
    assert sum("store answers again" in m for m in messages) == 1


async def test_a_webhook_shape_fails_at_once_during_an_outage(
    private_redis_port: PrivateRedis, bot: Bot
) -> None:
    port, kill, _start = private_redis_port
    idem = Idem(f"redis://127.0.0.1:{port}/0?socket_timeout=0.5")
    runs: list[int] = []
    dp = dispatcher(idem, runs)
    update = Update.model_validate(load_fixture("techpost_command"), context={"bot": bot})
    kill()
    try:
        async with asyncio.timeout(5):
            with pytest.raises(StoreError):
                await dp.feed_update(bot, update)  # the answer is non-2xx: re-sent later
    finally:
        await idem.close()
    assert runs == []


async def test_outage_wait_bounds_the_wait(private_redis_port: PrivateRedis, bot: Bot) -> None:
    port, kill, _start = private_redis_port
    idem = Idem(f"redis://127.0.0.1:{port}/0?socket_timeout=0.5")
    dp = dispatcher(idem, [], outage_wait=1.0)
    update = Update.model_validate(load_fixture("techpost_command"), context={"bot": bot})
    kill()
    try:
        async with asyncio.timeout(10):
            with pytest.raises(StoreError):
                await dp.feed_update(bot, update, bots=[bot])
    finally:
        await idem.close()
