"""InboxWorker: per-chat order, retries with backoff, dead letters, shutdown, takeover."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from telegram_idem import ManualClock
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.backends.sqlite import SQLiteStore
from telegram_idem.inbox.base import Inbox, NewEntry
from telegram_idem.inbox.worker import InboxWorker

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
    slow._entries = inner._entries  # type: ignore[attr-defined]
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
