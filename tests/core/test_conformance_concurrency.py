"""Concurrency conformance: one key claimed at once from many connections and processes."""

from __future__ import annotations

import asyncio
import multiprocessing

import pytest
from services import SHARED_STATE_STORES, StoreFactory

from telegram_idem import Outcome, Store
from telegram_idem.backends import store_from_url
from telegram_idem.clock import ManualClock

KEY = "idem:7000000001:u:734519002"


async def test_50_concurrent_claims_from_separate_connections_acquire_once(
    store_factory: StoreFactory, store_name: str
) -> None:
    if store_name in SHARED_STATE_STORES:
        stores = [await store_factory() for _ in range(50)]
    else:
        stores = [await store_factory()] * 50
    claims = await asyncio.gather(
        *(s.claim(KEY, fingerprint="fp", lease=30, retention=3600) for s in stores)
    )
    outcomes = [c.outcome for c in claims]
    assert outcomes.count(Outcome.ACQUIRED) == 1
    assert set(outcomes) == {Outcome.ACQUIRED, Outcome.IN_PROGRESS}
    assert len({c.token for c in claims}) == 1


async def test_zombie_completion_after_takeover_is_rejected_across_connections(
    store_factory: StoreFactory, store_name: str, clock: ManualClock
) -> None:
    first: Store = await store_factory()
    second: Store = await store_factory() if store_name in SHARED_STATE_STORES else first
    zombie = await first.claim(KEY, lease=30, retention=3600)
    clock.advance(31)
    heir = await second.claim(KEY, lease=30, retention=3600)
    assert heir.outcome is Outcome.ACQUIRED
    assert heir.token == zombie.token + 1
    assert await second.complete(KEY, heir.token, b'"heir"', retention=3600)
    assert not await first.complete(KEY, zombie.token, b'"zombie"', retention=3600)
    assert not await first.release(KEY, zombie.token)
    replay = await first.claim(KEY, lease=30, retention=3600)
    assert replay.outcome is Outcome.REPLAY
    assert replay.record.result == b'"heir"'


def _claim_in_process(url: str, key: str, n: int, queue: multiprocessing.Queue[list[str]]) -> None:
    async def run() -> list[str]:
        store = store_from_url(url)
        try:
            claims = await asyncio.gather(
                *(store.claim(key, lease=60, retention=3600) for _ in range(n))
            )
            return [c.outcome.value for c in claims]
        finally:
            await store.close()

    queue.put(asyncio.run(run()))


@pytest.mark.shared_state
def test_claims_from_4_os_processes_acquire_once(store_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue[list[str]] = ctx.Queue()
    procs = [
        ctx.Process(target=_claim_in_process, args=(store_url, KEY, 10, queue)) for _ in range(4)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    outcomes = [o for r in results for o in r]
    assert len(outcomes) == 40
    assert outcomes.count("acquired") == 1, outcomes
