"""InboxWorker: per-chat order, retries with backoff, dead letters, shutdown, takeover."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiogram import Bot, Dispatcher
from aiogram.types import Message

from telegram_idem import (
    ChatParkedError,
    Idem,
    ManualClock,
    PermanentUpdateError,
    SendFailedError,
    StoreError,
    UnknownOutcomeError,
)
from telegram_idem.adapters.aiogram import inbox_dispatch
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.backends.redis import RedisStore
from telegram_idem.backends.sqlite import SQLiteStore
from telegram_idem.inbox._base import Inbox, InboxEntry, NewEntry
from telegram_idem.inbox._entries import Ordering, new_entry
from telegram_idem.inbox._worker import InboxWorker
from telegram_idem.testing._factories import UpdateFactory

RETENTION = 3600.0


def entry(update_id: int, chat: str) -> NewEntry:
    return NewEntry(
        f"idem:7:u:{update_id}", chat, json.dumps({"update_id": update_id, "chat": chat}).encode()
    )


@pytest.fixture
async def inbox(tmp_path: Path) -> Inbox:
    return SQLiteStore(tmp_path / "inbox.db").inbox()


async def test_each_chat_in_order_with_one_in_flight_while_chats_run_in_parallel(
    inbox: Inbox,
) -> None:
    seen: dict[str, list[int]] = defaultdict(list)
    busy: dict[str, int] = defaultdict(int)
    max_busy: dict[str, int] = defaultdict(int)
    overlap = {"chats_at_once": 0, "now": 0}

    async def dispatch(update: dict[str, Any]) -> None:
        chat = update["chat"]
        busy[chat] += 1
        overlap["now"] += 1
        max_busy[chat] = max(max_busy[chat], busy[chat])
        overlap["chats_at_once"] = max(overlap["chats_at_once"], overlap["now"])
        await asyncio.sleep(0.005)
        seen[chat].append(update["update_id"])
        busy[chat] -= 1
        overlap["now"] -= 1

    for uid in range(30):
        await inbox.admit(entry(uid, f"chat:{uid % 3}"), retention=RETENTION)
    worker = InboxWorker(inbox, dispatch, concurrency=6, poll_interval=0.01)
    worker.start()
    await worker.drain(limit=30)
    await worker.stop()
    for chat, ids in seen.items():
        assert ids == sorted(ids), chat
        assert max_busy[chat] == 1
    assert sum(len(v) for v in seen.values()) == 30
    assert overlap["chats_at_once"] > 1


async def test_failures_retry_with_backoff_then_dead_letter(inbox: Inbox) -> None:
    calls: list[int] = []

    async def dispatch(update: dict[str, Any]) -> None:
        calls.append(update["update_id"])
        raise RuntimeError("handler bug")

    await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
    worker = InboxWorker(inbox, dispatch, max_attempts=3, backoff_base=0.01, poll_interval=0.01)
    assert [worker.backoff(n) for n in (1, 2, 3)] == [0.01, 0.02, 0.04]
    worker.start()
    async with asyncio.timeout(10):
        while not await inbox.dead_letters():
            await asyncio.sleep(0.01)
    await worker.stop()
    assert calls == [1, 1, 1]
    [dead] = await inbox.dead_letters()
    assert dead.attempts == 3 and dead.last_error == "RuntimeError: handler bug"


async def test_a_recovered_failure_is_processed_once(inbox: Inbox) -> None:
    calls: list[int] = []

    async def dispatch(update: dict[str, Any]) -> None:
        calls.append(update["update_id"])
        if len(calls) == 1:
            raise TimeoutError("LLM timed out")

    await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
    worker = InboxWorker(inbox, dispatch, backoff_base=0.01, poll_interval=0.01)
    worker.start()
    await worker.drain(limit=10)
    await worker.stop()
    assert calls == [1, 1]
    assert await inbox.depth() == 0 and await inbox.dead_letters() == []


async def test_graceful_stop_returns_unfinished_entries(inbox: Inbox) -> None:
    started = asyncio.Event()

    async def dispatch(update: dict[str, Any]) -> None:
        started.set()
        await asyncio.Event().wait()  # never finishes

    await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
    worker = InboxWorker(inbox, dispatch, poll_interval=0.01)
    worker.start()
    await started.wait()
    await worker.stop(grace=0.05)
    assert await inbox.depth() == 1
    again = await inbox.take(lease=30)
    assert again is not None and again.last_error == "worker shut down"


async def test_an_entry_left_by_a_dead_worker_is_processed_by_another() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    inbox = store.inbox()
    await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
    orphan = await inbox.take(lease=30)  # this worker dies without acking
    assert orphan is not None
    done: list[int] = []

    async def dispatch(update: dict[str, Any]) -> None:
        done.append(update["update_id"])

    heir = InboxWorker(inbox, dispatch, lease=30)
    assert await heir.run_once() is False
    clock.advance(31)
    assert await heir.run_once() is True
    assert done == [1]
    assert await inbox.depth() == 0


async def test_an_entry_taken_while_the_worker_stops_goes_back_at_once() -> None:
    store = MemoryStore()
    inner = store.inbox()
    started, release = asyncio.Event(), asyncio.Event()

    class SlowTake(type(inner)):  # type: ignore[misc]
        async def take(self, *, lease: float) -> Any:
            started.set()
            await release.wait()  # the store commits the take after the worker was cancelled
            return await inner.take(lease=lease)

    slow = SlowTake(store)
    slow._entries = inner._entries
    await inner.admit(entry(1, "chat:a"), retention=RETENTION)

    async def dispatch(update: dict[str, Any]) -> None:
        raise AssertionError("must not run during shutdown")

    worker = InboxWorker(slow, dispatch, concurrency=1, poll_interval=0.01)
    worker.start()
    await started.wait()
    stopping = asyncio.create_task(worker.stop(grace=0.1))
    await asyncio.sleep(0.01)
    release.set()
    await stopping
    back = await inner.take(lease=30)
    assert back is not None and back.last_error == "worker shut down"


# ------------------------------------------------------- hung, blocking and bad handlers


async def test_a_hung_handler_times_out_into_a_dead_letter_and_frees_its_chat(
    inbox: Inbox,
) -> None:
    runs: list[int] = []

    async def dispatch(update: dict[str, Any]) -> None:
        runs.append(update["update_id"])
        if update["update_id"] == 1:
            await asyncio.Event().wait()  # awaits forever; the heartbeat would keep it

    await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
    await inbox.admit(entry(2, "chat:a"), retention=RETENTION)
    worker = InboxWorker(
        inbox,
        dispatch,
        lease=0.3,
        handler_timeout=0.2,
        max_attempts=2,
        backoff_base=0.01,
        poll_interval=0.01,
    )
    worker.start()
    try:
        async with asyncio.timeout(10):
            while 2 not in runs:
                await asyncio.sleep(0.01)
    finally:
        await worker.stop()
    assert runs == [1, 1, 2]
    [dead] = await inbox.dead_letters()
    assert dead.id == "idem:7:u:1" and dead.attempts == 2
    assert dead.last_error is not None and dead.last_error.startswith("HandlerTimeout")


def test_handler_timeout_must_be_positive(inbox: Inbox) -> None:
    async def dispatch(update: dict[str, Any]) -> None:
        return None

    with pytest.raises(ValueError, match="handler_timeout"):
        InboxWorker(inbox, dispatch, handler_timeout=0)


def _blocking_worker(path: Path, runs: list[int], stop: threading.Event) -> None:
    """One worker process in miniature: its own event loop and store on the same file."""

    async def dispatch(update: dict[str, Any]) -> None:
        runs.append(update["update_id"])
        time.sleep(0.6)  # noqa: ASYNC251 - blocks this worker's event loop for two leases

    async def main() -> None:
        store = SQLiteStore(path)
        worker = InboxWorker(store.inbox(), dispatch, lease=0.3, max_attempts=3, poll_interval=0.02)
        worker.start()
        while not stop.is_set():
            await asyncio.sleep(0.02)
        await worker.stop(grace=2)
        await store.close()

    asyncio.run(main())


async def test_a_handler_blocking_the_loop_past_its_lease_is_buried_after_the_cap(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "inbox.db"
    store = SQLiteStore(path)
    inbox = store.inbox()
    await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
    runs: list[int] = []
    stop = threading.Event()
    caplog.set_level(logging.ERROR, logger="telegram_idem.worker")
    threads = [threading.Thread(target=_blocking_worker, args=(path, runs, stop)) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        async with asyncio.timeout(15):
            while not await inbox.dead_letters():
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            await asyncio.to_thread(t.join)
    [dead] = await inbox.dead_letters()
    assert dead.last_error is not None and "lease kept running out" in dead.last_error
    assert 2 <= len(runs) <= 3  # each take past the lease ran it once; the 4th buried it
    assert await inbox.depth() == 0
    assert any("heartbeat of entry idem:7:u:1 could not run" in r.message for r in caplog.records)
    await store.close()


async def test_the_heartbeat_keeps_a_long_run_from_a_second_worker(tmp_path: Path) -> None:
    path = tmp_path / "inbox.db"
    stores = [SQLiteStore(path), SQLiteStore(path)]
    await stores[0].inbox().admit(entry(1, "chat:a"), retention=RETENTION)
    runs: list[int] = []

    async def dispatch(update: dict[str, Any]) -> None:
        runs.append(update["update_id"])
        await asyncio.sleep(2.5)  # 2.5 leases long; awaiting lets the heartbeat run

    # A lease long enough that a loaded machine still beats in time (every lease / 3).
    workers = [InboxWorker(s.inbox(), dispatch, lease=1.0, poll_interval=0.02) for s in stores]
    for w in workers:
        w.start()
    try:
        async with asyncio.timeout(10):
            while await stores[0].inbox().depth():
                await asyncio.sleep(0.02)
    finally:
        for w in workers:
            await w.stop()
        for s in stores:
            await s.close()
    assert runs == [1]


async def test_a_permanent_error_is_a_dead_letter_at_once(inbox: Inbox) -> None:
    calls: list[int] = []

    async def dispatch(update: dict[str, Any]) -> None:
        calls.append(update["update_id"])
        raise PermanentUpdateError("cannot parse")

    await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
    worker = InboxWorker(inbox, dispatch, max_attempts=5, backoff_base=5, poll_interval=0.01)
    assert await worker.run_once() is True
    assert calls == [1]
    [dead] = await inbox.dead_letters()
    assert dead.attempts == 1 and dead.last_error == "PermanentUpdateError: cannot parse"


@pytest.mark.parametrize(
    "error",
    [
        UnknownOutcomeError("sendMessage idem:7:o:x: the outcome is unknown", key="idem:7:o:x"),
        SendFailedError("sendMessage: dead: 400: chat not found", key="idem:7:o:y"),
        ChatParkedError("sendMessage: parked: 403: bot was blocked", key="idem:7:o:z"),
    ],
    ids=["unknown", "dead", "parked"],
)
async def test_a_handler_whose_outbox_call_is_unsettled_is_a_dead_letter_at_once(
    inbox: Inbox, error: Exception
) -> None:
    """Running the update again would replay the same unknown or refused call: the entry
    is dead-lettered at its first attempt, for the operator to settle the call and
    redrive the update, not retried until max_attempts."""
    calls: list[int] = []

    async def dispatch(update: dict[str, Any]) -> None:
        calls.append(update["update_id"])
        raise error

    await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
    worker = InboxWorker(inbox, dispatch, max_attempts=5, backoff_base=5, poll_interval=0.01)
    assert await worker.run_once() is True
    assert calls == [1]
    [dead] = await inbox.dead_letters()
    assert dead.attempts == 1 and type(error).__name__ in (dead.last_error or "")


async def test_an_update_aiogram_cannot_parse_is_a_dead_letter_without_blocking_its_chat(
    inbox: Inbox,
) -> None:
    bot = Bot("7000000001:AAworker")
    dp = Dispatcher()
    seen: list[str] = []

    @dp.message()
    async def on_message(message: Message) -> None:
        seen.append(message.text or "")

    chat = {"id": 42, "type": "private"}
    bad = {"update_id": 1, "message": {"message_id": 1, "text": "no chat, no date"}}
    good = {"update_id": 2, "message": {"message_id": 2, "date": 1, "chat": chat, "text": "hi"}}
    for update in (bad, good):
        await inbox.admit(
            NewEntry(f"idem:7:u:{update['update_id']}", "chat:42", json.dumps(update).encode()),
            retention=RETENTION,
        )
    worker = InboxWorker(inbox, inbox_dispatch(dp, bot), backoff_base=5, poll_interval=0.01)
    try:
        assert await worker.run_once() and await worker.run_once()
    finally:
        await bot.session.close()
    assert seen == ["hi"]  # the next message of the chat ran at once, no 5 s backoff
    [dead] = await inbox.dead_letters()
    assert dead.id == "idem:7:u:1" and dead.attempts == 1
    assert dead.last_error is not None and "does not parse" in dead.last_error


# ------------------------------------------------------------------- ordering lanes


async def _first_runs_while_second_is_busy(inbox: Inbox, long: NewEntry, quick: NewEntry) -> bool:
    """Admit ``long`` then ``quick``; ``long`` waits (≤ 3 s) for ``quick`` to be done.
    True if ``quick`` was processed while ``long`` was still running."""
    quick_done = asyncio.Event()
    state = {"long_running": False, "quick_during_long": False}

    async def dispatch(update: dict[str, Any]) -> None:
        if update["update_id"] == 1:
            state["long_running"] = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(quick_done.wait(), 3.0)
            state["long_running"] = False
        else:
            state["quick_during_long"] = state["long_running"]
            quick_done.set()

    await inbox.admit(long, retention=RETENTION)
    await inbox.admit(quick, retention=RETENTION)
    worker = InboxWorker(inbox, dispatch, concurrency=2, poll_interval=0.01)
    worker.start()
    try:
        await worker.drain(limit=10)
    finally:
        await worker.stop()
    return state["quick_during_long"]


def _admitted(update: dict[str, Any]) -> NewEntry:
    return new_entry(Idem("memory://"), update, bot_id=7)


async def test_a_button_tap_is_processed_during_a_long_job_of_its_chat(inbox: Inbox) -> None:
    updates = UpdateFactory()
    job = updates.command("/techpost", "a long pipeline")
    tap = updates.callback_query("status", from_message=job["message"])
    job["update_id"], tap["update_id"] = 1, 2
    assert await _first_runs_while_second_is_busy(inbox, _admitted(job), _admitted(tap))


async def test_without_the_callback_lane_a_tap_waits_for_the_job(inbox: Inbox) -> None:
    updates = UpdateFactory()
    job = updates.command("/techpost", "a long pipeline")
    tap = updates.callback_query("status", from_message=job["message"])
    job["update_id"], tap["update_id"] = 1, 2
    idem = Idem("memory://")
    same_lane = Ordering(callback_lane=False)
    long = new_entry(idem, job, bot_id=7, ordering=same_lane)
    quick = new_entry(idem, tap, bot_id=7, ordering=same_lane)
    assert not await _first_runs_while_second_is_busy(inbox, long, quick)


async def test_forum_topics_do_not_wait_for_each_other(inbox: Inbox) -> None:
    forum = {"id": -1001, "type": "supergroup", "title": "f", "is_forum": True}
    user = {"id": 5, "is_bot": False, "first_name": "u"}

    def topic_message(update_id: int, topic: int) -> dict[str, Any]:
        return {
            "update_id": update_id,
            "message": {
                "message_id": update_id,
                "date": 1,
                "chat": forum,
                "from": user,
                "message_thread_id": topic,
                "is_topic_message": True,
                "text": "/x",
            },
        }

    assert await _first_runs_while_second_is_busy(
        inbox, _admitted(topic_message(1, 10)), _admitted(topic_message(2, 20))
    )


# ------------------------------------------------------------------ store outage


async def test_a_store_outage_backs_off_and_logs_once_then_once_on_recovery(
    private_redis_port: tuple[int, Callable[[], None], Callable[[], None]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    port, kill, start = private_redis_port
    store = RedisStore(f"redis://127.0.0.1:{port}/0?socket_timeout=1")
    inbox = store.inbox()
    takes = {"n": 0}
    real_take = inbox.take

    async def counted_take(*, lease: float) -> InboxEntry | None:
        takes["n"] += 1
        return await real_take(lease=lease)

    inbox.take = counted_take  # type: ignore[method-assign]
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        await asyncio.sleep(seconds)

    done: list[int] = []

    async def dispatch(update: dict[str, Any]) -> None:
        done.append(update["update_id"])

    worker = InboxWorker(
        inbox,
        dispatch,
        concurrency=2,
        poll_interval=0.02,
        outage_backoff_max=0.4,
        sleep=sleep,
    )
    caplog.set_level(logging.WARNING, logger="telegram_idem.worker")
    worker.start()
    try:
        await asyncio.sleep(0.1)
        kill()
        async with asyncio.timeout(5):
            while worker.inbox_down_since is None:
                await asyncio.sleep(0.01)
        before = takes["n"]
        await asyncio.sleep(2.0)
        during = takes["n"] - before
        start()
        async with asyncio.timeout(10):
            while worker.inbox_down_since is not None:
                await asyncio.sleep(0.02)
        await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
        worker.notify()
        async with asyncio.timeout(5):
            while not done:
                await asyncio.sleep(0.02)
    finally:
        await worker.stop()
        await store.close()
    # Backoff: each task waits 0.02, 0.04, … capped at 0.4 s, so 2 s of outage is a few
    # takes per task, not one per poll_interval (≈ 200) nor a busy loop.
    assert during <= 20, during
    assert max(waits) == 0.4 and waits == sorted(waits)
    lines = [r for r in caplog.records if r.name == "telegram_idem.worker"]
    down = [r for r in lines if "inbox unavailable since" in r.getMessage()]
    still = [r for r in lines if "still unavailable" in r.getMessage()]
    up = [r for r in lines if "inbox available again" in r.getMessage()]
    assert (len(down), len(still), len(up)) == (1, 0, 1)
    assert all(r.exc_info is None for r in lines)  # no traceback per poll
    assert done == [1]


async def test_notify_ends_the_outage_backoff_once_an_update_is_admitted(
    private_redis_port: tuple[int, Callable[[], None], Callable[[], None]],
) -> None:
    """A worker backing off from an inbox outage takes a newly admitted update when the
    ingress notifies it, instead of sleeping out the rest of a long backoff."""
    port, kill, start = private_redis_port
    store = RedisStore(f"redis://127.0.0.1:{port}/0?socket_timeout=0.5")
    done: list[int] = []

    async def dispatch(update: dict[str, Any]) -> None:
        done.append(update["update_id"])

    worker = InboxWorker(
        store.inbox(), dispatch, concurrency=1, poll_interval=60.0, outage_backoff_max=60.0
    )
    kill()
    worker.start()
    try:
        async with asyncio.timeout(10):
            while worker.inbox_down_since is None:
                await asyncio.sleep(0.01)
        await asyncio.sleep(1.5)  # a few failed polls: the backoff has grown past seconds
        start()
        async with asyncio.timeout(10):
            while True:  # the ingress admits once the store answers again
                with contextlib.suppress(StoreError):
                    await store.inbox().admit(entry(1, "chat:a"), retention=RETENTION)
                    break
                await asyncio.sleep(0.05)
        worker.notify()
        async with asyncio.timeout(5):  # far less than the 60 s backoff cap
            while not done:
                await asyncio.sleep(0.02)
    finally:
        await worker.stop()
        await store.close()
    assert done == [1]


class _AdmitDuringEmptyTake(Inbox):
    """Delegates to ``inner``; the first take that finds nothing admits an entry and
    calls ``notify`` before it returns: an ingress admitting while the worker looks."""

    def __init__(self, inner: Inbox) -> None:
        self.inner = inner
        self.worker: InboxWorker | None = None
        self.fired = False

    async def take(self, *, lease: float) -> Any:
        got = await self.inner.take(lease=lease)
        if got is None and not self.fired and self.worker is not None:
            self.fired = True
            await self.inner.admit(entry(1, "chat:a"), retention=RETENTION)
            self.worker.notify()
        return got

    def __getattribute__(self, name: str) -> Any:
        if name in {
            "admit",
            "admit_many",
            "ack",
            "retry",
            "bury",
            "extend",
            "dead_letters",
            "redrive",
            "depth",
            "get",
            "entries",
            "drop",
            "stats",
            "backlog",
        }:
            return getattr(object.__getattribute__(self, "inner"), name)
        return object.__getattribute__(self, name)

    admit = admit_many = ack = retry = bury = extend = None  # type: ignore[assignment]
    dead_letters = redrive = depth = None  # type: ignore[assignment]
    get = entries = drop = stats = backlog = None  # type: ignore[assignment]


async def test_a_notify_during_a_take_that_found_nothing_is_not_lost(tmp_path: Path) -> None:
    wrapped = _AdmitDuringEmptyTake(SQLiteStore(tmp_path / "inbox.db").inbox())
    seen: list[int] = []

    async def dispatch(update: dict[str, Any]) -> None:
        seen.append(update["update_id"])

    # A poll interval far longer than the test: only the notify can wake the worker.
    worker = InboxWorker(wrapped, dispatch, concurrency=1, poll_interval=3600.0)
    wrapped.worker = worker
    async with worker:
        async with asyncio.timeout(10):
            while not seen:
                await asyncio.sleep(0.01)
    assert wrapped.fired and seen == [1]
