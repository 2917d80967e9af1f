"""``serve`` and ``poll``: the bot as a separate process / a polling loop, over real HTTP."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp

from examples.blog_bot.app import build_blog_bot
from examples.blog_bot.config import Settings
from examples.blog_bot.writer import OfflineWriter
from telegram_idem.testing.bot_api import FakeBotAPI
from telegram_idem.testing.delivery import TelegramDelivery, load_fixture

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "7000000001:AAcli-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _wait_for(predicate: Callable[[], bool], limit: float = 60.0) -> None:
    async with asyncio.timeout(limit):
        while not predicate():
            await asyncio.sleep(0.05)


async def test_serve_process_publishes_once_for_repeated_deliveries(tmp_path: Path) -> None:
    port = _free_port()
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
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "examples.blog_bot",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            cwd=ROOT,
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            async with aiohttp.ClientSession() as session:

                async def up() -> bool:
                    try:
                        async with session.get(f"{url}/healthz") as resp:
                            return resp.status == 200
                    except aiohttp.ClientError:
                        return False

                async with asyncio.timeout(60):
                    while not await up():
                        await asyncio.sleep(0.1)
            async with TelegramDelivery(f"{url}/webhook", secret_token="cli-secret") as tg:
                reports = await tg.deliver_concurrently(load_fixture("techpost_no_title"), 4)
                assert all(r.statuses == [200] for r in reports)
                await _wait_for(
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
        polling = asyncio.create_task(blog.dispatcher.start_polling(blog.bot, handle_signals=False))
        try:
            await _wait_for(
                lambda: any((m.text or "").startswith("✅") for m in api.messages(5550001001))
            )
            assert len(api.calls_of("sendMessage")) == 1
            assert api.calls_of("getUpdates")
        finally:
            await blog.dispatcher.stop_polling()
            await polling
            await blog.close()
