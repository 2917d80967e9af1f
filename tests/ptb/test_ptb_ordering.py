"""Item: per-chat ordering in ``IdempotentUpdateProcessor``.

With ``max_concurrent_updates > 1`` PTB runs updates concurrently; the processor keeps the
updates of one chat in the order PTB queued them while other chats run in parallel, and
an update waiting for its chat never takes a place another chat could use.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from ptb_support import App, build, in_chat, running
from telegram import Update
from telegram.ext import CallbackQueryHandler, ContextTypes, MessageHandler, filters

from telegram_idem import ConfigurationError, Idem
from telegram_idem._ordering import DEFAULT_ORDERING, Ordering, OrderingUnit
from telegram_idem.adapters.ptb import IdempotentUpdateProcessor
from telegram_idem.inbox import _entries as entries
from telegram_idem.testing._delivery import load_fixture
from telegram_idem.testing._factories import UpdateFactory
from telegram_idem.testing.bot_api import FakeBotAPI

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


# ---------------------------------------------------------------- the callback lane

LONG_JOB = 3.0  # seconds the chat's job runs unless the tap ends it first


def long_job_then_tap(app: App) -> tuple[Update, Update]:
    """A command in a chat, then a tap on a button of the bot in that same chat."""
    factory = UpdateFactory()
    job = factory.command("/techpost", update_id=1)
    tap = factory.callback_query("page:2", update_id=2)
    return Update.de_json(job, app.bot), Update.de_json(tap, app.bot)


def lane_app(
    api: FakeBotAPI, idem: Idem, events: list[str], job_seconds: float, **options: Any
) -> App:
    """A job handler that runs until the tap was processed (at most ``job_seconds``)."""
    tapped = asyncio.Event()

    async def on_job(update: Update, context: Ctx) -> None:
        events.append("job start")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(tapped.wait(), job_seconds)
        events.append("job end")

    async def on_tap(update: Update, context: Ctx) -> None:
        events.append("tap")
        tapped.set()

    app = build(api, idem, concurrency=8, **options)
    app.add_handler(MessageHandler(filters.ALL, on_job))
    app.add_handler(CallbackQueryHandler(on_tap))
    return app


async def test_a_tap_is_processed_while_a_long_job_of_its_chat_runs(
    api: FakeBotAPI, idem: Idem
) -> None:
    """The processor uses the shared Ordering: callback queries run in ``<unit>:cbq``, so a
    tap is never held past Telegram's ~15 s answerCallbackQuery window by its chat's job."""
    events: list[str] = []
    app = lane_app(api, idem, events, LONG_JOB)
    async with running(app):
        job, tap = long_job_then_tap(app)
        await app.update_queue.put(job)
        await app.update_queue.put(tap)
        await app.update_queue.join()
    assert events == ["job start", "tap", "job end"]


async def test_without_the_callback_lane_a_tap_waits_for_its_chat(
    api: FakeBotAPI, idem: Idem
) -> None:
    events: list[str] = []
    app = lane_app(api, idem, events, 0.5, ordering=Ordering(callback_lane=False))
    async with running(app):
        job, tap = long_job_then_tap(app)
        await app.update_queue.put(job)
        await app.update_queue.put(tap)
        await app.update_queue.join()
    assert events == ["job start", "job end", "tap"]


async def test_a_custom_unit_orders_the_processor_like_the_inbox(
    api: FakeBotAPI, idem: Idem
) -> None:
    """One rule for every shape: a unit covering every update serialises two chats."""
    second_started = asyncio.Event()
    order: list[int] = []

    async def on_message(update: Update, context: Ctx) -> None:
        if update.update_id == 1:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(second_started.wait(), 0.3)
        else:
            second_started.set()
        order.append(update.update_id)

    app = build(api, idem, concurrency=8, ordering=Ordering(lambda update: "all"))
    app.add_handler(MessageHandler(filters.ALL, on_message))
    async with running(app):
        await app.update_queue.put(message(app, 1, CHAT_A))
        await app.update_queue.put(message(app, 2, CHAT_B))
        await app.update_queue.join()
    assert order == [1, 2]


async def test_a_failing_ordering_rule_never_drops_the_update(
    api: FakeBotAPI, idem: Idem, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(update: Mapping[str, Any]) -> str:
        raise RuntimeError("boom")

    ran: list[int] = []

    async def on_message(update: Update, context: Ctx) -> None:
        ran.append(update.update_id)

    app = build(api, idem, concurrency=2, ordering=Ordering(broken))
    app.add_handler(MessageHandler(filters.ALL, on_message))
    async with running(app):
        await app.update_queue.put(message(app, 1, CHAT_A))
        await app.update_queue.join()
    assert ran == [1]
    assert "ordering rule failed for update 1" in caplog.text


def test_ordering_with_ordered_false_is_refused(idem: Idem) -> None:
    with pytest.raises(ConfigurationError, match="ordered=False"):
        IdempotentUpdateProcessor(idem, 2, ordered=False, ordering=Ordering())


def test_the_inbox_and_the_processor_share_one_ordering_rule() -> None:
    assert entries.Ordering is Ordering
    assert entries.DEFAULT_ORDERING is DEFAULT_ORDERING
    assert entries.OrderingUnit is OrderingUnit
