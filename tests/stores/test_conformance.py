"""The store conformance suite (``telegram_idem.testing.conformance``) on every store of
this package, and on a custom store written as a third party would write one.

One class per store, each given the URL factory of tests/conftest.py (the plugin's
:class:`~telegram_idem.testing._stores.IsolatedUrls`): a new file, table prefix, key
prefix or table per URL. Select one store with ``-k Postgres`` or ``-m postgres``.
"""

from __future__ import annotations

import pytest
from services import UrlFactory

from telegram_idem._clock import Clock
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.testing.conformance import InboxConformance, StoreConformance


class TestMemory(InboxConformance):
    pytestmark = pytest.mark.memory
    shares_state = False  # each memory:// store keeps its own records

    @pytest.fixture
    def store_url_factory(self, memory_url_factory: UrlFactory) -> UrlFactory:
        return memory_url_factory


class TestSQLite(InboxConformance):
    pytestmark = pytest.mark.sqlite

    @pytest.fixture
    def store_url_factory(self, sqlite_url_factory: UrlFactory) -> UrlFactory:
        return sqlite_url_factory


class TestPostgres(InboxConformance):
    pytestmark = pytest.mark.postgres

    @pytest.fixture
    def store_url_factory(self, postgres_url_factory: UrlFactory) -> UrlFactory:
        return postgres_url_factory


class TestRedis(InboxConformance):
    pytestmark = pytest.mark.redis

    @pytest.fixture
    def store_url_factory(self, redis_url_factory: UrlFactory) -> UrlFactory:
        return redis_url_factory


class TestRedisCluster(InboxConformance):
    pytestmark = pytest.mark.redis

    @pytest.fixture
    def store_url_factory(self, redis_cluster_url_factory: UrlFactory) -> UrlFactory:
        return redis_cluster_url_factory


class TestDynamoDB(StoreConformance):  # DynamoDB has no inbox
    pytestmark = pytest.mark.dynamodb
    model_examples = 12  # every request is an HTTP round trip to moto

    @pytest.fixture
    def store_url_factory(self, dynamodb_url_factory: UrlFactory) -> UrlFactory:
        return dynamodb_url_factory


# ----------------------------------------------------------------- a third party's store


class ThirdPartyStore(MemoryStore):
    """A custom store as a bot author writes one: a class of its own, registered with
    ``store_from_url`` under a scheme of its own (its records kept by MemoryStore)."""

    schemes = ("thirdparty",)

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> ThirdPartyStore:
        assert url.startswith("thirdparty://"), url
        return cls() if clock is None else cls(clock=clock)


class TestThirdPartyStore(InboxConformance):
    """Only what a third party has: the public classes and its own URL factory."""

    shares_state = False

    @pytest.fixture
    def store_url_factory(self) -> UrlFactory:
        return lambda: "thirdparty://"

    def test_the_suite_runs_on_the_custom_class(self, store_url: str) -> None:
        store = self.open_store(store_url, None)
        assert type(store) is ThirdPartyStore
