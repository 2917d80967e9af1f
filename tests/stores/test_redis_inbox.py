"""Redis inbox specifics: round trips, one slot on a cluster (``inbox_shards=1``), no
TTL on entries, and a model check against the memory inbox. The sharded layout:
``test_redis_inbox_shards.py``.

Round trips on a single node are counted on a private ``redis-server`` (its
``INFO commandstats`` and the client's socket writes); on the cluster, in the client
(``ClusterNode.execute_command`` / ``execute_pipeline`` calls), as in ``test_redis.py``.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from fixtures_redis import private_redis_server
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection, ConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from telegram_idem import ConfigurationError, ManualClock, Outcome, Status
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.backends.redis import SCRIPTS, RedisInbox, RedisStore
from telegram_idem.inbox._base import EntryStatus, Inbox, InboxEntry, NewEntry

pytestmark = pytest.mark.redis

T = TypeVar("T")
LEASE = 30.0
RETENTION = 3600.0
SOURCES = tuple(
    SCRIPTS[name].source
    for name in (
        "inbox_admit",
        "inbox_take",
        "inbox_held",
        "inbox_redrive",
        "inbox_dead_letters",
        "claim",
        "get",
    )
)


def entry(update_id: int, chat: str | None = "chat:1", bot: int = 7) -> NewEntry:
    payload = json.dumps({"update_id": update_id, "message": {"text": str(update_id)}}).encode()
    return NewEntry(f"idem:{bot}:u:{update_id}", chat, payload)


def inbox_of(store: RedisStore) -> RedisInbox:
    inbox = store.inbox()
    assert isinstance(inbox, RedisInbox)
    return inbox


# ----------------------------------------------------------------- single node: counting


@pytest.fixture(scope="module")
def stats_port() -> Iterator[int]:
    """A private redis-server whose command statistics only this module touches."""
    yield from private_redis_server("idem-redis-inbox-test-")


@pytest.fixture
async def admin(stats_port: int) -> AsyncIterator[Redis]:
    client = Redis(port=stats_port)
    await client.flushall()
    yield client
    await client.aclose()


class CountingConnection(Connection):
    """Counts socket writes: one per round trip."""

    writes = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.writes += 1
        await super().send_packed_command(command, check_health)


@pytest.fixture
async def counted(stats_port: int, admin: Redis) -> AsyncIterator[RedisStore]:
    pool = ConnectionPool(
        connection_class=CountingConnection, port=stats_port, retry=Retry(NoBackoff(), 0)
    )
    store = RedisStore(Redis.from_pool(pool))  # the client owns the pool: aclose() closes it
    for source in SOURCES:  # steady state: no NOSCRIPT below
        await admin.script_load(source)
    await store.get("warm-up")  # the connection is open
    yield store
    await store.close()
    await store.client.aclose()


async def measure(admin: Redis, action: Awaitable[T]) -> tuple[T, tuple[int, dict[str, int]]]:
    """``action``'s result, socket writes and the top-level commands the server ran
    (``cmdstat`` of commands that only scripts call left out)."""
    before = await admin.info("commandstats")
    CountingConnection.writes = 0
    result = await action
    writes = CountingConnection.writes
    after = await admin.info("commandstats")
    inner = {"evalsha", "eval", "zcard"}
    top = {
        name.removeprefix("cmdstat_"): stats["calls"] - before.get(name, {}).get("calls", 0)
        for name, stats in after.items()
        if name.removeprefix("cmdstat_") in inner
    }
    return result, (writes, {n: c for n, c in top.items() if c})


ONE_EVALSHA = (1, {"evalsha": 1})


async def test_every_inbox_call_is_one_round_trip(counted: RedisStore, admin: Redis) -> None:
    inbox = inbox_of(counted)
    for uid, chat in [(1, "chat:a"), (2, "chat:a"), (3, "chat:b")]:
        admitted, m = await measure(admin, inbox.admit(entry(uid, chat), retention=RETENTION))
        assert admitted and m == ONE_EVALSHA
    duplicate, m = await measure(admin, inbox.admit(entry(1, "chat:a"), retention=RETENTION))
    assert duplicate is False and m == ONE_EVALSHA

    first, m = await measure(admin, inbox.take(lease=LEASE))
    assert first is not None and first.id == "idem:7:u:1" and m == ONE_EVALSHA
    second, m = await measure(admin, inbox.take(lease=LEASE))
    assert second is not None and second.id == "idem:7:u:3" and m == ONE_EVALSHA
    nothing, m = await measure(admin, inbox.take(lease=LEASE))
    assert nothing is None and m == ONE_EVALSHA

    for action in (
        inbox.extend(first, lease=LEASE),
        inbox.retry(second, delay=0, error="boom"),
        inbox.bury(first, error="bad"),
        inbox.redrive(first.id),
    ):
        done, m = await measure(admin, action)
        assert done is True and m == ONE_EVALSHA
    _, m = await measure(admin, inbox.dead_letters())
    assert m == ONE_EVALSHA
    depth, m = await measure(admin, inbox.depth())
    assert depth == 3 and m == (1, {"zcard": 1})
    again, _ = await measure(admin, inbox.take(lease=LEASE))
    assert again is not None
    done, m = await measure(admin, inbox.ack(again))
    assert done and m == ONE_EVALSHA


async def test_admit_many_100_is_one_evalsha(counted: RedisStore, admin: Redis) -> None:
    inbox = inbox_of(counted)
    batch = [entry(734519000 + i, f"chat:{i % 7}") for i in range(100)]
    answers, m = await measure(admin, inbox.admit_many(batch, retention=RETENTION))
    assert answers == [True] * 100 and m == ONE_EVALSHA
    answers, m = await measure(admin, inbox.admit_many(batch[:50], retention=RETENTION))
    assert answers == [False] * 50 and m == ONE_EVALSHA
    assert await inbox.depth() == 100


async def test_scripts_survive_script_flush(counted: RedisStore, admin: Redis) -> None:
    inbox = inbox_of(counted)
    await admin.script_flush()
    assert await inbox.admit(entry(1), retention=RETENTION)  # NOSCRIPT, then EVAL
    await admin.script_flush()
    taken, m = await measure(admin, inbox.take(lease=LEASE))
    assert taken is not None and m == (2, {"evalsha": 1, "eval": 1})
    _, m = await measure(admin, inbox.ack(taken))
    assert m == (2, {"evalsha": 1, "eval": 1})


# ----------------------------------------------------------------- layout, TTL


async def test_single_node_keeps_the_record_layout(
    redis_url_factory: Callable[[], str],
) -> None:
    store = RedisStore(redis_url_factory(), clock=ManualClock())
    inbox = inbox_of(store)
    try:
        assert await inbox.admit(entry(1), retention=RETENTION)
        rkey = store.redis_key("idem:7:u:1")
        assert rkey == f"{store.key_prefix}:{{idem:7:u:1}}"
        assert await store.client.hget(rkey, "status") == b"completed"
        assert await store.client.hget(rkey, "result") == b"null"
        assert await store.client.exists(inbox.key("e:idem:7:u:1")) == 1
    finally:
        await store.close()


async def test_admission_writes_the_record_admitted_record_describes(
    redis_url_factory: Callable[[], str],
) -> None:
    clock = ManualClock()
    store = RedisStore(redis_url_factory(), clock=clock)
    try:
        claim = await store.claim("idem:7:u:9", lease=LEASE, retention=RETENTION)
        clock.advance(LEASE + 1)  # the claimer died: admission takes the update over
        assert await store.inbox().admit(entry(9), retention=RETENTION)
        record = await store.get("idem:7:u:9")
        assert record is not None
        assert (record.status, record.result, record.fencing_token, record.attempts) == (
            Status.COMPLETED,
            b"null",
            claim.token + 1,
            2,
        )
        assert record.expires_at == pytest.approx(clock.now + RETENTION)
        assert record.lease_expires_at == pytest.approx(clock.now + RETENTION)
        assert not await store.complete("idem:7:u:9", claim.token, b"1", retention=RETENTION)
    finally:
        await store.close()


async def test_the_guard_ttl_never_drops_a_live_entry(
    redis_url_factory: Callable[[], str],
) -> None:
    store = RedisStore(redis_url_factory())  # the server's clock: real expiry
    inbox = inbox_of(store)
    try:
        assert await inbox.admit(entry(1, "chat:a"), retention=0.1)
        assert await inbox.admit(entry(2, "chat:a"), retention=0.1)
        held = await inbox.take(lease=LEASE)
        assert held is not None and held.id == "idem:7:u:1"
        assert await inbox.bury(held, error="x")
        async for key in store.client.scan_iter(match=f"{inbox.base}*"):
            assert await store.client.pttl(key) == -1, key  # no inbox key has a TTL
        await asyncio.sleep(0.3)
        assert await store.client.exists(store.redis_key("idem:7:u:2")) == 0  # guard gone
        assert await store.get("idem:7:u:2") is None
        assert await inbox.depth() == 1
        [dead] = await inbox.dead_letters()
        assert dead.id == "idem:7:u:1"
        nxt = await inbox.take(lease=LEASE)
        assert nxt is not None and nxt.id == "idem:7:u:2"
        assert await inbox.ack(nxt)
    finally:
        await store.close()


async def test_readmission_after_the_guard_expired_replaces_the_entry_and_fences(
    redis_url_factory: Callable[[], str],
) -> None:
    clock = ManualClock()
    store = RedisStore(redis_url_factory(), clock=clock)
    inbox = inbox_of(store)
    try:
        assert await inbox.admit(entry(1), retention=60)
        stale = await inbox.take(lease=LEASE)
        assert stale is not None and stale.token == 1
        clock.advance(61)  # the guard record's retention is over; the entry is still live
        assert await inbox.admit(entry(1), retention=60)
        assert await inbox.depth() == 1  # replaced, not enqueued twice
        assert not await inbox.ack(stale)
        fresh = await inbox.take(lease=LEASE)
        assert fresh is not None and fresh.id == stale.id
        assert (fresh.token, fresh.attempts, fresh.seq) == (2, 1, 2)
        assert not await inbox.ack(stale)  # the old token never comes back
        assert await inbox.ack(fresh)
    finally:
        await store.close()


async def test_dead_letters_limit(redis_url_factory: Callable[[], str]) -> None:
    store = RedisStore(redis_url_factory(), clock=ManualClock())
    inbox = inbox_of(store)
    try:
        for uid in range(5):
            await inbox.admit(entry(uid, f"chat:{uid}"), retention=RETENTION)
            taken = await inbox.take(lease=LEASE)
            assert taken is not None and await inbox.bury(taken, error=f"e{uid}")
        assert [e.id for e in await inbox.dead_letters(limit=2)] == ["idem:7:u:0", "idem:7:u:1"]
        assert await inbox.dead_letters(limit=0) == []
        assert len(await inbox.dead_letters()) == 5
        assert await inbox.depth() == 0
    finally:
        await store.close()


# ----------------------------------------------------------------- cluster


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


def cluster_client(store: RedisStore) -> RedisCluster:
    assert isinstance(store.client, RedisCluster)
    return store.client


async def test_cluster_round_trips(
    redis_cluster_url_factory: Callable[[], str], node_calls: dict[str, int]
) -> None:
    store = RedisStore(redis_cluster_url_factory(), inbox_shards=1)  # the one-slot layout
    inbox = inbox_of(store)
    try:
        await store.get("warm-up")  # discovery happens here
        for source in SOURCES:
            await store.client.execute_command(
                "SCRIPT LOAD", source, target_nodes=RedisCluster.PRIMARIES
            )

        async def calls(action: Awaitable[T]) -> tuple[T, dict[str, int]]:
            node_calls.update(command=0, pipeline=0)
            result = await action
            return result, dict(node_calls)

        one = {"command": 1, "pipeline": 0}
        assert await calls(inbox.admit(entry(1, "chat:a"), retention=RETENTION)) == (True, one)
        batch = [entry(734519000 + i, f"chat:{i % 7}") for i in range(100)]
        answers, n = await calls(inbox.admit_many(batch, retention=RETENTION))
        assert answers == [True] * 100 and n == one
        taken, n = await calls(inbox.take(lease=LEASE))
        assert taken is not None and taken.id == "idem:7:u:1" and n == one
        assert await calls(inbox.extend(taken, lease=LEASE)) == (True, one)
        assert await calls(inbox.ack(taken)) == (True, one)
        assert await calls(inbox.depth()) == (100, one)
        # the update guards share the inbox's slot: a getUpdates batch is one script
        claims, n = await calls(
            store.claim_many(
                [f"idem:8:u:{i}" for i in range(100)], lease=LEASE, retention=RETENTION
            )
        )
        assert {c.outcome for c in claims} == {Outcome.ACQUIRED}
        assert n == {"command": 0, "pipeline": 1}
    finally:
        await store.close()


async def test_cluster_puts_the_inbox_and_the_update_guards_in_one_slot(
    redis_cluster_url_factory: Callable[[], str],
) -> None:
    store = RedisStore(redis_cluster_url_factory(), clock=ManualClock(), inbox_shards=1)
    inbox = inbox_of(store)
    client = cluster_client(store)
    try:
        for uid, chat in [(1, "chat:a"), (2, "chat:{b}"), (3, None), (4, "user:5")]:
            assert await inbox.admit(entry(uid, chat), retention=RETENTION)
        dead = await inbox.take(lease=LEASE)
        assert dead is not None and await inbox.bury(dead, error="x")
        slot = await client.cluster_keyslot(inbox.key("seq"))
        keys = [k async for k in client.scan_iter(match=f"{store.key_prefix}:*")]
        assert len(keys) > 10
        for key in keys:
            assert await client.cluster_keyslot(key.decode()) == slot, key
        assert store.redis_key("idem:7:u:1") == f"{inbox.base}r:idem:7:u:1"
        record = await store.get("idem:7:u:1")
        assert record is not None and record.status is Status.COMPLETED
        # other records still spread over the cluster by their own key
        assert store.redis_key("idem:7:a:approve:1") == f"{store.key_prefix}:{{idem:7:a:approve:1}}"
        with pytest.raises(ConfigurationError, match="update guard keys"):
            await inbox.admit(NewEntry("idem:7:a:not-an-update", None, b"{}"), retention=60)
    finally:
        await store.close()


async def test_cluster_takers_on_separate_clients_never_share_an_entry(
    redis_cluster_url_factory: Callable[[], str],
) -> None:
    url = redis_cluster_url_factory()
    stores = [RedisStore(url) for _ in range(3)]
    try:
        inboxes = [inbox_of(s) for s in stores]
        await inboxes[0].admit_many(
            [entry(uid, f"chat:{uid % 10}") for uid in range(40)], retention=RETENTION
        )
        seen: list[str] = []
        while await inboxes[0].depth():
            taken = await asyncio.gather(*(inboxes[i % 3].take(lease=LEASE) for i in range(15)))
            got = [t for t in taken if t is not None]
            assert len(got) == len({t.ordering_key for t in got})  # one per chat at once
            seen += [t.id for t in got]
            await asyncio.gather(*(inboxes[0].ack(t) for t in got))
        assert sorted(seen) == sorted(f"idem:7:u:{uid}" for uid in range(40))
        for chat in range(10):  # each chat in admission order
            ids = [int(s.rsplit(":", 1)[1]) for s in seen if int(s.rsplit(":", 1)[1]) % 10 == chat]
            assert ids == sorted(ids)
    finally:
        for store in stores:
            await store.close()


# ----------------------------------------------------------------- model check


async def _random_run(redis: Inbox, memory: Inbox, clock: ManualClock, seed: int) -> None:
    """The same random operations on both inboxes; every answer must be equal."""
    rng = random.Random(seed)
    held: list[InboxEntry] = []
    chats = ["chat:a", "chat:b", "user:c", None]

    def new() -> NewEntry:
        return entry(rng.randrange(40), rng.choice(chats))

    async def both(method: str, *args: Any, **kwargs: Any) -> Any:
        got = await getattr(redis, method)(*args, **kwargs)
        want = await getattr(memory, method)(*args, **kwargs)
        assert got == want, (method, args, kwargs)
        return got

    for _ in range(250):
        op = rng.randrange(12)
        if op == 0:
            await both("admit", new(), retention=RETENTION)
        elif op == 1:
            await both(
                "admit_many", [new() for _ in range(rng.randrange(1, 6))], retention=RETENTION
            )
        elif op in (2, 3, 4):
            taken = await both("take", lease=float(rng.randrange(0, 20)))
            if taken is not None:
                held.append(taken)
        elif op in (5, 6, 7, 8) and held:
            h = rng.choice(held)
            kind, secs = rng.randrange(4), float(rng.randrange(0, 10))
            if kind == 0:
                await both("ack", h)
            elif kind == 1:
                await both("retry", h, delay=secs, error=f"e{secs}")
            elif kind == 2:
                await both("bury", h, error="dead")
            else:
                await both("extend", h, lease=secs)
        elif op == 9:
            await both("redrive", f"idem:7:u:{rng.randrange(40)}")
        elif op == 10:
            await both("dead_letters", limit=rng.randrange(1, 5))
            await both("depth")
        else:
            clock.advance(float(rng.randrange(0, 8)))


@pytest.mark.parametrize("seed", range(6))
async def test_random_operations_match_the_memory_inbox(
    redis_url_factory: Callable[[], str], seed: int
) -> None:
    clock = ManualClock()
    store = RedisStore(redis_url_factory(), clock=clock)
    try:
        await _random_run(store.inbox(), MemoryStore(clock=clock).inbox(), clock, seed)
    finally:
        await store.close()


async def test_random_operations_match_the_memory_inbox_on_a_cluster(
    redis_cluster_url_factory: Callable[[], str],
) -> None:
    clock = ManualClock()
    store = RedisStore(redis_cluster_url_factory(), clock=clock, inbox_shards=1)
    try:
        await _random_run(store.inbox(), MemoryStore(clock=clock).inbox(), clock, 99)
    finally:
        await store.close()


async def test_a_dead_letter_reads_back_its_status_times_and_error(
    redis_url_factory: Callable[[], str],
) -> None:
    """The reply of a script decodes to the entry as written: status, millisecond times
    back in seconds, the error text."""
    clock = ManualClock(1_700_000_000.5)
    store = RedisStore(redis_url_factory(), clock=clock)
    inbox = inbox_of(store)
    try:
        assert await inbox.admit(entry(1), retention=RETENTION)
        taken = await inbox.take(lease=LEASE)
        assert taken is not None and await inbox.bury(taken, error="err")
        [got] = await inbox.dead_letters()
        assert (got.id, got.status, got.attempts, got.token) == (
            "idem:7:u:1",
            EntryStatus.DEAD,
            1,
            1,
        )
        assert (got.available_at, got.lease_expires_at) == (1_700_000_000.5, 1_700_000_030.5)
        assert got.last_error == "err"
    finally:
        await store.close()
