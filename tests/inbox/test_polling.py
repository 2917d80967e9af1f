"""PollingIngress.run stops promptly: a long poll in flight, or the pause after an error,
ends as soon as ``stop`` is set, and nothing fetched is lost by stopping."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer

from telegram_idem import Idem
from telegram_idem.adapters.aiogram import aiogram_get_updates
from telegram_idem.ingress._polling import PollingIngress
from telegram_idem.testing._factories import UpdateFactory
from telegram_idem.testing.bot_api import FakeBotAPI

TOKEN = "7000000001:AApolling"
BOT = 7000000001
LONG = 600.0
"""A long poll (and error pause) far longer than any test waits: without a prompt stop,
``run`` would not return before the test's bound."""
BOUND = 10.0
"""How long a test waits for ``run`` to return after ``stop`` (a hang guard, not a speed
check: a late stop takes ``LONG``)."""


@pytest.fixture
async def idem(tmp_path: Path) -> AsyncIterator[Idem]:
    guard = Idem(f"sqlite:///{tmp_path / 'bot.db'}")
    yield guard
    await guard.close()


async def until(condition: Any) -> None:
    async with asyncio.timeout(BOUND):
        while not condition():
            await asyncio.sleep(0.01)


async def test_stop_interrupts_a_long_poll_in_flight_and_the_batch_is_fetched_again(
    idem: Idem,
) -> None:
    async with FakeBotAPI(long_poll_cap=LONG) as api:
        bot = Bot(TOKEN, session=AiohttpSession(api=TelegramAPIServer.from_base(api.url)))
        try:
            ingress = PollingIngress(idem, aiogram_get_updates(bot), bot_id=BOT, poll_timeout=LONG)
            stop = asyncio.Event()
            running = asyncio.create_task(ingress.run(stop))
            await until(lambda: api.calls_of("getUpdates"))  # the long poll is waiting
            stop.set()
            async with asyncio.timeout(BOUND):
                await running  # returns now, not after the 600 s poll
            assert ingress.offset is None and ingress.admitted == 0

            # an update Telegram holds is not confirmed by the cancelled poll: the next
            # poller (same offset) gets it
            api.queue_update(UpdateFactory().command("/x", update_id=41))
            again = PollingIngress(idem, aiogram_get_updates(bot), bot_id=BOT, poll_timeout=0)
            assert await again.poll_once() == 1
            assert (again.admitted, again.offset) == (1, 42)
        finally:
            await bot.session.close()


async def test_a_batch_fetched_as_stop_is_set_is_still_admitted(idem: Idem) -> None:
    stop = asyncio.Event()
    batches = [[UpdateFactory().command("/x", update_id=7)]]

    async def get_updates(offset: int | None, limit: int, wait: float) -> list[Any]:
        if not batches:
            await asyncio.sleep(LONG)
        stop.set()  # stop arrives while the batch is on its way back
        return batches.pop()

    ingress = PollingIngress(idem, get_updates, bot_id=BOT, poll_timeout=LONG)
    async with asyncio.timeout(BOUND):
        await ingress.run(stop)
    assert (ingress.admitted, ingress.offset) == (1, 8)
    assert await idem.store.inbox().depth() == 1


async def test_stop_cuts_the_pause_after_a_failed_fetch_short(idem: Idem) -> None:
    calls: list[int | None] = []

    async def get_updates(offset: int | None, limit: int, wait: float) -> list[Any]:
        calls.append(offset)
        raise ConnectionError("Telegram unreachable")

    ingress = PollingIngress(idem, get_updates, bot_id=BOT, poll_timeout=0, error_delay=LONG)
    stop = asyncio.Event()
    running = asyncio.create_task(ingress.run(stop))
    await until(lambda: calls)  # failed once, now pausing for error_delay
    stop.set()
    async with asyncio.timeout(BOUND):
        await running
    assert calls == [None]


async def test_cancelling_run_cancels_the_poll_in_flight(idem: Idem) -> None:
    polls: list[str] = []

    async def get_updates(offset: int | None, limit: int, wait: float) -> list[Any]:
        polls.append("started")
        try:
            await asyncio.sleep(LONG)
        except asyncio.CancelledError:
            polls.append("cancelled")
            raise
        return []

    ingress = PollingIngress(idem, get_updates, bot_id=BOT, poll_timeout=LONG)
    running = asyncio.create_task(ingress.run(asyncio.Event()))
    await until(lambda: polls)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert polls == ["started", "cancelled"]  # no poll left running behind the caller


async def test_failed_polls_back_off_and_log_once_per_run_of_failures(
    idem: Idem, caplog: pytest.LogCaptureFixture
) -> None:
    """A fetch that keeps failing is retried with a growing delay, logged when failures
    start and when polling works again: not a traceback per poll."""
    calls: list[float] = []
    failing = {"on": True}
    update = UpdateFactory().message("hi")

    async def get_updates(offset: int | None, limit: int, wait: float) -> list[dict[str, Any]]:
        calls.append(asyncio.get_running_loop().time())
        if failing["on"]:
            raise ConnectionError("network is down")
        return [] if offset else [update]

    ingress = PollingIngress(
        idem, get_updates, bot_id=BOT, poll_timeout=0, error_delay=0.02, error_delay_max=0.16
    )
    stop = asyncio.Event()
    caplog.set_level("WARNING", logger="telegram_idem.ingress")
    task = asyncio.create_task(ingress.run(stop))
    await until(lambda: len(calls) >= 6)
    delays = [b - a for a, b in itertools.pairwise(calls)][:5]
    assert delays[-1] > delays[0] * 3  # the wait grows: 0.02, 0.04, 0.08, 0.16, 0.16
    assert ingress.failing_since is not None
    failing["on"] = False
    await until(lambda: ingress.admitted == 1)
    stop.set()
    async with asyncio.timeout(BOUND):
        await task
    messages = [r.getMessage() for r in caplog.records if r.name == "telegram_idem.ingress"]
    assert sum("getUpdates failed" in m for m in messages) == 1  # not one per poll
    assert sum("polling works again" in m for m in messages) == 1
    assert not any(r.exc_info for r in caplog.records)  # no traceback flood
    assert ingress.failing_since is None


async def test_a_429_on_get_updates_waits_its_retry_after_not_the_shorter_backoff(
    idem: Idem,
) -> None:
    """Telegram's 429 names how long to wait (Bot API, ``ResponseParameters.retry_after``);
    the next getUpdates comes no sooner, though ``error_delay`` is far shorter."""
    async with FakeBotAPI() as api:
        bot = Bot(TOKEN, session=AiohttpSession(api=TelegramAPIServer.from_base(api.url)))
        try:
            api.fail_next("getUpdates", status=429, retry_after=1)
            api.queue_update(UpdateFactory().command("/x", update_id=7))
            ingress = PollingIngress(
                idem, aiogram_get_updates(bot), bot_id=BOT, poll_timeout=0, error_delay=0.01
            )
            stop = asyncio.Event()
            running = asyncio.create_task(ingress.run(stop))
            await until(lambda: ingress.admitted == 1)
            stop.set()
            async with asyncio.timeout(BOUND):
                await running
            first, second = api.calls_of("getUpdates")[:2]
            assert second.at - first.at >= 1.0  # the 429's retry_after, not error_delay
        finally:
            await bot.session.close()
