"""The memory store's eviction when full: counted, logged as a summary (issue 8, item 19)."""

from __future__ import annotations

import logging

import pytest

from telegram_idem import ConfigurationError, ManualClock
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.flood import Bucket
from telegram_idem.outbox import AmbiguousPolicy, NewCall

LOGGER = "telegram_idem.store.memory"


async def test_evictions_are_counted_and_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock, max_items=10, eviction_log_interval=60.0)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    for i in range(1000):
        await store.claim(f"idem:7:u:{i}", lease=30, retention=3600)
    assert len(store) == 10
    assert store.evicted_live == 990
    lines = [r for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1  # the first eviction, at once; the rest wait for the interval
    assert "evicted 1 live record(s)" in lines[0].getMessage()

    clock.advance(61)
    for i in range(1000, 1100):
        await store.claim(f"idem:7:u:{i}", lease=30, retention=3600)
    lines = [r for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 2
    assert "evicted 990 live record(s)" in lines[1].getMessage()  # 989 waiting + this one
    assert "(991 in all)" in lines[1].getMessage()
    assert store.evicted_live == 1090


async def test_expired_records_leave_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock, max_items=10)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    for i in range(100):
        await store.claim(f"idem:7:u:{i}", lease=1, retention=1)
        clock.advance(2)
    assert store.evicted_live == 0
    assert [r for r in caplog.records if r.name == LOGGER] == []


def test_a_negative_interval_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="eviction_log_interval"):
        MemoryStore(eviction_log_interval=-1)


# ----------------------------------------------------------------- outbox and flood budget


async def test_the_outbox_deletes_settled_entries_once_their_retention_ends() -> None:
    clock = ManualClock()
    outbox = MemoryStore(clock=clock).outbox()
    for i in range(50):
        await outbox.enqueue(_call(i, retention=10.0))
        taken = await outbox.take(bot_id=7, lease=30)
        assert taken is not None and await outbox.deliver(taken, result=b"true")
    await outbox.enqueue(_call("stays", retention=10.0))
    assert len(outbox) == 51
    clock.advance(11)
    assert await outbox.get("idem:7:o:0") is None
    assert len(outbox) == 1  # the memory is given back, not only hidden


async def test_the_outbox_and_budget_belong_to_one_store_and_its_clock() -> None:
    clock = ManualClock()
    store, other = MemoryStore(clock=clock), MemoryStore(clock=clock)
    assert store.outbox() is store.outbox() and store.flood_budget() is store.flood_budget()
    await store.outbox().enqueue(_call(1))
    assert await other.outbox().get("idem:7:o:1") is None  # each memory store is its own
    entry = await store.outbox().take(bot_id=7, lease=30)
    assert entry is not None and entry.lease_expires_at == clock.now + 30


async def test_the_flood_budget_forgets_keys_a_minute_after_their_tat() -> None:
    clock = ManualClock()
    budget = MemoryStore(clock=clock).flood_budget()
    for i in range(100):
        assert await budget.reserve([Bucket(f"idem:7:f:chat:{i}", 1.0, 1)]) == 0.0
    await budget.pause("idem:7:f:pause", 600)
    assert len(budget) == 101
    clock.advance(62)
    assert await budget.reserve([Bucket("idem:7:f:chat:0", 1.0, 1)]) == 0.0  # a full bucket
    assert len(budget) == 2  # the paused gate is kept: its tat is ahead
    assert await budget.paused_for("idem:7:f:pause") == 600 - 62


def _call(name: object, *, retention: float = 3600.0) -> NewCall:
    return NewCall(
        key=f"idem:7:o:{name}",
        bot_id=7,
        method="sendMessage",
        params=b'{"chat_id":1,"text":"hi"}',
        ordering_key=None,
        collapse_key=None,
        policy=AmbiguousPolicy.HOLD,
        retention=retention,
    )
