"""The Redis inbox split into shards by ordering key (``inbox_shards``): the inbox
contract with several shards on a single node and on the cluster, the spread over every
master, fairness between shards, per-chat order under concurrent takers, the crash
windows of the three-step admission, and an inbox of the one-slot layout still read.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from fixtures_redis import with_option
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from services import UrlFactory

from telegram_idem import ConfigurationError, ManualClock, Status
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.backends.redis import RedisInbox, RedisStore
from telegram_idem.backends.redis._inbox import ADMISSION_LEASE
from telegram_idem.backends.redis._keys import CLUSTER_INBOX_SHARDS
from telegram_idem.inbox import EntryStatus, InboxEntry, NewEntry
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


# ----------------------------------------------------------------- helpers

LEASE = 30.0
RETENTION = 3600.0


def entry(update_id: int, chat: str | None = "chat:1", bot: int = 7) -> NewEntry:
    payload = json.dumps({"update_id": update_id, "message": {"text": str(update_id)}}).encode()
    return NewEntry(f"idem:{bot}:u:{update_id}", chat, payload)


def inbox_of(store: RedisStore) -> RedisInbox:
    inbox = store.inbox()
    assert isinstance(inbox, RedisInbox)
    return inbox


def chats_by_shard(inbox: RedisInbox, per_shard: int = 1) -> dict[int, list[str]]:
    """``per_shard`` chat names in every shard of ``inbox``."""
    found: dict[int, list[str]] = {s: [] for s in range(inbox.shards)}
    n = 0
    while any(len(c) < per_shard for c in found.values()):
        chat = f"chat:{n}"
        if len(found[inbox.shard_of(chat)]) < per_shard:
            found[inbox.shard_of(chat)].append(chat)
        n += 1
    return found


def uid(e: InboxEntry) -> int:
    return int(e.id.rsplit(":", 1)[1])


# ----------------------------------------------------------------- settings


async def test_the_default_is_one_shard_so_an_upgrade_finds_its_inbox_and_guards(
    redis_url_factory: UrlFactory, redis_cluster_url_factory: UrlFactory
) -> None:
    single, cluster = RedisStore(redis_url_factory()), RedisStore(redis_cluster_url_factory())
    try:
        assert inbox_of(single).shards == 1
        assert inbox_of(cluster).shards == 1
        # one slot: the update guards stay in the inbox's slot, where earlier versions put them
        assert (
            cluster.redis_key("idem:7:u:1")
            == f"{cluster.key_prefix}:{{{cluster.key_prefix}:inbox}}:r:idem:7:u:1"
        )
        assert CLUSTER_INBOX_SHARDS == 16
        sharded = RedisStore(redis_cluster_url_factory(), inbox_shards=CLUSTER_INBOX_SHARDS)
        assert sharded.redis_key("idem:7:u:1") == f"{sharded.key_prefix}:{{idem:7:u:1}}"
        await sharded.close()
        assert single.redis_key("idem:7:u:1") == f"{single.key_prefix}:{{idem:7:u:1}}"
    finally:
        await single.close()
        await cluster.close()
    assert inbox_of(RedisStore(redis_url_factory(), inbox_shards=8)).shards == 8
    with pytest.raises(ConfigurationError, match="inbox_shards"):
        RedisStore(with_option(redis_url_factory(), "inbox_shards", "0"))
    with pytest.raises(ConfigurationError, match="inbox_shards"):
        RedisStore(redis_url_factory(), inbox_shards=5000)


# ----------------------------------------------------------------- spread over the masters


async def test_records_and_entries_land_on_every_master(
    redis_cluster_url_factory: UrlFactory,
) -> None:
    store = RedisStore(redis_cluster_url_factory(), inbox_shards=CLUSTER_INBOX_SHARDS)
    inbox = inbox_of(store)
    client = store.client
    assert isinstance(client, RedisCluster)
    try:
        batch = [entry(900_000 + i, f"chat:{i % 97}") for i in range(400)]
        for start in range(0, len(batch), 100):  # getUpdates batches of 100
            answers = await inbox.admit_many(batch[start : start + 100], retention=RETENTION)
            assert answers == [True] * 100
        assert await inbox.depth() == 400
        masters = client.get_primaries()
        assert len(masters) >= 3
        guards_at, entries_at = {}, {}
        for node in masters:
            direct = Redis(host=node.host, port=int(node.port))
            try:
                keys = [k.decode() async for k in direct.scan_iter(match=f"{store.key_prefix}:*")]
            finally:
                await direct.aclose()
            guards_at[node.name] = sum(
                1 for k in keys if k.startswith(f"{store.key_prefix}:{{idem:")
            )
            entries_at[node.name] = sum(1 for k in keys if ":inbox:" in k and "}:e:" in k)
        assert sum(guards_at.values()) == 400 and sum(entries_at.values()) == 400
        assert all(n > 0 for n in guards_at.values()), guards_at
        assert all(n > 0 for n in entries_at.values()), entries_at
        # the slots say the same: each master's shard slots hold keys (CLUSTER
        # COUNTKEYSINSLOT asked of the master that owns the slot)
        per_master: dict[str, int] = {}
        for shard in range(inbox.shards):
            key = inbox.shard_key(shard, "live")
            owner = client.get_node_from_key(key)
            assert owner is not None
            held = await client.execute_command(
                "CLUSTER COUNTKEYSINSLOT", key_slot(key.encode()), target_nodes=owner
            )
            per_master[owner.name] = per_master.get(owner.name, 0) + int(held)
        assert set(per_master) == set(guards_at) and all(per_master.values()), per_master
    finally:
        await store.close()


# ----------------------------------------------------------------- fairness, order


@pytest.fixture(params=["single", "cluster"])
def sharded_url(
    request: pytest.FixtureRequest,
    redis_url_factory: UrlFactory,
    redis_cluster_url_factory: UrlFactory,
) -> UrlFactory:
    if request.param == "single":
        return sharded(redis_url_factory, 4)
    return sharded(redis_cluster_url_factory, 16)


async def test_takes_follow_admission_order_across_every_shard(sharded_url: UrlFactory) -> None:
    store = RedisStore(sharded_url(), clock=ManualClock())
    inbox = inbox_of(store)
    try:
        chats = chats_by_shard(inbox, per_shard=2)
        order = [c for pair in zip(*chats.values(), strict=True) for c in pair]  # shards mixed
        plan = [(i, order[i % len(order)]) for i in range(3 * len(order))]
        assert await inbox.admit_many([entry(u, c) for u, c in plan], retention=RETENTION) == [
            True
        ] * len(plan)
        taken = []
        while (got := await inbox.take(lease=LEASE)) is not None:
            taken.append(got)
            assert await inbox.ack(got)
        assert [uid(e) for e in taken] == [u for u, _ in plan]  # oldest first, every shard
    finally:
        await store.close()


async def test_a_busy_shard_never_starves_a_quiet_one(sharded_url: UrlFactory) -> None:
    """A quiet shard's entry is taken before anything admitted after it, however many
    entries a busy shard gets meanwhile."""
    store = RedisStore(sharded_url(), clock=ManualClock())
    inbox = inbox_of(store)
    try:
        chats = chats_by_shard(inbox, per_shard=8)
        busy, quiet = chats[0], chats[inbox.shards - 1][0]
        n = 0
        for _ in range(3):
            assert (
                await inbox.admit_many(
                    [entry(n + i, busy[i % 8]) for i in range(40)], retention=RETENTION
                )
                == [True] * 40
            )
            n += 40
        assert await inbox.admit(entry(10_000, quiet), retention=RETENTION)  # after 120
        taken_at = None
        for step in range(200):
            # the busy shard keeps getting work while the workers take
            await inbox.admit(entry(n, busy[n % 8]), retention=RETENTION)
            n += 1
            got = await inbox.take(lease=LEASE)
            assert got is not None
            if got.id == "idem:7:u:10000":
                taken_at = step
                break
            assert await inbox.ack(got)
        assert taken_at is not None and taken_at <= 120
    finally:
        await store.close()


async def test_per_chat_order_under_concurrent_takers(sharded_url: UrlFactory) -> None:
    url = sharded_url()
    stores = [RedisStore(url) for _ in range(4)]
    try:
        inboxes = [inbox_of(s) for s in stores]
        plan = [(u, f"chat:{u % 23}") for u in range(230)]
        for start in range(0, len(plan), 50):
            await inboxes[start // 50 % 4].admit_many(
                [entry(u, c) for u, c in plan[start : start + 50]], retention=RETENTION
            )
        busy: set[str] = set()
        done: dict[str, list[int]] = {}

        async def worker(inbox: RedisInbox) -> None:
            idle = 0
            while idle < 3:
                got = await inbox.take(lease=LEASE)
                if got is None:
                    idle += 1
                    await asyncio.sleep(0.01)
                    continue
                idle = 0
                assert got.ordering_key not in busy  # never two of one chat at once
                busy.add(got.ordering_key)
                await asyncio.sleep(0)
                done.setdefault(got.ordering_key, []).append(uid(got))
                busy.discard(got.ordering_key)
                assert await inbox.ack(got)

        await asyncio.gather(*(worker(inboxes[i % 4]) for i in range(12)))
        assert sum(len(v) for v in done.values()) == 230
        for chat, ids in done.items():
            assert ids == sorted(ids), chat  # each chat in admission order
            assert ids == [u for u, c in plan if c == chat]
    finally:
        for s in stores:
            await s.close()


# ----------------------------------------------------------------- the admission's crash windows


class Crash(Exception):
    """The admitting process dies here (nothing after it runs)."""


def crash_after(store: RedisStore, steps: int) -> None:
    """Make ``store``'s next admission die after its first ``steps`` steps (each step is
    one ``RedisInbox._each``: the scripts of one step, sent at once)."""
    inbox = inbox_of(store)
    real = inbox._each
    seen = 0

    async def each(op: str, calls: Any) -> list[Any]:
        nonlocal seen
        if seen >= steps:
            raise Crash
        seen += 1
        return await real(op, calls)

    inbox._each = each  # type: ignore[method-assign]


@pytest.fixture
def pair(sharded_url: UrlFactory) -> Iterator[tuple[str, ManualClock]]:
    yield sharded_url(), ManualClock()


async def test_a_crash_after_the_claim_loses_nothing(pair: tuple[str, ManualClock]) -> None:
    url, clock = pair
    dying, heir = RedisStore(url, clock=clock), RedisStore(url, clock=clock)
    try:
        crash_after(dying, 1)  # the guard claimed, nothing written
        with pytest.raises(Crash):
            await inbox_of(dying).admit(entry(1), retention=RETENTION)
        inbox = inbox_of(heir)
        assert await inbox.admit(entry(1), retention=RETENTION) is False  # not yet
        record = await heir.get("idem:7:u:1")
        assert record is not None and record.status is Status.IN_PROGRESS
        assert record.lease_expires_at == clock.now + ADMISSION_LEASE
        clock.advance(ADMISSION_LEASE)
        assert await inbox.admit(entry(1), retention=RETENTION) is True  # taken over
        assert await inbox.admit(entry(1), retention=RETENTION) is False  # a duplicate now
        assert await inbox.depth() == 1
    finally:
        await dying.close()
        await heir.close()


@pytest.mark.parametrize("processed", [False, True])
async def test_a_crash_after_the_write_neither_loses_nor_doubles(
    pair: tuple[str, ManualClock], processed: bool
) -> None:
    url, clock = pair
    dying, heir = RedisStore(url, clock=clock), RedisStore(url, clock=clock)
    try:
        crash_after(dying, 2)  # the entry written, the guard still in progress
        with pytest.raises(Crash):
            await inbox_of(dying).admit(entry(1), retention=RETENTION)
        inbox = inbox_of(heir)
        assert await inbox.depth() == 1
        if processed:  # a worker handles the entry before the redelivery
            got = await inbox.take(lease=LEASE)
            assert got is not None and await inbox.ack(got)
        clock.advance(ADMISSION_LEASE)
        assert await inbox.admit(entry(1), retention=RETENTION) is True  # finished now
        record = await heir.get("idem:7:u:1")
        assert record is not None and (record.status, record.result) == (
            Status.COMPLETED,
            b"null",
        )
        assert await inbox.depth() == (0 if processed else 1)  # never enqueued twice
        if not processed:
            got = await inbox.take(lease=LEASE)
            assert got is not None and got.attempts == 1 and await inbox.ack(got)
        assert await inbox.take(lease=LEASE) is None
        assert await inbox.admit(entry(1), retention=RETENTION) is False
    finally:
        await dying.close()
        await heir.close()


async def test_a_crash_after_a_taken_over_write_still_finishes_once(
    pair: tuple[str, ManualClock],
) -> None:
    """Two admissions die after writing (the second took the first's claim over); the
    third still finds the update's entry and finishes it, enqueuing nothing more."""
    url, clock = pair
    stores = [RedisStore(url, clock=clock) for _ in range(3)]
    try:
        for dying in stores[:2]:
            crash_after(dying, 2)
            with pytest.raises(Crash):
                await inbox_of(dying).admit(entry(1), retention=RETENTION)
            clock.advance(ADMISSION_LEASE)
        inbox = inbox_of(stores[2])
        got = await inbox.take(lease=LEASE)
        assert got is not None and await inbox.ack(got)
        assert await inbox.admit(entry(1), retention=RETENTION) is True
        assert await inbox.depth() == 0
    finally:
        for s in stores:
            await s.close()


async def test_a_slow_admission_overtaken_by_a_redelivery_writes_nothing(
    pair: tuple[str, ManualClock],
) -> None:
    url, clock = pair
    slow, quick = RedisStore(url, clock=clock), RedisStore(url, clock=clock)
    try:
        slow_inbox = inbox_of(slow)
        real = slow_inbox._each
        claimed, resume = asyncio.Event(), asyncio.Event()
        seen = 0

        async def paused(op: str, calls: Any) -> list[Any]:
            nonlocal seen
            seen += 1
            if seen == 2:  # between the claim and the write
                claimed.set()
                await resume.wait()
            return await real(op, calls)

        slow_inbox._each = paused  # type: ignore[method-assign]
        late = asyncio.create_task(slow_inbox.admit(entry(1), retention=RETENTION))
        await asyncio.wait_for(claimed.wait(), 10)
        clock.advance(ADMISSION_LEASE)  # its lease ends: the redelivery takes it over
        inbox = inbox_of(quick)
        assert await inbox.admit(entry(1), retention=RETENTION) is True
        got = await inbox.take(lease=LEASE)
        assert got is not None and await inbox.ack(got)
        resume.set()
        assert await late is False  # superseded: wrote nothing, completed nothing
        assert await inbox.depth() == 0
        record = await quick.get("idem:7:u:1")
        assert record is not None and record.status is Status.COMPLETED
    finally:
        await slow.close()
        await quick.close()


# ----------------------------------------------------------------- the one-slot layout, read on


async def test_an_inbox_of_the_one_slot_layout_is_still_read(
    redis_url_factory: UrlFactory,
) -> None:
    url = redis_url_factory()
    clock = ManualClock()
    old = RedisStore(url, clock=clock, inbox_shards=1)
    new = RedisStore(url, clock=clock, inbox_shards=4)
    try:
        before = inbox_of(old)
        assert (
            await before.admit_many(
                [entry(1, "chat:a"), entry(2, "chat:b"), entry(3, "chat:c")], retention=RETENTION
            )
            == [True] * 3
        )
        held = await before.take(lease=LEASE)
        assert held is not None and held.id == "idem:7:u:1"
        poison = await before.take(lease=LEASE)
        assert poison is not None and await before.bury(poison, error="bad")
        after = inbox_of(new)
        assert await after.admit(entry(4, "chat:d"), retention=RETENTION)
        assert await after.admit(entry(1, "chat:a"), retention=RETENTION) is False  # a dup
        assert await after.depth() == 3
        assert [uid(e) for e in await after.entries()] == [1, 2, 3, 4]
        assert [uid(e) for e in await after.dead_letters()] == [2]
        stats = await after.stats()
        assert dict(stats.counts) == {
            EntryStatus.PENDING: 2,
            EntryStatus.IN_FLIGHT: 1,
            EntryStatus.DEAD: 1,
        }
        got = await after.get("idem:7:u:3")
        assert got is not None and got.status is EntryStatus.PENDING
        assert await after.ack(held)  # taken under the old layout, acked under the new
        nxt = await after.take(lease=LEASE)
        assert nxt is not None and nxt.id == "idem:7:u:3"  # the oldest first
        assert await after.ack(nxt)
        assert await after.redrive(poison.id)
        last = [await after.take(lease=LEASE), await after.take(lease=LEASE)]
        assert [e and uid(e) for e in last] == [4, 2]  # a redrive goes to the tail
        assert await after.take(lease=LEASE) is None
    finally:
        await old.close()
        await new.close()


# ----------------------------------------------------------------- model check


async def test_random_operations_match_the_memory_inbox(sharded_url: UrlFactory) -> None:
    """The sharded inbox answers as the memory inbox does, its seqs aside (a sharded
    admission reserves seqs for a whole batch, duplicates included: gaps)."""
    clock = ManualClock()
    store = RedisStore(sharded_url(), clock=clock)
    redis, memory = inbox_of(store), MemoryStore(clock=clock).inbox()
    rng = random.Random(13)
    held: list[tuple[InboxEntry, InboxEntry]] = []
    chats = ["chat:a", "chat:b", "user:c", "chat:d", "chat:e", None]

    def same(got: Any) -> Any:
        if isinstance(got, InboxEntry):
            return replace(got, seq=0)
        if isinstance(got, list):
            return [same(g) for g in got]
        return got

    def new() -> NewEntry:
        return entry(rng.randrange(40), rng.choice(chats))

    try:
        for _ in range(300):
            op = rng.randrange(12)
            got: Any
            want: Any
            if op == 0:
                e = new()
                args: tuple[Any, ...] = (e,)
                got, want = (
                    await redis.admit(e, retention=RETENTION),
                    await memory.admit(e, retention=RETENTION),
                )
            elif op == 1:
                batch = [new() for _ in range(rng.randrange(1, 6))]
                args = (batch,)
                got = await redis.admit_many(batch, retention=RETENTION)
                want = await memory.admit_many(batch, retention=RETENTION)
            elif op in (2, 3, 4):
                lease = float(rng.randrange(0, 20))
                args = (lease,)
                got, want = await redis.take(lease=lease), await memory.take(lease=lease)
                if got is not None and want is not None:
                    held.append((got, want))
            elif op in (5, 6, 7, 8) and held:
                g, w = rng.choice(held)
                kind, secs = rng.randrange(4), float(rng.randrange(0, 10))
                args = (kind, g.id)
                if kind == 0:
                    got, want = await redis.ack(g), await memory.ack(w)
                elif kind == 1:
                    got = await redis.retry(g, delay=secs, error="e")
                    want = await memory.retry(w, delay=secs, error="e")
                elif kind == 2:
                    got, want = await redis.bury(g, error="d"), await memory.bury(w, error="d")
                else:
                    got = await redis.extend(g, lease=secs)
                    want = await memory.extend(w, lease=secs)
            elif op == 9:
                key = f"idem:7:u:{rng.randrange(40)}"
                args = (key,)
                got, want = await redis.redrive(key), await memory.redrive(key)
            elif op == 10:
                args = ()
                got = (
                    await redis.dead_letters(limit=3),
                    await redis.depth(),
                    await redis.entries(),
                )
                want = (
                    await memory.dead_letters(limit=3),
                    await memory.depth(),
                    await memory.entries(),
                )
                got, want = tuple(same(x) for x in got), tuple(same(x) for x in want)
            else:
                clock.advance(float(rng.randrange(0, 8)))
                continue
            assert same(got) == same(want), (op, args)
        assert same(await redis.entries(limit=1000)) == same(await memory.entries(limit=1000))
        assert await redis.stats() == await memory.stats()
        assert await redis.backlog() == await memory.backlog()
    finally:
        await store.close()


# ----------------------------------------------------------------- round trips


async def test_sharded_round_trips_on_a_cluster(
    redis_cluster_url_factory: UrlFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of 100 is three steps of one pipeline per master each; one update is four
    scripts in three steps; a take asks every shard in one pipeline per master, then
    takes with one script; an ack is one script."""
    calls = {"command": 0, "pipeline": 0}
    command, pipeline = ClusterNode.execute_command, ClusterNode.execute_pipeline

    async def counted_command(self: ClusterNode, *args: Any, **kwargs: Any) -> Any:
        calls["command"] += 1
        return await command(self, *args, **kwargs)

    async def counted_pipeline(self: ClusterNode, *args: Any, **kwargs: Any) -> Any:
        calls["pipeline"] += 1
        return await pipeline(self, *args, **kwargs)

    store = RedisStore(redis_cluster_url_factory(), inbox_shards=CLUSTER_INBOX_SHARDS)
    inbox = inbox_of(store)
    try:
        await inbox.admit(entry(1), retention=RETENTION)  # discovery, scripts cached
        got = await inbox.take(lease=LEASE)
        assert got is not None and await inbox.ack(got)
        masters = len(cluster_of(store).get_primaries())
        monkeypatch.setattr(ClusterNode, "execute_command", counted_command)
        monkeypatch.setattr(ClusterNode, "execute_pipeline", counted_pipeline)

        async def count(action: Any) -> tuple[Any, dict[str, int]]:
            calls.update(command=0, pipeline=0)
            result = await action
            return result, dict(calls)

        batch = [entry(1000 + i, f"chat:{i % 40}") for i in range(100)]
        answers, n = await count(inbox.admit_many(batch, retention=RETENTION))
        assert answers == [True] * 100
        assert n["command"] == 0 and n["pipeline"] <= 3 * masters
        assert await count(inbox.admit(entry(5, "chat:x"), retention=RETENTION)) == (
            True,
            {"command": 4, "pipeline": 0},
        )
        taken, n = await count(inbox.take(lease=LEASE))
        assert taken is not None and n == {"command": 1, "pipeline": masters}
        assert await count(inbox.ack(taken)) == (True, {"command": 1, "pipeline": 0})
    finally:
        await store.close()


def cluster_of(store: RedisStore) -> RedisCluster:
    assert isinstance(store.client, RedisCluster)
    return store.client
