"""The Redis store's fast lane (telegram_idem/backends/redis/_lane.py) on a real Redis:
which stores take it, one connection for concurrent calls, the URL's database and client
name, a caller cancelled mid-call, a server that never answers, a new event loop."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from fixtures_redis import private_redis_server, redis_base_url, with_option
from redis.asyncio import Redis

from telegram_idem import Outcome, StoreError
from telegram_idem.backends.redis import RedisStore

pytestmark = pytest.mark.redis

LEASE, RETENTION = 30.0, 3600.0
RESULT = b'{"ok":true}'


async def test_a_single_node_url_store_takes_the_lane_and_nothing_else_does(
    redis_url_factory: Callable[[], str],
) -> None:
    url = redis_url_factory()
    store = RedisStore(url)
    client = Redis.from_url(redis_base_url())
    passed_in = RedisStore(client, key_prefix=f"lane-{secrets.token_hex(4)}")
    cluster = RedisStore.from_url("redis+cluster://127.0.0.1:7000")
    tls = RedisStore.from_url("rediss://127.0.0.1:6380?ssl_cert_reqs=none")
    try:
        assert store.connection.lane is not None
        claim = await store.claim("k", lease=LEASE, retention=RETENTION)
        assert claim.outcome is Outcome.ACQUIRED
        assert await store.complete("k", claim.token, RESULT, retention=RETENTION)
        replay = await store.claim("k", lease=LEASE, retention=RETENTION)
        assert replay.outcome is Outcome.REPLAY and replay.record.result == RESULT
        # redis-py's path, as configured: a client passed in, a cluster, TLS
        assert passed_in.connection.lane is None
        assert cluster.connection.lane is None and tls.connection.lane is None
    finally:
        await store.close()
        await passed_in.close()
        await client.aclose()
        await cluster.close()
        await tls.close()


async def test_concurrent_calls_share_one_connection_and_each_gets_its_own_answer(
    redis_url_factory: Callable[[], str],
) -> None:
    name = f"lane-{secrets.token_hex(4)}"
    store = RedisStore(with_option(redis_url_factory(), "client_name", name))
    observer = Redis.from_url(redis_base_url())
    try:
        keys = [f"c:{i}" for i in range(200)]
        claims = await asyncio.gather(
            *(store.claim(k, lease=LEASE, retention=RETENTION) for k in keys)
        )
        assert all(c.outcome is Outcome.ACQUIRED for c in claims)
        assert [c.record.key for c in claims] == keys
        done = await asyncio.gather(
            *(
                store.complete(k, c.token, k.encode(), retention=RETENTION)
                for k, c in zip(keys, claims, strict=True)
            )
        )
        assert all(done)
        records = await asyncio.gather(*(store.get(k) for k in keys))
        assert [r.result if r else None for r in records] == [k.encode() for k in keys]
        clients = await observer.client_list()
        assert [c["name"] for c in clients if c["name"] == name] == [name]
    finally:
        await store.close()
        await observer.aclose()


async def test_the_url_database_is_the_one_written(redis_url_factory: Callable[[], str]) -> None:
    redis_url_factory()  # skips without a Redis
    base = redis_base_url().split("?")[0].rsplit("/", 1)[0]
    prefix = f"lane-{secrets.token_hex(4)}"
    store = RedisStore(f"{base}/3?key_prefix={prefix}")
    db3 = Redis.from_url(f"{base}/3")
    db0 = Redis.from_url(f"{base}/0")
    try:
        assert store.connection.lane is not None
        await store.claim("k", lease=LEASE, retention=RETENTION)
        assert await db3.exists(store.redis_key("k")) == 1
        assert await db0.exists(store.redis_key("k")) == 0
    finally:
        await db3.delete(store.redis_key("k"))
        await store.close()
        await db3.aclose()
        await db0.aclose()


async def test_a_caller_cancelled_mid_call_leaves_the_next_answers_in_order(
    redis_url_factory: Callable[[], str],
) -> None:
    store = RedisStore(redis_url_factory())
    try:
        for key in ("a", "b"):
            claim = await store.claim(key, lease=LEASE, retention=RETENTION)
            await store.complete(key, claim.token, key.encode(), retention=RETENTION)
        sent = asyncio.create_task(store.get("a"))
        await asyncio.sleep(0)  # the command is written, its reply not read yet
        sent.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sent
        record = await store.get("b")
        assert record is not None and record.result == b"b"
    finally:
        await store.close()


@pytest.fixture
async def silent_server() -> AsyncIterator[int]:
    """A TCP server on loopback that reads everything and never answers."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def test_a_server_that_never_answers_is_a_store_error_within_the_timeout(
    silent_server: int,
) -> None:
    store = RedisStore(f"redis://127.0.0.1:{silent_server}/0?socket_timeout=0.3")
    try:
        assert store.connection.lane is not None
        results = await asyncio.gather(
            store.claim("x", lease=LEASE, retention=RETENTION),
            store.get("y"),
            return_exceptions=True,
        )
        assert all(isinstance(r, StoreError) for r in results), results
        assert "Timeout" in str(results[0])
    finally:
        await store.close()


def test_a_store_used_from_a_new_event_loop_connects_again(
    redis_url_factory: Callable[[], str],
) -> None:
    store = RedisStore(redis_url_factory())

    async def claim(key: str) -> Outcome:
        return (await store.claim(key, lease=LEASE, retention=RETENTION)).outcome

    assert asyncio.run(claim("first")) is Outcome.ACQUIRED
    assert asyncio.run(claim("second")) is Outcome.ACQUIRED
    assert asyncio.run(claim("first")) is Outcome.IN_PROGRESS
    asyncio.run(store.close())


@pytest.fixture
def private_port() -> Iterator[int]:
    """A redis-server of this module's own (its scripts are flushed)."""
    yield from private_redis_server("idem-redis-lane-test-")


async def test_scripts_flushed_on_the_server_run_again_single_and_pipelined(
    private_port: int,
) -> None:
    """NOSCRIPT on the lane: one call and a pipeline of them (records() reads each
    record with one script per key) are sent again as EVAL and answer."""
    store = RedisStore(f"redis://127.0.0.1:{private_port}/0?key_prefix=lane")
    admin = Redis(port=private_port)
    try:
        assert store.connection.lane is not None
        for key in ("lane-a", "lane-b"):
            claim = await store.claim(key, lease=LEASE, retention=RETENTION)
            await store.complete(key, claim.token, key.encode(), retention=RETENTION)
        await admin.script_flush()
        record = await store.get("lane-a")
        assert record is not None and record.result == b"lane-a"
        await admin.script_flush()
        records = await store.records(prefix="lane-")
        assert sorted((r.key, r.result) for r in records) == [
            ("lane-a", b"lane-a"),
            ("lane-b", b"lane-b"),
        ]
        stats = await admin.info("commandstats")
        assert stats["cmdstat_eval"]["calls"] >= 2
    finally:
        await store.close()
        await admin.aclose()
