"""The at-most-once protocol and reconciliation on every store with an effect ledger
(the plugin's store parametrisation: memory, SQLite, PostgreSQL, Redis, DynamoDB where
their servers are given), with two store objects where the store shares records."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from services import StoreFactory

from telegram_idem import (
    AmbiguousEffectError,
    Idem,
    ManualClock,
    Status,
    UnknownOutcomeError,
)
from telegram_idem.backends import has_ledger

KEY = "idem:7000000001:a:grant:stores"
LEASE = 30.0


async def guards(store_factory: StoreFactory, clock: ManualClock, name: str) -> tuple[Idem, Idem]:
    first = await store_factory()
    if not has_ledger(first):
        pytest.skip(f"{first!r} has no effect ledger")
    second = first if name == "memory" else await store_factory()
    return (
        Idem(first, clock=clock, heartbeat=False, lease=LEASE, holder="a"),
        Idem(second, clock=clock, heartbeat=False, lease=LEASE, holder="b"),
    )


async def test_unknown_then_resolved_across_workers(
    store_factory: StoreFactory, clock: ManualClock, store_name: str
) -> None:
    a, b = await guards(store_factory, clock, store_name)
    runs: list[str] = []

    async def grant() -> str:
        runs.append("grant")
        raise AmbiguousEffectError("no answer")

    async def action(idem: Idem) -> str:
        return await idem.step("grant", grant, once="at_most")

    with pytest.raises(UnknownOutcomeError):
        await a.run(KEY, lambda: action(a))
    with pytest.raises(UnknownOutcomeError) as caught:
        await b.run(KEY, lambda: action(b))
    step_key = a.keys.step(KEY, "grant")
    assert caught.value.key == step_key
    [item] = await b.unresolved()
    assert (item.key, item.kind, item.holder, item.attempts) == (step_key, "step", "a", 3)
    await b.resolve(step_key, result="granted")
    assert await a.run(KEY, lambda: action(a)) == "granted"
    assert runs == ["grant"]
    assert await a.unresolved() == [] and await a.oldest_unresolved_age() is None


async def test_a_late_holder_loses_to_the_resolver(
    store_factory: StoreFactory, clock: ManualClock, store_name: str
) -> None:
    a, b = await guards(store_factory, clock, store_name)
    claim = await a.store.claim(KEY, lease=LEASE, retention=3600.0)
    assert await a.store.ledger().start(KEY, token=claim.token, holder="a") is None
    clock.advance(LEASE + 1)
    [item] = await b.unresolved()
    assert item.state == "started"
    await b.resolve(KEY, not_applied=True)
    assert not await a.store.complete(KEY, claim.token, b'"late"', retention=3600.0)
    ran: list[int] = []

    async def grant() -> str:
        ran.append(1)
        return "granted once"

    assert await b.run(KEY, grant, once="at_most") == "granted once"
    assert await a.run(KEY, grant, once="at_most") == "granted once"
    assert ran == [1]
    record = await a.store.get(KEY)
    assert record is not None and record.status is Status.COMPLETED


@pytest.mark.redis
async def test_a_window_action_on_redis_runs_its_steps_again_in_each_window(
    redis_url_factory: Callable[[], str],
) -> None:
    """Redis deletes expired records, so every run of a ``window=`` action has epoch 0
    and its steps keep one key: only their own expiry (no longer than the window) keeps
    a later window from replaying the first one's step (second fresh-user trial)."""
    idem = Idem(redis_url_factory(), heartbeat=False, lease=5.0)
    runs = 0

    async def count() -> int:
        nonlocal runs
        runs += 1
        return runs

    async def action() -> int:
        return await idem.step("s", count)

    try:
        seen = []
        for _ in range(3):
            seen.append(await idem.run(KEY, action, window=1.0))
            await asyncio.sleep(1.5)
        assert seen == [1, 2, 3]
    finally:
        await idem.close()
