"""``serve`` and ``poll``: the bot as a separate process / a polling loop, over real HTTP."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from examples.blog_bot.app import build_blog_bot
from examples.blog_bot.config import Settings
from examples.blog_bot.tests.blog_harness import free_port, start_serve, until
from examples.blog_bot.writer import OfflineWriter
from telegram_idem.testing import TelegramDelivery, load_fixture
from telegram_idem.testing.bot_api import FakeBotAPI

TOKEN = "7000000001:AAcli-test"


async def test_serve_process_publishes_once_for_repeated_deliveries(tmp_path: Path) -> None:
    port = free_port()
    async with FakeBotAPI() as api:
        env = {
            **os.environ,
            "BOT_TOKEN": TOKEN,
            "TELEGRAM_API_URL": api.url,
            "WEBHOOK_SECRET": "cli-secret",
            "IDEM_STORE_URL": f"sqlite:///{tmp_path / 'bot.db'}",
            "BLOG_REPO_PATH": str(tmp_path / "repo"),
            "WRITER_DELAY_SCALE": "0.005",
        }
        proc = await start_serve(env, port)
        try:
            url = f"http://127.0.0.1:{port}"
            async with TelegramDelivery(f"{url}/webhook", secret_token="cli-secret") as tg:
                reports = await tg.deliver_concurrently(load_fixture("techpost_no_title"), 4)
                assert all(r.statuses == [200] for r in reports)
                await until(
                    lambda: any((m.text or "").startswith("✅") for m in api.messages(5550001001))
                )
                again = await tg.deliver(load_fixture("techpost_no_title"))
                assert again.statuses == [200]
            assert len(api.calls_of("sendMessage")) == 1
        finally:
            proc.terminate()
            await proc.wait()


async def test_poll_mode_processes_queued_updates_once(tmp_path: Path) -> None:
    async with FakeBotAPI(long_poll_cap=0.2) as api:
        settings = Settings(
            bot_token=TOKEN,
            api_url=api.url,
            store_url=f"sqlite:///{tmp_path / 'bot.db'}",
            repo_path=str(tmp_path / "repo"),
            callback_secret="y" * 32,
        )
        blog = build_blog_bot(settings, writer=OfflineWriter(delay_scale=0))
        update = load_fixture("techpost_command")
        api.queue_update(update)
        api.queue_update(update)  # a getUpdates batch re-fetched after a crash
        stop = asyncio.Event()
        polling = asyncio.create_task(blog.poll(stop))  # getUpdates → inbox → workers
        try:
            await until(
                lambda: any((m.text or "").startswith("✅") for m in api.messages(5550001001))
            )
            await blog.settle()
            assert len(api.calls_of("sendMessage")) == 1
            assert api.calls_of("getUpdates")
            assert api.webhook.url == ""  # poll mode removed any webhook first
        finally:
            stop.set()
            await polling
            await blog.close()
