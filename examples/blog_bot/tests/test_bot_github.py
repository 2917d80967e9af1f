"""The bot publishing through the GitHub Git Tree API (a local server speaking its shapes)."""

from __future__ import annotations

from pathlib import Path

from examples.blog_bot.app import build_blog_bot
from examples.blog_bot.config import Settings
from examples.blog_bot.content import dead_links
from examples.blog_bot.publisher import GitHubPublisher
from examples.blog_bot.tests.github_api import FakeGitHub
from examples.blog_bot.writer import OfflineWriter
from telegram_idem.testing import load_fixture
from telegram_idem.testing.bot_api import FakeBotAPI


async def test_settings_choose_github_and_repeated_update_makes_one_commit(
    tmp_path: Path,
) -> None:
    async with FakeBotAPI() as api, FakeGitHub() as github:
        settings = Settings.from_env(
            {
                "BOT_TOKEN": "7000000001:AAgithub",
                "TELEGRAM_API_URL": api.url,
                "IDEM_STORE_URL": f"sqlite:///{tmp_path / 'bot.db'}",
                "GITHUB_TOKEN": github.token,
                "GITHUB_REPO": github.full_name,
                "GITHUB_API_URL": github.url,
            }
        )
        blog = build_blog_bot(settings, writer=OfflineWriter(delay_scale=0))
        assert isinstance(blog.publisher, GitHubPublisher)
        before = len(github.log())
        update = load_fixture("techpost_no_title")
        try:
            for _ in range(3):
                await blog.dispatcher.feed_raw_update(blog.bot, update)
        finally:
            await blog.close()
        assert len(github.log()) == before + 1
        files = github.text_files()
        assert len([p for p in files if p.endswith(".md") and "index" not in p]) == 3
        assert dead_links(files) == []
