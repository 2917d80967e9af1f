"""Shared fixtures, built on the project's own pytest plugin (``telegram_idem.testing.plugin``).

The plugin parametrises every test that uses ``idem_store_name`` over the stores of the
ini option ``idem_stores`` (pyproject.toml: all six), and finds each server as a bot
author's suite would: ``--idem-<store>-url`` / ``IDEM_<STORE>_URL`` / ``idem_<store>_url``,
else the ``pytest_idem_server_url`` hook below (tests/services.py says what it finds).
On top of it:

- ``store_url_factory``: the plugin's ``idem_store_url_factory``, a new isolated URL of
  the store under test per call (its own file, table prefix, key prefix or table), all
  cleaned up at teardown;
- ``store_url``: one such URL;
- ``store_factory``: more store objects on ``store_url`` (separate connections), through
  the plugin's ``idem_store_factory``;
- ``store``: the first of them;
- ``clock``: the plugin's ``idem_clock``, given to every store (server stores too), so
  tests move time with ``clock.advance`` and never sleep;
- ``<name>_url_factory`` for each server store, for tests of one store.

A server store whose service is absent skips (or, with ``--idem-require-stores`` /
``IDEM_REQUIRE_STORES=1``, fails). Store conformance runs from
``tests/stores/test_conformance.py`` (``telegram_idem.testing.conformance``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import services
from fixtures_dynamodb import dynamodb_url_factory, start_session_moto  # noqa: F401
from fixtures_local import memory_url_factory, sqlite_url_factory  # noqa: F401
from fixtures_nats import (  # noqa: F401
    jetstream_store,
    jetstream_stream,
    jetstream_streams,
    private_nats,
)
from fixtures_postgres import find_postgres, postgres_url_factory  # noqa: F401
from fixtures_redis import (  # noqa: F401
    find_redis,
    redis_cluster_url_factory,
    redis_url_factory,
    start_private_cluster,
)
from services import (
    INBOX_STORES,
    SHARED_STATE_STORES,
    StoreFactory,
    UrlFactory,
    load_services_script,
    service_missing,
)

from telegram_idem._clock import ManualClock
from telegram_idem.backends._base import Store

STORE_MARKS = {
    "memory": "memory",
    "sqlite": "sqlite",
    "postgres": "postgres",
    "redis": "redis",
    "redis-cluster": "redis",
    "dynamodb": "dynamodb",
}
"""The marker (``-m postgres``) each store's parametrised tests carry."""


def pytest_configure(config: pytest.Config) -> None:
    """Give tests/services.py the session's config (its helpers find servers with it)."""
    services.use_config(config)


@pytest.hookimpl
def pytest_idem_server_url(config: pytest.Config, name: str) -> str | None:
    """The servers of this suite when none is configured (see tests/services.py)."""
    finders: dict[str, Callable[[], str]] = {
        "postgres": find_postgres,
        "redis": find_redis,
        "redis-cluster": lambda: start_private_cluster(config),
        "dynamodb": lambda: start_session_moto(config),
    }
    finder = finders.get(name)
    return finder() if finder is not None else None


def store_of(node: pytest.Item | pytest.Function) -> str | None:
    """The store a collected test runs on, read from its ``idem_store_name`` parameter
    (never from the test id, whose parts other parameters share), or ``None``."""
    callspec = getattr(node, "callspec", None)
    name = callspec.params.get("idem_store_name") if callspec is not None else None
    return name if isinstance(name, str) else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each parametrised test with its store's marker, and deselect combinations a
    test does not apply to (rather than skip them): ``@pytest.mark.inbox`` needs a store
    with an inbox, ``@pytest.mark.shared_state`` needs store objects that share records
    (not memory)."""
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        store = store_of(item)
        if store is not None and (
            (item.get_closest_marker("inbox") and store not in INBOX_STORES)
            or (item.get_closest_marker("shared_state") and store not in SHARED_STATE_STORES)
        ):
            dropped.append(item)
            continue
        if store in STORE_MARKS:
            item.add_marker(STORE_MARKS[store])
        keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture
def clock(idem_clock: ManualClock) -> ManualClock:
    """Time that moves only on ``clock.advance(seconds)`` (the plugin's ``idem_clock``)."""
    return idem_clock


@pytest.fixture
def store_url_factory(idem_store_url_factory: UrlFactory) -> UrlFactory:
    """A new isolated URL of the store under test per call (parametrised by the plugin)."""
    return idem_store_url_factory


@pytest.fixture
def store_name(idem_store_name: str) -> str:
    """The store under test (``"sqlite"``, ``"redis-cluster"``…)."""
    return idem_store_name


@pytest.fixture
def store_url(store_url_factory: UrlFactory) -> str:
    """A fresh, isolated URL of the store under test."""
    return store_url_factory()


@pytest.fixture
def store_factory(
    store_url: str, idem_store_factory: Callable[[str], Awaitable[Store]]
) -> StoreFactory:
    """Makes store objects (separate connections) on one fresh URL, with the shared
    clock; the plugin closes them after the test."""
    return lambda: idem_store_factory(store_url)


@pytest.fixture
async def store(store_factory: StoreFactory) -> Store:
    """A store of each selected kind, on a fresh URL, with the shared clock."""
    return await store_factory()


@pytest.fixture
def private_redis_port() -> Iterator[tuple[int, Callable[[], None], Callable[[], None]]]:
    """A redis-server of this test's own on a free port: (port, kill, start)."""
    if shutil.which("redis-server") is None:
        service_missing("redis-server is not installed: no private server")
    module = load_services_script()
    directory = Path(tempfile.mkdtemp(prefix="idem-worker-outage-"))
    port = module.free_port()
    pids: list[int] = []

    def start() -> None:
        pids.append(module.start_redis_server(directory, port))

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[-1], signal.SIGKILL)

    try:
        start()
    except module.ServiceError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        service_missing(f"private redis-server failed: {exc}")
    yield port, kill, start
    kill()
    shutil.rmtree(directory, ignore_errors=True)
