"""Stores made from URLs (docs/design/record.md#the-store-contract)."""

from __future__ import annotations

from pathlib import Path

import pytest

from telegram_idem import ConfigurationError, ManualClock, Outcome, store_from_url
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.backends.sqlite import SQLiteStore


async def test_memory_url(clock: ManualClock) -> None:
    store = store_from_url("memory://?max_items=10", clock=clock)
    assert isinstance(store, MemoryStore)
    c = await store.claim("k", lease=1.0, retention=1.0)
    assert c.outcome is Outcome.ACQUIRED
    clock.advance(2)
    assert await store.get("k") is None  # the store judges time by the given clock


async def test_sqlite_url_absolute_path(tmp_path: Path, clock: ManualClock) -> None:
    path = tmp_path / "sub" / "bot.db"
    store = store_from_url(f"sqlite:///{path}", clock=clock)
    try:
        assert isinstance(store, SQLiteStore)
        assert Path(store.path) == path
        await store.claim("k", lease=1.0, retention=1.0)
        assert path.exists()
    finally:
        await store.close()


@pytest.mark.parametrize(
    "url",
    [
        "mysql://localhost/db",
        "",
        "sqlite://",
        "sqlite://host/file.db",
        "memory://?max_items=lots",
        "sqlite:///x.db?busy_timeout=soon",
    ],
)
def test_bad_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError):
        store_from_url(url)
