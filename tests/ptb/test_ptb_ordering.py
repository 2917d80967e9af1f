"""Item: per-chat ordering in ``IdempotentUpdateProcessor``.

With ``max_concurrent_updates > 1`` PTB runs updates concurrently; the processor keeps the
updates of one chat in the order PTB queued them while other chats run in parallel, and
an update waiting for its chat never takes a place another chat could use.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from ptb_support import App, build, in_chat, running
from telegram import Update
from telegram.ext import ContextTypes, MessageHandler, filters

from telegram_idem import Idem
from telegram_idem.testing.bot_api import FakeBotAPI
from telegram_idem.testing.delivery import load_fixture

Ctx = ContextTypes.DEFAULT_TYPE
CHAT_A = 5550001001
CHAT_B = 5550002002
GUARD = 5.0  # seconds: only to turn a deadlock into a failure, never a speed bound


@pytest.fixture
async def api() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI() as fake:
        yield fake


@pytest.fixture
async def idem() -> AsyncIterator[Idem]:
    guard = Idem("memory://")
    yield guard
    await guard.close()


def message(app: App, update_id: int, chat: int) -> Update:
    return Update.de_json(in_chat(load_fixture("techpost_command"), update_id, chat), app.bot)


async def test_two_messages_of_one_chat_run_one_after_the_other_in_order(
    api: FakeBotAPI, idem: Idem
) -> None:
    events: list[str] = []

    async def on_message(update: Update, context: Ctx) -> None:
        events.append(f"start {update.update_id}")
        if update.update_id == 1:
            for _ in range(20):  # slow: give the second every chance to overtake
                await asyncio.sleep(0)
            await asyncio.sleep(0.05)
        events.append(f"end {update.update_id}")

    app = build(api, idem, concurrency=8)
    app.add_handler(MessageHandler(filters.ALL, on_message))
    async with running(app):
        for update_id in (1, 2, 3):
            await app.update_queue.put(message(app, update_id, CHAT_A))
        await app.update_queue.join()
    assert events == ["start 1", "end 1", "start 2", "end 2", "start 3", "end 3"]


async def test_other_chats_run_while_one_chat_is_busy(api: FakeBotAPI, idem: Idem) -> None:
    """Chat A's first update waits until chat B's update ran; with two places, A's queued
    second update must not take the place B needs (else this deadlocks)."""
    b_ran = asyncio.Event()
    order: list[int] = []

    async def on_message(update: Update, context: Ctx) -> None:
        assert update.effective_chat is not None
        if update.update_id == 1:
            await asyncio.wait_for(b_ran.wait(), GUARD)
        if update.effective_chat.id == CHAT_B:
            b_ran.set()
        order.append(update.update_id)

    app = build(api, idem, concurrency=2)
    app.add_handler(MessageHandler(filters.ALL, on_message))
    async with running(app):
        for update_id, chat in ((1, CHAT_A), (2, CHAT_A), (3, CHAT_A), (4, CHAT_B)):
            await app.update_queue.put(message(app, update_id, chat))
        await app.update_queue.join()
    assert order == [4, 1, 2, 3]


async def test_ordered_false_lets_one_chat_overlap(api: FakeBotAPI, idem: Idem) -> None:
    second_started = asyncio.Event()
    order: list[int] = []

    async def on_message(update: Update, context: Ctx) -> None:
        if update.update_id == 1:
            await asyncio.wait_for(second_started.wait(), GUARD)
        else:
            second_started.set()
        order.append(update.update_id)

    app = build(api, idem, concurrency=2, ordered=False)
    app.add_handler(MessageHandler(filters.ALL, on_message))
    async with running(app):
        for update_id in (1, 2):
            await app.update_queue.put(message(app, update_id, CHAT_A))
        await app.update_queue.join()
    assert order == [2, 1]
