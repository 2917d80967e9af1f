"""Lock ownership: who may take a held lock over (telegram_idem.locks)."""

from __future__ import annotations

import pytest

from telegram_idem import LockHeldError, ManualClock, Outcome, Store
from telegram_idem.locks import acquire_lock

KEY = "idem:7:l:post:chat:1"


async def test_a_live_lock_of_another_owner_is_held(store: Store, clock: ManualClock) -> None:
    first = await acquire_lock(store, KEY, ttl=120, retention=3600, owner="a", clock=clock)
    with pytest.raises(LockHeldError) as err:
        await acquire_lock(store, KEY, ttl=120, retention=3600, owner="b", clock=clock)
    assert err.value.retry_after == pytest.approx(120)
    assert (await store.get(KEY)).fencing_token == first.token  # type: ignore[union-attr]


async def test_the_same_owner_takes_its_lock_over(store: Store, clock: ManualClock) -> None:
    dead = await acquire_lock(store, KEY, ttl=120, retention=3600, owner="action-1", clock=clock)
    clock.advance(5)  # the action was taken over long before the lock's ttl
    heir = await acquire_lock(store, KEY, ttl=120, retention=3600, owner="action-1", clock=clock)
    assert heir.token > dead.token
    assert not await store.release(KEY, dead.token)  # the dead holder's finally is harmless
    with pytest.raises(LockHeldError):
        await acquire_lock(store, KEY, ttl=120, retention=3600, owner="action-2", clock=clock)


async def test_a_lock_whose_holder_crashed_frees_after_its_ttl(
    store: Store, clock: ManualClock
) -> None:
    await acquire_lock(store, KEY, ttl=120, retention=3600, owner="a", clock=clock)
    clock.advance(119)
    with pytest.raises(LockHeldError):
        await acquire_lock(store, KEY, ttl=120, retention=3600, owner="b", clock=clock)
    clock.advance(2)
    taken = await acquire_lock(store, KEY, ttl=120, retention=3600, owner="b", clock=clock)
    assert taken.outcome is Outcome.ACQUIRED


async def test_a_released_lock_is_free_and_its_token_keeps_rising(
    store: Store, clock: ManualClock
) -> None:
    first = await acquire_lock(store, KEY, ttl=120, retention=3600, owner=None, clock=clock)
    assert await store.release(KEY, first.token)
    second = await acquire_lock(store, KEY, ttl=120, retention=3600, owner="x", clock=clock)
    assert second.token == first.token + 1
