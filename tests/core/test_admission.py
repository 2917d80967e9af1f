"""The one admission rule: only a completed update is acknowledged as a duplicate; one in
progress elsewhere is not (Telegram must re-send it), and after the holder's lease ends the
next delivery runs it once by takeover — on every store."""

from __future__ import annotations

import asyncio

import pytest

from telegram_idem import (
    Idem,
    ManualClock,
    Outcome,
    Store,
    UpdateInProgressError,
    Verdict,
    verdict_for,
)

BOT = 7000000001
UPDATE = {"update_id": 501, "message": {"message_id": 1, "chat": {"id": 42, "type": "private"}}}


def make_idem(store: Store, clock: ManualClock, lease: float = 0.4) -> Idem:
    async def sleep(seconds: float) -> None:  # time passes for the store and the test alike
        clock.advance(seconds)
        await asyncio.sleep(seconds)

    return Idem(store, clock=clock, heartbeat=False, lease=lease, sleep=sleep)


def test_verdicts() -> None:
    assert verdict_for(Outcome.ACQUIRED) is Verdict.RUN
    assert verdict_for(Outcome.IN_PROGRESS) is Verdict.NOT_YET
    assert verdict_for(Outcome.REPLAY) is Verdict.DUPLICATE
    assert verdict_for(Outcome.FAILED) is Verdict.DUPLICATE


async def test_in_progress_is_not_a_duplicate(store: Store, clock: ManualClock) -> None:
    idem = make_idem(store, clock)
    dead = await idem.claim_update(UPDATE, bot_id=BOT)  # a run that was killed
    assert dead.outcome is Outcome.ACQUIRED
    runs: list[int] = []

    async def handler() -> None:
        runs.append(1)

    with pytest.raises(UpdateInProgressError) as info:
        await idem.process_update(UPDATE, handler, bot_id=BOT)
    assert info.value.key == dead.record.key
    assert runs == []


async def test_delivery_after_the_dead_lease_runs_once(store: Store, clock: ManualClock) -> None:
    idem = make_idem(store, clock)
    await idem.claim_update(UPDATE, bot_id=BOT)  # killed holder, never releases
    claim = await idem.admit_update(UPDATE, bot_id=BOT, wait=3.0)
    assert claim.outcome is Outcome.ACQUIRED
    runs: list[int] = []

    async def handler() -> str:
        runs.append(1)
        return "done"

    assert await idem.process_update(UPDATE, handler, bot_id=BOT, claim=claim) == (True, "done")
    # A later delivery is a duplicate of a completed update: acknowledged, not run.
    again = await idem.admit_update(UPDATE, bot_id=BOT, wait=3.0)
    assert verdict_for(again.outcome) is Verdict.DUPLICATE
    assert await idem.process_update(UPDATE, handler, bot_id=BOT, claim=again) == (False, None)
    assert runs == [1]


async def test_wait_zero_answers_not_yet_at_once(store: Store, clock: ManualClock) -> None:
    idem = make_idem(store, clock, lease=30.0)
    await idem.claim_update(UPDATE, bot_id=BOT)
    claim = await idem.admit_update(UPDATE, bot_id=BOT, wait=0.0)
    assert verdict_for(claim.outcome) is Verdict.NOT_YET
