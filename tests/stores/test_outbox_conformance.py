"""The outbound conformance suites (``OutboxConformance``, ``FloodBudgetConformance`` of
``telegram_idem.testing.conformance``) on every store of this package that has an outbox.

One class per store, each given the URL factory of tests/conftest.py or
tests/stores/test_conformance.py; select one store with ``-k Postgres`` or
``-m postgres``. Every store listed here must have both abilities: a store without them
fails the suites (its ``outbox()`` raises ``ConfigurationError``), it is never skipped.
"""

from __future__ import annotations

import pytest
from services import UrlFactory

from telegram_idem.backends import Store, has_flood_budget, has_outbox
from telegram_idem.testing.conformance import FloodBudgetConformance, OutboxConformance


class Outbound(OutboxConformance, FloodBudgetConformance):
    """Both outbound suites."""

    def test_the_store_has_both_abilities(self, store: Store) -> None:
        assert has_outbox(store) and has_flood_budget(store)


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


class TestRedisCluster(Outbound):
    pytestmark = pytest.mark.redis

    @pytest.fixture
    def store_url_factory(self, redis_cluster_url_factory: UrlFactory) -> UrlFactory:
        return redis_cluster_url_factory
