"""The heartbeat ticker ends as soon as its last holder leaves."""

from __future__ import annotations

import asyncio

from telegram_idem._heartbeat import heartbeat


async def test_work_that_ends_before_its_first_beat_starts_no_task() -> None:
    async def extend() -> bool:
        return True

    before = set(asyncio.all_tasks())
    with heartbeat(extend, interval=30.0, name="k"):
        await asyncio.sleep(0)
        assert set(asyncio.all_tasks()) - before == set()  # a timer until a beat is due
    await asyncio.sleep(0)
    assert set(asyncio.all_tasks()) - before == set()


async def test_the_ticker_task_ends_when_the_last_holder_leaves() -> None:
    beaten = asyncio.Event()

    async def extend() -> bool:
        beaten.set()
        return True

    before = set(asyncio.all_tasks())
    with heartbeat(extend, interval=0.01, name="k"):
        await beaten.wait()  # the first beat was due: the ticker task runs
        tickers = set(asyncio.all_tasks()) - before
        assert len(tickers) >= 1
    # Two turns of the loop, far less than the ticker's 1 s look: it must be done.
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert all(task.done() for task in tickers)


async def test_a_beat_scheduled_before_the_holder_left_does_not_extend() -> None:
    calls: list[str] = []

    async def extend() -> bool:
        calls.append("extend")
        return True

    # A beat due at once is scheduled on the ticker's first look; the block ends (and
    # the caller would release) before that beat task gets to run.
    with heartbeat(extend, interval=0.0, name="k"):
        await asyncio.sleep(0)  # the ticker runs and schedules the beat task
    for _ in range(5):
        await asyncio.sleep(0)
    assert calls == []
