"""Where the test suite finds its services, and what happens when one is absent.

| variable                        | default                                         |
|---------------------------------|-------------------------------------------------|
| ``IDEM_TEST_POSTGRES_URL``      | ``postgresql://postgres@127.0.0.1:5432/test``   |
| ``IDEM_TEST_REDIS_URL``         | ``redis://127.0.0.1:6379/0``                    |
| ``IDEM_TEST_REDIS_CLUSTER_URL`` | none (``scripts/services.py start`` sets it)    |
| ``IDEM_TEST_DYNAMODB_ENDPOINT`` | none: a moto server is started on loopback      |

An absent service skips its tests with the reason, unless ``IDEM_REQUIRE_SERVICES=1``
(CI sets it), which turns every such skip into a failure.

The shared services are never stopped, flushed or reconfigured by a test (other runs use
them at the same time): a test that needs an outage, a restart or a server setting
starts a private server on a free port with ``scripts/services.py``
(:func:`load_services_script`), as ``tests/fixtures_postgres.py`` (``private_postgres``)
and ``tests/stores/test_redis.py`` (``outage_server``) do.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

from telegram_idem.backends.base import Store

UrlFactory = Callable[[], str]
"""Returns a new, isolated store URL each call."""
StoreFactory = Callable[[], Awaitable[Store]]
"""Makes another store object (its own connection) on one URL."""

SHARED_STATE_STORES = {"sqlite", "postgres", "redis", "redis_cluster", "dynamodb"}
"""Stores whose objects made from one URL share records (all but memory)."""

POSTGRES_URL = os.environ.get("IDEM_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REDIS_CLUSTER_URL = os.environ.get("IDEM_TEST_REDIS_CLUSTER_URL", "")
DYNAMODB_ENDPOINT = os.environ.get("IDEM_TEST_DYNAMODB_ENDPOINT", "")


def service_missing(reason: str) -> NoReturn:
    """Skip (or, under ``IDEM_REQUIRE_SERVICES=1``, fail) because a service is absent."""
    if os.environ.get("IDEM_REQUIRE_SERVICES") == "1":
        pytest.fail(f"required service missing: {reason}", pytrace=False)
    pytest.skip(reason)


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
