"""The JetStream inbox (``telegram_idem.backends.nats``): the whole store conformance
suite, inbox contract included, on real claim stores (SQLite files, PostgreSQL, Redis)
wrapped by ``with_jetstream_inbox`` over a real nats-server with JetStream. The record
tests show the wrapper hands every record call to the claim store unchanged; the inbox
tests run the same contract as every other inbox."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest
from fixtures_nats import delete_streams, stream_for, wrap
from services import UrlFactory

from telegram_idem._clock import Clock
from telegram_idem.backends import Store, store_from_url
from telegram_idem.testing._stores import NATS_DEFAULT_URL
from telegram_idem.testing.conformance import InboxConformance

pytestmark = pytest.mark.nats


class JetStreamContract(InboxConformance):
    """The suite on ``claim_url_factory``'s store with a JetStream inbox; one stream per
    claim URL, so store objects made on one URL share their inbox as they share records
    (in this process or, for the OS-process tests, another)."""

    model_examples = 12
    nats_url = ""
    tag = "c"

    @pytest.fixture
    def store_url_factory(
        self, claim_url_factory: UrlFactory, idem_nats_url: str
    ) -> Iterator[UrlFactory]:
        made: list[str] = []
        type(self).nats_url = idem_nats_url

        def make() -> str:
            url = claim_url_factory()
            made.append(stream_for(url, self.tag))
            return url

        yield make
        asyncio.run(delete_streams(idem_nats_url, made))

    def open_store(self, url: str, clock: Clock | None) -> Store:
        nats_url = self.nats_url or os.environ.get("IDEM_NATS_URL", NATS_DEFAULT_URL)
        return wrap(store_from_url(url, clock=clock), nats_url, stream_for(url, self.tag))


class TestJetStreamOnSQLite(JetStreamContract):
    tag = "sqlite"

    @pytest.fixture
    def claim_url_factory(self, sqlite_url_factory: UrlFactory) -> UrlFactory:
        return sqlite_url_factory


class TestJetStreamOnPostgres(JetStreamContract):
    pytestmark = pytest.mark.postgres
    tag = "pg"

    @pytest.fixture
    def claim_url_factory(self, postgres_url_factory: UrlFactory) -> UrlFactory:
        return postgres_url_factory


class TestJetStreamOnRedis(JetStreamContract):
    pytestmark = pytest.mark.redis
    tag = "redis"

    @pytest.fixture
    def claim_url_factory(self, redis_url_factory: UrlFactory) -> UrlFactory:
        return redis_url_factory
