"""A blog bot wired to a local Bot API, a SQLite file and a local git repository (test helper)."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from examples.blog_bot.app import BlogBot, build_blog_bot
from examples.blog_bot.config import Settings
from examples.blog_bot.writer import OfflineWriter
from telegram_idem.testing import TelegramDelivery, serve_app
from telegram_idem.testing.bot_api import FakeBotAPI

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
        runner, base = await serve_app(blog.web_app())
        url = f"{base}/webhook"
        async with TelegramDelivery(url, secret_token=SECRET, timeout=10, retry_delay=0.01) as tg:
            yield Harness(blog, api, writer, url, tg, settings)
        await runner.cleanup()
        await blog.close()


ROOT = Path(__file__).resolve().parents[3]


def publish_commits(repo_path: Path) -> list[str]:
    """Messages of the "Publish …" commits in the bare repository at ``repo_path``
    (none while it does not exist yet)."""
    from dulwich.repo import Repo

    if not (repo_path / "HEAD").exists():
        return []
    repo = Repo(str(repo_path))
    try:
        messages = [e.commit.message.decode() for e in repo.get_walker()]
    except KeyError:  # initialised, its first commit not written yet: HEAD resolves to nothing
        return []
    finally:
        repo.close()
    return [m for m in messages if m.startswith("Publish")]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def until(predicate: Callable[[], bool], limit: float = 90.0) -> None:
    """Poll ``predicate`` every 50 ms until it holds; TimeoutError after ``limit`` s."""
    async with asyncio.timeout(limit):
        # Polls what another process or server changes: there is no event to wait on.
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def start_serve(env: dict[str, str], port: int) -> asyncio.subprocess.Process:
    """``python -m examples.blog_bot serve`` as a separate process, once /healthz answers."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "examples.blog_bot", "serve", "--host", "127.0.0.1",
        "--port", str(port), cwd=ROOT, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    async with aiohttp.ClientSession() as session, asyncio.timeout(60):
        while True:
            try:
                async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
                    if resp.status == 200:
                        return proc
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)
