"""The one admission decision (``Idem.admit``): only a completed update is acknowledged
as a duplicate; one in progress elsewhere is not (Telegram must re-send it), and after
the holder's lease ends the next delivery runs it once by takeover — on every store. A
store outage is ``UNAVAILABLE`` (fail-closed) or ``UNGUARDED`` (fail-open), never a
decision; ``Admitted.run`` is the one way an admitted update runs and is recorded."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from telegram_idem import (
    Admission,
    ConfigurationError,
    Idem,
    ManualClock,
    Outcome,
    Status,
    Store,
    StoreError,
    StorePolicy,
    UpdateInProgressError,
    current_update,
)
from telegram_idem._admission import admission_for, refused_admission
from telegram_idem._records import Record

BOT = 7000000001
UPDATE = {"update_id": 501, "message": {"message_id": 1, "chat": {"id": 42, "type": "private"}}}
FUTURE = {"update_id": 502, "brand_new_thing": {"id": "abc"}}  # a type this version lacks


def make_idem(store: Store, clock: ManualClock, lease: float = 0.4) -> Idem:
    async def sleep(seconds: float) -> None:  # time passes for the store and the test alike
        clock.advance(seconds)
        await asyncio.sleep(seconds)

    return Idem(store, clock=clock, heartbeat=False, lease=lease, sleep=sleep)


def test_outcomes_of_claims_and_of_refused_inbox_admissions() -> None:
    assert admission_for(Outcome.ACQUIRED) is Admission.RUN
    assert admission_for(Outcome.IN_PROGRESS) is Admission.NOT_YET
    assert admission_for(Outcome.REPLAY) is Admission.DUPLICATE
    assert admission_for(Outcome.FAILED) is Admission.DUPLICATE

    def record(status: Status) -> Record:
        return Record("k", status, 1, 0.0, 0.0)

    assert refused_admission(record(Status.COMPLETED)) is Admission.DUPLICATE
    assert refused_admission(record(Status.FAILED)) is Admission.DUPLICATE
    assert refused_admission(record(Status.IN_PROGRESS)) is Admission.NOT_YET
    assert refused_admission(None) is Admission.NOT_YET
    assert [a for a in Admission if a.acknowledged] == [
        Admission.RUN,
        Admission.DUPLICATE,
        Admission.UNGUARDED,
    ]
    assert [a for a in Admission if a.runs] == [Admission.RUN, Admission.UNGUARDED]


def test_store_policy_takes_its_string_values_and_refuses_others() -> None:
    assert StorePolicy.of("fail_open") is StorePolicy.FAIL_OPEN
    assert StorePolicy.of(StorePolicy.FAIL_CLOSED) is StorePolicy.FAIL_CLOSED
    as_string: str = StorePolicy.FAIL_CLOSED  # old call sites hold it as a str...
    assert as_string == "fail_closed"  # ...and compare it with the string value
    with pytest.raises(ConfigurationError, match="fail-open"):
        StorePolicy.of("fail-open")  # type: ignore[arg-type]


async def test_a_new_update_runs_once_then_is_a_duplicate(store: Store, clock: ManualClock) -> None:
    idem = make_idem(store, clock)
    seen: list[tuple[int, Admission | None]] = []

    async def handler() -> str:
        ctx = current_update()
        seen.append((ctx.update["update_id"], ctx.admission))
        return "done"

    admitted = await idem.admit(UPDATE, bot_id=BOT)
    assert (admitted.outcome, admitted.key, admitted.update_id) == (
        Admission.RUN,
        idem.keys.update(BOT, 501),
        501,
    )
    assert admitted.claim is not None and admitted.claim.outcome is Outcome.ACQUIRED
    assert await admitted.run(handler) == "done"
    record = await store.get(admitted.key)
    assert record is not None and record.status is Status.COMPLETED
    again = await idem.admit(UPDATE, bot_id=BOT)
    assert again.outcome is Admission.DUPLICATE and again.webhook_status == 200
    assert seen == [(501, Admission.RUN)]


async def test_in_progress_is_not_a_duplicate(store: Store, clock: ManualClock) -> None:
    idem = make_idem(store, clock)
    dead = await idem.claim_update(UPDATE, bot_id=BOT)  # a run that was killed
    assert dead.outcome is Outcome.ACQUIRED
    runs: list[int] = []

    async def handler() -> None:
        runs.append(1)

    admitted = await idem.admit(UPDATE, bot_id=BOT)
    assert admitted.outcome is Admission.NOT_YET
    assert not admitted.acknowledged and admitted.webhook_status == 503
    with pytest.raises(UpdateInProgressError) as info:
        await admitted.run(handler)
    assert info.value.key == dead.record.key
    assert runs == []


async def test_delivery_after_the_dead_lease_runs_once(store: Store, clock: ManualClock) -> None:
    idem = make_idem(store, clock)
    dead = await idem.claim_update(UPDATE, bot_id=BOT)  # killed holder, never releases
    admitted = await idem.admit(UPDATE, bot_id=BOT, wait=3.0)
    assert admitted.outcome is Admission.RUN
    assert admitted.claim is not None and admitted.claim.token > dead.token  # takeover
    runs: list[int] = []

    async def handler() -> str:
        runs.append(1)
        return "done"

    assert await admitted.run(handler) == "done"
    # A later delivery is a duplicate of a completed update: acknowledged, not run.
    assert (await idem.admit(UPDATE, bot_id=BOT, wait=3.0)).outcome is Admission.DUPLICATE
    assert runs == [1]


async def test_wait_zero_answers_not_yet_at_once(store: Store, clock: ManualClock) -> None:
    idem = make_idem(store, clock, lease=30.0)
    await idem.claim_update(UPDATE, bot_id=BOT)
    assert (await idem.admit(UPDATE, bot_id=BOT, wait=0.0)).outcome is Admission.NOT_YET


async def test_a_failed_run_releases_the_claim(store: Store, clock: ManualClock) -> None:
    idem = make_idem(store, clock)

    async def broken() -> None:
        raise RuntimeError("handler bug")

    with pytest.raises(RuntimeError, match="handler bug"):
        await (await idem.admit(UPDATE, bot_id=BOT)).run(broken)
    again = await idem.admit(UPDATE, bot_id=BOT)  # released: the re-delivery runs it
    assert again.outcome is Admission.RUN


async def test_an_unknown_update_type_is_admitted_like_any_other(
    store: Store, clock: ManualClock
) -> None:
    idem = make_idem(store, clock)

    async def handler() -> dict[str, Any]:
        return dict(current_update().update)

    assert await (await idem.admit(FUTURE, bot_id=BOT)).run(handler) == FUTURE  # untouched
    assert (await idem.admit(FUTURE, bot_id=BOT)).outcome is Admission.DUPLICATE


async def test_a_completion_lost_to_a_takeover_is_logged_once_and_not_raised(
    store: Store, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    idem = make_idem(store, clock, lease=5.0)
    other = make_idem(store, clock, lease=5.0)
    admitted = await idem.admit(UPDATE, bot_id=BOT)

    async def slow() -> str:
        clock.advance(6.0)  # the lease ends mid-run (no heartbeat) ...
        taker = await other.admit(UPDATE, bot_id=BOT)  # ... and a re-delivery takes over
        assert taker.outcome is Admission.RUN
        return "processed"

    caplog.set_level(logging.ERROR, logger="telegram_idem")
    assert await admitted.run(slow) == "processed"  # it was processed: no error raised
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "501 was processed but its completion was not stored" in errors[0]
    assert "taken over" in errors[0]
    record = await store.get(admitted.key)
    assert record is not None and record.status is Status.IN_PROGRESS  # the taker's
    assert record.fencing_token == 2


async def test_fail_records_an_unparseable_update(store: Store, clock: ManualClock) -> None:
    idem = make_idem(store, clock)
    admitted = await idem.admit(UPDATE, bot_id=BOT)
    assert await admitted.fail(ValueError("bad field"), source="a framework")
    record = await store.get(admitted.key)
    assert record is not None and record.status is Status.FAILED
    assert b"a framework cannot parse it: bad field" in (record.result or b"")
    assert (await idem.admit(UPDATE, bot_id=BOT)).outcome is Admission.DUPLICATE
    with pytest.raises(ConfigurationError):
        await (await idem.admit(UPDATE, bot_id=BOT)).fail(ValueError("x"), source="a")


async def test_an_adopted_update_runs_bound_without_a_claim(
    store: Store, clock: ManualClock
) -> None:
    idem = make_idem(store, clock)

    async def handler() -> Admission | None:
        return current_update().admission

    owned = idem.adopt(UPDATE, bot_id=BOT)  # the inbox owns it
    assert await owned.run(handler) is Admission.RUN
    unguarded = idem.adopt(UPDATE, bot_id=BOT, outcome=Admission.UNGUARDED)
    assert await unguarded.run(handler) is Admission.UNGUARDED
    assert await store.get(idem.keys.update(BOT, 501)) is None  # nothing claimed
    with pytest.raises(ConfigurationError):
        idem.adopt(UPDATE, bot_id=BOT, outcome=Admission.DUPLICATE)


# ----------------------------------------------------------------- store outages


def down_idem(path: Path, clock: ManualClock, *, heal_after: int | None = None) -> Idem:
    """A SQLite guard whose database path is a directory: every call raises StoreError.
    With ``heal_after``, the directory goes away at that many sleeps (the store answers)."""
    path.mkdir()
    sleeps = [0]

    async def sleep(seconds: float) -> None:
        sleeps[0] += 1
        if heal_after is not None and sleeps[0] == heal_after:
            os.rmdir(path)
        clock.advance(seconds)
        await asyncio.sleep(0)

    return Idem(f"sqlite:///{path}", clock=clock, heartbeat=False, sleep=sleep)


async def test_an_outage_fails_closed_by_default(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    idem = down_idem(tmp_path / "db", clock)
    caplog.set_level(logging.WARNING, logger="telegram_idem")
    try:
        admitted = await idem.admit(UPDATE, bot_id=BOT)
        assert admitted.outcome is Admission.UNAVAILABLE and admitted.webhook_status == 503
        assert isinstance(admitted.error, StoreError) and admitted.claim is None

        async def handler() -> None:
            raise AssertionError("never run")

        with pytest.raises(StoreError):
            await admitted.run(handler)
    finally:
        await idem.close()
    [line] = [r.getMessage() for r in caplog.records if "store outage" in r.getMessage()]
    assert "501 not admitted (fail_closed)" in line


async def test_an_outage_fails_open_when_asked_and_runs_unguarded(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    idem = down_idem(tmp_path / "db", clock)
    caplog.set_level(logging.ERROR, logger="telegram_idem")

    async def handler() -> tuple[int, Admission | None]:
        ctx = current_update()
        return ctx.update["update_id"], ctx.admission

    before = clock()
    try:
        admitted = await idem.admit(UPDATE, bot_id=BOT, store_policy="fail_open", outage_wait=60.0)
        assert admitted.outcome is Admission.UNGUARDED and admitted.webhook_status == 200
        assert await admitted.run(handler) == (501, Admission.UNGUARDED)
        assert clock() == before  # fail-open does not wait for the store
    finally:
        await idem.close()
    assert any("501 runs unguarded (fail_open)" in r.getMessage() for r in caplog.records)


async def test_a_polled_update_waits_out_an_outage_and_runs_once(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    idem = down_idem(tmp_path / "db", clock, heal_after=3)
    caplog.set_level(logging.WARNING, logger="telegram_idem")
    try:
        admitted = await idem.admit(UPDATE, bot_id=BOT, outage_wait=60.0)
        assert admitted.outcome is Admission.RUN
    finally:
        await idem.close()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("store unavailable" in m for m in messages) == 1
    assert sum("store answers again" in m for m in messages) == 1


async def test_an_outage_longer_than_outage_wait_loses_the_update_loudly(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    idem = down_idem(tmp_path / "db", clock)
    caplog.set_level(logging.ERROR, logger="telegram_idem")
    try:
        admitted = await idem.admit(UPDATE, bot_id=BOT, outage_wait=5.0)
        assert admitted.outcome is Admission.UNAVAILABLE
    finally:
        await idem.close()
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "501 LOST" in line and "fail_closed" in line and "5 s" in line
