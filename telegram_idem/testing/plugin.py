"""The ``telegram_idem`` pytest plugin: fixtures that prove a bot survives duplicates.

Installed with the package (entry point ``pytest11``), so no conftest code is needed.
Async fixtures use pytest-asyncio (``pytest_asyncio.fixture``: strict and auto mode).

| fixture | gives |
|---|---|
| ``idem_nats_url`` | the NATS (JetStream) server URL for the JetStream inbox's tests (see ``--idem-nats-url`` below); skips when none answers |
| ``idem_clock`` | a :class:`~telegram_idem.ManualClock` (seconds since the epoch; moves only on ``advance``) |
| ``idem_store`` | a :class:`~telegram_idem.Store` on the ``idem_clock``, once per selected store (default memory and sqlite; postgres, redis, redis-cluster, dynamodb by option) |
| ``idem_store_name`` / ``idem_store_url`` | the store under test and its URL (a server store's URL is shared: tests keep apart by key prefix) |
| ``idem_store_url_factory`` | ``idem_store_url_factory()`` → a new URL of the store under test with storage of its own (file, table prefix, key prefix or table), removed after the test (:class:`~telegram_idem.testing._stores.IsolatedUrls`) |
| ``idem_store_factory`` | ``await idem_store_factory(url=None)`` → another store object (its own connection) on ``url`` (default ``idem_store_url``) with ``idem_clock``, closed after the test |
| ``idem_key_prefix`` / ``idem_keys`` | this test's unique key prefix and a ``KeyBuilder`` with it |
| ``idem`` | an :class:`~telegram_idem.Idem` on ``idem_store`` with ``idem_keys`` and ``idem_clock``; its ``sleep`` (polls of the ``wait`` policy) advances the clock and yields ≤ 10 ms of real time |
| ``update_factory`` | an :class:`~telegram_idem.testing.UpdateFactory` dating updates by ``idem_clock`` |
| ``fake_bot_api`` | a started :class:`~telegram_idem.testing.FakeBotAPI` (needs aiohttp: ``pip install 'telegram-idem[testing]'``) |
| ``telegram_delivery`` | ``telegram_delivery(url, **options)`` → a :class:`~telegram_idem.testing.TelegramDelivery`, closed after the test |
| ``replay`` | ``replay(target, **options)`` → a :class:`~telegram_idem.testing.Replayer`, closed after the test |

Options (CLI flag / ini option; server URLs also by environment variable, see
:mod:`telegram_idem.testing._stores`):

- ``--idem-stores=memory,sqlite,postgres`` / ``IDEM_STORES`` / ``idem_stores`` (first
  found wins): the stores ``idem_store`` runs on. Default ``memory,sqlite``, the two that
  need no service; name a server store to add it. A server store asked for but with no
  URL and no Docker is skipped with one reason naming the flag, variable and ini option
  to set;
- ``--idem-require-stores`` / ``IDEM_REQUIRE_STORES=1`` / ``idem_require_stores = true``:
  a selected store that cannot run fails its tests instead of skipping them (CI);
- ``--idem-postgres-url``, ``--idem-redis-url``, ``--idem-redis-cluster-url``,
  ``--idem-dynamodb-url`` (and ``IDEM_POSTGRES_URL`` …, ``idem_postgres_url`` …): the
  servers;
- ``idem_testcontainers = false``: never start containers;
- ``--idem-nats-url`` / ``IDEM_NATS_URL`` / ``idem_nats_url``: the NATS server (with
  JetStream) of the ``idem_nats_url`` fixture; default ``nats://127.0.0.1:4222`` when a
  server answers there, else its tests skip (fail when stores are required).

With no URL configured, a ``pytest_idem_server_url(config, name)`` hook in a conftest
(:mod:`telegram_idem.testing.hooks`) may name a server, then a container is tried.
:func:`server_url`, :func:`require_server_url`, :func:`store_missing` and
:func:`isolated_urls` give a project's own fixtures the same answers.

Every test gets its own key prefix; a server store's records under it are deleted when the
test ends. A URL that is configured but does not answer fails the test (you asked for it).
Tests of :mod:`telegram_idem.testing.conformance` marked ``idem_shared_state`` are
deselected on a class whose ``shares_state`` is false.
This module imports no Telegram framework and no aiohttp.
"""

from __future__ import annotations

import asyncio
import os
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from telegram_idem._clock import ManualClock
from telegram_idem._guard import Idem
from telegram_idem._keys import KeyBuilder
from telegram_idem.backends import Store, store_from_url
from telegram_idem.errors import ConfigurationError, StoreError
from telegram_idem.testing import hooks
from telegram_idem.testing._factories import UpdateFactory
from telegram_idem.testing._replay import Replayer
from telegram_idem.testing._stores import (
    ALL_STORES,
    NATS_DEFAULT_URL,
    SERVER_STORES,
    ContainerPool,
    IsolatedUrls,
    missing_message,
    nats_answers,
    prepare_url,
    purge_prefix,
)

__all__ = [
    "IsolatedUrls",
    "configured_url",
    "isolated_urls",
    "nats_url",
    "require_server_url",
    "selected_stores",
    "server_url",
    "store_missing",
    "stores_required",
]

if TYPE_CHECKING:
    from telegram_idem.testing._delivery import TelegramDelivery
    from telegram_idem.testing.bot_api import FakeBotAPI

if TYPE_CHECKING:
    from pytest_asyncio import fixture as _async_fixture
else:
    try:
        from pytest_asyncio import fixture as _async_fixture
    except ImportError:  # pragma: no cover - async fixtures then need another async plugin
        _async_fixture = pytest.fixture

_POOL = pytest.StashKey[ContainerPool]()
_FOUND = pytest.StashKey[dict[str, tuple[str | None, str]]]()
DEFAULT_STORES: tuple[str, ...] = ("memory", "sqlite")
"""The stores ``idem_store`` runs on when none are configured: those that need no service."""
TESTING_EXTRA_HINT = "pip install 'telegram-idem[testing]'"
"""What to install for the plugin's aiohttp-based fixtures."""
_REAL_YIELD = 0.01  # seconds of real time a patched sleep yields at most


# ---------------------------------------------------------------------- options


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Register ``pytest_idem_server_url`` (:mod:`telegram_idem.testing.hooks`)."""
    pluginmanager.add_hookspecs(hooks)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the flags and ini options listed in the module docstring."""
    group = parser.getgroup("telegram-idem", "telegram-idem test stores")
    group.addoption(
        "--idem-stores",
        dest="idem_stores",
        default=None,
        metavar="NAMES",
        help=(
            f"comma-separated stores for the idem_store fixture ({', '.join(ALL_STORES)}; "
            f"default {','.join(DEFAULT_STORES)}; or IDEM_STORES, or ini idem_stores)"
        ),
    )
    parser.addini(
        "idem_stores",
        "comma-separated stores for the idem_store fixture",
        default=",".join(DEFAULT_STORES),
    )
    group.addoption(
        "--idem-require-stores",
        dest="idem_require_stores",
        action="store_true",
        default=None,
        help="fail, not skip, when a selected store cannot run (or IDEM_REQUIRE_STORES=1)",
    )
    parser.addini(
        "idem_require_stores",
        "fail, not skip, when a selected store cannot run",
        type="bool",
        default=False,
    )
    for store in SERVER_STORES.values():
        group.addoption(
            store.flag,
            dest=store.ini,
            default=None,
            metavar="URL",
            help=f"{store.name} store URL for idem_store (or {store.env}, or ini {store.ini})",
        )
        parser.addini(store.ini, f"{store.name} store URL for idem_store", default="")
    group.addoption(
        "--idem-nats-url",
        dest="idem_nats_url",
        default=None,
        metavar="URL",
        help="NATS (JetStream) server for idem_nats_url (or IDEM_NATS_URL, or ini idem_nats_url)",
    )
    parser.addini("idem_nats_url", "NATS (JetStream) server for idem_nats_url", default="")
    parser.addini(
        "idem_testcontainers",
        "start server stores with testcontainers when no URL is given (default true)",
        type="bool",
        default=True,
    )


def pytest_configure(config: pytest.Config) -> None:
    """Create the session's container pool (containers stop at the end of the session)
    and register the ``idem_shared_state`` marker."""
    pool = ContainerPool(enabled=bool(config.getini("idem_testcontainers")))
    config.stash[_POOL] = pool
    config.stash[_FOUND] = {}
    config.add_cleanup(pool.stop_all)
    config.addinivalue_line(
        "markers",
        "idem_shared_state: needs store objects made from one URL to share records "
        "(deselected on a conformance class whose shares_state is false)",
    )


def selected_stores(config: pytest.Config) -> list[str]:
    """The stores ``idem_store`` is parametrised over: ``--idem-stores``, else
    ``IDEM_STORES``, else the ini option ``idem_stores`` (default ``memory,sqlite``).

    Args:
        config: the pytest ``Config`` (``request.config``, ``pytestconfig``).

    Raises:
        pytest.UsageError: an unknown store name.
    """
    raw = (
        config.getoption("idem_stores", None)
        or os.environ.get("IDEM_STORES")
        or config.getini("idem_stores")
    )
    text = ",".join(raw) if isinstance(raw, list) else str(raw)
    names = [n.strip() for n in text.replace(" ", ",").split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_STORES]
    if unknown:
        raise pytest.UsageError(
            f"--idem-stores / idem_stores: unknown store(s) {unknown}; known: {', '.join(ALL_STORES)}"
        )
    return list(dict.fromkeys(names))


def stores_required(config: pytest.Config) -> bool:
    """True when a selected store that cannot run must fail its tests: the flag
    ``--idem-require-stores``, ``IDEM_REQUIRE_STORES=1`` or ini ``idem_require_stores``.

    Args:
        config: the pytest ``Config`` (``request.config``, ``pytestconfig``).
    """
    if config.getoption("idem_require_stores", None):
        return True
    if os.environ.get("IDEM_REQUIRE_STORES") == "1":
        return True
    return bool(config.getini("idem_require_stores"))


def configured_url(config: pytest.Config, name: str) -> str | None:
    """The URL of server store ``name`` from its flag, environment variable or ini option.

    Args:
        config: the pytest ``Config`` (``request.config``, ``pytestconfig``).
        name: the server store's name: ``postgres``, ``redis``, ``redis-cluster`` or
            ``dynamodb``.
    """
    store = SERVER_STORES[name]
    for value in (
        config.getoption(store.ini, None),
        os.environ.get(store.env),
        config.getini(store.ini),
    ):
        if value:
            return str(value)
    return None


def server_url(config: pytest.Config, name: str) -> str | None:
    """The URL of server store ``name``: the configured one (:func:`configured_url`), else
    what a ``pytest_idem_server_url`` hook names, else a container's; ``None`` when there
    is none. Found once per session (a hook or a container is asked at most once).

    Args:
        config: the pytest ``Config`` (``request.config``, ``pytestconfig``).
        name: the server store's name: ``postgres``, ``redis``, ``redis-cluster`` or
            ``dynamodb``.

    Raises:
        KeyError: ``name`` is not a server store.
    """
    return _find(config, name)[0]


def require_server_url(config: pytest.Config, name: str) -> str:
    """:func:`server_url`, or :func:`store_missing` with the reason there is none.

    Args:
        config: the pytest ``Config`` (``request.config``, ``pytestconfig``).
        name: the server store's name: ``postgres``, ``redis``, ``redis-cluster`` or
            ``dynamodb``.
    """
    url, reason = _find(config, name)
    if url is None:
        store_missing(config, reason)
    return url


def store_missing(config: pytest.Config, reason: str) -> NoReturn:
    """Skip the current test because a store or its server cannot run here; fail it
    instead when stores are required (:func:`stores_required`).

    Args:
        config: the pytest ``Config`` (``request.config``, ``pytestconfig``).
        reason: why the store cannot run, shown in the skip or failure.
    """
    if stores_required(config):
        pytest.fail(f"required store missing: {reason}", pytrace=False)
    pytest.skip(reason)


def isolated_urls(config: pytest.Config, name: str, directory: Path) -> IsolatedUrls:
    """An :class:`IsolatedUrls` of store ``name`` (SQLite files under ``directory``), its
    server found as for ``idem_store``; call ``close()`` on it when the test ends.

    Args:
        config: the pytest ``Config`` (``request.config``, ``pytestconfig``).
        name: the store's name (``memory``, ``sqlite``, or a server store).
        directory: where SQLite files go (a test's ``tmp_path``).

    Raises:
        pytest.skip.Exception: a server store with no server (``pytest.fail`` when stores
            are required).
    """
    base = require_server_url(config, name) if name in SERVER_STORES else None
    return IsolatedUrls(name, base, directory)


def _find(config: pytest.Config, name: str) -> tuple[str | None, str]:
    found = config.stash[_FOUND]
    if name not in found:
        found[name] = _search(config, name)
    return found[name]


def _search(config: pytest.Config, name: str) -> tuple[str | None, str]:
    url = configured_url(config, name)
    if url is not None:
        return url, ""
    hook_note = ""
    try:
        url = config.hook.pytest_idem_server_url(config=config, name=name)
    except Exception as exc:
        hook_note = str(exc) or repr(exc)
    if url:
        return str(url), ""
    url, why = config.stash[_POOL].url(name)
    if url is not None:
        return url, ""
    return None, missing_message(name, docker_note=why, hook_note=hook_note)


def pytest_report_header(config: pytest.Config) -> str:
    """One header line: the selected stores and which server URLs are set."""
    parts = []
    for name in selected_stores(config):
        if name in SERVER_STORES:
            state = "url set" if configured_url(config, name) else "no url"
            parts.append(f"{name} ({state})")
        else:
            parts.append(name)
    return "telegram-idem stores: " + ", ".join(parts)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise every test that uses ``idem_store`` (directly or through ``idem``)."""
    if "idem_store_name" not in metafunc.fixturenames:
        return
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0] if marker.args else ""
        listed = names.split(",") if isinstance(names, str) else list(names)
        if "idem_store_name" in (n.strip() for n in listed):
            return  # the test chose its stores itself
    stores = selected_stores(metafunc.config)
    metafunc.parametrize("idem_store_name", stores, ids=stores, indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect tests marked ``idem_shared_state`` on a class whose ``shares_state`` is
    false (a conformance class of a store whose objects keep records of their own)."""
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        cls = getattr(item, "cls", None)
        if item.get_closest_marker("idem_shared_state") and not getattr(cls, "shares_state", True):
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


# ---------------------------------------------------------------------- stores


@pytest.fixture
def idem_store_name(request: pytest.FixtureRequest) -> str:
    """The store under test: ``"memory"``, ``"sqlite"``, ``"postgres"``, ``"redis"``,
    ``"redis-cluster"`` or ``"dynamodb"`` (``"memory"`` when not parametrised)."""
    return str(getattr(request, "param", "memory"))


@pytest.fixture
def idem_key_prefix() -> str:
    """A key prefix no other test uses (``t`` + 16 hex digits)."""
    return f"t{uuid.uuid4().hex[:16]}"


@pytest.fixture
def idem_keys(idem_key_prefix: str) -> KeyBuilder:
    """A ``KeyBuilder`` with this test's prefix: give it to any ``Idem`` you build."""
    return KeyBuilder(prefix=idem_key_prefix)


def nats_url(config: pytest.Config) -> str | None:
    """The NATS server: ``--idem-nats-url``, ``IDEM_NATS_URL`` or ini ``idem_nats_url``
    (used as given: one that does not answer fails its tests), else
    ``nats://127.0.0.1:4222`` when a server greets there, else ``None``.

    Args:
        config: the pytest ``Config`` (``request.config``, ``pytestconfig``).
    """
    for value in (
        config.getoption("idem_nats_url", None),
        os.environ.get("IDEM_NATS_URL"),
        config.getini("idem_nats_url"),
    ):
        if value:
            return str(value)
    return NATS_DEFAULT_URL if nats_answers(NATS_DEFAULT_URL) else None


@pytest.fixture
def idem_nats_url(request: pytest.FixtureRequest) -> str:
    """The NATS server (:func:`nats_url`); the test skips when there is none (fails
    when stores are required: ``IDEM_REQUIRE_STORES=1``)."""
    url = nats_url(request.config)
    if url is None:
        store_missing(
            request.config,
            f"no NATS server: set --idem-nats-url, IDEM_NATS_URL or ini idem_nats_url "
            f"(none answers at {NATS_DEFAULT_URL}); start one with `nats-server -js`",
        )
    return url


@pytest.fixture
def idem_clock() -> ManualClock:
    """A clock that moves only on ``idem_clock.advance(seconds)`` (starts at 1.7e9 s)."""
    return ManualClock()


@pytest.fixture
def idem_store_url(idem_store_name: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of the store under test: ``memory://``, a new SQLite file, or the
    configured (or containerised) server; skips with what to set when there is none."""
    if idem_store_name == "memory":
        return "memory://"
    if idem_store_name == "sqlite":
        return f"sqlite:///{tmp_path / 'idem.db'}"
    return prepare_url(idem_store_name, require_server_url(request.config, idem_store_name))


@pytest.fixture
def idem_store_url_factory(
    idem_store_name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[IsolatedUrls]:
    """``idem_store_url_factory()``: a new URL of the store under test, with storage of its
    own (a SQLite file, a PostgreSQL table prefix with its tables made, a Redis key
    prefix, a DynamoDB table), removed after the test; skips as ``idem_store_url``."""
    urls = isolated_urls(request.config, idem_store_name, tmp_path)
    try:
        yield urls
    finally:
        urls.close()


@_async_fixture
async def idem_store_factory(
    idem_store_url: str, idem_clock: ManualClock
) -> AsyncIterator[Callable[..., Awaitable[Store]]]:
    """``await idem_store_factory(url=None)``: another store object (its own connection)
    on ``url`` (default ``idem_store_url``) with ``idem_clock``; all closed after the test.

    Raises:
        ConfigurationError: ``url`` is not a store URL (when called).
    """
    made: list[Store] = []

    async def make(url: str | None = None) -> Store:
        store = store_from_url(url or idem_store_url, clock=idem_clock)
        made.append(store)
        return store

    try:
        yield make
    finally:
        for store in made:
            await store.close()


@_async_fixture
async def idem_store(
    idem_store_name: str, idem_store_url: str, idem_clock: ManualClock, idem_key_prefix: str
) -> AsyncIterator[Store]:
    """A store of each selected kind, on ``idem_clock``; closed after the test, and a
    server store's records under ``idem_key_prefix`` deleted."""
    try:
        store = store_from_url(idem_store_url, clock=idem_clock)
    except ConfigurationError as exc:
        pytest.fail(f"{idem_store_name} store: {exc}", pytrace=False)
    server = idem_store_name in SERVER_STORES
    if server:
        try:
            await store.get(f"{idem_key_prefix}:probe")
        except StoreError as exc:
            await store.close()
            pytest.fail(
                f"{idem_store_name} store configured but not answering: {exc}", pytrace=False
            )
    try:
        yield store
    finally:
        await store.close()
        if server:
            try:
                await purge_prefix(idem_store_name, idem_store_url, idem_key_prefix)
            except Exception as exc:
                warnings.warn(
                    f"could not delete {idem_store_name} records under {idem_key_prefix}: "
                    f"{exc!r} (they expire with their retention)",
                    stacklevel=1,
                )


@pytest.fixture
def idem(idem_store: Store, idem_keys: KeyBuilder, idem_clock: ManualClock) -> Idem:
    """An :class:`Idem` on ``idem_store`` with this test's keys and ``idem_clock``.

    Its ``sleep`` (between polls of the ``wait`` policy) advances ``idem_clock`` by the
    poll delay after yielding at most 10 ms of real time: a waiter behind a crashed
    holder takes over once the lease has passed on the clock, without real waiting.
    """

    async def sleep(seconds: float) -> None:
        await asyncio.sleep(min(max(seconds, 0.0), _REAL_YIELD))
        idem_clock.advance(max(seconds, 0.0))

    return Idem(idem_store, keys=idem_keys, clock=idem_clock, sleep=sleep)


# ---------------------------------------------------------------------- Telegram side


def _require_aiohttp(fixture: str) -> None:
    """Fail the test with the install hint when aiohttp is missing."""
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        missing = True
    else:
        missing = False
    if missing:  # failed outside the except block: no chained traceback in the report
        pytest.fail(
            f"the {fixture} fixture needs aiohttp, which is not installed; "
            f"install the testing extra: {TESTING_EXTRA_HINT}",
            pytrace=False,
        )


@pytest.fixture
def update_factory(idem_clock: ManualClock) -> UpdateFactory:
    """An :class:`UpdateFactory` (default bot, user and chat; dates from ``idem_clock``)."""
    return UpdateFactory(clock=idem_clock)


@_async_fixture
async def fake_bot_api() -> AsyncIterator[FakeBotAPI]:
    """A started :class:`FakeBotAPI` on loopback (``.url``, ``.ptb_base_url``).

    Raises:
        pytest.fail.Exception: aiohttp is not installed (the message says
            ``pip install 'telegram-idem[testing]'``).
    """
    _require_aiohttp("fake_bot_api")
    from telegram_idem.testing.bot_api import FakeBotAPI

    async with FakeBotAPI() as api:
        yield api


@_async_fixture
async def telegram_delivery() -> AsyncIterator[Callable[..., TelegramDelivery]]:
    """``telegram_delivery(url, **options)``: a :class:`TelegramDelivery` (options as its
    constructor), closed after the test. Needs aiohttp, as ``fake_bot_api``."""
    _require_aiohttp("telegram_delivery")
    from telegram_idem.testing._delivery import TelegramDelivery

    made: list[TelegramDelivery] = []

    def make(url: str, **options: Any) -> TelegramDelivery:
        delivery = TelegramDelivery(url, **options)
        made.append(delivery)
        return delivery

    yield make
    for delivery in made:
        await delivery.close()


@_async_fixture
async def replay() -> AsyncIterator[Callable[..., Replayer]]:
    """``replay(target, **options)``: a :class:`Replayer` (options as its constructor),
    closed after the test."""
    made: list[Replayer] = []

    def make(target: object, **options: Any) -> Replayer:
        replayer = Replayer(target, **options)
        made.append(replayer)
        return replayer

    yield make
    for replayer in made:
        await replayer.close()
