"""``once="at_most"`` on ``Idem.run``, ``Idem.step`` and ``@idempotent``: the ledger's
protocol (telegram_idem/ledger/_base.py) on the real memory and SQLite stores."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from telegram_idem import (
    AmbiguousEffectError,
    ConfigurationError,
    DecisionEvent,
    Idem,
    LostClaimError,
    ManualClock,
    NotAppliedError,
    PermanentEffectError,
    Status,
    Store,
    StoredFailureError,
    UnknownOutcomeError,
    bind_update,
    idempotent,
    store_from_url,
    subscribe,
)
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.ledger import Ledger, LedgerEntry, LedgerState
from telegram_idem.testing._delivery import load_fixture

BOT = 7000000001
KEY = "idem:7000000001:a:charge:4130"
LEASE = 30.0


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
    return Idem(store, clock=clock, heartbeat=False, lease=LEASE, holder="worker-a")


def ledger(idem: Idem) -> Ledger:
    led = idem.store.ledger()
    assert isinstance(led, Ledger)
    return led


class Effect:
    """An async effect that counts its runs and returns (or raises) what it is told."""

    def __init__(self, *results: Any) -> None:
        self.calls = 0
        self._results = list(results)

    async def __call__(self) -> Any:
        self.calls += 1
        value = self._results[min(self.calls, len(self._results)) - 1]
        if isinstance(value, BaseException):
            raise value
        return value


async def died_after_start(idem: Idem, key: str, holder: str = "worker-dead") -> int:
    """Play a holder that claimed ``key``, started its at-most-once effect and died (no
    outcome recorded): its record stays in progress until the lease ends."""
    claim = await idem.store.claim(key, lease=LEASE, retention=3600.0)
    assert await ledger(idem).start(key, token=claim.token, holder=holder) is None
    return claim.token


# ------------------------------------------------------------------ success


async def test_at_most_runs_once_replays_and_leaves_no_row(idem: Idem) -> None:
    effect = Effect({"charged": 5})
    assert await idem.run(KEY, effect, once="at_most") == {"charged": 5}
    assert await idem.run(KEY, effect, once="at_most") == {"charged": 5}
    assert effect.calls == 1
    record = await idem.store.get(KEY)
    assert record is not None and record.status is Status.COMPLETED
    assert await ledger(idem).get(KEY) is None


async def test_the_row_is_written_before_the_effect_runs(idem: Idem) -> None:
    seen: list[LedgerEntry | None] = []

    async def effect() -> str:
        seen.append(await ledger(idem).get(KEY))
        return "done"

    await idem.run(KEY, effect, once="at_most")
    [row] = seen
    assert row is not None and row.state is LedgerState.STARTED
    assert row.holder == "worker-a"


# ------------------------------------------------------- a holder that died


async def test_a_retry_after_a_crash_raises_unknown_and_never_runs(
    idem: Idem, clock: ManualClock
) -> None:
    dead = await died_after_start(idem, KEY)
    clock.advance(LEASE + 1)
    effect = Effect("charged again")
    with pytest.raises(UnknownOutcomeError) as caught:
        await idem.run(KEY, effect, once="at_most", handler="charge")
    assert effect.calls == 0
    error = caught.value
    assert error.key == KEY
    assert isinstance(error.entry, LedgerEntry)
    assert error.entry.state is LedgerState.UNKNOWN
    assert error.entry.attempts == 2 and error.entry.token > dead
    message = str(error)
    for part in ("'charge'", KEY, "worker-dead", "2 holder(s)", "2023-11-14T22:13:20", "resolve"):
        assert part in message
    # The finder released its claim: the next retry meets the row again and counts it.
    with pytest.raises(UnknownOutcomeError) as again:
        await idem.run(KEY, effect, once="at_most")
    assert isinstance(again.value.entry, LedgerEntry) and again.value.entry.attempts == 3
    assert effect.calls == 0


async def test_a_live_holder_is_in_progress_not_unknown(idem: Idem) -> None:
    await died_after_start(idem, KEY)
    with pytest.raises(Exception, match="in progress"):
        await idem.run(KEY, Effect(1), once="at_most")
    row = await ledger(idem).get(KEY)
    assert row is not None and row.state is LedgerState.STARTED and row.attempts == 1


# --------------------------------------------------------- outcome classes


async def test_ambiguous_failure_is_unknown_at_once_and_on_retry(idem: Idem) -> None:
    cause = AmbiguousEffectError("provider timed out after the request was sent")
    effect = Effect(cause, "never")
    with pytest.raises(UnknownOutcomeError) as caught:
        await idem.run(KEY, effect, once="at_most")
    assert caught.value.__cause__ is cause
    row = await ledger(idem).get(KEY)
    assert row is not None and row.state is LedgerState.UNKNOWN
    assert "AmbiguousEffectError: provider timed out" in row.detail
    with pytest.raises(UnknownOutcomeError, match="provider timed out"):
        await idem.run(KEY, effect, once="at_most")
    assert effect.calls == 1


async def test_not_applied_releases_and_removes_the_row(idem: Idem) -> None:
    effect = Effect(NotAppliedError("card declined before charging"), "charged")
    with pytest.raises(NotAppliedError):
        await idem.run(KEY, effect, once="at_most")
    assert await ledger(idem).get(KEY) is None
    assert await idem.run(KEY, effect, once="at_most") == "charged"
    assert effect.calls == 2


async def test_permanent_failure_is_stored_and_the_row_removed(idem: Idem) -> None:
    effect = Effect(PermanentEffectError("no such product"), "never")
    with pytest.raises(PermanentEffectError):
        await idem.run(KEY, effect, once="at_most")
    assert await ledger(idem).get(KEY) is None
    with pytest.raises(StoredFailureError, match="no such product"):
        await idem.run(KEY, effect, once="at_most")
    assert effect.calls == 1


async def test_an_unlisted_error_is_ambiguous_unless_on_error_store(idem: Idem) -> None:
    with pytest.raises(UnknownOutcomeError):
        await idem.run(KEY, Effect(RuntimeError("boom")), once="at_most")
    other = KEY + ":2"
    with pytest.raises(RuntimeError):
        await idem.run(other, Effect(RuntimeError("boom")), once="at_most", on_error="store")
    with pytest.raises(StoredFailureError):
        await idem.run(other, Effect("x"), once="at_most", on_error="store")
    assert await ledger(idem).get(other) is None


async def test_listed_classes_decide(idem: Idem) -> None:
    effect = Effect(KeyError("sku"), "ok")
    with pytest.raises(KeyError):
        await idem.run(KEY, effect, once="at_most", not_applied=(KeyError,))
    assert await idem.run(KEY, effect, once="at_most", not_applied=(KeyError,)) == "ok"
    with pytest.raises(TimeoutError):
        await idem.run(KEY + ":p", Effect(TimeoutError()), permanent=(TimeoutError,))
    with pytest.raises(StoredFailureError):
        await idem.run(KEY + ":p", Effect("x"))


async def test_cancellation_is_unknown_under_at_most(idem: Idem) -> None:
    started = asyncio.Event()

    async def effect() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    task = asyncio.create_task(idem.run(KEY, effect, once="at_most"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    row = await ledger(idem).get(KEY)
    assert row is not None and row.state is LedgerState.UNKNOWN
    assert "interrupted" in row.detail
    with pytest.raises(UnknownOutcomeError):
        await idem.run(KEY, Effect("again"), once="at_most")


async def test_cancellation_still_releases_under_at_least(idem: Idem) -> None:
    started = asyncio.Event()

    async def effect() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    task = asyncio.create_task(idem.run(KEY, effect))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await idem.run(KEY, Effect("ran again")) == "ran again"
    assert await ledger(idem).get(KEY) is None


# ------------------------------------------------------- fencing, settling


async def test_a_late_holder_leaves_the_row_to_its_successor(
    idem: Idem, clock: ManualClock
) -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def slow() -> str:
        started.set()
        await release.wait()
        return "late"

    late = asyncio.create_task(idem.run(KEY, slow, once="at_most"))
    await started.wait()
    clock.advance(LEASE + 1)
    with pytest.raises(UnknownOutcomeError):
        await idem.run(KEY, Effect("second"), once="at_most")
    release.set()
    with pytest.raises(LostClaimError):
        await late
    row = await ledger(idem).get(KEY)
    assert row is not None and row.state is LedgerState.UNKNOWN  # not finished by the late one
    record = await idem.store.get(KEY)
    assert record is not None and record.status is Status.IN_PROGRESS


async def test_a_settled_row_is_applied_by_the_next_holder(idem: Idem, clock: ManualClock) -> None:
    # A resolver that settled and stopped before completing the record.
    await died_after_start(idem, KEY)
    clock.advance(LEASE + 1)
    claim = await idem.store.claim(KEY, lease=LEASE, retention=3600.0)
    assert await ledger(idem).settle(
        KEY, token=claim.token, result=idem.codec.encode({"charged": 5}), not_applied=False
    )
    clock.advance(LEASE + 1)
    effect = Effect("never")
    assert await idem.run(KEY, effect, once="at_most") == {"charged": 5}
    assert await idem.run(KEY, effect, once="at_most") == {"charged": 5}
    assert effect.calls == 0
    assert await ledger(idem).get(KEY) is None


async def test_a_settled_not_applied_row_runs_once_more(idem: Idem, clock: ManualClock) -> None:
    await died_after_start(idem, KEY)
    clock.advance(LEASE + 1)
    claim = await idem.store.claim(KEY, lease=LEASE, retention=3600.0)
    assert await ledger(idem).settle(KEY, token=claim.token, result=None, not_applied=True)
    clock.advance(LEASE + 1)
    effect = Effect("charged")
    assert await idem.run(KEY, effect, once="at_most") == "charged"
    assert await idem.run(KEY, effect, once="at_most") == "charged"
    assert effect.calls == 1
    assert await ledger(idem).get(KEY) is None


# --------------------------------------------------------------- steps


async def test_gathered_at_most_steps_run_once_each(idem: Idem) -> None:
    runs: dict[str, int] = {}
    items = [f"item{i}" for i in range(25)]
    fail = [True]

    async def grant(item: str) -> str:
        runs[item] = runs.get(item, 0) + 1
        await asyncio.sleep(0)
        return f"granted {item}"

    async def action() -> list[str]:
        granted = await asyncio.gather(
            *(idem.step(f"grant:{i}", grant, i, once="at_most") for i in items)
        )
        if fail.pop() if fail else False:
            raise RuntimeError("the action fails after its steps")
        return list(granted)

    with pytest.raises(RuntimeError):
        await idem.run(KEY, action)  # released: the retry is the same run
    assert await idem.run(KEY, action) == [f"granted {i}" for i in items]
    assert runs == dict.fromkeys(items, 1)
    assert await ledger(idem).entries() == []


async def test_an_interrupted_step_is_unknown_to_the_retried_action(
    idem: Idem, clock: ManualClock
) -> None:
    caught: list[UnknownOutcomeError] = []
    effect = Effect("charged")

    async def action() -> str:
        try:
            return str(await idem.step("charge", effect, once="at_most"))
        except UnknownOutcomeError as exc:
            caught.append(exc)
            return "needs an operator"

    step_key = idem.keys.step(KEY, "charge")
    claim = await idem.store.claim(KEY, lease=LEASE, retention=3600.0)
    await died_after_start(idem, step_key)  # the action's first holder died mid-step
    clock.advance(LEASE + 1)
    assert await idem.run(KEY, action) == "needs an operator"
    assert effect.calls == 0
    [error] = caught
    assert error.key == step_key and "step 'charge'" in str(error)
    assert claim.token >= 1


async def test_at_most_needs_a_store_with_a_ledger(clock: ManualClock) -> None:
    class NoLedger(MemoryStore):
        ledger = Store.ledger  # type: ignore[assignment]  # the base's absent stand-in

    idem = Idem(NoLedger(clock=clock), clock=clock, heartbeat=False)
    effect = Effect("x")
    with pytest.raises(ConfigurationError, match=r"NoLedger.*effect ledger"):
        await idem.run(KEY, effect, once="at_most")
    assert effect.calls == 0
    assert await idem.store.get(KEY) is None  # nothing claimed
    assert await idem.run(KEY, effect) == "x"  # at least once needs none


async def test_bad_once_is_refused(idem: Idem) -> None:
    with pytest.raises(ConfigurationError, match="once must be"):
        await idem.run(KEY, Effect(1), once="exactly")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="once must be"):
        idempotent(key="k", once="never")  # type: ignore[arg-type]


# ------------------------------------------------------------ @idempotent


async def test_idempotent_at_most_under_a_bound_update(idem: Idem, clock: ManualClock) -> None:
    update = load_fixture("callback_delete")
    effect = Effect("deleted")

    @idempotent(key="delete:{callback_query.message.message_id}", once="at_most")
    async def delete(_update: Any) -> Any:
        return await effect()

    events: list[DecisionEvent] = []
    with bind_update(update, bot_id=BOT, idem=idem), subscribe(events.append):
        key = idem.keys.action(BOT, f"delete:{update['callback_query']['message']['message_id']}")
        await died_after_start(idem, key)
        clock.advance(LEASE + 1)
        with pytest.raises(UnknownOutcomeError) as caught:
            await delete(update)
        assert caught.value.key == key
        assert "delete" in str(caught.value)
    assert effect.calls == 0
    assert [e.decision for e in events if e.key == key][-1] == "unknown"
    assert events[-1].update_id == update["update_id"]


async def test_idempotent_at_most_runs_and_replays(idem: Idem) -> None:
    update = load_fixture("callback_delete")
    effect = Effect("deleted")

    @idempotent(key="delete:{callback_query.message.message_id}", once="at_most")
    async def delete(_update: Any) -> Any:
        return await effect()

    with bind_update(update, bot_id=BOT, idem=idem):
        assert await delete(update) == "deleted"
        assert await delete(update) == "deleted"
    assert effect.calls == 1
    assert await ledger(idem).entries() == []


async def test_a_huge_error_text_is_kept_as_its_head(idem: Idem) -> None:
    """A provider's 200 KB error page is not stored whole as the row's detail."""
    effect = Effect(AmbiguousEffectError("<html>" + "x" * 200_000), "never")
    with pytest.raises(UnknownOutcomeError):
        await idem.run(KEY, effect, once="at_most")
    row = await ledger(idem).get(KEY)
    assert row is not None and row.detail.startswith("AmbiguousEffectError: <html>xx")
    assert len(row.detail) < 1100 and "(200006 characters)" in row.detail


async def test_an_unknown_outcome_is_logged_at_warning(
    idem: Idem, caplog: pytest.LogCaptureFixture
) -> None:
    effect = Effect(AmbiguousEffectError("timeout"), "never")
    with caplog.at_level(logging.INFO, logger="telegram_idem.decisions"):
        with pytest.raises(UnknownOutcomeError):
            await idem.run(KEY, effect, once="at_most")
    levels = {r.getMessage().split()[1]: r.levelno for r in caplog.records}
    assert levels["unknown"] == logging.WARNING and levels["acquired"] == logging.INFO
