"""The answers of aiogram's webhook paths and polling, by the admission rule.

Only a *completed* update is acknowledged as a duplicate. A delivery that finds the update
in progress elsewhere (a killed run, or a claim a store applied after its client had
timed out) is answered non-2xx so Telegram re-sends it, and the delivery after the dead
holder's lease runs it once. Real aiogram Dispatchers and Bots, real aiohttp servers on
loopback, real stores, a real ``kill -9``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiogram import Bot, Dispatcher, Router
from aiogram.types import Message
from aiogram.webhook.aiohttp_server import SimpleRequestHandler
from aiohttp import web

from telegram_idem import ConfigurationError, Idem, ManualClock, Status, Store
from telegram_idem.adapters._aiogram_webhook import FastAckWebhook, IdempotentRequestHandler
from telegram_idem.adapters.aiogram import IdempotencyMiddleware
from telegram_idem.testing._delivery import load_fixture
from telegram_idem.testing._loopback import serve_app
from telegram_idem.testing.bot_api import FakeBotAPI

TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"
BOT = 7000000001
SECRET = "answers-secret"
HEADERS = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}


def counting_dispatcher(idem: Idem, runs: list[int], **options: Any) -> Dispatcher:
    dp = Dispatcher()
    dp.update.outer_middleware(IdempotencyMiddleware(idem, **options))
    router = Router()

    @router.message()
    async def on_message(message: Message) -> None:
        runs.append(message.message_id)

    dp.include_router(router)
    return dp


async def post(url: str, update: dict[str, Any], headers: dict[str, str] = HEADERS) -> int:
    body = json.dumps(update, ensure_ascii=False).encode()
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as r:
        return r.status


async def serve_hook(handler: Any) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/webhook", handler)
    runner, base = await serve_app(app)
    return runner, f"{base}/webhook"


async def settle(hook: FastAckWebhook) -> None:
    await hook.drain(limit=10)


# ------------------------------------------------------- FastAckWebhook: NOT_YET → 503


async def test_claim_applied_after_a_timeout_is_503_then_runs_once_after_the_lease(
    store: Store, clock: ManualClock, bot: Bot
) -> None:
    """The store-timeout shape: the claim reached the store, its client got an error (the
    webhook answered 503); Telegram's re-send finds the claim in progress."""
    idem = Idem(store, clock=clock, heartbeat=False, lease=30.0)
    update = load_fixture("techpost_command")
    await idem.claim_update(update, bot_id=BOT)  # applied, but nobody holds it any more
    runs: list[int] = []
    hook = FastAckWebhook(counting_dispatcher(idem, runs), bot, idem, secret_token=SECRET)
    runner, url = await serve_hook(hook.handle)
    try:
        assert await post(url, update) == 503  # not acknowledged: Telegram re-sends
        await settle(hook)
        assert runs == []
        clock.advance(31)  # the dead holder's lease ends
        assert await post(url, update) == 200
        await settle(hook)
        assert runs == [4121]
        assert await post(url, update) == 200  # completed: a duplicate, not run
        await settle(hook)
    finally:
        await runner.cleanup()
    assert runs == [4121]
    record = await idem.store.get(idem.keys.update(BOT, update["update_id"]))
    assert record is not None and record.status is Status.COMPLETED


CLAIMER = """
import asyncio, sys
from telegram_idem import Idem

async def main():
    idem = Idem(sys.argv[1], lease=float(sys.argv[2]), heartbeat=True)
    update = {"update_id": int(sys.argv[3]), "message": {}}
    claim = await idem.claim_update(update, bot_id=int(sys.argv[4]))
    print(claim.outcome.value, flush=True)
    await asyncio.sleep(3600)  # "processing" until killed

asyncio.run(main())
"""


async def test_kill_9_of_the_holder_is_503_within_its_lease_then_runs_once(
    tmp_path: Path, bot: Bot
) -> None:
    url_of_store = f"sqlite:///{tmp_path / 'bot.db'}"
    lease = 1.0
    update = load_fixture("techpost_command")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CLAIMER,
        url_of_store,
        str(lease),
        str(update["update_id"]),
        str(BOT),
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() == b"acquired"
    os.kill(proc.pid, signal.SIGKILL)  # the first run dies mid-handler
    await proc.wait()
    idem = Idem(url_of_store, lease=lease)
    runs: list[int] = []
    hook = FastAckWebhook(counting_dispatcher(idem, runs), bot, idem, secret_token=SECRET)
    runner, url = await serve_hook(hook.handle)
    try:
        assert await post(url, update) == 503  # within the dead run's lease
        assert runs == []
        statuses: list[int] = []
        async with asyncio.timeout(10):  # Telegram keeps re-sending until a 2xx
            while not statuses or statuses[-1] != 200:
                await asyncio.sleep(0.2)
                statuses.append(await post(url, update))
        await settle(hook)
        assert await post(url, update) == 200
        await settle(hook)
    finally:
        await runner.cleanup()
        await idem.close()
    assert set(statuses[:-1]) <= {503}
    assert runs == [4121]


# -------------------------------------- the middleware: webhooks raise, polling waits


async def test_simple_request_handler_answers_non_2xx_while_in_progress(
    store: Store, clock: ManualClock, bot: Bot
) -> None:
    """aiogram's handler with handle_in_background=False answers from the result: the
    middleware's UpdateInProgressError makes it non-2xx."""
    idem = Idem(store, clock=clock, heartbeat=False, lease=30.0)
    update = load_fixture("techpost_command")
    await idem.claim_update(update, bot_id=BOT)  # a killed holder
    runs: list[int] = []
    app = web.Application()
    SimpleRequestHandler(
        dispatcher=counting_dispatcher(idem, runs),
        bot=bot,
        handle_in_background=False,
        secret_token=SECRET,
    ).register(app, path="/webhook")
    runner, base = await serve_app(app)
    try:
        status = await post(f"{base}/webhook", update)
        assert status >= 500
        assert runs == []
        clock.advance(31)
        assert await post(f"{base}/webhook", update) == 200
        assert runs == [4121]
    finally:
        await runner.cleanup()


async def test_polling_waits_out_a_dead_holders_lease_and_runs_once(
    tmp_path: Path, api: FakeBotAPI, bot: Bot
) -> None:
    """aiogram's start_polling: the next getUpdates confirms the update whatever happens,
    so the middleware waits (about one lease) instead of dropping it."""
    idem = Idem(f"sqlite:///{tmp_path / 'bot.db'}", lease=0.5)
    update = load_fixture("techpost_command")
    await idem.claim_update(update, bot_id=BOT)  # the process was killed mid-handler
    runs: list[int] = []
    dp = counting_dispatcher(idem, runs)
    api.queue_update(update)  # the restarted process re-reads it
    polling = asyncio.create_task(dp.start_polling(bot, handle_signals=False, polling_timeout=0))
    try:
        async with asyncio.timeout(10):
            while not runs:
                await asyncio.sleep(0.05)
    finally:
        await dp.stop_polling()
        await polling
        await idem.close()
    assert runs == [4121]


# ---------------------------------- a store outage: decide before answering (item 2)


async def test_idempotent_request_handler_answers_503_on_a_store_outage(
    tmp_path: Path, bot: Bot
) -> None:
    broken = Idem(f"sqlite:///{tmp_path}")  # a directory: the database cannot open
    runs: list[int] = []
    app = web.Application()
    IdempotentRequestHandler(
        dispatcher=counting_dispatcher(broken, runs), bot=bot, idem=broken, secret_token=SECRET
    ).register(app, path="/webhook")
    runner, base = await serve_app(app)
    try:
        assert await post(f"{base}/webhook", load_fixture("techpost_command")) == 503
        wrong = {**HEADERS, "X-Telegram-Bot-Api-Secret-Token": "wrong"}
        assert await post(f"{base}/webhook", load_fixture("techpost_command"), wrong) == 401
    finally:
        await runner.cleanup()
        await broken.close()
    assert runs == []


async def test_idempotent_request_handler_processes_once(
    store: Store, clock: ManualClock, bot: Bot
) -> None:
    idem = Idem(store, clock=clock, heartbeat=False)
    runs: list[int] = []
    app = web.Application()
    handler = IdempotentRequestHandler(
        dispatcher=counting_dispatcher(idem, runs), bot=bot, idem=idem, secret_token=SECRET
    )
    handler.register(app, path="/webhook")
    runner, base = await serve_app(app)
    try:
        update = load_fixture("techpost_command")
        assert await post(f"{base}/webhook", update) == 200
        await handler.webhook.drain(limit=10)
        assert await post(f"{base}/webhook", update) == 200
        await handler.webhook.drain(limit=10)
    finally:
        await runner.cleanup()
    assert runs == [4121]


async def test_naive_simple_request_handler_is_warned_about(
    tmp_path: Path, bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    """aiogram's default handle_in_background=True answers 200 before the guard decides:
    the outage's StoreError dies in the background. The middleware says so, once."""
    broken = Idem(f"sqlite:///{tmp_path}")
    runs: list[int] = []
    app = web.Application()
    SimpleRequestHandler(
        dispatcher=counting_dispatcher(broken, runs), bot=bot, secret_token=SECRET
    ).register(app, path="/webhook")
    runner, base = await serve_app(app)
    caplog.set_level(logging.WARNING, logger="telegram_idem.aiogram")
    try:
        for update_id in (1, 2):
            update = {**load_fixture("techpost_command"), "update_id": update_id}
            assert await post(f"{base}/webhook", update) == 200  # aiogram answered first
        async with asyncio.timeout(5):
            while not any("IdempotentRequestHandler" in r.message for r in caplog.records):
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
    finally:
        await runner.cleanup()
        await broken.close()
    warnings = [r for r in caplog.records if "handle_in_background=True" in r.message]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert runs == []


async def test_fail_open_runs_a_parseable_update_unguarded_but_refuses_an_unparseable_one(
    tmp_path: Path, bot: Bot
) -> None:
    """Fail-open runs what can run without its claim; an update aiogram cannot parse
    could never run, so it is answered 503 and recorded failed once the store answers."""
    broken = Idem(f"sqlite:///{tmp_path}")  # a directory: the database cannot open
    runs: list[int] = []
    hook = FastAckWebhook(
        counting_dispatcher(broken, runs),
        bot,
        broken,
        secret_token=SECRET,
        on_store_error="fail_open",
    )
    runner, url = await serve_hook(hook.handle)
    try:
        assert await post(url, load_fixture("techpost_command")) == 200
        await settle(hook)
        assert await post(url, {"update_id": 734519999, "message": {"text": "no chat"}}) == 503
    finally:
        await runner.cleanup()
        await broken.close()
    assert runs == [4121]  # the middleware passed the unguarded update through


# ------------------------------------------- a body aiogram cannot parse (item 15)


async def test_an_update_aiogram_cannot_parse_is_acknowledged_and_recorded_failed(
    store: Store, clock: ManualClock, bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    idem = Idem(store, clock=clock, heartbeat=False)
    runs: list[int] = []
    hook = FastAckWebhook(counting_dispatcher(idem, runs), bot, idem, secret_token=SECRET)
    runner, url = await serve_hook(hook.handle)
    broken = {"update_id": 734519999, "message": {"text": "no chat, no date"}}
    caplog.set_level(logging.ERROR, logger="telegram_idem.webhook")
    try:
        assert await post(url, broken) == 200  # a re-send could never parse either
        assert await post(url, broken) == 200
    finally:
        await runner.cleanup()
    assert runs == []
    record = await idem.store.get(idem.keys.update(BOT, 734519999))
    assert record is not None and record.status is Status.FAILED
    assert b"cannot parse" in (record.result or b"")
    assert any("does not parse" in r.message for r in caplog.records)


# ---------------------------------------------------------------- secrets (item 14)


def test_a_webhook_without_a_secret_is_refused_unless_opted_out(
    bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    idem = Idem("memory://")
    dp = Dispatcher()
    with pytest.raises(ConfigurationError, match="secret_token is required"):
        FastAckWebhook(dp, bot, idem)
    with pytest.raises(ConfigurationError, match="secret_token is required"):
        IdempotentRequestHandler(dispatcher=dp, bot=bot, idem=idem)
    caplog.set_level(logging.WARNING, logger="telegram_idem.webhook")
    FastAckWebhook(dp, bot, idem, allow_unauthenticated=True)
    assert any("without a secret token" in r.message for r in caplog.records)
