"""The effect-ledger conformance suite (``LedgerConformance`` of
``telegram_idem.testing.conformance``) on every store of this package that has a ledger.

One class per store, each given the URL factory of tests/conftest.py; a store listed here
without the ability fails the suite (its ``ledger()`` raises ``ConfigurationError``), it
is never skipped.
"""

from __future__ import annotations

import pytest
from services import UrlFactory

from telegram_idem.backends import Store, has_ledger
from telegram_idem.testing.conformance import LedgerConformance


class Ledgers(LedgerConformance):
    def test_the_store_has_the_ability(self, store: Store) -> None:
        assert has_ledger(store)


class TestMemory(Ledgers):
    pytestmark = pytest.mark.memory
    shares_state = False  # each memory:// store keeps its own ledger

    @pytest.fixture
    def store_url_factory(self, memory_url_factory: UrlFactory) -> UrlFactory:
        return memory_url_factory


class TestSQLite(Ledgers):
    pytestmark = pytest.mark.sqlite

    @pytest.fixture
    def store_url_factory(self, sqlite_url_factory: UrlFactory) -> UrlFactory:
        return sqlite_url_factory


class TestRedis(Ledgers):
    pytestmark = pytest.mark.redis

    @pytest.fixture
    def store_url_factory(self, redis_url_factory: UrlFactory) -> UrlFactory:
        return redis_url_factory


class TestRedisCluster(Ledgers):
    pytestmark = pytest.mark.redis

    @pytest.fixture
    def store_url_factory(self, redis_cluster_url_factory: UrlFactory) -> UrlFactory:
        return redis_cluster_url_factory


class TestPostgres(Ledgers):
    pytestmark = pytest.mark.postgres

    @pytest.fixture
    def store_url_factory(self, postgres_url_factory: UrlFactory) -> UrlFactory:
        return postgres_url_factory


class TestDynamoDB(Ledgers):
    pytestmark = pytest.mark.dynamodb

    @pytest.fixture
    def store_url_factory(self, dynamodb_url_factory: UrlFactory) -> UrlFactory:
        return dynamodb_url_factory
