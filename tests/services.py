"""Where the test suite finds its services, and what happens when one is absent.

One scheme, the plugin's (:mod:`telegram_idem.testing._stores`): a server's URL comes from
``--idem-<store>-url``, ``IDEM_<STORE>_URL`` or the ini option ``idem_<store>_url``, for
``postgres``, ``redis``, ``redis-cluster`` and ``dynamodb``. With none set, the
``pytest_idem_server_url`` hook of ``tests/conftest.py`` finds one:

| store           | found without configuration                                        |
|-----------------|--------------------------------------------------------------------|
| ``postgres``    | ``postgresql://postgres@127.0.0.1:5432/test``, if it answers       |
| ``redis``       | ``redis://127.0.0.1:6379/0``, if it answers                        |
| ``redis-cluster`` | a private 3-master cluster for the session (``scripts/services.py``) |
| ``dynamodb``    | a moto server in this process (``tests/fixtures_dynamodb.py``)      |

An absent service skips its tests with the reason, unless ``--idem-require-stores`` or
``IDEM_REQUIRE_STORES=1`` (CI sets it), which turns every such skip into a failure.

The shared services are never stopped, flushed or reconfigured by a test (other runs use
them at the same time): a test that needs an outage, a restart or a server setting
starts a private server on a free port with ``scripts/services.py``
(:func:`load_services_script`), as ``tests/fixtures_postgres.py`` (``private_postgres``)
and ``tests/stores/test_redis.py`` (``outage_server``) do.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import NoReturn
from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest

from telegram_idem.backends._base import Store
from telegram_idem.testing.plugin import require_server_url, store_missing

UrlFactory = Callable[[], str]
"""Returns a new, isolated store URL each call."""
StoreFactory = Callable[[], Awaitable[Store]]
"""Makes another store object (its own connection) on one URL."""

SHARED_STATE_STORES = {"sqlite", "postgres", "redis", "redis-cluster", "dynamodb"}
"""Stores whose objects made from one URL share records (all but memory)."""

INBOX_STORES = {"memory", "sqlite", "postgres", "redis", "redis-cluster"}
"""Stores with a durable inbox (DynamoDB has none)."""

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
"""The PostgreSQL the suite uses when none is configured (if it answers)."""
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
"""The Redis the suite uses when none is configured (if it answers)."""


class ServiceUnavailable(Exception):
    """A service looked for and not found (the message says why): raised by the
    ``pytest_idem_server_url`` hook, whose reason the plugin shows in the skip."""


_session: list[pytest.Config] = []


def use_config(config: pytest.Config) -> None:
    """Remember the session's config (``tests/conftest.py`` calls this at configure)."""
    _session[:] = [config]


def session_config() -> pytest.Config:
    """The session's config.

    Raises:
        RuntimeError: called before ``tests/conftest.py`` was configured.
    """
    if not _session:
        raise RuntimeError("tests/services.py: no session config yet")
    return _session[0]


def service_missing(reason: str) -> NoReturn:
    """Skip (or, with stores required, fail) because a service is absent."""
    store_missing(session_config(), reason)


def server_url(name: str) -> str:
    """The URL of server store ``name`` (see the module docstring); skips (or fails) the
    test when there is none."""
    return require_server_url(session_config(), name)


def postgres_dsn() -> str:
    """The PostgreSQL server's URL without store options: a DSN for asyncpg itself."""
    from telegram_idem.backends.postgres import STORE_OPTIONS

    parts = urlsplit(server_url("postgres"))
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in STORE_OPTIONS]
    return parts._replace(query=urlencode(query)).geturl()


def redis_url() -> str:
    """The single Redis server's URL (store options such as ``key_prefix`` removed)."""
    parts = urlsplit(server_url("redis"))
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "key_prefix"]
    return parts._replace(query=urlencode(query)).geturl()


_SCRIPTS_SERVICES = Path(__file__).resolve().parent.parent / "scripts" / "services.py"


def load_services_script() -> ModuleType:
    """``scripts/services.py`` as a module (its name would clash with this one)."""
    name = "idem_scripts_services"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _SCRIPTS_SERVICES)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
