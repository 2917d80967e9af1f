"""Redis outbox and flood budget specifics: take does not scan entries, settled entries
expire (and only they), one slot per bot on a cluster, keys found without their bot,
racing takers, and a flood budget shared by two OS processes.

The work of a script is counted on a private ``redis-server`` (its ``INFO
commandstats`` counts the commands scripts run), as in ``test_redis_inbox.py``.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from fixtures_redis import private_redis_server
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from telegram_idem import ConfigurationError, ManualClock
from telegram_idem.backends.redis import RedisFloodBudget, RedisOutbox, RedisStore
from telegram_idem.flood import Bucket
from telegram_idem.outbox import AmbiguousPolicy, CallStatus, NewCall, OutboxEntry

pytestmark = pytest.mark.redis

LEASE = 30.0
BOT = 7


def call(
    name: str,
    chat: str | None = "chat:1",
    *,
    bot: int = BOT,
    key: str | None = None,
    priority: int = 0,
    retention: float = 3600.0,
    collapse: str | None = None,
) -> NewCall:
    return NewCall(
        key=key or f"idem:{bot}:o:{name}",
        bot_id=bot,
        method="sendMessage",
        params=b'{"chat_id":1,"text":"' + name.encode() + b'"}',
        ordering_key=chat,
        collapse_key=collapse,
        policy=AmbiguousPolicy.HOLD,
        priority=priority,
        retention=retention,
    )


def outbox_of(store: RedisStore) -> RedisOutbox:
    outbox = store.outbox()
    assert isinstance(outbox, RedisOutbox)
    assert store.outbox() is outbox  # one instance per store
    return outbox


async def enqueue_all(outbox: RedisOutbox, calls: list[NewCall]) -> None:
    """Enqueue ``calls`` in their order (one after the other: their seqs follow it)."""
    for c in calls:
        await outbox.enqueue(c)


# ----------------------------------------------------------------- take does not scan


@pytest.fixture(scope="module")
def stats_port() -> Iterator[int]:
    """A private redis-server whose command statistics only this module touches."""
    yield from private_redis_server("idem-redis-outbox-test-")


@pytest.fixture
async def private(stats_port: int) -> AsyncIterator[tuple[RedisStore, Redis]]:
    admin = Redis(port=stats_port)
    await admin.flushall()
    store = RedisStore(f"redis://127.0.0.1:{stats_port}/0")
    yield store, admin
    await store.close()
    await admin.aclose()


async def commands_run(admin: Redis, action: Callable[[], object]) -> tuple[object, int]:
    """``action()``'s result, and how many commands the server ran for it (scripts'
    inner commands included, the script calls themselves left out)."""
    before = await admin.info("commandstats")
    result = await action()  # type: ignore[misc]
    after = await admin.info("commandstats")
    outer = {"cmdstat_evalsha", "cmdstat_eval", "cmdstat_info"}
    ran = sum(
        stats["calls"] - before.get(name, {}).get("calls", 0)
        for name, stats in after.items()
        if name not in outer
    )
    return result, ran


async def test_take_costs_the_same_with_10000_entries_waiting_in_a_chat(
    private: tuple[RedisStore, Redis],
) -> None:
    store, admin = private
    outbox = outbox_of(store)
    # small: 10 entries in chat:big, 1 in chat:other
    await enqueue_all(outbox, [call(f"s{i}", "chat:big") for i in range(10)])
    await outbox.enqueue(call("s-other", "chat:other"))
    head, small_first = await commands_run(admin, lambda: outbox.take(bot_id=BOT, lease=LEASE))
    assert isinstance(head, OutboxEntry) and head.key == "idem:7:o:s0"
    other, small_second = await commands_run(admin, lambda: outbox.take(bot_id=BOT, lease=LEASE))
    assert isinstance(other, OutboxEntry) and other.key == "idem:7:o:s-other"

    # large: the same shape with 10 000 entries waiting behind the big chat's head
    await admin.flushall()
    outbox = outbox_of(RedisStore(store.client))
    await enqueue_all(outbox, [call(f"b{i}", "chat:big") for i in range(10_000)])
    await outbox.enqueue(call("b-other", "chat:other"))
    head, large_first = await commands_run(admin, lambda: outbox.take(bot_id=BOT, lease=LEASE))
    assert isinstance(head, OutboxEntry) and head.key == "idem:7:o:b0"
    # the big chat is busy (its head in flight): the other chat is taken in one call
    other, large_second = await commands_run(admin, lambda: outbox.take(bot_id=BOT, lease=LEASE))
    assert isinstance(other, OutboxEntry) and other.key == "idem:7:o:b-other"
    nothing, large_third = await commands_run(admin, lambda: outbox.take(bot_id=BOT, lease=LEASE))
    assert nothing is None
    # O(1) in the entries: the same commands whatever waits behind the heads
    assert (large_first, large_second) == (small_first, small_second)
    assert large_third < 20
    assert (await outbox.counts(bot_id=BOT))[CallStatus.PENDING] == 9_999


# ----------------------------------------------------------------- expiry


async def test_settled_entries_expire_after_their_retention_and_live_ones_never(
    redis_url_factory: Callable[[], str],
) -> None:
    store = RedisStore(redis_url_factory())  # the server's clock: real expiry
    outbox = outbox_of(store)
    client = store.client
    try:
        base = outbox.base(BOT)
        await outbox.enqueue(call("done", "chat:a", retention=0.5))
        await outbox.enqueue(call("old", "chat:b", retention=0.5, collapse="c"))
        await outbox.enqueue(call("new", "chat:b", retention=0.5, collapse="c"))  # supersedes
        await outbox.enqueue(call("dead", "chat:c", retention=0.5))
        await outbox.enqueue(call("waiting", "chat:d", retention=0.5))
        taken = {}
        for _ in range(3):
            entry = await outbox.take(bot_id=BOT, lease=LEASE)
            assert entry is not None
            taken[entry.key.rsplit(":", 1)[1]] = entry
        assert set(taken) == {"done", "new", "dead"}
        assert await outbox.deliver(taken["done"], result=b'{"message_id":1}')
        assert await outbox.settle(taken["dead"], status=CallStatus.DEAD, error="400")
        assert 0 < await client.pttl(f"{base}e:idem:7:o:done") <= 500
        assert 0 < await client.pttl(f"{base}e:idem:7:o:old") <= 500
        for live in ("dead", "new", "waiting"):  # dead, in flight, pending: no TTL
            assert await client.pttl(f"{base}e:idem:7:o:{live}") == -1
        await asyncio.sleep(1.2)
        assert await outbox.get("idem:7:o:done") is None
        assert await outbox.get("idem:7:o:old") is None
        assert not await client.exists(f"{base}e:idem:7:o:done", f"{base}e:idem:7:o:old")
        counts = await outbox.counts(bot_id=BOT)
        assert counts == {CallStatus.DEAD: 1, CallStatus.IN_FLIGHT: 1, CallStatus.PENDING: 1}
        assert await client.zcard(f"{base}s:delivered") == 0  # the index forgot them too
        assert await client.zcard(f"{base}x") == 0
        again, stored = await outbox.enqueue(call("done", "chat:a", retention=0.5))
        assert stored and again.status is CallStatus.PENDING  # the key is free again
    finally:
        await store.close()


async def test_a_test_clock_drives_retention(redis_url_factory: Callable[[], str]) -> None:
    clock = ManualClock()
    store = RedisStore(redis_url_factory(), clock=clock)
    outbox = outbox_of(store)
    try:
        await outbox.enqueue(call("a", retention=60.0))
        entry = await outbox.take(bot_id=BOT, lease=LEASE)
        assert entry is not None and await outbox.deliver(entry, result=b"true")
        clock.advance(59.0)
        assert (await outbox.enqueue(call("a", retention=60.0)))[1] is False  # replayed
        clock.advance(2.0)
        assert await outbox.get("idem:7:o:a") is None
        assert await outbox.entries(status=CallStatus.DELIVERED) == []
        assert (await outbox.enqueue(call("a", retention=60.0)))[1] is True
    finally:
        await store.close()


# ----------------------------------------------------------------- keys without their bot


async def test_entries_are_found_by_key_alone_for_any_bot_and_any_key(
    redis_url_factory: Callable[[], str],
) -> None:
    store = RedisStore(redis_url_factory(), clock=ManualClock())
    outbox = outbox_of(store)
    try:
        await outbox.enqueue(call("x", bot=5, key="plain key without a bot"))
        await outbox.enqueue(call("y", bot=6, key="idem:5:o:looks-like-bot-5"))  # a wrong hint
        await outbox.enqueue(call("z", bot=-100))
        found = await outbox.get("plain key without a bot")
        assert found is not None and found.bot_id == 5
        found = await outbox.get("idem:5:o:looks-like-bot-5")
        assert found is not None and found.bot_id == 6
        found = await outbox.get("idem:-100:o:z")
        assert found is not None and found.bot_id == -100
        assert await outbox.get("idem:5:o:missing") is None
        # a second store object (another process) finds them through the directory
        other = outbox_of(
            RedisStore(store.client, clock=ManualClock(), key_prefix=store.key_prefix)
        )
        assert (await other.get("plain key without a bot")) == await outbox.get(
            "plain key without a bot"
        )
        pending = await other.entries(status=CallStatus.PENDING)
        assert [e.key for e in pending] == [
            "plain key without a bot",
            "idem:5:o:looks-like-bot-5",
            "idem:-100:o:z",
        ]  # store-wide seq on a single node: enqueue order across bots
        assert (await other.counts())[CallStatus.PENDING] == 3
    finally:
        await store.close()


async def _lost_directory_comes_back_with_the_next_enqueue(url: str) -> None:
    store = RedisStore(url, clock=ManualClock())
    outbox = outbox_of(store)  # stays alive, as a running bot's does
    try:
        await outbox.enqueue(call("before"))
        assert (await outbox.counts())[CallStatus.PENDING] == 1
        # Redis loses the bot directory (a restart without persistence loses it all)
        await store.client.delete(f"{outbox.directory}bots")
        assert await outbox.counts() == {}
        await outbox.enqueue(call("after"))
        assert (await outbox.counts())[CallStatus.PENDING] == 2
        pending = await outbox.entries(status=CallStatus.PENDING)
        assert [e.key for e in pending] == [f"idem:{BOT}:o:before", f"idem:{BOT}:o:after"]
        # an unknown send is listed store-wide, not only with its bot named
        entry = await outbox.take(bot_id=BOT, lease=LEASE)
        assert entry is not None
        await outbox.settle(entry, status=CallStatus.UNKNOWN, error="no answer")
        assert (await outbox.counts())[CallStatus.UNKNOWN] == 1
        unknown = await outbox.entries(status=CallStatus.UNKNOWN)
        assert [e.key for e in unknown] == [f"idem:{BOT}:o:before"]
    finally:
        await store.close()


async def test_a_lost_bot_directory_is_whole_again_with_the_next_enqueue(
    redis_url_factory: Callable[[], str],
) -> None:
    await _lost_directory_comes_back_with_the_next_enqueue(redis_url_factory())


async def test_a_lost_bot_directory_is_whole_again_with_the_next_enqueue_on_a_cluster(
    redis_cluster_url_factory: Callable[[], str],
) -> None:
    await _lost_directory_comes_back_with_the_next_enqueue(redis_cluster_url_factory())


# ----------------------------------------------------------------- racing takers


async def _race(url: str) -> None:
    stores = [RedisStore(url) for _ in range(3)]
    try:
        outboxes = [outbox_of(s) for s in stores]
        await enqueue_all(
            outboxes[0],
            [call(f"{chat}-{n}", f"chat:{chat}") for n in range(5) for chat in range(8)],
        )
        seen: list[str] = []
        while len(seen) < 40:
            taken = await asyncio.gather(
                *(outboxes[i % 3].take(bot_id=BOT, lease=LEASE) for i in range(12))
            )
            got = [t for t in taken if t is not None]
            assert got, "nothing takeable while entries are pending"
            assert len(got) == len({t.ordering_key for t in got})  # one per chat at once
            seen += [t.key for t in got]
            results = await asyncio.gather(
                *(outboxes[(i + 1) % 3].deliver(t, result=b"true") for i, t in enumerate(got))
            )
            assert all(results)
        for chat in range(8):  # each chat in enqueue order
            mine = [int(k.rsplit("-", 1)[1]) for k in seen if k.startswith(f"idem:7:o:{chat}-")]
            assert mine == list(range(5))
        assert await outboxes[1].counts(bot_id=BOT) == {CallStatus.DELIVERED: 40}
    finally:
        for store in stores:
            await store.close()


async def test_racing_takers_on_separate_clients_hold_one_entry_per_chat(
    redis_url_factory: Callable[[], str],
) -> None:
    await _race(redis_url_factory())


async def test_racing_takers_on_a_cluster(redis_cluster_url_factory: Callable[[], str]) -> None:
    await _race(redis_cluster_url_factory())


# ----------------------------------------------------------------- cluster


async def test_cluster_keeps_each_bots_outbox_and_budgets_in_one_slot(
    redis_cluster_url_factory: Callable[[], str],
) -> None:
    store = RedisStore(redis_cluster_url_factory(), clock=ManualClock())
    outbox = outbox_of(store)
    flood = store.flood_budget()
    assert isinstance(flood, RedisFloodBudget) and store.flood_budget() is flood
    client = store.client
    assert isinstance(client, RedisCluster)
    try:
        for bot in (7, 8):
            for i, chat in enumerate(["chat:a", "chat:{b}", None, "chat:a"]):
                collapse = "edit" if chat == "chat:a" else None  # the last supersedes the first
                await outbox.enqueue(call(f"{bot}-{i}", chat, bot=bot, collapse=collapse))
            entry = await outbox.take(bot_id=bot, lease=LEASE)
            assert entry is not None and await outbox.park(entry, error="403")
            entry = await outbox.take(bot_id=bot, lease=LEASE)
            assert entry is not None and await outbox.deliver(entry, result=b"{}")
        buckets = [
            Bucket.gate("idem:7:f:pause"),
            Bucket("idem:7:f:global", 1 / 30, 30),
            Bucket("idem:7:f:chat:-100", 3.0, 3),
        ]
        assert await flood.reserve(buckets) == 0.0
        for bot in (7, 8):
            base = outbox.base(bot)
            slot = await client.cluster_keyslot(base)
            keys = [k async for k in client.scan_iter(match=f"{base}*")]
            assert len(keys) > 8
            for key in keys:
                assert await client.cluster_keyslot(key.decode()) == slot, key
        budget_slots = {await client.cluster_keyslot(flood.redis_key(b.key)) for b in buckets}
        assert len(budget_slots) == 1
        with pytest.raises(ConfigurationError, match="one slot"):
            await flood.reserve([Bucket.gate("idem:7:f:pause"), Bucket.gate("idem:8:f:pause")])
        found = await outbox.get("idem:8:o:8-1")
        assert found is not None and found.bot_id == 8
        parked = await outbox.parked_units()
        assert parked == [(7, "chat:{b}"), (8, "chat:{b}")]
        superseded = await outbox.get("idem:7:o:7-0")
        assert superseded is not None and superseded.status is CallStatus.SUPERSEDED
    finally:
        await store.close()


# ----------------------------------------------------------------- flood across processes

_RESERVER = textwrap.dedent(
    """
    import asyncio, sys
    from telegram_idem.backends.redis import RedisStore
    from telegram_idem.flood import Bucket

    async def main() -> None:
        store = RedisStore(sys.argv[1])
        budget = store.flood_budget()
        buckets = [Bucket.gate("idem:7:f:pause"), Bucket("idem:7:f:chat:1", 60.0, 5)]
        sys.stdin.readline()  # start together
        passed = 0
        for _ in range(20):
            passed += await budget.reserve(buckets) == 0.0
        print(passed, flush=True)
        await store.close()

    asyncio.run(main())
    """
)


async def test_two_processes_share_one_flood_budget(redis_url_factory: Callable[[], str]) -> None:
    url = redis_url_factory()
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _RESERVER,
            url,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for _ in range(2)
    ]
    runs = await asyncio.wait_for(
        asyncio.gather(*(p.communicate(b"go\n") for p in procs)), timeout=60
    )
    outputs = [out.decode() for out, _ in runs]
    assert all(p.returncode == 0 for p in procs)
    passed = [int(out.strip()) for out in outputs]
    assert sum(passed) == 5, passed  # the burst of the shared bucket, not 5 each
    store = RedisStore(url)
    try:
        budget = store.flood_budget()
        wait = await budget.reserve([Bucket("idem:7:f:chat:1", 60.0, 5)])
        assert 55.0 < wait <= 60.0  # the next call waits one interval, for everyone
        await budget.pause("idem:7:f:pause", 5.0)
        await budget.pause("idem:7:f:pause", 1.0)  # never shortens
        assert 4.0 < await budget.paused_for("idem:7:f:pause") <= 5.0
        key = budget.redis_key("idem:7:f:chat:1") if isinstance(budget, RedisFloodBudget) else ""
        ttl = await store.client.pttl(key)
        assert 60_000 < ttl <= 5 * 60_000 + 60_000  # a minute after its tat
    finally:
        await store.close()


async def test_cluster_seqs_stay_unique_when_enqueues_race(
    redis_cluster_url_factory: Callable[[], str],
) -> None:
    url = redis_cluster_url_factory()
    stores = [RedisStore(url) for _ in range(3)]
    try:
        outboxes = [outbox_of(s) for s in stores]
        answers = await asyncio.gather(
            *(outboxes[i % 3].enqueue(call(f"r{i}", "chat:1", bot=7 + i % 2)) for i in range(30))
        )
        seqs = [entry.seq for entry, _ in answers]
        assert len(set(seqs)) == 30  # store-wide unique, across bots and processes
        for bot in (7, 8):  # each bot's chat goes out in seq order
            order = []
            while (entry := await outboxes[0].take(bot_id=bot, lease=LEASE)) is not None:
                order.append(entry.seq)
                assert await outboxes[0].deliver(entry, result=b"true")
            assert order == sorted(order) and len(order) == 15
    finally:
        for store in stores:
            await store.close()
