"""Shared fixtures: a manual clock, and one ``store`` fixture parametrised over every store.

Every store contributes a ``<name>_url_factory`` fixture: a callable returning a new,
isolated store URL each time it is called (its own file, key prefix, table or table
prefix), all cleaned up at teardown. From it come

- ``store_url_factory``: the factory of the store under test (parametrised over ``STORES``);
- ``store``: one store made from a fresh URL with the shared :class:`ManualClock`;
- ``store_factory``: more store objects on the *same* URL (separate connections).

Server stores skip (or fail under ``IDEM_REQUIRE_SERVICES=1``) when their service is
absent: see ``tests/services.py``. In-process stores take the shared clock, and server
stores are given it too, so tests move time with ``clock.advance`` and never sleep.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from fixtures_dynamodb import dynamodb_url_factory  # noqa: F401
from fixtures_postgres import postgres_url_factory  # noqa: F401
from fixtures_redis import (  # noqa: F401
    load_services_script,
    redis_cluster_url_factory,
    redis_url_factory,
)
from services import SHARED_STATE_STORES, StoreFactory, UrlFactory, service_missing

from telegram_idem.backends import store_from_url
from telegram_idem.backends.base import Store
from telegram_idem.clock import ManualClock

STORES = [
    pytest.param("memory_url_factory", id="memory", marks=pytest.mark.memory),
    pytest.param("sqlite_url_factory", id="sqlite", marks=pytest.mark.sqlite),
    pytest.param("postgres_url_factory", id="postgres", marks=pytest.mark.postgres),
    pytest.param("redis_url_factory", id="redis", marks=pytest.mark.redis),
    pytest.param("redis_cluster_url_factory", id="redis_cluster", marks=pytest.mark.redis),
    pytest.param("dynamodb_url_factory", id="dynamodb", marks=pytest.mark.dynamodb),
]
"""Every store of the conformance suite, as the name of its URL factory fixture."""


INBOX_STORES = {"memory", "sqlite", "postgres", "redis", "redis_cluster"}
"""Stores with a durable inbox (DynamoDB has none)."""

STORE_OF_FACTORY: dict[str, str] = {str(p.values[0]): str(p.id) for p in STORES}
"""The store id (``"redis_cluster"``) of each URL factory fixture name."""


def store_of(node: pytest.Item | pytest.Function) -> str | None:
    """The store a collected test runs on, read from its ``store_url_factory`` parameter
    (never from the test id, whose parts other parameters share), or ``None``."""
    callspec = getattr(node, "callspec", None)
    factory = callspec.params.get("store_url_factory") if callspec is not None else None
    return STORE_OF_FACTORY.get(factory) if isinstance(factory, str) else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect store combinations a test does not apply to (rather than skip them):
    ``@pytest.mark.inbox`` needs a store with an inbox, ``@pytest.mark.shared_state``
    needs store objects that share records (not memory)."""
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        store = store_of(item)
        if store is not None and (
            (item.get_closest_marker("inbox") and store not in INBOX_STORES)
            or (item.get_closest_marker("shared_state") and store not in SHARED_STATE_STORES)
        ):
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture
def clock() -> ManualClock:
    """Time that moves only on ``clock.advance(seconds)``."""
    return ManualClock()


@pytest.fixture
def memory_url_factory() -> UrlFactory:
    """``memory://``: every store made from it is a separate, empty store."""
    return lambda: "memory://"


@pytest.fixture
def sqlite_url_factory(tmp_path: Path) -> UrlFactory:
    """A new SQLite file per call."""
    counter = itertools.count()
    return lambda: f"sqlite:///{tmp_path / f'idem-{next(counter)}.db'}"


@pytest.fixture(params=STORES)
def store_url_factory(request: pytest.FixtureRequest) -> Iterator[UrlFactory]:
    """The URL factory of each store in ``STORES`` in turn."""
    factory: UrlFactory = request.getfixturevalue(request.param)
    yield factory


@pytest.fixture
def store_name(request: pytest.FixtureRequest) -> str:
    """The id of the store under test (``"sqlite"``, ``"redis"``…)."""
    return store_of(request.node) or ""


@pytest.fixture
def store_url(store_url_factory: UrlFactory) -> str:
    """A fresh, isolated URL of the store under test."""
    return store_url_factory()


@pytest.fixture
async def store_factory(store_url: str, clock: ManualClock) -> AsyncIterator[StoreFactory]:
    """Makes store objects (separate connections) on one fresh URL; closes them after."""
    made: list[Store] = []

    async def make() -> Store:
        store = store_from_url(store_url, clock=clock)
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()


@pytest.fixture
async def store(store_factory: StoreFactory) -> Store:
    """A store of each kind in ``STORES``, on a fresh URL, with the shared clock."""
    return await store_factory()


@pytest.fixture
def private_redis_port() -> Iterator[tuple[int, Callable[[], None], Callable[[], None]]]:
    """A redis-server of this test's own on a free port: (port, kill, start)."""
    if shutil.which("redis-server") is None:
        service_missing("redis-server is not installed: no private server")
    services = load_services_script()
    directory = Path(tempfile.mkdtemp(prefix="idem-worker-outage-"))
    port = services.free_port()
    pids: list[int] = []

    def start() -> None:
        pids.append(services.start_redis_server(directory, port))

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[-1], signal.SIGKILL)

    try:
        start()
    except services.ServiceError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        service_missing(f"private redis-server failed: {exc}")
    yield port, kill, start
    kill()
    shutil.rmtree(directory, ignore_errors=True)
