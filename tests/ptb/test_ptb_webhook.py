"""Item: a PTB webhook that decides before it answers.

PTB's ``run_webhook`` answers 200 as soon as the update is queued, so a store outage
loses it. ``ptb_webhook`` claims first: 503 on an outage or while another holder's lease
is alive, 200 once claimed; the application's processor then runs the update under that
claim. Real ``Application``, real HTTP on loopback.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from ptb_support import BOT, TOKEN, App, build, running
from telegram import Update
from telegram.ext import ApplicationBuilder, CommandHandler, ContextTypes

from telegram_idem import Idem, Status
from telegram_idem._records import Outcome
from telegram_idem.adapters.ptb import ptb_webhook, ptb_webhook_app
from telegram_idem.errors import ConfigurationError
from telegram_idem.testing._delivery import TelegramDelivery, load_fixture
from telegram_idem.testing._loopback import serve_app
from telegram_idem.testing.bot_api import FakeBotAPI

Ctx = ContextTypes.DEFAULT_TYPE
SECRET = "ptb-webhook-secret"


@pytest.fixture
async def api() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI() as fake:
        yield fake


def techpost_app(api: FakeBotAPI, idem: Idem, runs: list[int]) -> App:
    async def techpost(update: Update, context: Ctx) -> None:
        runs.append(update.update_id)

    app = build(api, idem, concurrency=4)
    app.add_handler(CommandHandler("techpost", techpost))
    return app


async def serve(app: App, idem: Idem) -> tuple[aiohttp.web.AppRunner, str]:
    runner, base = await serve_app(ptb_webhook_app(app, idem, secret_token=SECRET))
    return runner, f"{base}/webhook"


async def test_store_outage_is_answered_503_and_nothing_runs(
    api: FakeBotAPI, tmp_path: Path
) -> None:
    broken = Idem("sqlite:///" + str(tmp_path))  # SQLite cannot open a directory
    runs: list[int] = []
    app = techpost_app(api, broken, runs)
    runner, url = await serve(app, broken)
    try:
        async with TelegramDelivery(url, secret_token=SECRET, max_attempts=1) as tg:
            report = await tg.deliver(load_fixture("techpost_command"))
    finally:
        await runner.cleanup()
        await broken.close()
    assert report.statuses == [503]
    assert runs == []


async def test_claimed_then_200_runs_once_and_a_resend_is_a_duplicate(
    api: FakeBotAPI, tmp_path: Path
) -> None:
    idem = Idem(f"sqlite:///{tmp_path / 'bot.db'}")
    runs: list[int] = []
    app = techpost_app(api, idem, runs)
    runner, url = await serve(app, idem)
    update = load_fixture("techpost_command")
    try:
        async with TelegramDelivery(url, secret_token=SECRET, max_attempts=1) as tg:
            first = await tg.deliver(update)
            await app.update_queue.join()
            again = await tg.deliver(update)
            await app.update_queue.join()
        async with TelegramDelivery(url, secret_token="wrong", max_attempts=1) as forged:
            refused = await forged.deliver(update)
        record = await idem.store.get(idem.keys.update(BOT, update["update_id"]))
    finally:
        await runner.cleanup()
        await idem.close()
    assert (first.statuses, again.statuses, refused.statuses) == ([200], [200], [401])
    assert runs == [update["update_id"]]
    assert record is not None and record.status is Status.COMPLETED


async def test_in_progress_elsewhere_is_503_until_the_dead_holders_lease_ends(
    api: FakeBotAPI, tmp_path: Path
) -> None:
    url_db = f"sqlite:///{tmp_path / 'bot.db'}"
    update = load_fixture("techpost_command")
    killed = Idem(url_db, lease=0.5, heartbeat=False)  # a run killed mid-handler
    assert (await killed.claim_update(update, bot_id=BOT)).outcome is Outcome.ACQUIRED
    await killed.close()
    idem = Idem(url_db, lease=0.5)
    runs: list[int] = []
    app = techpost_app(api, idem, runs)
    runner, url = await serve(app, idem)
    try:
        # Telegram re-sends until a 2xx; here every 0.2 s, up to 2 s in all.
        async with TelegramDelivery(
            url, secret_token=SECRET, retry_delay=0.2, max_attempts=10
        ) as tg:
            report = await tg.deliver(update)
        await app.update_queue.join()
    finally:
        await runner.cleanup()
        await idem.close()
    assert report.statuses[0] == 503
    assert report.statuses[-1] == 200
    assert runs == [update["update_id"]]


async def test_an_update_ptb_cannot_parse_is_acknowledged_and_recorded_as_failed(
    api: FakeBotAPI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 400 made Telegram re-send a payload that can never parse for 24 h, and nothing was
    stored. Now: 200, the claim stored as a failure with the parse error, logged ERROR; a
    re-send is a duplicate."""
    idem = Idem(f"sqlite:///{tmp_path / 'bot.db'}")
    runs: list[int] = []
    app = techpost_app(api, idem, runs)
    runner, url = await serve(app, idem)
    bad = {"update_id": 9001, "message": {"text": "hi"}}  # no date: KeyError in PTB
    try:
        with caplog.at_level(logging.ERROR, logger="telegram_idem.webhook"):
            async with TelegramDelivery(url, secret_token=SECRET, max_attempts=1) as tg:
                first = await tg.deliver(bad)
                again = await tg.deliver(bad)
        record = await idem.store.get(idem.keys.update(BOT, 9001))
    finally:
        await runner.cleanup()
        await idem.close()
    assert (first.statuses, again.statuses) == ([200], [200])
    assert runs == []
    assert record is not None and record.status is Status.FAILED
    assert b"cannot parse" in (record.result or b"")
    assert any("9001 does not parse" in r.getMessage() for r in caplog.records)


async def test_ptb_webhook_app_passes_read_timeout_and_bot_id(api: FakeBotAPI) -> None:
    """``ptb_webhook_app`` took neither: a body that never finishes held the request open
    for the default 10 s, and the guard keys always used the token's bot id. A bot id the
    processor does not use is refused (the claim would never reach the processor)."""
    idem = Idem("memory://")
    runs: list[int] = []

    async def techpost(update: Update, context: Ctx) -> None:
        runs.append(update.update_id)

    with pytest.raises(ConfigurationError, match="bot_id=42"):
        ptb_webhook_app(techpost_app(api, idem, []), idem, secret_token=SECRET, bot_id=42)
    app = build(api, idem, bot_id=42)
    app.add_handler(CommandHandler("techpost", techpost))
    web_app = ptb_webhook_app(app, idem, secret_token=SECRET, read_timeout=0.3, bot_id=42)
    runner, base = await serve_app(web_app)
    host, port = base.removeprefix("http://").split("/")[0].split(":")
    update = load_fixture("techpost_command")
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(
                b"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"X-Telegram-Bot-Api-Secret-Token: " + SECRET.encode() + b"\r\n"
                b"Content-Length: 1000\r\n\r\n" + b'{"update_id": 1, "mess'
            )
            await writer.drain()  # ... and the rest never comes
            async with asyncio.timeout(5):  # bounded: the server must answer on its own
                status_line = await reader.readline()
        finally:
            writer.close()
        async with TelegramDelivery(f"{base}/webhook", secret_token=SECRET, max_attempts=1) as tg:
            report = await tg.deliver(update)
        await app.update_queue.join()
        record = await idem.store.get(idem.keys.update(42, update["update_id"]))
    finally:
        await runner.cleanup()
        await idem.close()
    assert status_line.split()[1] == b"408"
    assert report.statuses == [200] and runs == [update["update_id"]]
    assert record is not None and record.status is Status.COMPLETED


async def test_ptb_webhook_needs_the_idempotent_processor(api: FakeBotAPI) -> None:
    idem = Idem("memory://")
    plain: App = ApplicationBuilder().token(TOKEN).base_url(api.ptb_base_url).build()
    with pytest.raises(ConfigurationError, match="IdempotentUpdateProcessor"):
        ptb_webhook(plain, idem, secret_token=SECRET)
    with pytest.raises(ConfigurationError, match="another Idem"):
        ptb_webhook(build(api, Idem("memory://")), idem, secret_token=SECRET)


async def test_ptb_webhook_needs_a_secret_unless_opted_out(
    api: FakeBotAPI, caplog: pytest.LogCaptureFixture
) -> None:
    idem = Idem("memory://")
    app = build(api, idem)
    with pytest.raises(ConfigurationError, match="allow_unauthenticated"):
        ptb_webhook(app, idem, secret_token=None)
    with pytest.raises(ConfigurationError, match="contradicts"):
        ptb_webhook(app, idem, secret_token=SECRET, allow_unauthenticated=True)
    with caplog.at_level(logging.WARNING, logger="telegram_idem.webhook"):
        ptb_webhook(app, idem, secret_token=None, allow_unauthenticated=True)
    assert any("forged" in r.getMessage() for r in caplog.records)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_the_processor_warns_behind_ptbs_own_webhook_server(
    api: FakeBotAPI, caplog: pytest.LogCaptureFixture
) -> None:
    idem = Idem("memory://")
    runs: list[int] = []
    app = techpost_app(api, idem, runs)
    port = free_port()
    with caplog.at_level(logging.WARNING, logger="telegram_idem.ptb"):
        async with running(app):
            assert app.updater is not None
            await app.updater.start_webhook(
                listen="127.0.0.1",
                port=port,
                url_path="webhook",
                webhook_url=f"http://127.0.0.1:{port}/webhook",
                secret_token=SECRET,
            )
            try:
                async with TelegramDelivery(
                    f"http://127.0.0.1:{port}/webhook", secret_token=SECRET, max_attempts=1
                ) as tg:
                    report = await tg.deliver(load_fixture("techpost_command"))
                await app.update_queue.join()
            finally:
                await app.updater.stop()
    await idem.close()
    assert report.statuses == [200] and runs == [734519001]
    assert any(
        r.levelno == logging.WARNING and "PTB's own webhook server" in r.getMessage()
        for r in caplog.records
    )
