"""The heartbeat ticker ends as soon as its last holder leaves."""

from __future__ import annotations

import asyncio

from telegram_idem._heartbeat import heartbeat


async def test_the_ticker_task_ends_when_the_last_holder_leaves() -> None:
    async def extend() -> bool:
        return True

    before = set(asyncio.all_tasks())
    with heartbeat(extend, interval=30.0, name="k"):
        await asyncio.sleep(0)
        tickers = set(asyncio.all_tasks()) - before
        assert len(tickers) == 1
    # Two turns of the loop, far less than the ticker's 1 s look: it must be done.
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert all(task.done() for task in tickers)
