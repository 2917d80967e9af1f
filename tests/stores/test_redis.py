"""Redis store specifics: round trips, key layout, expiry, scripts, outages, URLs.

Round trips on a single node are counted on a private ``redis-server`` (so no other test
run pollutes its ``INFO commandstats``); on the cluster they are counted in the client
(``ClusterNode.execute_command`` / ``execute_pipeline`` calls). The outage test kills
its own private server with SIGKILL and restarts it on the same port.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis.exceptions as rexc
from fixtures_redis import load_services_script, redis_base_url, with_option
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection, ConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from services import service_missing

from telegram_idem import (
    ConfigurationError,
    ManualClock,
    Outcome,
    StoreError,
    store_from_url,
)
from telegram_idem.backends.redis import SCRIPTS, RedisStore

pytestmark = pytest.mark.redis

T = TypeVar("T")
LEASE = 30.0
RETENTION = 3600.0
KEY = "idem:7000000001:a:approve:4130:5550001001"


# ----------------------------------------------------------------- a private server


@dataclass
class PrivateRedis:
    """A ``redis-server`` this module started, on a free port, no persistence."""

    directory: Path
    port: int
    pid: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def kill(self) -> None:
        """SIGKILL: no shutdown, no save, connections cut."""
        os.kill(self.pid, signal.SIGKILL)
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:  # daemonized: not our child
            pass

    def start(self) -> None:
        self.pid = load_services_script().start_redis_server(self.directory, self.port)

    def stop(self) -> None:
        try:
            self.kill()
        except ProcessLookupError:
            pass
        shutil.rmtree(self.directory, ignore_errors=True)


def _private_redis() -> PrivateRedis:
    if shutil.which("redis-server") is None:
        service_missing("redis-server is not installed: no private server")
    module = load_services_script()
    directory = Path(tempfile.mkdtemp(prefix="idem-redis-test-"))
    port = module.free_port()
    server = PrivateRedis(directory, port, 0)
    try:
        server.start()
    except module.ServiceError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        service_missing(f"private redis-server failed: {exc}")
    return server


@pytest.fixture(scope="module")
def stats_server() -> Iterator[PrivateRedis]:
    """A private server whose command statistics only this module touches."""
    server = _private_redis()
    yield server
    server.stop()


@pytest.fixture
def outage_server() -> Iterator[PrivateRedis]:
    """A private server a test may kill and restart."""
    server = _private_redis()
    yield server
    server.stop()


@pytest.fixture
async def admin(stats_server: PrivateRedis) -> AsyncIterator[Redis]:
    client = Redis(port=stats_server.port)
    await client.flushall()
    yield client
    await client.aclose()


SCRIPT_INNER = {"hmget", "hset", "hdel", "pexpire", "time"}
"""Commands the scripts call inside Redis (commandstats counts them too)."""


class CountingConnection(Connection):
    """Counts what is written to the socket: one write per round trip (or pipeline)."""

    writes = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.writes += 1
        await super().send_packed_command(command, check_health)


def counting_store(server: PrivateRedis) -> RedisStore:
    pool = ConnectionPool(
        connection_class=CountingConnection, port=server.port, retry=Retry(NoBackoff(), 0)
    )
    return RedisStore(Redis.from_pool(pool))  # the client owns the pool: aclose() closes it


@dataclass
class Measured:
    round_trips: int
    commands: dict[str, int]
    """Top-level commands the server ran (script-internal ones and INFO left out)."""


async def measure(admin: Redis, action: Awaitable[T]) -> tuple[T, Measured]:
    """Run ``action``; count its socket writes and the server's top-level commands."""
    before = await admin.info("commandstats")
    CountingConnection.writes = 0
    result = await action
    writes = CountingConnection.writes
    after = await admin.info("commandstats")
    delta = {
        name.removeprefix("cmdstat_"): stats["calls"] - before.get(name, {}).get("calls", 0)
        for name, stats in after.items()
    }
    top = {n: c for n, c in delta.items() if c and n not in SCRIPT_INNER | {"info"}}
    return result, Measured(writes, top)


ONE_EVALSHA = Measured(1, {"evalsha": 1})


async def warm_up(store: RedisStore) -> None:
    """Open the connection and load every script, so later calls show steady state."""
    c = await store.claim("warm-up", lease=LEASE, retention=RETENTION)
    await store.claim_many(["warm-up-2"], lease=LEASE, retention=RETENTION)
    await store.extend("warm-up", c.token, lease=LEASE)
    await store.release("warm-up", c.token)
    c = await store.claim("warm-up", lease=LEASE, retention=RETENTION)
    await store.fail("warm-up", c.token, b"e", retention=RETENTION)
    c = await store.claim("warm-up-2", lease=LEASE, retention=RETENTION)
    await store.complete("warm-up-2", c.token, b"1", retention=RETENTION)
    await store.get("warm-up")


# ----------------------------------------------------------------- round trips


def cluster_client(store: RedisStore) -> RedisCluster:
    assert isinstance(store.client, RedisCluster)
    return store.client


async def test_each_primitive_is_one_evalsha(stats_server: PrivateRedis, admin: Redis) -> None:
    store = counting_store(stats_server)
    try:
        await warm_up(store)
        claim, m = await measure(
            admin, store.claim(KEY, fingerprint="fp", lease=LEASE, retention=RETENTION)
        )
        assert claim.outcome is Outcome.ACQUIRED
        assert m == ONE_EVALSHA

        done, m = await measure(
            admin, store.complete(KEY, claim.token, b'"ok"', retention=RETENTION)
        )
        assert done and m == ONE_EVALSHA

        replay, m = await measure(
            admin, store.claim(KEY, fingerprint="fp", lease=LEASE, retention=RETENTION)
        )
        assert (replay.outcome, replay.record.result) == (Outcome.REPLAY, b'"ok"')
        assert m == ONE_EVALSHA  # duplicate detected, stored result returned: 1 round trip

        other = await store.claim("k2", lease=LEASE, retention=RETENTION)
        for action in (
            store.extend("k2", other.token, lease=LEASE),
            store.release("k2", other.token),
            store.get("k2"),
            store.fail("k2", other.token, b"e", retention=RETENTION),
        ):
            _, m = await measure(admin, action)
            assert m == ONE_EVALSHA
    finally:
        await store.close()
        await store.client.aclose()


async def test_claim_many_100_is_one_evalsha_on_a_single_node(
    stats_server: PrivateRedis, admin: Redis
) -> None:
    store = counting_store(stats_server)
    keys = [f"idem:1:u:{734519000 + i}" for i in range(100)]
    try:
        await warm_up(store)
        claims, m = await measure(admin, store.claim_many(keys, lease=LEASE, retention=RETENTION))
        assert m == ONE_EVALSHA
        assert [c.record.key for c in claims] == keys
        assert {c.outcome for c in claims} == {Outcome.ACQUIRED}
        again, m = await measure(admin, store.claim_many(keys, lease=LEASE, retention=RETENTION))
        assert m == ONE_EVALSHA
        assert {c.outcome for c in again} == {Outcome.IN_PROGRESS}
    finally:
        await store.close()
        await store.client.aclose()


@pytest.fixture
def node_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts what cluster clients send: single commands and pipelines, per call."""
    calls = {"command": 0, "pipeline": 0}
    command, pipeline = ClusterNode.execute_command, ClusterNode.execute_pipeline

    async def counted_command(self: ClusterNode, *args: Any, **kwargs: Any) -> Any:
        calls["command"] += 1
        return await command(self, *args, **kwargs)

    async def counted_pipeline(self: ClusterNode, *args: Any, **kwargs: Any) -> Any:
        calls["pipeline"] += 1
        return await pipeline(self, *args, **kwargs)

    monkeypatch.setattr(ClusterNode, "execute_command", counted_command)
    monkeypatch.setattr(ClusterNode, "execute_pipeline", counted_pipeline)
    return calls


async def test_cluster_round_trips(
    redis_cluster_url_factory: Callable[[], str], node_calls: dict[str, int]
) -> None:
    store = RedisStore(redis_cluster_url_factory())
    # action keys: on a cluster, update keys all live in the inbox's slot (test_redis_inbox)
    keys = [f"idem:1:a:approve:{734519000 + i}" for i in range(100)]
    try:
        await store.get("warm-up")  # discovery happens here
        for source in (SCRIPTS["claim"].source, SCRIPTS["complete"].source):  # no NOSCRIPT below
            await store.client.execute_command(
                "SCRIPT LOAD", source, target_nodes=RedisCluster.PRIMARIES
            )
        masters = len(cluster_client(store).get_primaries())
        node_calls.update(command=0, pipeline=0)
        claim = await store.claim(KEY, lease=LEASE, retention=RETENTION)
        assert node_calls == {"command": 1, "pipeline": 0}
        await store.complete(KEY, claim.token, b"1", retention=RETENTION)
        assert node_calls == {"command": 2, "pipeline": 0}

        node_calls.update(command=0, pipeline=0)
        claims = await store.claim_many(keys, lease=LEASE, retention=RETENTION)
        assert [c.record.key for c in claims] == keys
        assert {c.outcome for c in claims} == {Outcome.ACQUIRED}
        # one pipeline per master holding any of the keys, sent in parallel
        assert node_calls == {"command": 0, "pipeline": masters}
    finally:
        await store.close()


# ----------------------------------------------------------------- key layout


async def test_keys_carry_the_record_key_as_hash_tag(
    redis_cluster_url_factory: Callable[[], str],
) -> None:
    store = RedisStore(redis_cluster_url_factory())
    keys = [KEY, "idem:1:a:x", "with space", "한국어", "a{b}c", "}{", ""]
    try:
        assert isinstance(store.client, RedisCluster)
        claims = await store.claim_many(keys, lease=LEASE, retention=RETENTION)
        assert {c.outcome for c in claims} == {Outcome.ACQUIRED}
        for key in keys:
            rkey = store.redis_key(key)
            assert rkey == f"{store.key_prefix}:{{{key}}}"
            server_slot = await cluster_client(store).cluster_keyslot(rkey)
            assert server_slot == key_slot(rkey.encode())  # what claim_many groups by
            if "{" not in key and "}" not in key and key:
                # the whole record key is the tag: same slot as the bare key in braces
                assert server_slot == await cluster_client(store).cluster_keyslot(f"x{{{key}}}")
            assert await store.client.exists(rkey) == 1  # on the node owning the slot
        single = await store.claim("a{b}c", lease=LEASE, retention=RETENTION)
        assert single.outcome is Outcome.IN_PROGRESS
    finally:
        await store.close()


async def test_claim_many_batches_share_a_slot(
    redis_cluster_url_factory: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RedisStore(redis_cluster_url_factory())
    sent: list[list[bytes]] = []
    original = store.connection.run_pipelined

    async def spy(script: Any, batches: list[list[bytes]], args: Any) -> Any:
        sent.extend(batches)
        return await original(script, batches, args)

    monkeypatch.setattr(store.connection, "run_pipelined", spy)
    keys = [f"idem:1:a:approve:{i * 7919}:{i}" for i in range(300)]  # 2 pairs share a slot
    try:
        await store.claim_many(keys, lease=LEASE, retention=RETENTION)
        assert sum(len(b) for b in sent) == 300
        assert len(sent) < 300  # some keys share a slot: fewer scripts than keys
        for batch in sent:
            slots = {await cluster_client(store).cluster_keyslot(k.decode()) for k in batch}
            assert len(slots) == 1
    finally:
        await store.close()


async def test_key_prefix_with_braces_is_rejected() -> None:
    for prefix in ("a{b", "a}b", ""):
        with pytest.raises(ConfigurationError):
            RedisStore(Redis(), key_prefix=prefix)


# ----------------------------------------------------------------- expiry (PX)


async def _pttl_s(store: RedisStore, key: str) -> float:
    return int(await store.client.pttl(store.redis_key(key))) / 1000


async def test_records_expire_by_px_with_the_server_clock(
    redis_url_factory: Callable[[], str],
) -> None:
    store = RedisStore(redis_url_factory())
    try:
        claim = await store.claim(KEY, lease=LEASE, retention=RETENTION)
        assert RETENTION - 2 < await _pttl_s(store, KEY) <= RETENTION
        server_now = float(".".join(str(x) for x in await store.client.time()))
        assert claim.record.lease_expires_at == pytest.approx(server_now + LEASE, abs=2)
        assert claim.record.expires_at == pytest.approx(server_now + RETENTION, abs=2)
        assert await store.complete(KEY, claim.token, b"1", retention=100.0)
        assert 98 < await _pttl_s(store, KEY) <= 100
        assert await store.client.hget(store.redis_key(KEY), "lease") is not None
    finally:
        await store.close()


async def test_px_follows_a_given_clock(redis_url_factory: Callable[[], str]) -> None:
    clock = ManualClock()
    store = RedisStore(redis_url_factory(), clock=clock)
    try:
        claim = await store.claim(KEY, lease=10.0, retention=20.0)
        assert 19 < await _pttl_s(store, KEY) <= 20
        clock.advance(15)  # manual time: the PX is "expires_at - now", not wall time
        assert await store.extend(KEY, claim.token, lease=30.0)  # exp → now + 30
        assert 29 < await _pttl_s(store, KEY) <= 30
        clock.advance(5)
        assert await store.complete(KEY, claim.token, b"1", retention=100.0)
        assert 99 < await _pttl_s(store, KEY) <= 100
        record = await store.get(KEY)
        assert record is not None and record.expires_at == pytest.approx(clock.now + 100)
    finally:
        await store.close()


async def test_px_expiry_forgets_the_record(redis_url_factory: Callable[[], str]) -> None:
    store = RedisStore(redis_url_factory())
    try:
        first = await store.claim(KEY, lease=0.05, retention=0.1)
        await asyncio.sleep(0.25)
        assert await store.client.exists(store.redis_key(KEY)) == 0
        assert await store.get(KEY) is None
        again = await store.claim(KEY, lease=LEASE, retention=RETENTION)
        assert again.outcome is Outcome.ACQUIRED
        assert again.token == first.token  # forgotten entirely: tokens start again at 1
    finally:
        await store.close()


# ----------------------------------------------------------------- scripts


async def test_scripts_survive_script_flush(stats_server: PrivateRedis, admin: Redis) -> None:
    store = counting_store(stats_server)
    try:
        await warm_up(store)
        claim = await store.claim(KEY, lease=LEASE, retention=RETENTION)
        await admin.script_flush()
        done, m = await measure(admin, store.complete(KEY, claim.token, b"1", retention=RETENTION))
        assert done
        # NOSCRIPT, then EVAL of the source (which caches it again): 2 round trips, once
        assert m == Measured(2, {"evalsha": 1, "eval": 1})
        _, m = await measure(admin, store.get(KEY))
        assert m == Measured(2, {"evalsha": 1, "eval": 1})  # each script once
        _, m = await measure(admin, store.get(KEY))
        assert m == ONE_EVALSHA
    finally:
        await store.close()
        await store.client.aclose()


async def test_cluster_claim_many_survives_script_flush(
    redis_cluster_url_factory: Callable[[], str],
    monkeypatch: pytest.MonkeyPatch,
    node_calls: dict[str, int],
) -> None:
    store = RedisStore(redis_cluster_url_factory())
    keys = [f"idem:1:a:{i}" for i in range(50)]
    sent: list[str] = []
    pipe = store.connection._pipe

    async def spy(commands: Any) -> Any:
        sent.extend({command for command, *_ in commands})  # one kind per pipeline
        return await pipe(commands)

    monkeypatch.setattr(store.connection, "_pipe", spy)
    try:
        await store.get("warm-up")
        await store.client.execute_command("SCRIPT FLUSH", target_nodes=RedisCluster.PRIMARIES)
        node_calls.update(command=0, pipeline=0)
        claims = await store.claim_many(keys, lease=LEASE, retention=RETENTION)
        assert {c.outcome for c in claims} == {Outcome.ACQUIRED}
        assert sent == ["EVALSHA", "EVAL"]  # NOSCRIPT answers redone with EVAL, once
        masters = len(cluster_client(store).get_primaries())
        assert node_calls == {"command": 0, "pipeline": 2 * masters}
        sent.clear()
        again = await store.claim_many(keys, lease=LEASE, retention=RETENTION)
        assert {c.outcome for c in again} == {Outcome.IN_PROGRESS}
        assert sent == ["EVALSHA"]  # cached again by the EVAL
    finally:
        await store.close()


async def test_a_foreign_key_under_the_prefix_is_a_configuration_error(
    redis_url_factory: Callable[[], str],
) -> None:
    """WRONGTYPE: another program writes under the store's key_prefix. No retry can fix
    it, and the raw redis-py error never escapes."""
    store = RedisStore(redis_url_factory())
    try:
        await store.client.set(store.redis_key(KEY), b"not a hash")
        with pytest.raises(ConfigurationError) as info:
            await store.claim(KEY, lease=LEASE, retention=RETENTION)
        assert isinstance(info.value.__cause__, rexc.ResponseError)
        assert "WRONGTYPE" in str(info.value) and "key_prefix" in str(info.value)
    finally:
        await store.client.delete(store.redis_key(KEY))
        await store.close()


# ----------------------------------------------------------------- outage


async def test_outage_is_a_store_error_and_the_store_recovers(
    outage_server: PrivateRedis,
) -> None:
    store = RedisStore(outage_server.url)
    try:
        first = await store.claim(KEY, lease=LEASE, retention=RETENTION)
        assert first.outcome is Outcome.ACQUIRED

        outage_server.kill()
        for action in (
            lambda: store.claim(KEY, lease=LEASE, retention=RETENTION),
            lambda: store.claim_many(["a", "b"], lease=LEASE, retention=RETENTION),
            lambda: store.complete(KEY, first.token, b"1", retention=RETENTION),
            lambda: store.release(KEY, first.token),
            lambda: store.extend(KEY, first.token, lease=LEASE),
            lambda: store.get(KEY),
        ):
            with pytest.raises(StoreError) as info:
                await action()
            assert isinstance(info.value.original, RedisStore.driver_errors)
            assert info.value.__cause__ is info.value.original

        outage_server.start()  # same port, empty (no persistence)
        again = await store.claim(KEY, lease=LEASE, retention=RETENTION)
        # the record was lost with the server: acquired again (a duplicate could run)
        assert again.outcome is Outcome.ACQUIRED
        assert await store.complete(KEY, again.token, b"1", retention=RETENTION)
        assert (await store.claim(KEY, lease=LEASE, retention=RETENTION)).outcome is (
            Outcome.REPLAY
        )
    finally:
        await store.close()


async def test_idle_connections_broken_by_a_restart_cost_no_call(
    outage_server: PrivateRedis,
) -> None:
    store = RedisStore(outage_server.url)
    try:
        held = await asyncio.gather(
            *(store.claim(f"k{i}", lease=LEASE, retention=RETENTION) for i in range(5))
        )  # five connections now idle in the pool
        outage_server.kill()
        await asyncio.sleep(0.1)
        outage_server.start()
        again = await asyncio.gather(
            *(store.claim(f"k{i}", lease=LEASE, retention=RETENTION) for i in range(5))
        )
        # every idle connection was found broken and replaced before use; the records
        # died with the server (no persistence), so the same keys are acquired again
        assert [c.outcome for c in again] == [Outcome.ACQUIRED] * 5
        assert [c.token for c in again] == [c.token for c in held]
    finally:
        await store.close()


async def test_kill_mid_run_gives_only_answers_or_store_errors(
    outage_server: PrivateRedis,
) -> None:
    store = RedisStore(outage_server.url)
    try:
        await store.get("warm-up")

        async def one(i: int) -> object:
            await asyncio.sleep(i * 0.001)
            try:
                return await store.claim(f"k{i}", lease=LEASE, retention=RETENTION)
            except StoreError as exc:
                return exc

        tasks = [asyncio.ensure_future(one(i)) for i in range(300)]
        await asyncio.sleep(0.05)
        outage_server.kill()
        results = await asyncio.gather(*tasks)
        errors = [r for r in results if isinstance(r, StoreError)]
        answers = [r for r in results if not isinstance(r, StoreError)]
        assert errors, "the kill came after every claim finished"
        assert all(getattr(a, "outcome", None) is Outcome.ACQUIRED for a in answers)
        assert all(isinstance(e.original, RedisStore.driver_errors) for e in errors)
    finally:
        await store.close()


async def test_unreachable_cluster_is_a_store_error() -> None:
    port = load_services_script().free_port()
    store = store_from_url(f"redis+cluster://127.0.0.1:{port}?socket_connect_timeout=1")
    try:
        with pytest.raises(StoreError) as info:
            await store.claim(KEY, lease=LEASE, retention=RETENTION)
        assert info.value.original is not None
    finally:
        await store.close()


async def test_cluster_url_on_a_plain_node_is_a_configuration_error() -> None:
    base = redis_base_url()
    port = Redis.from_url(base).connection_pool.connection_kwargs.get("port", 6379)
    store = store_from_url(f"redis+cluster://127.0.0.1:{port}")
    try:
        with pytest.raises(ConfigurationError):
            await store.claim(KEY, lease=LEASE, retention=RETENTION)
    finally:
        await store.close()


async def test_a_busy_server_is_a_store_error(outage_server: PrivateRedis) -> None:
    admin = Redis(port=outage_server.port)
    hog = Redis(port=outage_server.port, socket_timeout=None)
    store = RedisStore(outage_server.url)
    try:
        await store.get("warm-up")
        await admin.config_set("busy-reply-threshold", 50)  # ms a script runs before BUSY
        await admin.ping()  # connected before the hog blocks the server
        spin = asyncio.ensure_future(hog.eval("local i = 0 while true do i = i + 1 end", 0))
        await asyncio.sleep(0.3)
        with pytest.raises(StoreError) as info:
            await store.claim(KEY, lease=LEASE, retention=RETENTION)
        assert isinstance(info.value.original, rexc.ResponseError)
        assert str(info.value.original).startswith("BUSY")
        await admin.script_kill()
        with pytest.raises(rexc.ResponseError):
            await spin
        claim = await store.claim(KEY, lease=LEASE, retention=RETENTION)
        assert claim.outcome is Outcome.ACQUIRED
    finally:
        await store.close()
        await hog.aclose()
        await admin.aclose()


async def test_a_master_without_replicas_refusing_writes_is_a_store_error(
    outage_server: PrivateRedis,
) -> None:
    admin = Redis(port=outage_server.port)
    store = RedisStore(outage_server.url)
    try:
        await admin.config_set("min-replicas-to-write", 1)  # and there are none
        with pytest.raises(StoreError) as info:
            await store.claim(KEY, lease=LEASE, retention=RETENTION)
        assert str(info.value.original).startswith("NOREPLICAS")
        await admin.config_set("min-replicas-to-write", 0)
        assert (await store.claim(KEY, lease=LEASE, retention=RETENTION)).outcome is (
            Outcome.ACQUIRED
        )
    finally:
        await store.close()
        await admin.aclose()


# ----------------------------------------------------------------- concurrency


async def _fifty_clients(url: str) -> list[Outcome]:
    stores = [RedisStore(url) for _ in range(50)]  # 50 clients, server clock
    try:
        claims = await asyncio.gather(
            *(s.claim(KEY, fingerprint="fp", lease=LEASE, retention=RETENTION) for s in stores)
        )
    finally:
        for s in stores:
            await s.close()
    assert len({c.token for c in claims}) == 1
    return [c.outcome for c in claims]


async def test_50_clients_one_key_single_node(redis_url_factory: Callable[[], str]) -> None:
    outcomes = await _fifty_clients(redis_url_factory())
    assert outcomes.count(Outcome.ACQUIRED) == 1
    assert outcomes.count(Outcome.IN_PROGRESS) == 49


async def test_50_clients_one_key_cluster(redis_cluster_url_factory: Callable[[], str]) -> None:
    outcomes = await _fifty_clients(redis_cluster_url_factory())
    assert outcomes.count(Outcome.ACQUIRED) == 1
    assert outcomes.count(Outcome.IN_PROGRESS) == 49


@pytest.mark.parametrize("factory", ["redis_url_factory", "redis_cluster_url_factory"])
async def test_more_concurrent_calls_than_connections_wait_their_turn(
    factory: str, request: pytest.FixtureRequest
) -> None:
    url = with_option(request.getfixturevalue(factory)(), "max_connections", "4")
    store = RedisStore(url)
    try:
        claims = await asyncio.gather(
            *(store.claim(f"k{i}", lease=LEASE, retention=RETENTION) for i in range(500))
        )
        assert {c.outcome for c in claims} == {Outcome.ACQUIRED}
        batches = await asyncio.gather(
            *(
                store.claim_many([f"m{j}:{i}" for i in range(20)], lease=LEASE, retention=RETENTION)
                for j in range(50)
            )
        )
        assert {c.outcome for b in batches for c in b} == {Outcome.ACQUIRED}
    finally:
        await store.close()


# ----------------------------------------------------------------- clients and URLs


async def test_close_closes_only_a_client_the_store_made(
    redis_url_factory: Callable[[], str],
) -> None:
    url = redis_url_factory()
    prefix = url.rsplit("key_prefix=", 1)[1]
    client = Redis.from_url(redis_base_url())
    store = RedisStore(client, key_prefix=prefix)
    await store.claim(KEY, lease=LEASE, retention=RETENTION)
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreError):
        await store.get(KEY)
    assert await client.exists(f"{prefix}:{{{KEY}}}") == 1  # the client still works
    await client.aclose()


async def test_a_decoding_client_is_rejected() -> None:
    with pytest.raises(ConfigurationError):
        RedisStore(Redis(decode_responses=True))
    with pytest.raises(TypeError):
        RedisStore(42)  # type: ignore[arg-type]


def _kwargs(store: RedisStore) -> dict[str, Any]:
    assert isinstance(store.client, Redis)
    return dict(store.client.connection_pool.connection_kwargs)


def test_single_node_urls() -> None:
    store = RedisStore.from_url("redis://:s3cret@cache.internal:6380/3?key_prefix=bot")
    kw = _kwargs(store)
    assert (kw["host"], kw["port"], kw["db"], kw["password"]) == (
        "cache.internal",
        6380,
        3,
        "s3cret",
    )
    assert store.key_prefix == "bot" and not store.is_cluster
    assert kw["socket_timeout"] == 5.0 and kw["socket_connect_timeout"] == 5.0
    assert kw["retry"].get_retries() == 0
    assert kw["protocol"] == 2  # see _DEFAULT_PROTOCOL

    tls = RedisStore.from_url(
        "rediss://user:pw@cache.internal:6380?ssl_cert_reqs=none&socket_timeout=2.5"
    )
    kw = _kwargs(tls)
    assert isinstance(tls.client, Redis)
    assert tls.client.connection_pool.connection_class.__name__ == "SSLConnection"
    assert (kw["username"], kw["password"], kw["ssl_cert_reqs"]) == ("user", "pw", "none")
    assert kw["socket_timeout"] == 2.5
    assert "key_prefix" not in kw

    assert _kwargs(RedisStore.from_url("redis://h?db=2"))["db"] == 2
    assert RedisStore.from_url("redis://h").key_prefix == "idem"


def test_cluster_urls() -> None:
    store = RedisStore.from_url(
        "redis+cluster://u:p@n1:7000,n2:7001?key_prefix=x&max_connections=20"
    )
    assert store.is_cluster and store.key_prefix == "x"
    assert isinstance(store.client, RedisCluster)
    nodes = sorted((n.host, n.port) for n in store.client.nodes_manager.startup_nodes.values())
    assert nodes == [("n1", 7000), ("n2", 7001)]
    assert store.client.connection_kwargs["password"] == "p"
    assert store.client.retry.get_retries() == 0


@pytest.mark.parametrize(
    "url",
    [
        "redis://localhost?keyprefix=x",  # a typo of key_prefix
        "redis://localhost?db=one",
        "redis://localhost/one",
        "redis://localhost?socket_timeout=soon",
        "redis://localhost?socket_timeout=0",
        "redis://localhost?key_prefix=a{b}",
        "redis://localhost?decode_responses=true",
        "redis://localhost?ssl_cert_reqs=none",  # TLS options need rediss://
        "redis://localhost?protocol=4",
        "redis://localhost?max_connections=many",
        "redis://",
        "redis+cluster://localhost",  # no port
        "redis+cluster://n1:7000/1",  # clusters have only db 0
        "redis+cluster://n1:7000?db=0",
        "redis+cluster://n1:7000?ssl=maybe",
    ],
)
def test_bad_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError):
        store_from_url(url)


def test_with_option_helper_keeps_other_options() -> None:
    assert with_option("redis://h/0?db=1", "key_prefix", "p") == "redis://h/0?db=1&key_prefix=p"


def test_configuration_errors_do_not_show_the_password() -> None:
    with pytest.raises(ConfigurationError) as info:
        store_from_url("redis://bot:s3cret@cache.internal:6380/0?bogus=1")
    assert "s3cret" not in str(info.value)
    assert "bogus" in str(info.value)
