"""kill -9 in the middle of a /techpost pipeline, then a restart: exactly one commit and
one final ✅ message (the inbox keeps the update; the steps replay what finished)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from dulwich.repo import Repo

from examples.blog_bot.tests.blog_harness import free_port, start_serve, until
from telegram_idem.testing import TelegramDelivery, load_fixture
from telegram_idem.testing.bot_api import FakeBotAPI

CHAT = 5550001001
LEASE = 2.0
"""Seconds of the bot's leases (``IDEM_LEASE``): a dead worker's entry is free after it."""


async def test_kill_9_mid_pipeline_then_restart_gives_one_commit_and_one_done_message(
    tmp_path: Path,
) -> None:
    port = free_port()
    async with FakeBotAPI() as api:
        env = {
            **os.environ,
            "BOT_TOKEN": "7000000001:AAcrash",
            "TELEGRAM_API_URL": api.url,
            "WEBHOOK_SECRET": "crash-secret",
            "IDEM_STORE_URL": f"sqlite:///{tmp_path / 'bot.db'}",
            "BLOG_REPO_PATH": str(tmp_path / "repo"),
            "WRITER_DELAY_SCALE": "0.1",  # ≈ 5 s pipeline
            "IDEM_LEASE": str(LEASE),  # a dead worker's claims free up after LEASE s
        }
        first = await start_serve(env, port)
        async with TelegramDelivery(
            f"http://127.0.0.1:{port}/webhook", secret_token="crash-secret"
        ) as tg:
            report = await tg.deliver(load_fixture("techpost_no_title"))
        assert report.statuses == [200]
        # Kill once the Korean draft is being written (title done, draft not yet).
        await until(
            lambda: any("2/3" in str(c.params.get("text")) for c in api.calls_of("editMessageText"))
        )
        os.kill(first.pid, signal.SIGKILL)
        await first.wait()
        assert not any((m.text or "").startswith("✅") for m in api.messages(CHAT)), (
            "the pipeline finished before the kill; make it slower"
        )

        second = await start_serve(env, port)
        try:
            await until(lambda: any((m.text or "").startswith("✅") for m in api.messages(CHAT)))
            # A duplicate would come from a second take of the entry, possible only once a
            # lease has ended: wait past one lease (and a heartbeat) before counting.
            await asyncio.sleep(LEASE * 1.5)
        finally:
            second.terminate()
            await second.wait()

    done = [
        c for c in api.calls_of("editMessageText") if str(c.params.get("text")).startswith("✅")
    ]
    assert len(done) == 1
    assert len(api.calls_of("sendMessage")) == 1  # the status message was reused, not resent
    repo = Repo(str(tmp_path / "repo"))
    try:
        messages = [e.commit.message.decode() for e in repo.get_walker()]
    finally:
        repo.close()
    assert len([m for m in messages if m.startswith("Publish")]) == 1
