"""Two ingress shapes on one store (a rolling migration, or one app with two routes).

A shape that processes in-process (``IdempotentRequestHandler`` / ``FastAckWebhook``, PTB,
Lambda) claims the update guard *in progress*; the inbox shapes (``WebhookIngress``,
``PollingIngress``) must not take that claim for "done". Its holder may have been killed:
until its lease ends the inbox shape does not acknowledge the update, and after it the
update is admitted by takeover and run once. Real SQLite files shared by two ``Idem``
objects, real aiohttp on loopback, a real aiogram Dispatcher behind the worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiogram import Bot, Dispatcher
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.types import Message
from aiohttp import web

from telegram_idem import Idem, ManualClock, Status
from telegram_idem.adapters.aiogram import (
    IdempotencyMiddleware,
    aiogram_get_updates,
    inbox_dispatch,
)
from telegram_idem.inbox._worker import InboxWorker
from telegram_idem.ingress._polling import PollingIngress
from telegram_idem.ingress._webhook import WebhookIngress
from telegram_idem.testing._delivery import load_fixture
from telegram_idem.testing._loopback import serve_app
from telegram_idem.testing.bot_api import FakeBotAPI

TOKEN = "7000000001:AAmixedshapes"
BOT = 7000000001
SECRET = "mixed-secret"
LEASE = 30.0


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'shared.db'}"


@pytest.fixture
async def replicas(db: str, clock: ManualClock) -> AsyncIterator[tuple[Idem, Idem]]:
    """``(inbox_replica, in_process_replica)``: two guards on one SQLite file."""
    inbox_side = Idem(db, clock=clock, lease=LEASE)
    other_side = Idem(db, clock=clock, lease=LEASE)
    yield inbox_side, other_side
    await inbox_side.close()
    await other_side.close()


@pytest.fixture
async def api() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI(long_poll_cap=0.05) as fake:
        yield fake


@pytest.fixture
async def bot(api: FakeBotAPI) -> AsyncIterator[Bot]:
    session = AiohttpSession(api=TelegramAPIServer.from_base(api.url))
    async with Bot(TOKEN, session=session) as client:
        yield client


async def post(url: str, update: dict[str, Any]) -> int:
    headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, data=json.dumps(update).encode(), headers=headers) as resp,
    ):
        return resp.status


async def test_webhook_ingress_answers_503_while_another_shape_holds_the_update_then_runs_it_once(
    replicas: tuple[Idem, Idem], clock: ManualClock, bot: Bot
) -> None:
    idem, other = replicas
    update = load_fixture("techpost_command")
    # The in-process replica claimed the update and was killed mid-handler.
    dead = await other.claim_update(update, bot_id=BOT)
    runs: list[int] = []
    dp = Dispatcher()
    dp.update.outer_middleware(IdempotencyMiddleware(idem))

    @dp.message()
    async def on_message(message: Message) -> None:
        runs.append(message.message_id)

    worker = InboxWorker(idem.store.inbox(), inbox_dispatch(dp, bot), poll_interval=0.01)
    ingress = WebhookIngress(idem, bot_id=BOT, secret_token=SECRET, on_admitted=worker.notify)
    app = web.Application()
    app.router.add_post("/webhook", ingress.handle)
    runner, base = await serve_app(app)
    try:
        # Telegram's re-send within the dead holder's lease: not acknowledged, no entry.
        assert await post(f"{base}/webhook", update) == 503
        assert await idem.store.inbox().depth() == 0
        clock.advance(LEASE - 1)
        assert await post(f"{base}/webhook", update) == 503
        assert ingress.not_yet == 2
        # After its lease: admitted by takeover, run once by the worker.
        clock.advance(2)
        assert await post(f"{base}/webhook", update) == 200
        assert await post(f"{base}/webhook", update) == 200  # now a duplicate
        assert (ingress.admitted, ingress.duplicates) == (1, 1)
        worker.start()
        await worker.drain(limit=30)
    finally:
        await worker.stop()
        await runner.cleanup()
    assert runs == [4121]
    record = await other.store.get(dead.record.key)
    assert record is not None and record.status is Status.COMPLETED
    # the dead holder, should it wake, cannot mark the update done
    assert not await other.store.complete(dead.record.key, dead.token, b"null", retention=60)


async def test_polling_keeps_the_offset_at_an_update_held_elsewhere_until_its_lease_ends(
    replicas: tuple[Idem, Idem], clock: ManualClock, bot: Bot, api: FakeBotAPI
) -> None:
    idem, other = replicas
    held = {**load_fixture("techpost_command"), "update_id": 500}
    after = {**load_fixture("techpost_command"), "update_id": 501}
    await other.claim_update(held, bot_id=BOT)  # its holder then died
    api.queue_update(held)
    api.queue_update(after)
    poller = PollingIngress(idem, aiogram_get_updates(bot), bot_id=BOT, poll_timeout=0)
    assert await poller.poll_once() == 2
    assert poller.offset == 500  # not confirmed: getUpdates confirms below the offset
    assert (poller.admitted, poller.not_yet) == (1, 1)
    clock.advance(LEASE - 1)
    assert await poller.poll_once() == 2  # Telegram sends 500 again: still held
    assert (poller.admitted, poller.duplicates, poller.offset) == (1, 1, 500)
    clock.advance(2)
    assert await poller.poll_once() == 2  # the lease ended: taken over and admitted
    assert (poller.admitted, poller.offset, poller.held_since) == (2, 501 + 1, {})
    assert await poller.poll_once() == 0
    assert await idem.store.inbox().depth() == 2


async def test_polling_moves_past_a_holder_that_keeps_renewing_after_not_yet_wait(
    replicas: tuple[Idem, Idem],
    clock: ManualClock,
    bot: Bot,
    api: FakeBotAPI,
    caplog: pytest.LogCaptureFixture,
) -> None:
    idem, other = replicas
    held = {**load_fixture("techpost_command"), "update_id": 700}
    claim = await other.claim_update(held, bot_id=BOT)
    api.queue_update(held)
    poller = PollingIngress(
        idem, aiogram_get_updates(bot), bot_id=BOT, poll_timeout=0, not_yet_wait=50.0
    )
    caplog.set_level(logging.WARNING, logger="telegram_idem.ingress")
    assert await poller.poll_once() == 1
    assert poller.offset == 700
    for _ in range(2):  # a live holder: its heartbeat renews the lease
        clock.advance(25)
        assert await other.store.extend(claim.record.key, claim.token, lease=LEASE)
        await poller.poll_once()
    assert poller.offset == 701 and poller.held_since == {}
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "700" in errors[0].getMessage()
    assert await idem.store.inbox().depth() == 0


async def test_polling_run_waits_out_a_dead_holders_lease_and_admits_the_update(
    db: str, bot: Bot, api: FakeBotAPI
) -> None:
    idem = Idem(db)
    other = Idem(db, lease=0.3)
    try:
        held = {**load_fixture("techpost_command"), "update_id": 900}
        await other.claim_update(held, bot_id=BOT)  # killed: never completes
        api.queue_update(held)
        poller = PollingIngress(
            idem, aiogram_get_updates(bot), bot_id=BOT, poll_timeout=0, error_delay=0.05
        )
        stop = asyncio.Event()
        running = asyncio.create_task(poller.run(stop))
        async with asyncio.timeout(10):
            while poller.admitted == 0:
                await asyncio.sleep(0.02)
        stop.set()
        await running
        assert poller.not_yet >= 1 and poller.offset == 901
        assert await idem.store.inbox().depth() == 1
    finally:
        await idem.close()
        await other.close()
