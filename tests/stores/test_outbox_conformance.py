"""The outbound conformance suites (``OutboxConformance``, ``FloodBudgetConformance`` of
``telegram_idem.testing.conformance``) on every store of this package that has an outbox.

One class per store, each given the URL factory of tests/conftest.py or
tests/stores/test_conformance.py. A store that has no outbox and flood budget yet skips
(:func:`needs_outbox`); select one store with ``-k Postgres`` or ``-m postgres``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from services import UrlFactory

from telegram_idem.backends import Store, has_flood_budget, has_outbox
from telegram_idem.testing.conformance import FloodBudgetConformance, OutboxConformance
from telegram_idem.testing.plugin import isolated_urls


def needs_outbox(store: Store) -> None:
    """Skip the test when ``store`` has no outbox or no flood budget (yet)."""
    if not (has_outbox(store) and has_flood_budget(store)):
        pytest.skip("no outbox on this store yet")


class Outbound(OutboxConformance, FloodBudgetConformance):
    """Both outbound suites, skipped on a store without the abilities."""

    @pytest.fixture(autouse=True)
    def _needs_outbox(self, store: Store) -> None:
        needs_outbox(store)


@pytest.fixture
def memory_url_factory(pytestconfig: pytest.Config, tmp_path: Path) -> Iterator[UrlFactory]:
    """``memory://``: every store made from it is a separate, empty store."""
    urls = isolated_urls(pytestconfig, "memory", tmp_path)
    yield urls
    urls.close()


@pytest.fixture
def sqlite_url_factory(pytestconfig: pytest.Config, tmp_path: Path) -> Iterator[UrlFactory]:
    """A new SQLite file per call."""
    urls = isolated_urls(pytestconfig, "sqlite", tmp_path)
    yield urls
    urls.close()


class TestMemory(Outbound):
    pytestmark = pytest.mark.memory
    shares_state = False  # each memory:// store keeps its own outbox

    @pytest.fixture
    def store_url_factory(self, memory_url_factory: UrlFactory) -> UrlFactory:
        return memory_url_factory


class TestSQLite(Outbound):
    pytestmark = pytest.mark.sqlite

    @pytest.fixture
    def store_url_factory(self, sqlite_url_factory: UrlFactory) -> UrlFactory:
        return sqlite_url_factory


class TestPostgres(Outbound):
    pytestmark = pytest.mark.postgres

    @pytest.fixture
    def store_url_factory(self, postgres_url_factory: UrlFactory) -> UrlFactory:
        return postgres_url_factory


class TestRedis(Outbound):
    pytestmark = pytest.mark.redis

    @pytest.fixture
    def store_url_factory(self, redis_url_factory: UrlFactory) -> UrlFactory:
        return redis_url_factory
