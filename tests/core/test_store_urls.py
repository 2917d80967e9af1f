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
        "memory://?max_items=0",
        "memory://?max_item=10",
        "sqlite:///x.db?busy_timeout=soon",
        "sqlite:///x.db?busy_timeout=-1",
        "sqlite:///x.db?busy_timeout=inf",
        "sqlite:///x.db?busy_timout=1",
    ],
)
def test_bad_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError):
        store_from_url(url)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("memory://?max_items=0", "max_items must be an integer ≥ 1"),
        ("memory://?max_item=10", "unknown option(s) ['max_item']"),
        ("sqlite://host/x.db", "a SQLite URL is sqlite:///file.db"),
        ("sqlite:///x.db?busy_timeout=-1", "busy_timeout must be ≥ 0 seconds"),
    ],
)
def test_local_store_url_errors_name_the_problem_and_the_url(url: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        store_from_url(url)
    assert message in str(info.value) and repr(url) in str(info.value)


def test_a_local_store_refuses_another_scheme() -> None:
    with pytest.raises(ConfigurationError, match="memory://"):
        MemoryStore.from_url("sqlite:///x.db")
    with pytest.raises(ConfigurationError, match="sqlite://"):
        SQLiteStore.from_url("memory://")


async def test_sqlite_busy_timeout_zero_is_allowed(tmp_path: Path) -> None:
    store = store_from_url(f"sqlite:///{tmp_path / 'b.db'}?busy_timeout=0")
    try:
        assert (await store.claim("k", lease=1.0, retention=1.0)).outcome is Outcome.ACQUIRED
    finally:
        await store.close()
