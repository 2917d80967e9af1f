"""What a relay logs while its store cannot answer: one ERROR when the outage starts
(not one per take loop), one INFO when it ends, and at most one "still unavailable" line
per ``outage_log_interval`` with the count of failed takes; and a release that fails
during an outage is one WARNING with the error's text, its traceback only at DEBUG.

The store is a real Redis behind a loopback proxy the test cuts and restores, or a Redis
URL on a closed port."""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import Callable

import pytest
from outbox.outbox_support import BOT_ID, TOKEN
from services import UrlFactory
from store_proxy import Proxy

from telegram_idem import store_from_url
from telegram_idem._admitted import release_quietly
from telegram_idem._outage import OutageLog
from telegram_idem.outbox import HttpBotAPI, Relay

pytestmark = pytest.mark.redis


async def until(done: Callable[[], bool]) -> None:
    async with asyncio.timeout(10.0):
        while not done():
            await asyncio.sleep(0.01)


def outbox_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "telegram_idem.outbox"]


async def test_an_outage_is_one_error_when_it_starts_and_one_info_when_it_ends(
    redis_url_factory: UrlFactory, closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="telegram_idem.outbox")
    url = redis_url_factory()
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    proxy = Proxy(parts.hostname, parts.port)
    await proxy.start()
    store = store_from_url(url.replace(parts.netloc, f"127.0.0.1:{proxy.port}", 1))
    outbox = store.outbox()
    try:
        async with HttpBotAPI(TOKEN, base_url=f"http://127.0.0.1:{closed_port}") as api:
            relay = Relay(outbox, api, bot_id=BOT_ID, concurrency=8, poll_interval=0.01)
            async with relay:
                await outbox.counts(bot_id=BOT_ID)  # the store answers through the proxy
                await proxy.cut()
                # every one of the 8 take loops fails, most of them more than once
                await until(lambda: relay._outage.failures >= 24)
                down = outbox_lines(caplog)
                await proxy.start()  # the same port again
                await until(lambda: relay._outage.failures == 0)
    finally:
        await store.close()
        await proxy.cut()
    assert [(r.levelno, r.getMessage().split(" since ")[0]) for r in down] == [
        (logging.ERROR, "outbox unavailable")
    ]
    up = outbox_lines(caplog)[len(down) :]
    assert [r.levelno for r in up] == [logging.INFO]
    assert "outbox available again after" in up[0].getMessage()
    assert "failed takes" in up[0].getMessage()


def test_a_long_outage_is_said_again_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="idem.test.outage")
    now = [100.0]
    outage = OutageLog(
        logging.getLogger("idem.test.outage"),
        "outbox",
        every=60.0,
        clock=lambda: now[0],
        wall=lambda: 1_780_000_000.0 + now[0],
    )
    error = ConnectionError("Connection refused")
    for _ in range(8):  # 8 loops at once
        outage.failed(error)
    now[0] += 59.0
    outage.failed(error)  # not yet
    now[0] += 1.0
    for _ in range(8):
        outage.failed(error)  # one line for all 8
    now[0] += 30.0
    outage.succeeded()
    outage.succeeded()  # nothing more to end
    assert outage.since is None
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines == [
        (logging.ERROR, "outbox unavailable since 2026-05-28T20:28:20+00:00: Connection refused"),
        (
            logging.ERROR,
            "outbox still unavailable after 60 s (10 failed takes): Connection refused",
        ),
        (logging.INFO, "outbox available again after 90.0 s (17 failed takes)"),
    ]
    outage.failed(error)  # a new outage starts anew
    assert outage.since == 1_780_000_190.0  # the new outage's own start
    assert caplog.records[-1].getMessage() == (
        "outbox unavailable since 2026-05-28T20:29:50+00:00: Connection refused"
    )
    with pytest.raises(ValueError, match="every must be > 0"):
        OutageLog(logging.getLogger("idem.test.outage"), "outbox", every=0)


async def test_a_failed_release_is_one_warning_with_the_error_and_no_traceback(
    closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    store = store_from_url(f"redis://127.0.0.1:{closed_port}/0")
    caplog.set_level(logging.INFO, logger="telegram_idem")
    try:
        await release_quietly(store, "idem:1:u:2", 1)
        [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert warning.getMessage().startswith(
            "could not release idem:1:u:2; it frees when its lease ends: "
        )
        assert len(warning.getMessage()) > len(
            "could not release idem:1:u:2; it frees when its lease ends: "
        )
        assert warning.exc_info is None
        caplog.clear()
        caplog.set_level(logging.DEBUG, logger="telegram_idem")
        await release_quietly(store, "idem:1:u:2", 1)
        traced = [r for r in caplog.records if r.exc_info is not None]
        assert [r.levelno for r in traced] == [logging.DEBUG]
    finally:
        await store.close()
