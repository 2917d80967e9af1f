"""The memory store's eviction when full: counted, logged as a summary (issue 8, item 19)."""

from __future__ import annotations

import logging

import pytest

from telegram_idem import ConfigurationError, ManualClock
from telegram_idem.backends.memory import MemoryStore

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
