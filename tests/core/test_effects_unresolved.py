"""Reconciliation: ``idem.unresolved()`` lists unknown steps, actions and sends, oldest
first, with what is known; ``idem.resolve()`` settles one, fenced; bad input is a clear
error. Memory and SQLite."""

from __future__ import annotations

import asyncio
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
    ResolveError,
    ResultEncodingError,
    Status,
    Store,
    UnknownOutcomeError,
    store_from_url,
    subscribe,
)
from telegram_idem.ledger import Ledger, LedgerState
from telegram_idem.outbox import AmbiguousPolicy, CallStatus, NewCall

BOT = 7000000001
KEY = f"idem:{BOT}:a:buy:1"
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
    return Idem(store, clock=clock, heartbeat=False, lease=LEASE, holder="shop-1:42")


def ledger(idem: Idem) -> Ledger:
    return idem.store.ledger()


async def lost_answer() -> str:
    raise AmbiguousEffectError("the provider did not answer")


async def make_unknown(idem: Idem, key: str) -> None:
    with pytest.raises(UnknownOutcomeError):
        await idem.run(key, lost_answer, once="at_most")


async def died_after_start(idem: Idem, key: str) -> int:
    claim = await idem.store.claim(key, lease=LEASE, retention=3600.0)
    assert await ledger(idem).start(key, token=claim.token, holder="shop-0:7") is None
    return claim.token


# ---------------------------------------------------------------- listing


async def test_unresolved_lists_oldest_first_with_what_is_known(
    idem: Idem, clock: ManualClock
) -> None:
    assert await idem.unresolved() == []
    assert await idem.oldest_unresolved_age() is None
    step_key = idem.keys.step(KEY, "charge")
    await make_unknown(idem, step_key)
    clock.advance(10)
    await make_unknown(idem, KEY)
    clock.advance(5)
    step, action = await idem.unresolved()
    assert (step.key, step.kind, step.state) == (step_key, "step", "unknown")
    assert (action.key, action.kind) == (KEY, "action")
    assert step.holder == "shop-1:42" and step.attempts == 2
    assert "the provider did not answer" in step.detail
    assert step.started_at == clock() - 15 and step.age == 15
    assert action.age == 5
    assert await idem.oldest_unresolved_age() == 15
    assert [u.key for u in await idem.unresolved(limit=1)] == [step_key]
    assert [u.key for u in await idem.unresolved(prefix=KEY + ":")] == [step_key]


async def test_a_started_row_is_listed_once_its_holder_is_gone(
    idem: Idem, clock: ManualClock
) -> None:
    await died_after_start(idem, KEY)
    assert await idem.unresolved() == []  # its lease is alive: running
    clock.advance(LEASE + 1)
    [item] = await idem.unresolved()
    assert (item.key, item.state, item.holder, item.attempts) == (KEY, "started", "shop-0:7", 1)


async def test_a_started_row_whose_record_is_gone_is_listed(idem: Idem, clock: ManualClock) -> None:
    await died_after_start(idem, KEY)
    clock.advance(3601)  # the record's retention ended too
    [item] = await idem.unresolved()
    assert item.key == KEY


async def test_a_stale_started_row_is_removed_not_listed(idem: Idem) -> None:
    # The holder completed the record and stopped before removing its row.
    claim = await idem.store.claim(KEY, lease=LEASE, retention=3600.0)
    assert await ledger(idem).start(KEY, token=claim.token, holder="x") is None
    assert await idem.store.complete(KEY, claim.token, b'"done"', retention=3600.0)
    assert await idem.unresolved() == []
    assert await ledger(idem).get(KEY) is None


async def test_unknown_sends_are_listed_and_resolved(idem: Idem, clock: ManualClock) -> None:
    outbox = idem.store.outbox()
    send_key = f"idem:{BOT}:o:receipt:1"
    call = NewCall(
        key=send_key,
        bot_id=BOT,
        method="sendMessage",
        params=b'{"chat_id":1,"text":"receipt"}',
        ordering_key="chat:1",
        collapse_key=None,
        policy=AmbiguousPolicy.HOLD,
    )
    await outbox.enqueue(call)
    entry = await outbox.take(bot_id=BOT, lease=LEASE)
    assert entry is not None
    assert await outbox.settle(entry, status=CallStatus.UNKNOWN, error="connection reset")
    clock.advance(3)
    await make_unknown(idem, KEY)
    send, action = await idem.unresolved()
    assert (send.key, send.kind, send.state) == (send_key, "send", "unknown")
    assert "sendMessage" in send.detail and "connection reset" in send.detail
    assert send.age == 3 and action.key == KEY
    await idem.resolve(send_key, result={"message_id": 99})
    stored = await outbox.get(send_key)
    assert stored is not None and stored.status is CallStatus.DELIVERED
    assert stored.result == b'{"message_id":99}'
    assert [u.key for u in await idem.unresolved()] == [KEY]


async def test_a_send_recorded_with_its_method_in_the_error_shows_the_method_once(
    idem: Idem,
) -> None:
    """An entry a relay recorded before it dropped the transport's ``"<method>: "`` from
    the error text still reads "sendMessage: no answer", not the method twice."""
    outbox = idem.store.outbox()
    send_key = f"idem:{BOT}:o:old:1"
    await outbox.enqueue(
        NewCall(send_key, BOT, "sendMessage", b"{}", None, None, AmbiguousPolicy.HOLD)
    )
    entry = await outbox.take(bot_id=BOT, lease=LEASE)
    assert entry is not None
    error = "sendMessage: no answer: ServerDisconnectedError: Server disconnected"
    assert await outbox.settle(entry, status=CallStatus.UNKNOWN, error=error)
    [send] = await idem.unresolved()
    assert send.detail == error


async def test_an_unknown_send_resolved_not_applied_goes_back_to_the_outbox(idem: Idem) -> None:
    outbox = idem.store.outbox()
    send_key = f"idem:{BOT}:o:receipt:2"
    await outbox.enqueue(
        NewCall(send_key, BOT, "sendMessage", b"{}", None, None, AmbiguousPolicy.HOLD)
    )
    entry = await outbox.take(bot_id=BOT, lease=LEASE)
    assert entry is not None
    assert await outbox.settle(entry, status=CallStatus.UNKNOWN, error="timeout")
    await idem.resolve(send_key, not_applied=True)
    stored = await outbox.get(send_key)
    assert stored is not None and stored.status is CallStatus.PENDING


async def test_limit_must_be_positive(idem: Idem) -> None:
    with pytest.raises(ConfigurationError, match="limit"):
        await idem.unresolved(limit=0)


# ---------------------------------------------------------------- resolving


async def test_resolve_with_a_result_makes_the_next_run_replay_it(idem: Idem) -> None:
    await make_unknown(idem, KEY)
    await idem.resolve(KEY, result={"charge": "ch_1"})
    runs: list[int] = []

    async def charge() -> Any:
        runs.append(1)
        return "again"

    assert await idem.run(KEY, charge, once="at_most") == {"charge": "ch_1"}
    assert runs == []
    assert await idem.unresolved() == []
    assert await ledger(idem).get(KEY) is None
    with pytest.raises(ResolveError, match="nothing"):
        await idem.resolve(KEY, result="twice")


async def test_a_resolved_step_gives_its_action_the_result(idem: Idem) -> None:
    step_key = idem.keys.step(KEY, "charge")
    runs: list[int] = []

    async def charge() -> str:
        runs.append(1)
        raise AmbiguousEffectError("lost")

    async def action() -> str:
        return "receipt for " + await idem.step("charge", charge, once="at_most")

    with pytest.raises(UnknownOutcomeError):
        await idem.run(KEY, action)
    await idem.resolve(step_key, result="ch_7")
    assert await idem.run(KEY, action) == "receipt for ch_7"
    assert runs == [1]


async def test_resolve_not_applied_makes_it_run_once_more(idem: Idem) -> None:
    await make_unknown(idem, KEY)
    await idem.resolve(KEY, not_applied=True)
    runs: list[int] = []

    async def charge() -> str:
        runs.append(1)
        return "charged"

    assert await idem.run(KEY, charge, once="at_most") == "charged"
    assert await idem.run(KEY, charge, once="at_most") == "charged"
    assert runs == [1]


async def test_a_late_holder_cannot_overwrite_a_resolution(idem: Idem, clock: ManualClock) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow() -> str:
        started.set()
        await release.wait()
        return "the late holder's result"

    late = asyncio.create_task(idem.run(KEY, slow, once="at_most"))
    await started.wait()
    clock.advance(LEASE + 1)
    [item] = await idem.unresolved()
    assert item.state == "started"
    await idem.resolve(KEY, result="the operator's result")
    release.set()
    with pytest.raises(LostClaimError):
        await late
    record = await idem.store.get(KEY)
    assert record is not None and record.status is Status.COMPLETED
    assert idem.codec.decode(record.result or b"") == "the operator's result"
    assert await ledger(idem).get(KEY) is None


async def test_resolve_needs_exactly_one_of_result_and_not_applied(idem: Idem) -> None:
    await make_unknown(idem, KEY)
    with pytest.raises(ConfigurationError, match="exactly one"):
        await idem.resolve(KEY)
    with pytest.raises(ConfigurationError, match="exactly one"):
        await idem.resolve(KEY, result=1, not_applied=True)
    await idem.resolve(KEY, result=None)  # None is a result
    assert await idem.run(KEY, lost_answer, once="at_most") is None


async def test_resolve_of_a_key_that_is_not_unknown(idem: Idem) -> None:
    with pytest.raises(ResolveError, match="nothing") as caught:
        await idem.resolve(KEY, result=1)
    assert caught.value.key == KEY

    async def done() -> str:
        return "done"

    await idem.run(KEY + ":done", done, once="at_most")
    with pytest.raises(ResolveError):
        await idem.resolve(KEY + ":done", not_applied=True)


async def test_resolve_of_a_running_effect_is_refused(idem: Idem) -> None:
    await died_after_start(idem, KEY)  # its lease is alive
    with pytest.raises(ResolveError, match="lease is alive"):
        await idem.resolve(KEY, result=1)
    row = await ledger(idem).get(KEY)
    assert row is not None and row.state is LedgerState.STARTED


async def test_resolve_of_a_completed_key_removes_its_stale_row(idem: Idem) -> None:
    claim = await idem.store.claim(KEY, lease=LEASE, retention=3600.0)
    assert await ledger(idem).start(KEY, token=claim.token, holder="x") is None
    assert await idem.store.complete(KEY, claim.token, b'"done"', retention=3600.0)
    with pytest.raises(ResolveError, match="recorded already"):
        await idem.resolve(KEY, result="other")
    assert await ledger(idem).get(KEY) is None


async def test_a_settled_row_cannot_be_resolved_again(idem: Idem, clock: ManualClock) -> None:
    await died_after_start(idem, KEY)
    clock.advance(LEASE + 1)
    claim = await idem.store.claim(KEY, lease=LEASE, retention=3600.0)
    assert await ledger(idem).settle(KEY, token=claim.token, result=b"1", not_applied=False)
    with pytest.raises(ResolveError, match="settled already"):
        await idem.resolve(KEY, not_applied=True)


async def test_an_unstorable_result_is_refused_before_anything_is_written(idem: Idem) -> None:
    await make_unknown(idem, KEY)
    with pytest.raises(ResultEncodingError):
        await idem.resolve(KEY, result=object())
    row = await ledger(idem).get(KEY)
    assert row is not None and row.state is LedgerState.UNKNOWN


async def test_unknown_and_resolved_are_decision_events(idem: Idem) -> None:
    events: list[DecisionEvent] = []
    with subscribe(events.append):
        await make_unknown(idem, KEY)
        await idem.resolve(KEY, result=1)
    decisions = [(e.key, e.decision) for e in events]
    assert (KEY, "unknown") in decisions
    assert decisions[-1] == (KEY, "resolved")


async def test_an_unknown_step_of_an_at_most_action_settles_in_two(idem: Idem) -> None:
    step_key = idem.keys.step(KEY, "charge")
    runs: list[str] = []

    async def charge() -> str:
        runs.append("charge")
        raise AmbiguousEffectError("lost")

    async def action() -> str:
        runs.append("action")
        return "receipt for " + await idem.step("charge", charge, once="at_most")

    with pytest.raises(UnknownOutcomeError) as caught:
        await idem.run(KEY, action, once="at_most")
    assert caught.value.key == KEY  # the action is unknown too: it raised an unknown
    assert {u.key for u in await idem.unresolved()} == {KEY, step_key}
    await idem.resolve(step_key, result="ch_9")
    await idem.resolve(KEY, not_applied=True)
    assert await idem.run(KEY, action, once="at_most") == "receipt for ch_9"
    assert runs == ["action", "charge", "action"]
    assert await idem.unresolved() == []
