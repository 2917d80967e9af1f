"""Shared fixtures: a manual clock and one ``store`` fixture parametrised over every store.

Every conformance test takes ``store`` and runs once per store (the style of the ``limits``
library): each store is a fixture named ``<name>_store`` and ``STORES`` lists them as
``pytest.param`` entries. To add a store (Postgres, Redis, DynamoDB), write its
``<name>_store`` fixture (skipping when its server is unreachable) and append
``pytest.param("<name>_store", id="<name>", marks=pytest.mark.<name>)`` to ``STORES``.

In-process stores take the shared :class:`ManualClock`, so tests move time with
``clock.advance`` and never sleep.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from telegram_idem.backends.base import Store
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.backends.sqlite import SQLiteStore
from telegram_idem.clock import ManualClock

STORES = [
    pytest.param("memory_store", id="memory"),
    pytest.param("sqlite_store", id="sqlite"),
]


@pytest.fixture
def clock() -> ManualClock:
    """Time that moves only on ``clock.advance(seconds)``."""
    return ManualClock()


@pytest.fixture
async def memory_store(clock: ManualClock) -> AsyncIterator[MemoryStore]:
    store = MemoryStore(clock=clock)
    yield store
    await store.close()


@pytest.fixture
async def sqlite_store(clock: ManualClock, tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "idem.db", clock=clock)
    yield store
    await store.close()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Store:
    """Each store in ``STORES`` in turn, built on the shared ``clock``."""
    result: Store = request.getfixturevalue(request.param)
    return result
