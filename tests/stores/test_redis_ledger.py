"""Redis effect-ledger specifics (the shared rules are LedgerConformance's): every call is
one script, rows and their index never expire, the server's clock when none is injected,
a listing longer than one chunk of the index, one slot per key prefix on a cluster,
OS processes racing for the same rows,
RESP3, a script cache flushed, and Redis errors translated as the store's.

Command counts come from a private ``redis-server`` (``INFO commandstats``), as in
``test_redis_outbox.py``.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis.exceptions as rexc
from fixtures_redis import private_redis_server, with_option
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from telegram_idem import ConfigurationError, ManualClock, StoreError
from telegram_idem.backends.redis import SCRIPTS, RedisLedger, RedisStore
from telegram_idem.ledger import LedgerState

pytestmark = pytest.mark.redis

KEY = "idem:7:a:pay:42:s:charge"
EVERY = list(LedgerState)


def ledger_of(store: RedisStore) -> RedisLedger:
    ledger = store.ledger()
    assert isinstance(ledger, RedisLedger)
    assert store.ledger() is ledger  # the same object on every call
    return ledger


# ----------------------------------------------------------------- one script per call


@pytest.fixture(scope="module")
def stats_port() -> Iterator[int]:
    """A private redis-server whose command statistics only this module touches."""
    yield from private_redis_server("idem-redis-ledger-test-")


@pytest.fixture
async def private(stats_port: int) -> AsyncIterator[tuple[RedisStore, Redis]]:
    admin = Redis(port=stats_port)
    await admin.flushall()
    store = RedisStore(f"redis://127.0.0.1:{stats_port}/0", clock=ManualClock())
    yield store, admin
    await store.close()
    await admin.aclose()


_INNER = {"hmget", "hset", "hdel", "zadd", "zrem", "zrange", "del", "time"}
"""The commands the ledger's scripts run inside Redis."""


async def scripts_run(admin: Redis, action: Callable[[], object]) -> tuple[int, int]:
    """How many scripts the client sent for ``action()``, and how many other commands
    (those that are not a script's inner commands)."""
    before = await admin.info("commandstats")
    await action()  # type: ignore[misc]
    after = await admin.info("commandstats")
    delta = {
        name.removeprefix("cmdstat_"): stats["calls"] - before.get(name, {}).get("calls", 0)
        for name, stats in after.items()
    }
    scripts = delta.pop("evalsha", 0) + delta.pop("eval", 0)
    others = sum(n for name, n in delta.items() if name not in _INNER | {"info"})
    return scripts, others


async def test_every_call_is_one_script(private: tuple[RedisStore, Redis]) -> None:
    store, admin = private
    ledger = ledger_of(store)
    calls: list[Callable[[], object]] = [
        lambda: ledger.start(KEY, token=1, holder="h:1"),
        lambda: ledger.start(KEY, token=2, holder="h:2"),
        lambda: ledger.mark_unknown(KEY, token=2, detail="found"),
        lambda: ledger.get(KEY),
        lambda: ledger.entries(states=EVERY, prefix="idem:7:", limit=5),
        lambda: ledger.settle(KEY, token=3, result=b"r", not_applied=False),
        lambda: ledger.finish(KEY, token=3),
    ]
    for name, script in SCRIPTS.items():  # cached: no EVALSHA falls back to EVAL
        if name.startswith("ledger_"):
            await admin.script_load(script.source)
    for action in calls:
        assert await scripts_run(admin, action) == (1, 0)


async def test_a_flushed_script_cache_costs_one_eval(private: tuple[RedisStore, Redis]) -> None:
    store, admin = private
    ledger = ledger_of(store)
    await ledger.start(KEY, token=1, holder="h:1")
    await admin.script_flush()
    row = await ledger.get(KEY)
    assert row is not None and row.holder == "h:1"
    assert await scripts_run(admin, lambda: ledger.get(KEY)) == (1, 0)  # cached again


# ----------------------------------------------------------------- never expire, clock


async def test_rows_and_index_have_no_ttl_on_the_servers_clock(
    redis_url_factory: Callable[[], str],
) -> None:
    store = RedisStore(redis_url_factory())  # no clock: the server's TIME
    ledger = ledger_of(store)
    try:
        before = time.time()
        assert await ledger.start(KEY, token=1, holder="h:1") is None
        after = time.time()
        row = await ledger.get(KEY)
        assert row is not None
        assert before - 1 <= row.started_at <= after + 1  # the server's clock, seconds
        assert row.updated_at == row.started_at
        client = store.client
        assert await client.pttl(ledger.redis_key(KEY)) == -1
        assert await client.pttl(f"{ledger.base}i") == -1
        unknown = await ledger.mark_unknown(KEY, token=2, detail="d")
        assert unknown is not None and unknown.updated_at >= row.updated_at
        assert await ledger.settle(KEY, token=3, result=b"", not_applied=False)
        settled = await ledger.get(KEY)
        assert settled is not None and settled.result == b""  # empty bytes are a result
        assert await client.pttl(ledger.redis_key(KEY)) == -1
        assert await ledger.finish(KEY, token=3)
        assert not await client.exists(ledger.redis_key(KEY))
        assert await client.zcard(f"{ledger.base}i") == 0  # the index forgets it too
    finally:
        await store.close()


async def test_microsecond_times_order_the_listing(redis_url_factory: Callable[[], str]) -> None:
    clock = ManualClock(1_700_000_000.25)
    store = RedisStore(redis_url_factory(), clock=clock)
    ledger = ledger_of(store)
    try:
        await ledger.start("idem:b", token=1, holder="h")
        clock.advance(0.000_002)
        await ledger.start("idem:a", token=1, holder="h")
        rows = await ledger.entries()
        assert [r.key for r in rows] == ["idem:b", "idem:a"]  # 2 µs apart: not a tie
        assert rows[0].started_at == 1_700_000_000.25
        assert rows[1].started_at == pytest.approx(1_700_000_000.250_002, abs=1e-7)
    finally:
        await store.close()


# ----------------------------------------------------------------- listing


async def test_a_listing_longer_than_one_chunk_of_the_index(
    redis_url_factory: Callable[[], str],
) -> None:
    clock = ManualClock()
    store = RedisStore(redis_url_factory(), clock=clock)
    ledger = ledger_of(store)
    try:
        keys = []
        for n in range(700):
            key = f"idem:{'a' if n % 3 else 'b'}:{n:04d}"
            keys.append(key)
            await ledger.start(key, token=1, holder="h")
            if n % 2:
                await ledger.mark_unknown(key, token=2, detail="d")
            clock.advance(0.5)
        every = await ledger.entries(limit=1000)
        assert [r.key for r in every] == keys
        b_keys = [k for k in keys if k.startswith("idem:b:")]
        listed = await ledger.entries(prefix="idem:b:", limit=200)
        assert [r.key for r in listed] == b_keys[:200]  # the last ones past the 2nd chunk
        unknown = await ledger.entries(states=[LedgerState.UNKNOWN], prefix="idem:a:", limit=1000)
        assert [r.key for r in unknown] == [
            k for n, k in enumerate(keys) if n % 2 and k.startswith("idem:a:")
        ]
        assert [r.key for r in await ledger.entries(limit=3)] == keys[:3]
        assert await ledger.entries(states=[]) == []
    finally:
        await store.close()


async def test_ties_are_listed_by_key_and_prefixes_are_literal(
    redis_url_factory: Callable[[], str],
) -> None:
    store = RedisStore(redis_url_factory(), clock=ManualClock())
    ledger = ledger_of(store)
    keys = ["idem:ä", "idem:z", "idem:*", "idem:[a]", "idem:?", "idem:\\", "idem:👍"]
    try:
        for key in keys:
            await ledger.start(key, token=1, holder="h")
        assert [r.key for r in await ledger.entries()] == sorted(keys)  # code-point order
        for literal in ("idem:*", "idem:[", "idem:?", "idem:\\", "idem:%"):
            got = [r.key for r in await ledger.entries(prefix=literal)]
            assert got == [k for k in sorted(keys) if k.startswith(literal)]
        assert await ledger.entries(prefix="idem:\ud800") == []  # no stored key has it
    finally:
        await store.close()


# ----------------------------------------------------------------- cluster, RESP3


async def test_a_cluster_keeps_the_whole_ledger_in_one_slot(
    redis_cluster_url_factory: Callable[[], str],
) -> None:
    store = RedisStore(redis_cluster_url_factory(), clock=ManualClock())
    ledger = ledger_of(store)
    client = store.client
    assert isinstance(client, RedisCluster)
    try:
        keys = [f"idem:{bot}:a:{n}:s:x" for bot in range(5) for n in range(4)]
        for n, key in enumerate(keys):
            await ledger.start(key, token=n + 1, holder="h")
        slot = await client.cluster_keyslot(f"{ledger.base}i")
        for key in keys:
            assert await client.cluster_keyslot(ledger.redis_key(key)) == slot
        assert [r.key for r in await ledger.entries(limit=100)] == keys
        assert store.redis_key(keys[0]) != ledger.redis_key(keys[0])  # beside records
    finally:
        await store.close()


@pytest.mark.parametrize("protocol", ["2", "3"])
async def test_both_protocols_read_absent_rows_and_results(
    redis_url_factory: Callable[[], str], protocol: str
) -> None:
    store = RedisStore(with_option(redis_url_factory(), "protocol", protocol), clock=ManualClock())
    ledger = ledger_of(store)
    try:
        assert await ledger.get(KEY) is None
        assert await ledger.mark_unknown(KEY, token=1, detail="d") is None
        assert await ledger.start(KEY, token=1, holder="h") is None
        assert await ledger.settle(KEY, token=2, result=None, not_applied=True)
        row = await ledger.get(KEY)
        assert row is not None and (row.result, row.not_applied) == (None, True)
    finally:
        await store.close()


# ----------------------------------------------------------------- OS processes

_STARTER = textwrap.dedent(
    """
    import asyncio, sys
    from telegram_idem.backends.redis import RedisStore

    async def main(url, me):
        store = RedisStore(url)
        ledger = store.ledger()
        sys.stdin.readline()  # start together
        answers = await asyncio.gather(
            *(ledger.start(f"idem:7:a:{n}:s:pay", token=me, holder=f"p{me}") for n in range(200))
        )
        print(" ".join(str(n) for n, a in enumerate(answers) if a is None))
        await store.close()

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


@pytest.mark.parametrize("where", ["single", "cluster"])
async def test_processes_racing_for_200_rows_start_each_once(
    redis_url_factory: Callable[[], str],
    redis_cluster_url_factory: Callable[[], str],
    where: str,
) -> None:
    url = redis_url_factory() if where == "single" else redis_cluster_url_factory()
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _STARTER,
            url,
            str(me),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for me in (1, 2, 3)
    ]
    runs = await asyncio.wait_for(
        asyncio.gather(*(p.communicate(b"go\n") for p in procs)), timeout=60
    )
    assert all(p.returncode == 0 for p in procs)
    won = [{int(n) for n in out.split()} for out, _ in runs]
    assert sum(len(w) for w in won) == 200  # every row started by exactly one process
    assert set().union(*won) == set(range(200))
    store = RedisStore(url)
    try:
        rows = await ledger_of(store).entries(limit=1000)
        assert len(rows) == 200
        for row in rows:
            n = int(row.key.split(":")[3])
            assert n in won[row.token - 1] and row.holder == f"p{row.token}"
    finally:
        await store.close()


# ----------------------------------------------------------------- errors


async def test_a_foreign_key_at_the_index_is_a_configuration_error(
    redis_url_factory: Callable[[], str],
) -> None:
    store = RedisStore(redis_url_factory())
    ledger = ledger_of(store)
    index = f"{ledger.base}i"
    try:
        await store.client.set(index, b"not a sorted set")
        for action in (
            lambda: ledger.start(KEY, token=1, holder="h"),
            lambda: ledger.entries(),
        ):
            with pytest.raises(ConfigurationError) as info:
                await action()
            assert isinstance(info.value.__cause__, rexc.ResponseError)
            assert "WRONGTYPE" in str(info.value) and "ledger." in str(info.value)
    finally:
        await store.client.delete(index)
        await store.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_no_server_is_a_store_error_for_every_call() -> None:
    store = RedisStore(f"redis://127.0.0.1:{_free_port()}/0?socket_connect_timeout=1")
    ledger = ledger_of(store)
    try:
        for action in (
            lambda: ledger.start(KEY, token=1, holder="h"),
            lambda: ledger.mark_unknown(KEY, token=1, detail="d"),
            lambda: ledger.settle(KEY, token=1, result=b"r", not_applied=False),
            lambda: ledger.finish(KEY, token=1),
            lambda: ledger.get(KEY),
            lambda: ledger.entries(),
        ):
            with pytest.raises(StoreError) as info:
                await action()
            assert isinstance(info.value.original, RedisStore.driver_errors)
    finally:
        await store.close()
    with pytest.raises(StoreError, match="closed"):
        await ledger.get(KEY)
