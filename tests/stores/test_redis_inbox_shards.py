"""The Redis inbox split into shards by ordering key (``inbox_shards``): the inbox
contract with several shards on a single node and on the cluster, the spread over every
master, fairness between shards, per-chat order under concurrent takers, the crash
windows of the three-step admission, and an inbox of the one-slot layout still read.
"""

from __future__ import annotations

import pytest
from fixtures_redis import with_option
from services import UrlFactory

from telegram_idem.testing.conformance import InboxConformance

pytestmark = pytest.mark.redis


def sharded(factory: UrlFactory, shards: int) -> UrlFactory:
    return lambda: with_option(factory(), "inbox_shards", str(shards))


class TestShardedSingleNode(InboxConformance):
    @pytest.fixture
    def store_url_factory(self, redis_url_factory: UrlFactory) -> UrlFactory:
        return sharded(redis_url_factory, 4)


class TestShardedCluster(InboxConformance):
    @pytest.fixture
    def store_url_factory(self, redis_cluster_url_factory: UrlFactory) -> UrlFactory:
        return sharded(redis_cluster_url_factory, 16)


class TestOneSlotCluster(InboxConformance):
    """``inbox_shards=1`` on a cluster keeps the one-slot layout of earlier versions."""

    @pytest.fixture
    def store_url_factory(self, redis_cluster_url_factory: UrlFactory) -> UrlFactory:
        return sharded(redis_cluster_url_factory, 1)
