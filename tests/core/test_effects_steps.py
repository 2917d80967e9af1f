"""Step records belong to their action's claim: within one run of an action key its steps
replay (across releases and takeovers), a later run of the key (after its retention or
``window``, or after its record was purged) never gets an earlier run's step results,
and a step's record is kept no longer than its action's. Memory and SQLite, on a
``ManualClock``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from telegram_idem import (
    AmbiguousEffectError,
    EffectContext,
    Idem,
    LostClaimError,
    ManualClock,
    Status,
    Store,
    UnknownOutcomeError,
    store_from_url,
)
from telegram_idem.backends import as_purgeable

KEY = "idem:7000000001:a:grant:1"
LEASE = 30.0
RETENTION = 100.0


@pytest.fixture(params=["memory", "sqlite"])
async def store(
    request: pytest.FixtureRequest, clock: ManualClock, tmp_path: Path
) -> AsyncIterator[Store]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'idem.db'}"
    made = store_from_url(url, clock=clock)
    yield made
    await made.close()


@pytest.fixture
def idem(store: Store, clock: ManualClock) -> Idem:
    return Idem(store, clock=clock, heartbeat=False, lease=LEASE, action_retention=RETENTION)


class Grants:
    """A step body that numbers its runs."""

    def __init__(self) -> None:
        self.runs = 0

    async def __call__(self) -> int:
        self.runs += 1
        return self.runs


async def test_a_retry_of_the_same_run_replays_the_step(idem: Idem) -> None:
    grants = Grants()

    async def action() -> int:
        value = await idem.step("grant", grants)
        if grants.runs == 1 and not failed:
            failed.append(True)
            raise RuntimeError("after the step")
        return value

    failed: list[bool] = []
    with pytest.raises(RuntimeError):
        await idem.run(KEY, action)
    assert await idem.run(KEY, action) == 1
    assert grants.runs == 1


async def test_a_takeover_of_the_same_run_replays_the_step(idem: Idem, clock: ManualClock) -> None:
    grants = Grants()
    release = asyncio.Event()

    async def stalls_after_its_step() -> int:
        value = await idem.step("grant", grants)
        await release.wait()
        return value

    async def action() -> int:
        return await idem.step("grant", grants)

    first = asyncio.create_task(idem.run(KEY, stalls_after_its_step))
    while grants.runs == 0:
        await asyncio.sleep(0)
    clock.advance(LEASE + 1)
    assert await idem.run(KEY, action) == 1  # the taken-over run replays the step
    release.set()
    with pytest.raises(LostClaimError):
        await first
    assert grants.runs == 1


async def test_a_new_run_after_the_retention_runs_its_steps_again(
    idem: Idem, clock: ManualClock
) -> None:
    grants = Grants()

    async def action() -> int:
        return await idem.step("grant", grants)

    assert await idem.run(KEY, action) == 1
    clock.advance(RETENTION + 1)
    assert await idem.run(KEY, action) == 2  # not the first run's stored 1
    assert grants.runs == 2
    first_step = await idem.store.get(idem.keys.step(KEY, "grant"))
    assert first_step is None  # expired with its action
    record = await idem.store.get(KEY)
    assert record is not None
    epoch = record.fencing_token - record.attempts
    assert epoch > 0
    second_step = await idem.store.get(idem.keys.step(KEY, "grant", epoch))
    assert second_step is not None and second_step.status is Status.COMPLETED
    assert idem.keys.step(KEY, "grant", epoch) == f"{KEY}:r{epoch}:s:grant"


async def test_a_window_action_runs_its_steps_again_after_the_window(
    idem: Idem, clock: ManualClock
) -> None:
    grants = Grants()

    async def action() -> int:
        return await idem.step("grant", grants)

    assert await idem.run(KEY, action, window=2.0) == 1
    clock.advance(1)
    assert await idem.run(KEY, action, window=2.0) == 1  # within the window: replay
    clock.advance(2)
    assert await idem.run(KEY, action, window=2.0) == 2  # a new run: its own step
    clock.advance(1)
    assert await idem.run(KEY, action, window=2.0) == 2
    assert grants.runs == 2


async def test_a_step_record_is_kept_no_longer_than_its_action(
    idem: Idem, clock: ManualClock
) -> None:
    async def action() -> str:
        clock.advance(40)  # the action has run a while before its step
        return await idem.step("grant", lambda: asyncio.sleep(0, "granted"))

    claimed_at = clock()
    assert await idem.run(KEY, action) == "granted"
    step = await idem.store.get(idem.keys.step(KEY, "grant"))
    record = await idem.store.get(KEY)
    assert step is not None and record is not None
    assert step.expires_at <= claimed_at + RETENTION  # what the action's claim promised
    assert step.expires_at <= record.expires_at


async def test_steps_outside_an_action_keep_the_guard_retention(
    idem: Idem, clock: ManualClock
) -> None:
    assert await idem.step("send", lambda: asyncio.sleep(0, 1), key="idem:1:s:send") == 1
    step = await idem.store.get("idem:1:s:send")
    assert step is not None and step.expires_at == clock() + RETENTION


async def test_a_purged_action_never_replays_an_old_step(
    tmp_path: Path, clock: ManualClock
) -> None:
    store = store_from_url(f"sqlite:///{tmp_path / 'purged.db'}", clock=clock)
    idem = Idem(store, clock=clock, heartbeat=False, lease=LEASE, action_retention=RETENTION)
    try:
        grants = Grants()

        async def action() -> int:
            return await idem.step("grant", grants)

        # The action keeps its result 50 s; its step would default to the guard's 100 s.
        assert await idem.run(KEY, action, retention=50.0) == 1
        clock.advance(51)
        assert await as_purgeable(store).purge() == 2  # the action and its step
        assert await store.get(KEY) is None
        # Tokens restart after a purge, so the new run has the first run's epoch: the
        # step record must be gone with the action's.
        assert await idem.run(KEY, action, retention=50.0) == 2
        assert grants.runs == 2
    finally:
        await store.close()


@pytest.mark.parametrize("window", [None, 2.0])
async def test_an_unknown_at_most_step_stops_every_later_run_of_its_action(
    idem: Idem, clock: ManualClock, window: float | None
) -> None:
    """The run-carrying key must not let a later run of the action (after its retention,
    or its ``window``) meet no ledger row and charge again: an at-most-once step keeps
    the first run's key, so its unknown outcome stops every run until it is resolved,
    and the provider sees one idempotency key."""
    sent: list[str] = []

    async def charge(ctx: EffectContext) -> str:
        sent.append(ctx.idempotency_key)
        raise AmbiguousEffectError("the provider timed out after the request was sent")

    async def action() -> str:
        return await idem.step("charge", charge, once="at_most", context=True)

    for _ in range(3):
        with pytest.raises(UnknownOutcomeError) as caught:
            await idem.run(KEY, action, window=window)
        clock.advance(RETENTION + LEASE + 1)  # the action's record is long gone
    assert len(sent) == 1
    assert caught.value.key == idem.keys.step(KEY, "charge")
    assert [u.key for u in await idem.unresolved()] == [idem.keys.step(KEY, "charge")]
    await idem.resolve(idem.keys.step(KEY, "charge"), result="charged")
    assert await idem.run(KEY, action, window=window) == "charged"
    assert len(sent) == 1


async def test_a_window_actions_steps_are_kept_no_longer_than_its_window(
    idem: Idem, clock: ManualClock
) -> None:
    """On a store that drops expired records (Redis: the run's epoch is then always 0),
    only the step's own expiry keeps a later window's run from replaying it: a step's
    completed record is kept no longer than its action's window (second trial)."""
    grants = Grants()

    async def action() -> int:
        return await idem.step("grant", grants)

    assert await idem.run(KEY, action, window=2.0) == 1
    step = await idem.store.get(idem.keys.step(KEY, "grant"))
    parent = await idem.store.get(KEY)
    assert step is not None and parent is not None
    assert step.expires_at <= parent.expires_at
    clock.advance(2.5)
    assert await idem.store.get(idem.keys.step(KEY, "grant")) is None  # gone with the window
