"""The browsing and health conformance suite (``BrowseConformance`` of
``telegram_idem.testing.conformance``) on every store of this package that has the
Browsable and Checkable abilities; DynamoDB has neither (``telegram-idem check`` /
``inspect --prefix`` / ``purge --prefix`` answer exit 4 there, tests/cli).

One class per store, each given the URL factory of tests/conftest.py; a store listed here
without the abilities fails the suite, it is never skipped.
"""

from __future__ import annotations

import pytest
from services import UrlFactory

from telegram_idem.backends import Browsable, Checkable, Store
from telegram_idem.testing.conformance import BrowseConformance


class Browsing(BrowseConformance):
    def test_the_store_has_the_abilities(self, store: Store) -> None:
        assert isinstance(store, Browsable) and isinstance(store, Checkable)


class TestMemory(Browsing):
    pytestmark = pytest.mark.memory
    shares_state = False

    @pytest.fixture
    def store_url_factory(self, memory_url_factory: UrlFactory) -> UrlFactory:
        return memory_url_factory


class TestSQLite(Browsing):
    pytestmark = pytest.mark.sqlite

    @pytest.fixture
    def store_url_factory(self, sqlite_url_factory: UrlFactory) -> UrlFactory:
        return sqlite_url_factory


class TestRedis(Browsing):
    pytestmark = pytest.mark.redis
    counts_expired = False

    @pytest.fixture
    def store_url_factory(self, redis_url_factory: UrlFactory) -> UrlFactory:
        return redis_url_factory


class TestRedisCluster(Browsing):
    pytestmark = pytest.mark.redis
    counts_expired = False

    @pytest.fixture
    def store_url_factory(self, redis_cluster_url_factory: UrlFactory) -> UrlFactory:
        return redis_cluster_url_factory


class TestPostgres(Browsing):
    pytestmark = pytest.mark.postgres

    @pytest.fixture
    def store_url_factory(self, postgres_url_factory: UrlFactory) -> UrlFactory:
        return postgres_url_factory


class TestDynamoDB(Browsing):
    pytestmark = pytest.mark.dynamodb

    @pytest.fixture
    def store_url_factory(self, dynamodb_url_factory: UrlFactory) -> UrlFactory:
        return dynamodb_url_factory
