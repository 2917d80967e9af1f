"""Locks: who may take a held lock over, by whose clock, renewal, and bounded waits."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from telegram_idem import (
    ConfigurationError,
    Idem,
    LockHeldError,
    ManualClock,
    Outcome,
    Store,
    bind_update,
    store_from_url,
)
from telegram_idem._locks import acquire_lock
from telegram_idem.testing._delivery import load_fixture

KEY = "idem:7:l:post:chat:1"


async def test_a_live_lock_of_another_owner_is_held(store: Store, clock: ManualClock) -> None:
    first = await acquire_lock(store, KEY, ttl=120, retention=3600, owner="a")
    with pytest.raises(LockHeldError) as err:
        await acquire_lock(store, KEY, ttl=120, retention=3600, owner="b")
    assert err.value.retry_after == pytest.approx(120)
    assert (await store.get(KEY)).fencing_token == first.token  # type: ignore[union-attr]


async def test_the_same_owner_takes_its_lock_over(store: Store, clock: ManualClock) -> None:
    dead = await acquire_lock(store, KEY, ttl=120, retention=3600, owner="action-1")
    clock.advance(5)  # the action was taken over long before the lock's ttl
    heir = await acquire_lock(store, KEY, ttl=120, retention=3600, owner="action-1")
    assert heir.token > dead.token
    assert not await store.release(KEY, dead.token)  # the dead holder's finally is harmless
    with pytest.raises(LockHeldError):
        await acquire_lock(store, KEY, ttl=120, retention=3600, owner="action-2")


async def test_a_lock_whose_holder_crashed_frees_after_its_ttl(
    store: Store, clock: ManualClock
) -> None:
    await acquire_lock(store, KEY, ttl=120, retention=3600, owner="a")
    clock.advance(119)
    with pytest.raises(LockHeldError):
        await acquire_lock(store, KEY, ttl=120, retention=3600, owner="b")
    clock.advance(2)
    taken = await acquire_lock(store, KEY, ttl=120, retention=3600, owner="b")
    assert taken.outcome is Outcome.ACQUIRED


async def test_a_released_lock_is_free_and_its_token_keeps_rising(
    store: Store, clock: ManualClock
) -> None:
    first = await acquire_lock(store, KEY, ttl=120, retention=3600, owner=None)
    assert await store.release(KEY, first.token)
    second = await acquire_lock(store, KEY, ttl=120, retention=3600, owner="x")
    assert second.token == first.token + 1


# --------------------------------------------------------------- the store's clock


@pytest.fixture
async def real_store(store_url: str) -> AsyncIterator[Store]:
    """A store on its own time source: the server's clock for PostgreSQL and Redis, the
    host's for the in-process stores (none of them sees a worker's skewed clock)."""
    store = store_from_url(store_url)
    yield store
    await store.close()


async def test_a_worker_whose_clock_runs_ahead_does_not_take_a_live_lock(
    real_store: Store,
) -> None:
    holder = Idem(real_store, heartbeat=False)
    ahead = Idem(real_store, heartbeat=False, clock=lambda: time.time() + 45)
    async with holder.lock("post", bot_id=7, ttl=30) as claim:
        with pytest.raises(LockHeldError) as err:
            async with ahead.lock("post", bot_id=7, ttl=30):
                pytest.fail("a second holder took a live lock")
        assert 0 < err.value.retry_after <= 30
        record = await real_store.get(claim.record.key)
        assert record is not None and record.fencing_token == claim.token


async def test_retry_after_is_judged_by_the_store_clock(real_store: Store) -> None:
    holder = Idem(real_store, heartbeat=False)
    behind = Idem(real_store, heartbeat=False, clock=lambda: time.time() - 3600)
    async with holder.lock("post", bot_id=7, ttl=30):
        with pytest.raises(LockHeldError) as err:
            async with behind.lock("post", bot_id=7, ttl=30):
                pytest.fail("a second holder took a live lock")
    assert 0 < err.value.retry_after <= 30  # not 3630


# --------------------------------------------------------------- renewal


async def test_a_lock_is_renewed_while_its_holder_works_past_its_ttl(
    real_store: Store,
) -> None:
    holder = Idem(real_store)  # heartbeat on (the default)
    contender = Idem(real_store)
    refused = 0
    async with holder.lock("post", bot_id=7, ttl=0.6):
        loop = asyncio.get_running_loop()
        until = loop.time() + 2.0  # > 3 ttls
        while loop.time() < until:
            with pytest.raises(LockHeldError):
                async with contender.lock("post", bot_id=7, ttl=0.6):
                    pytest.fail("a second holder overlapped a live holder")
            refused += 1
            await asyncio.sleep(0.15)
    assert refused >= 5
    async with contender.lock("post", bot_id=7, ttl=0.6):  # released: free at once
        pass


# --------------------------------------------------------------- bounded wait


class PollingSleep:
    """``Idem(sleep=...)``: records each pause; runs ``then`` at the ``at``-th one."""

    def __init__(self, at: int = 0, then: Callable[[], Awaitable[object]] | None = None):
        self.pauses: list[float] = []
        self._at, self._then = at, then

    async def __call__(self, seconds: float) -> None:
        self.pauses.append(seconds)
        if len(self.pauses) == self._at and self._then is not None:
            await self._then()
        await asyncio.sleep(seconds)


async def test_a_waiting_lock_polls_until_the_holder_releases(store: Store) -> None:
    holder = Idem(store, heartbeat=False)
    cm = holder.lock("post", bot_id=7, ttl=120)
    await cm.__aenter__()
    sleep = PollingSleep(at=3, then=lambda: cm.__aexit__(None, None, None))
    waiter = Idem(store, heartbeat=False, sleep=sleep)
    async with waiter.lock("post", bot_id=7, ttl=120, wait=30) as claim:
        assert claim.outcome is Outcome.ACQUIRED
    assert len(sleep.pauses) == 3
    assert sleep.pauses == sorted(sleep.pauses)  # backoff: pauses grow


async def test_a_waiting_lock_gives_up_after_wait_seconds(store: Store) -> None:
    holder = Idem(store, heartbeat=False)
    sleep = PollingSleep()
    waiter = Idem(store, heartbeat=False, sleep=sleep)
    async with holder.lock("post", bot_id=7, ttl=120):
        with pytest.raises(LockHeldError):
            async with waiter.lock("post", bot_id=7, ttl=120, wait=0.3):
                pytest.fail("acquired a held lock")
        with pytest.raises(LockHeldError):
            async with waiter.lock("post", bot_id=7, ttl=120):  # wait=0: one try
                pytest.fail("acquired a held lock")
    assert sleep.pauses  # it polled again...
    assert sum(sleep.pauses) <= 0.3 + 1e-6  # ...but never slept past its deadline


async def test_chat_lock_waits_too(store: Store) -> None:
    update = load_fixture("techpost_command")
    holder = Idem(store, heartbeat=False)
    waiter = Idem(store, heartbeat=False, sleep=PollingSleep())
    with bind_update(update, bot_id=7, idem=holder):
        async with holder.chat_lock(ttl=120):
            with pytest.raises(LockHeldError):
                async with waiter.chat_lock(ttl=120, wait=0.1):
                    pytest.fail("acquired a held chat lock")


@pytest.mark.parametrize("wait", [-1.0, math.inf, math.nan])
async def test_a_bad_wait_is_refused(store: Store, wait: float) -> None:
    with pytest.raises(ConfigurationError):
        async with Idem(store).lock("post", bot_id=7, wait=wait):
            pass


# ---------------------------------------------------------- chat_lock's name


async def test_chat_lock_and_the_documented_lock_name_exclude_each_other(store: Store) -> None:
    """docs: ``chat_lock()`` is ``lock(f"chat:{chat_id}")``; ``chat_lock(name="post")``
    is ``lock(f"post:chat:{chat_id}")``."""
    update = load_fixture("techpost_command")
    chat = update["message"]["chat"]["id"]
    idem = Idem(store, heartbeat=False)
    with bind_update(update, bot_id=7, idem=idem):
        async with idem.chat_lock():
            with pytest.raises(LockHeldError):
                async with idem.lock(f"chat:{chat}"):
                    pass
        async with idem.lock(f"post:chat:{chat}"):
            with pytest.raises(LockHeldError):
                async with idem.chat_lock(name="post"):
                    pass
