"""``Idem``: the action guard (``run``), steps, locks and the update guard, on every store."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from telegram_idem import (
    Admission,
    ConfigurationError,
    ConflictError,
    Idem,
    InProgressError,
    LockHeldError,
    LostClaimError,
    ManualClock,
    Outcome,
    ResultEncodingError,
    Status,
    Store,
    StoredFailureError,
    bind_update,
    current_update,
    fingerprint,
    idempotent,
)
from telegram_idem.testing._delivery import load_fixture

BOT = 7000000001
KEY = "idem:7000000001:a:approve:4130"


@pytest.fixture
def idem(store: Store, clock: ManualClock) -> Idem:
    return Idem(store, clock=clock, heartbeat=False, lease=30.0)


class Counter:
    """An async body that counts its runs and returns (or raises) what it is told."""

    def __init__(self, *results: Any) -> None:
        self.calls = 0
        self._results = list(results)

    async def __call__(self) -> Any:
        self.calls += 1
        value = self._results[min(self.calls, len(self._results)) - 1]
        if isinstance(value, BaseException):
            raise value
        return value


async def hold(event: asyncio.Event, started: asyncio.Event, value: Any = "first") -> Any:
    started.set()
    await event.wait()
    return value


def body_waiting(
    event: asyncio.Event, started: asyncio.Event, value: Any = "first"
) -> Callable[[], Awaitable[Any]]:
    return lambda: hold(event, started, value)


# ----------------------------------------------------------------- run / replay


async def test_run_runs_once_and_replays(idem: Idem) -> None:
    body = Counter({"post": "webhook-retries", "files": 3})
    first = await idem.run(KEY, body)
    second = await idem.run(KEY, body)
    assert first == second == {"post": "webhook-retries", "files": 3}
    assert body.calls == 1
    record = await idem.store.get(KEY)
    assert record is not None and record.status is Status.COMPLETED


@pytest.mark.parametrize("value", [None, 0, "", False, {}, [], 0.0, "한국어"])
async def test_falsy_results_replay_exactly(idem: Idem, value: Any) -> None:
    body = Counter(value)
    assert await idem.run(KEY, body) == value
    replayed = await idem.run(KEY, body)
    assert replayed == value
    assert type(replayed) is type(value)
    assert body.calls == 1


async def test_exception_releases_so_the_retry_runs(idem: Idem) -> None:
    body = Counter(RuntimeError("telegram 502"), "ok")
    with pytest.raises(RuntimeError, match="telegram 502"):
        await idem.run(KEY, body)
    record = await idem.store.get(KEY)
    assert record is not None and record.status is Status.IN_PROGRESS  # released, not stored
    assert await idem.run(KEY, body) == "ok"
    assert await idem.run(KEY, body) == "ok"
    assert body.calls == 2


async def test_on_error_store_replays_the_failure(idem: Idem) -> None:
    body = Counter(ValueError("no such post"), "never")
    with pytest.raises(ValueError, match="no such post"):
        await idem.run(KEY, body, on_error="store")
    for _ in range(2):
        with pytest.raises(StoredFailureError) as info:
            await idem.run(KEY, body, on_error="store")
        assert info.value.error_type == "ValueError"
        assert info.value.error_message == "no such post"
        assert info.value.key == KEY
    assert body.calls == 1


async def test_cancellation_releases(idem: Idem) -> None:
    event, started = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(idem.run(KEY, body_waiting(event, started)))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await idem.run(KEY, Counter("second")) == "second"


# ----------------------------------------------------------------- in progress policies


async def test_in_progress_raise(idem: Idem) -> None:
    event, started = asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(idem.run(KEY, body_waiting(event, started)))
    await started.wait()
    other = Counter("second")
    with pytest.raises(InProgressError) as info:
        await idem.run(KEY, other, in_progress="raise")
    assert info.value.key == KEY
    assert info.value.record is not None
    assert info.value.record.status is Status.IN_PROGRESS
    event.set()
    assert await first == "first"
    assert other.calls == 0


async def test_in_progress_drop(idem: Idem) -> None:
    event, started = asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(idem.run(KEY, body_waiting(event, started)))
    await started.wait()
    other = Counter("second")
    assert await idem.run(KEY, other, in_progress="drop") is None
    event.set()
    assert await first == "first"
    assert other.calls == 0


async def test_in_progress_wait_returns_the_first_result(store: Store, clock: ManualClock) -> None:
    polls: list[float] = []

    async def sleep(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 3:
            event.set()  # the first holder finishes while the second waits
        await asyncio.sleep(0)

    idem = Idem(store, clock=clock, heartbeat=False, sleep=sleep)
    event, started = asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(idem.run(KEY, body_waiting(event, started, {"title": "t"})))
    await started.wait()
    other = Counter("second")
    assert await idem.run(KEY, other, in_progress="wait", wait_timeout=60.0) == {"title": "t"}
    assert await first == {"title": "t"}
    assert other.calls == 0
    assert len(polls) >= 3
    assert all(p > 0 for p in polls)


async def test_in_progress_wait_times_out(store: Store, clock: ManualClock) -> None:
    polls: list[float] = []

    async def sleep(seconds: float) -> None:
        polls.append(seconds)
        await asyncio.sleep(0.005)

    idem = Idem(store, clock=clock, heartbeat=False, sleep=sleep)
    event, started = asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(idem.run(KEY, body_waiting(event, started)))
    await started.wait()
    other = Counter("second")
    with pytest.raises(InProgressError):
        await idem.run(KEY, other, in_progress="wait", wait_timeout=0.05)
    assert polls  # it did wait before giving up
    assert other.calls == 0
    event.set()
    assert await first == "first"


async def test_wait_takes_over_when_the_holder_crashed(store: Store, clock: ManualClock) -> None:
    """A waiter whose holder's lease ends (crash) acquires by takeover and runs."""

    async def sleep(seconds: float) -> None:
        clock.advance(31)  # the holder never comes back
        await asyncio.sleep(0)

    idem = Idem(store, clock=clock, heartbeat=False, sleep=sleep, lease=30.0)
    crashed = await store.claim(KEY, lease=30.0, retention=3600.0)
    body = Counter("rerun")
    assert await idem.run(KEY, body, in_progress="wait", wait_timeout=60.0) == "rerun"
    record = await store.get(KEY)
    assert record is not None
    assert record.fencing_token == crashed.token + 1
    assert body.calls == 1


# ----------------------------------------------------------------- conflict / fencing


async def test_conflict_on_other_fingerprint(idem: Idem) -> None:
    body = Counter("ok")
    await idem.run(KEY, body, fingerprint=fingerprint({"post": "a", "lang": "ko"}))
    # same payload, keys in another order: replay
    assert await idem.run(KEY, body, fingerprint=fingerprint({"lang": "ko", "post": "a"})) == "ok"
    with pytest.raises(ConflictError) as info:
        await idem.run(KEY, body, fingerprint=fingerprint({"post": "b", "lang": "ko"}))
    assert info.value.key == KEY
    assert body.calls == 1


async def test_lost_claim_when_lease_taken_over(store: Store, clock: ManualClock) -> None:
    idem = Idem(store, clock=clock, heartbeat=False, lease=10.0)
    event, started = asyncio.Event(), asyncio.Event()
    stalled = asyncio.create_task(idem.run(KEY, body_waiting(event, started, "stale")))
    await started.wait()
    clock.advance(11)  # the first holder stalls past its lease
    assert await idem.run(KEY, Counter("fresh")) == "fresh"
    event.set()
    with pytest.raises(LostClaimError) as info:
        await stalled
    assert info.value.key == KEY
    record = await store.get(KEY)
    assert record is not None
    assert (record.status, record.result) == (Status.COMPLETED, b'"fresh"')
    assert await idem.run(KEY, Counter("third")) == "fresh"


async def test_heartbeat_extends_the_lease(store: Store, clock: ManualClock) -> None:
    """With heartbeats, a holder outlives many lease lengths of (manual) time."""
    lease = 0.06
    idem = Idem(store, clock=clock, heartbeat=True, lease=lease)
    competitor_outcomes: list[Outcome] = []

    async def long_work() -> str:
        for _ in range(5):
            clock.advance(lease * 0.8)  # not yet expired ...
            for _ in range(2000):  # ... until a heartbeat moves the lease past now + lease/2
                record = await store.get(KEY)
                assert record is not None
                if record.lease_expires_at > clock.now + lease / 2:
                    break
                await asyncio.sleep(0.005)
            else:
                pytest.fail("no heartbeat extended the lease")
            c = await store.claim(KEY, lease=lease, retention=3600.0)
            competitor_outcomes.append(c.outcome)
        return "published"

    assert await idem.run(KEY, long_work) == "published"
    assert competitor_outcomes == [Outcome.IN_PROGRESS] * 5
    record = await store.get(KEY)
    assert record is not None
    assert (record.status, record.fencing_token) == (Status.COMPLETED, 1)


async def test_without_heartbeat_a_long_holder_is_taken_over(
    store: Store, clock: ManualClock
) -> None:
    lease = 0.06
    idem = Idem(store, clock=clock, heartbeat=False, lease=lease)

    async def long_work() -> str:
        clock.advance(lease * 2)
        c = await store.claim(KEY, lease=lease, retention=3600.0)
        assert c.outcome is Outcome.ACQUIRED
        return "published"

    with pytest.raises(LostClaimError):
        await idem.run(KEY, long_work)


async def test_result_encoding_error_stores_a_failure(idem: Idem) -> None:
    body = Counter(object())
    with pytest.raises(ResultEncodingError):
        await idem.run(KEY, body)
    with pytest.raises(StoredFailureError) as info:
        await idem.run(KEY, body)
    assert info.value.error_type == "ResultEncodingError"
    assert body.calls == 1


# ----------------------------------------------------------------- steps


async def test_retried_action_skips_completed_steps(idem: Idem) -> None:
    calls: dict[str, int] = {"title": 0, "commit": 0}
    commit_fails = [True]

    async def make_title(topic: str) -> str:
        calls["title"] += 1
        return f"{topic}-{calls['title']}"

    async def commit(files: list[str]) -> dict[str, Any]:
        calls["commit"] += 1
        if commit_fails.pop(0) if commit_fails else False:
            raise ConnectionError("github 502")
        return {"sha": "abc123", "files": files}

    async def pipeline() -> dict[str, Any]:
        title = await idem.step("title", make_title, "webhooks")
        result = await idem.step("commit", commit, files=[f"ko/{title}.md"])
        return {"title": title, **result}

    with pytest.raises(ConnectionError):
        await idem.run(KEY, pipeline)
    done = await idem.run(KEY, pipeline)
    assert done == {"title": "webhooks-1", "sha": "abc123", "files": ["ko/webhooks-1.md"]}
    assert calls == {"title": 1, "commit": 2}
    assert await idem.run(KEY, pipeline) == done
    assert calls == {"title": 1, "commit": 2}
    step = await idem.store.get(idem.keys.step(KEY, "title"))
    assert step is not None and step.result == b'"webhooks-1"'


async def test_step_replays_falsy_results(idem: Idem) -> None:
    step_body = Counter(None)
    action_fails = [True]
    seen: list[Any] = []

    async def action() -> str:
        seen.append(await idem.step("noop", step_body))
        if action_fails.pop(0) if action_fails else False:
            raise RuntimeError("later step failed")
        return "done"

    with pytest.raises(RuntimeError):
        await idem.run(KEY, action)
    assert await idem.run(KEY, action) == "done"
    assert seen == [None, None]
    assert step_body.calls == 1


async def test_step_outside_an_action_needs_a_key(idem: Idem) -> None:
    body = Counter("sent")
    with pytest.raises(ConfigurationError):
        await idem.step("send", body)
    assert body.calls == 0
    assert await idem.step("send", body, key="idem:1:s:send") == "sent"
    assert await idem.step("send", body, key="idem:1:s:send") == "sent"
    assert body.calls == 1


async def test_steps_and_locks_use_the_idem_running_the_action(
    store: Store, clock: ManualClock
) -> None:
    """A module-level ``Idem`` (another store) called inside an action run by a test's
    ``Idem``: the step and the lock land next to the action, in the action's store."""
    module_idem = Idem("memory://", heartbeat=False)  # e.g. ``idem = Idem(...)`` in bot.py
    idem = Idem(store, clock=clock, heartbeat=False)
    body = Counter("sent")
    fails = [True]

    async def action() -> str:
        async with module_idem.lock("post:chat:42", bot_id=BOT, ttl=120) as lock:
            held = await store.get(lock.record.key)
            assert held is not None and held.fencing_token == lock.token
            sent: str = await module_idem.step("send", body)
        if fails.pop(0) if fails else False:
            raise RuntimeError("a later step failed")
        return sent

    with pytest.raises(RuntimeError):
        await idem.run(KEY, action)
    assert await idem.run(KEY, action) == "sent"
    assert body.calls == 1  # the retry found the step in the action's store
    assert await store.get(idem.keys.step(KEY, "send")) is not None
    assert await module_idem.store.get(idem.keys.step(KEY, "send")) is None
    assert await module_idem.store.get(idem.keys.lock(BOT, "post:chat:42")) is None
    await module_idem.close()


# ----------------------------------------------------------- dedup window


async def test_a_window_replays_for_window_seconds_after_the_run(
    store: Store, clock: ManualClock
) -> None:
    idem = Idem(store, clock=clock, heartbeat=False, lease=60.0)
    body = Counter("page 2", "page 2 again")
    assert await idem.run(KEY, body, window=2.0) == "page 2"
    clock.advance(1.5)
    assert await idem.run(KEY, body, window=2.0) == "page 2"  # a double tap: replayed
    assert body.calls == 1
    clock.advance(1.0)
    assert await idem.run(KEY, body, window=2.0) == "page 2 again"  # a later tap acts
    assert body.calls == 2


async def test_a_window_leaves_the_lease_alone(store: Store, clock: ManualClock) -> None:
    idem = Idem(store, clock=clock, heartbeat=False, lease=60.0)
    release, started = asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(idem.run(KEY, lambda: hold(release, started), window=2.0))
    await started.wait()
    clock.advance(10)  # far past the window, within the lease: still running
    with pytest.raises(InProgressError):
        await idem.run(KEY, Counter("second"), window=2.0)
    release.set()
    assert await first == "first"


async def test_a_window_through_the_decorator(store: Store, clock: ManualClock) -> None:
    idem = Idem(store, clock=clock, heartbeat=False, lease=60.0)
    runs: list[int] = []

    @idempotent(key="nav:{callback_query.message.message_id}", window=2.0)
    async def next_page() -> int:
        runs.append(1)
        return len(runs)

    with bind_update(load_fixture("callback_delete"), bot_id=BOT, idem=idem):
        assert await next_page() == 1
        assert await next_page() == 1
        clock.advance(3)
        assert await next_page() == 2


@pytest.mark.parametrize("window", [0.0, -1.0, math.inf, math.nan])
async def test_a_bad_window_is_refused(idem: Idem, window: float) -> None:
    body = Counter("x")
    with pytest.raises(ConfigurationError):
        await idem.run(KEY, body, window=window)
    with pytest.raises(ConfigurationError):
        await idem.run(KEY, body, window=2.0, retention=60.0)
    assert body.calls == 0


# ----------------------------------------------------------------- locks


async def test_second_lock_holder_gets_lock_held(idem: Idem, clock: ManualClock) -> None:
    async with idem.lock("post:chat:42", bot_id=BOT, ttl=120.0) as held:
        assert held.outcome is Outcome.ACQUIRED
        clock.advance(20)
        with pytest.raises(LockHeldError) as info:
            async with idem.lock("post:chat:42", bot_id=BOT, ttl=120.0):
                pytest.fail("two holders of one lock")
        assert info.value.retry_after == pytest.approx(100.0)
        assert info.value.key == idem.keys.lock(BOT, "post:chat:42")
        # another lock name, or another bot, is independent
        async with idem.lock("post:chat:43", bot_id=BOT):
            pass
        async with idem.lock("post:chat:42", bot_id=BOT + 1):
            pass
    async with idem.lock("post:chat:42", bot_id=BOT) as again:
        assert again.token == held.token + 1


async def test_lock_released_when_the_body_raises(idem: Idem) -> None:
    with pytest.raises(RuntimeError, match="translation failed"):
        async with idem.lock("post:chat:42", bot_id=BOT):
            raise RuntimeError("translation failed")
    async with idem.lock("post:chat:42", bot_id=BOT) as claim:
        assert claim.outcome is Outcome.ACQUIRED


async def test_lock_of_a_crashed_holder_frees_after_ttl(idem: Idem, clock: ManualClock) -> None:
    crashed = await idem.store.claim(idem.keys.lock(BOT, "x"), lease=120.0, retention=120.0)
    with pytest.raises(LockHeldError):
        async with idem.lock("x", bot_id=BOT):
            pass
    clock.advance(121)
    async with idem.lock("x", bot_id=BOT) as claim:
        assert claim.token != crashed.token


async def test_chat_lock_uses_the_chat(idem: Idem) -> None:
    update = load_fixture("techpost_no_title")
    with bind_update(update, bot_id=BOT, idem=idem):
        async with idem.chat_lock() as claim:
            assert claim.record.key == idem.keys.lock(BOT, "chat:5550001001")
            with pytest.raises(LockHeldError):
                async with idem.chat_lock():
                    pass


async def test_chat_lock_falls_back_to_the_user(idem: Idem) -> None:
    update = load_fixture("inline_query")
    with bind_update(update, bot_id=BOT, idem=idem):
        async with idem.chat_lock(name="post") as claim:
            assert claim.record.key == idem.keys.lock(BOT, "post:user:5550003003")
    poll = load_fixture("poll_answer")  # the same user, from another update type
    with bind_update(poll, bot_id=BOT, idem=idem):
        async with idem.chat_lock(name="post") as claim:
            assert claim.record.key.endswith(":l:post:user:5550003003")


async def test_chat_lock_needs_an_update_with_chat_or_user(idem: Idem) -> None:
    with pytest.raises(ConfigurationError):
        idem.chat_lock()
    with bind_update({"update_id": 1, "future_thing": {"x": 1}}, bot_id=BOT, idem=idem):
        with pytest.raises(ConfigurationError):
            idem.chat_lock()


async def test_lock_without_bot_needs_a_bound_update(idem: Idem) -> None:
    with pytest.raises(ConfigurationError):
        async with idem.lock("x"):
            pass
    with bind_update(load_fixture("techpost_command"), bot_id=BOT, idem=idem):
        async with idem.lock("x") as claim:
            assert claim.record.key == idem.keys.lock(BOT, "x")


# ----------------------------------------------------------------- update guard


async def test_admit_runs_each_update_once(idem: Idem) -> None:
    update = load_fixture("techpost_command")
    seen: list[tuple[int, int, Admission | None]] = []

    async def handle() -> str:
        ctx = current_update()
        seen.append((ctx.bot_id, ctx.update["update_id"], ctx.admission))
        assert ctx.idem is idem
        return "handled"

    first = await idem.admit(update, bot_id=BOT)
    assert first.outcome is Admission.RUN and first.webhook_status == 200
    assert await first.run(handle) == "handled"
    again = await idem.admit(update, bot_id=BOT)
    assert again.outcome is Admission.DUPLICATE and again.webhook_status == 200
    with pytest.raises(ConfigurationError):
        await again.run(handle)  # a duplicate is never run
    # the same update_id for another bot is another update
    assert await (await idem.admit(update, bot_id=BOT + 1)).run(handle) == "handled"
    assert seen == [(BOT, 734519001, Admission.RUN), (BOT + 1, 734519001, Admission.RUN)]
    record = await idem.store.get(idem.keys.update(BOT, 734519001))
    assert record is not None and record.status is Status.COMPLETED


async def test_a_failed_run_lets_the_redelivery_run(idem: Idem) -> None:
    update = load_fixture("callback_delete")
    body = Counter(RuntimeError("db down"), "ok")
    with pytest.raises(RuntimeError):
        await (await idem.admit(update, bot_id=BOT)).run(body)
    assert await (await idem.admit(update, bot_id=BOT)).run(body) == "ok"
    assert (await idem.admit(update, bot_id=BOT)).outcome is Admission.DUPLICATE
    assert body.calls == 2


async def test_an_admission_runs_once(idem: Idem) -> None:
    admitted = await idem.admit(load_fixture("callback_delete"), bot_id=BOT)
    body = Counter("ok", "again")
    assert await admitted.run(body) == "ok"
    with pytest.raises(ConfigurationError):
        await admitted.run(body)
    assert body.calls == 1


async def test_idem_from_url(tmp_path: Any, clock: ManualClock) -> None:
    idem = Idem(f"sqlite:///{tmp_path}/bot.db", clock=clock, heartbeat=False)
    try:
        body = Counter(0)
        assert await idem.run(KEY, body) == 0
        assert await idem.run(KEY, body) == 0
        assert body.calls == 1
    finally:
        await idem.close()
    with pytest.raises(ConfigurationError):
        Idem("mysql://nope")
