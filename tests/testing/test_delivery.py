"""TelegramDelivery against a small aiohttp webhook app on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from telegram_idem.testing._delivery import (
    FIXTURES,
    SECRET_HEADER,
    TelegramDelivery,
    fixture_names,
    load_fixture,
    load_update,
    make_double_tap,
)

Behaviour = Callable[[int], Awaitable[web.Response]]


@dataclass
class Hook:
    """A webhook that records every request and answers per ``behaviour(n)``."""

    url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    content_types: list[str] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)
    behaviour: Behaviour | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.raw.append(body)
        self.received.append(json.loads(body))
        self.headers.append(dict(request.headers))
        self.content_types.append(request.content_type)
        if self.behaviour is None:
            return web.Response(text="")
        return await self.behaviour(len(self.received))


@pytest.fixture
async def hook() -> AsyncIterator[Hook]:
    state = Hook()
    app = web.Application()
    app.router.add_post("/webhook", state.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    state.url = f"http://{host}:{port}/webhook"
    yield state
    await runner.cleanup()


def ids(hook: Hook) -> list[int]:
    return [update["update_id"] for update in hook.received]


async def test_ok_delivery_is_one_attempt_with_json_and_secret(hook: Hook) -> None:
    update = load_fixture("techpost_command")
    async with TelegramDelivery(hook.url, secret_token="s3cr3t-_T0ken") as telegram:
        report = await telegram.deliver(update)
    assert report.delivered and report.retries == 0 and report.statuses == [200]
    assert report.update_id == update["update_id"]
    assert hook.received == [update]
    assert hook.content_types == ["application/json"]
    assert hook.headers[0][SECRET_HEADER] == "s3cr3t-_T0ken"
    assert telegram.stats.deliveries == 1 and telegram.stats.attempts == 1


async def test_no_secret_header_without_secret(hook: Hook) -> None:
    async with TelegramDelivery(hook.url) as telegram:
        await telegram.deliver(load_fixture("inline_query"))
    assert SECRET_HEADER not in hook.headers[0]


async def test_slow_answer_is_resent_with_the_same_update_id(hook: Hook) -> None:
    async def slow_then_fast(n: int) -> web.Response:
        if n == 1:
            await asyncio.sleep(0.8)
        return web.Response()

    hook.behaviour = slow_then_fast
    update = load_fixture("techpost_no_title")
    async with TelegramDelivery(hook.url, timeout=0.3, retry_delay=0.05) as telegram:
        report = await telegram.deliver(update)
    assert ids(hook) == [update["update_id"]] * 2
    assert hook.raw[0] == hook.raw[1]  # byte-identical re-send
    first, second = report.attempts
    assert first.timed_out and first.status is None and first.error == "timeout"
    assert 0.25 <= first.elapsed < 0.7
    assert second.ok and report.delivered
    assert telegram.stats.timeouts == 1 and telegram.stats.retries == 1


async def test_always_slow_gives_up_after_max_attempts(hook: Hook) -> None:
    async def slow(n: int) -> web.Response:
        await asyncio.sleep(0.5)
        return web.Response()

    hook.behaviour = slow
    update = load_fixture("callback_delete")
    async with TelegramDelivery(
        hook.url, timeout=0.1, retry_delay=0.01, max_attempts=3
    ) as telegram:
        report = await telegram.deliver(update)
    assert not report.delivered
    assert report.statuses == [None, None, None]
    assert ids(hook) == [update["update_id"]] * 3
    assert telegram.stats.failed == 1 and telegram.stats.timeouts == 3


async def test_500_then_200_is_exactly_one_retry(hook: Hook) -> None:
    async def fail_once(n: int) -> web.Response:
        return web.Response(status=500 if n == 1 else 200)

    hook.behaviour = fail_once
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    update = load_fixture("edited_message")
    async with TelegramDelivery(hook.url, retry_delay=2.5, sleep=fake_sleep) as telegram:
        report = await telegram.deliver(update)
    assert report.statuses == [500, 200]
    assert report.retries == 1 and report.delivered
    assert sleeps == [2.5]
    assert ids(hook) == [update["update_id"]] * 2
    stats = telegram.stats
    assert (stats.deliveries, stats.attempts, stats.retries, stats.non_2xx) == (1, 2, 1, 1)


async def test_backoff_grows_the_wait_up_to_its_cap(hook: Hook) -> None:
    async def fail_four_times(n: int) -> web.Response:
        return web.Response(status=500 if n <= 4 else 200)

    hook.behaviour = fail_four_times
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async with TelegramDelivery(
        hook.url, retry_delay=0.5, backoff=2.0, max_retry_delay=3.0, sleep=fake_sleep
    ) as telegram:
        report = await telegram.deliver(load_fixture("edited_message"))
    assert report.statuses == [500, 500, 500, 500, 200]
    assert sleeps == [0.5, 1.0, 2.0, 3.0]


async def test_connection_failure_is_recorded_and_retried() -> None:
    probe = web.AppRunner(web.Application())
    await probe.setup()
    site = web.TCPSite(probe, "127.0.0.1", 0)
    await site.start()
    port = probe.addresses[0][1]
    await probe.cleanup()  # nothing listens there now
    async with TelegramDelivery(
        f"http://127.0.0.1:{port}/webhook", retry_delay=0, max_attempts=2
    ) as telegram:
        report = await telegram.deliver(load_fixture("poll_answer"))
    assert report.statuses == [None, None] and not report.delivered
    assert all(a.error and not a.timed_out for a in report.attempts)
    assert telegram.stats.connection_errors == 2


async def test_concurrent_delivery_arrives_n_times(hook: Hook) -> None:
    in_flight = 0
    peak = 0

    async def overlap(n: int) -> web.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.1)
        in_flight -= 1
        return web.Response()

    hook.behaviour = overlap
    update = load_fixture("successful_payment")
    async with TelegramDelivery(hook.url) as telegram:
        reports = await telegram.deliver_concurrently(update, 4)
    assert len(reports) == 4 and all(r.delivered and r.retries == 0 for r in reports)
    assert ids(hook) == [update["update_id"]] * 4
    assert peak == 4  # really simultaneous
    assert telegram.stats.deliveries == 4


async def test_double_tap_is_two_updates_with_the_same_action(hook: Hook) -> None:
    update = load_fixture("callback_delete")
    async with TelegramDelivery(hook.url) as telegram:
        first, second = await telegram.double_tap(update, update["update_id"] + 7)
    assert first.delivered and second.delivered
    assert sorted(ids(hook)) == [update["update_id"], update["update_id"] + 7]
    a, b = sorted(hook.received, key=lambda u: u["update_id"])
    qa, qb = a["callback_query"], b["callback_query"]
    assert qa["id"] != qb["id"]
    assert qa["from"] == qb["from"]
    assert qa["message"] == qb["message"]
    assert qa["data"] == qb["data"] == "del:8f3a1b2c9d"
    assert update["callback_query"]["id"] == qa["id"]  # original left untouched


def test_make_double_tap_defaults_and_errors() -> None:
    update = load_fixture("callback_delete")
    second = make_double_tap(update)
    assert second["update_id"] == update["update_id"] + 1
    assert second["callback_query"]["id"] == str(int(update["callback_query"]["id"]) + 1)
    with pytest.raises(ValueError, match="callback_query"):
        make_double_tap(load_fixture("techpost_command"))
    with pytest.raises(ValueError, match="new update_id"):
        make_double_tap(update, update["update_id"])


def test_invalid_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="secret_token"):
        TelegramDelivery("http://127.0.0.1:1/", secret_token="no spaces allowed")
    with pytest.raises(ValueError, match="secret_token"):
        TelegramDelivery("http://127.0.0.1:1/", secret_token="x" * 257)
    with pytest.raises(ValueError, match="max_attempts"):
        TelegramDelivery("http://127.0.0.1:1/", max_attempts=0)
    with pytest.raises(ValueError, match="timeout"):
        TelegramDelivery("http://127.0.0.1:1/", timeout=0)
    with pytest.raises(ValueError, match="backoff"):
        TelegramDelivery("http://127.0.0.1:1/", backoff=0.5)
    with pytest.raises(ValueError, match="max_retry_delay"):
        TelegramDelivery("http://127.0.0.1:1/", max_retry_delay=-1)


def test_fixtures_ship_with_the_package(tmp_path: Any) -> None:
    names = fixture_names()
    assert "callback_delete" in names and "random_id_after_silence" in names
    assert len(names) == 12
    assert (FIXTURES / "README.md").is_file()
    for name in names:
        assert isinstance(load_fixture(name)["update_id"], int)
    assert load_fixture("channel_post.json") == load_fixture("channel_post")
    first = load_fixture("inline_query")
    first["update_id"] = 0
    assert load_fixture("inline_query")["update_id"] == 734519050  # fresh copy each time
    with pytest.raises(FileNotFoundError, match="callback_delete"):
        load_fixture("nope")
    bad = tmp_path / "bad.json"
    bad.write_text('{"message": {}}', encoding="utf-8")
    with pytest.raises(ValueError, match="update_id"):
        load_update(bad)
