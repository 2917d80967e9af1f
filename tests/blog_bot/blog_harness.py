"""A blog bot wired to a local Bot API, a SQLite file and a local git repository (test helper)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from examples.blog_bot.app import BlogBot, build_blog_bot
from examples.blog_bot.config import Settings
from examples.blog_bot.writer import OfflineWriter
from telegram_idem.testing.bot_api import FakeBotAPI
from telegram_idem.testing.delivery import TelegramDelivery

TOKEN = "7000000001:AAtest-token"
SECRET = "test-webhook-secret"


@dataclass
class Harness:
    """The bot, its Bot API, its webhook URL and a Telegram-like sender."""

    blog: BlogBot
    api: FakeBotAPI
    writer: OfflineWriter
    url: str
    telegram: TelegramDelivery
    settings: Settings

    async def feed(self, update: dict[str, Any]) -> Any:
        """Feed through aiogram's real Dispatcher (no HTTP)."""
        return await self.blog.dispatcher.feed_raw_update(self.blog.bot, update)

    async def settle(self) -> None:
        """Wait for background processing to end."""
        await self.blog.settle(limit=60)

    async def commit_messages(self) -> list[str]:
        """Commit messages after the initial commit, oldest first."""
        from dulwich.repo import Repo

        await self.blog.publisher.snapshot()  # creates the repository if nothing was published
        repo = Repo(self.settings.repo_path)
        try:
            return [e.commit.message.decode() for e in repo.get_walker()][::-1][1:]
        finally:
            repo.close()


@asynccontextmanager
async def running_blog(
    tmp_path: Path, *, writer_delay_scale: float = 0.002, store_url: str | None = None
) -> AsyncIterator[Harness]:
    """Start the bot's webhook server on loopback beside a FakeBotAPI."""
    async with FakeBotAPI() as api:
        settings = Settings(
            bot_token=TOKEN,
            api_url=api.url,
            webhook_secret=SECRET,
            store_url=store_url or f"sqlite:///{tmp_path / 'bot.db'}",
            repo_path=str(tmp_path / "repo"),
            writer_delay_scale=0.0,
            callback_secret="x" * 32,
        )
        writer = OfflineWriter(delay_scale=writer_delay_scale)
        blog = build_blog_bot(settings, writer=writer)
        runner = web.AppRunner(blog.web_app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}/webhook"
        async with TelegramDelivery(url, secret_token=SECRET, timeout=10, retry_delay=0.01) as tg:
            yield Harness(blog, api, writer, url, tg, settings)
        await runner.cleanup()
        await blog.close()
