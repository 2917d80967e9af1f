"""PostgreSQL inbox specifics: round trips, concurrent takers on separate connections, the
per-chat admission lock, redrive to the tail, admission parity with
``logic.admitted_record``, the schema, and a model check against the memory inbox.

The inbox contract itself runs in tests/stores/test_conformance.py (``-k Postgres``).
Round trips are counted at asyncpg's protocol layer, as in tests/stores/test_postgres.py:
each protocol call (``prepare``, ``bind_execute``…) is one Sync and one ReadyForQuery.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
from fixtures_postgres import drop_tables, postgres_reachable_or_missing, with_option
from pg_counting import Trips, counting_connection_class
from services import postgres_dsn

from telegram_idem import ConfigurationError, ManualClock, Outcome, Status, StoreError
from telegram_idem import _inbox_logic as logic
from telegram_idem._records import Record
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.backends.postgres import (
    INBOX_COLUMNS,
    PostgresInbox,
    PostgresStore,
    create_ddl,
    migrate,
)
from telegram_idem.inbox._base import EntryStatus, Inbox, InboxEntry, NewEntry

pytestmark = pytest.mark.postgres

LEASE = 30.0
RETENTION = 3600.0

# ----------------------------------------------------------------- helpers


def entry(update_id: int, chat: str | None = "chat:1") -> NewEntry:
    payload = json.dumps({"update_id": update_id}).encode()
    return NewEntry(f"idem:7:u:{update_id}", chat, payload)


def prefix_of(url: str) -> str:
    return dict(p.split("=", 1) for p in urlsplit(url).query.split("&"))["table_prefix"]


def inbox_of(store: PostgresStore) -> PostgresInbox:
    inbox = store.inbox()
    assert isinstance(inbox, PostgresInbox)
    return inbox


async def raw_record(prefix: str, key: str) -> Record | None:
    """The stored record, expired or not (``store.get`` hides expired ones)."""
    conn = await asyncpg.connect(postgres_dsn())
    try:
        row = await conn.fetchrow(f"SELECT * FROM {prefix}_records WHERE key = $1", key)
    finally:
        await conn.close()
    if row is None:
        return None
    return Record(
        row["key"],
        Status(row["status"]),
        row["fencing_token"],
        row["lease_expires_at"],
        row["expires_at"],
        row["fingerprint"],
        row["result"],
        row["attempts"],
    )


@pytest.fixture
async def closing() -> AsyncIterator[Callable[[PostgresStore], PostgresStore]]:
    """Register stores to close at teardown."""
    made: list[PostgresStore] = []

    def keep(store: PostgresStore) -> PostgresStore:
        made.append(store)
        return store

    yield keep
    for store in made:
        await store.close()


@pytest.fixture
async def fresh_prefix() -> AsyncIterator[str]:
    """A table prefix with NO tables made; dropped after."""
    postgres_reachable_or_missing()
    prefix = f"t{os.urandom(6).hex()}"
    yield prefix
    await drop_tables(postgres_dsn(), [prefix])


# ----------------------------------------------------------------- round trips


async def test_every_inbox_call_is_one_round_trip(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    trips = Trips()
    url = with_option(postgres_url_factory(), "min_size=1&max_size=1&purge_every=0")
    store = closing(PostgresStore.from_url(url, clock=clock))
    store.connection.connect_kwargs["connection_class"] = counting_connection_class(trips)
    inbox = store.inbox()

    # warm every statement once (a new connection prepares each statement on first use)
    await inbox.admit(entry(9000, "chat:w"), retention=RETENTION)
    await inbox.admit_many([entry(9001, "chat:w2")], retention=RETENTION)
    w = await inbox.take(lease=LEASE)
    assert w is not None
    await inbox.extend(w, lease=LEASE)
    await inbox.retry(w, delay=0, error="x")
    w = await inbox.take(lease=LEASE)
    assert w is not None
    await inbox.bury(w, error="x")
    await inbox.redrive(w.id)
    await inbox.dead_letters()
    await inbox.depth()
    await inbox.get(w.id)
    await inbox.entries()
    await inbox.entries(status=EntryStatus.DEAD)
    await inbox.stats()
    await inbox.backlog()
    await inbox.drop("idem:7:u:nothing")
    for _ in range(2):
        w2 = await inbox.take(lease=LEASE)
        assert w2 is not None
        await inbox.ack(w2)

    trips.clear()
    assert await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
    assert trips.names == ["bind_execute"], "admit (enqueued)"
    trips.clear()
    assert not await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
    assert trips.names == ["bind_execute"], "admit (duplicate)"

    trips.clear()
    taken = await inbox.take(lease=LEASE)
    assert taken is not None and taken.id == "idem:7:u:1"
    assert trips.names == ["bind_execute"], "take (an entry)"
    trips.clear()
    assert await inbox.take(lease=LEASE) is None
    assert trips.names == ["bind_execute"], "take (nothing takeable)"

    calls: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("extend", lambda: inbox.extend(taken, lease=LEASE)),
        ("retry", lambda: inbox.retry(taken, delay=0, error="e")),
        ("stale ack", lambda: inbox.ack(taken)),
        ("depth", lambda: inbox.depth()),
        ("dead_letters", lambda: inbox.dead_letters()),
        ("get", lambda: inbox.get(taken.id)),
        ("entries", lambda: inbox.entries()),
        ("entries by status", lambda: inbox.entries(status=EntryStatus.DEAD)),
        ("stats", lambda: inbox.stats()),
        ("backlog", lambda: inbox.backlog()),
        ("drop (not a dead letter)", lambda: inbox.drop(taken.id)),
    ]
    for name, call in calls:
        trips.clear()
        await call()
        assert trips.names == ["bind_execute"], name
    again = await inbox.take(lease=LEASE)
    assert again is not None
    calls = [
        ("bury", lambda: inbox.bury(again, error="e")),
        ("redrive", lambda: inbox.redrive(again.id)),
    ]
    for name, call in calls:
        trips.clear()
        assert await call()
        assert trips.names == ["bind_execute"], name
    last = await inbox.take(lease=LEASE)
    assert last is not None
    trips.clear()
    assert await inbox.ack(last)
    assert trips.names == ["bind_execute"], "ack"

    batch = [entry(100 + i, f"chat:{i % 7}") for i in range(100)]
    trips.clear()
    assert await inbox.admit_many(batch, retention=RETENTION) == [True] * 100
    assert trips.names == ["bind_execute"], "admit_many(100)"
    trips.clear()
    assert await inbox.admit_many(batch, retention=RETENTION) == [False] * 100
    assert trips.names == ["bind_execute"], "admit_many(100) of duplicates"


# ----------------------------------------------------------------- admission


async def test_admit_many_orders_seq_by_the_batch_and_answers_repeats_as_duplicates(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    store = closing(PostgresStore.from_url(postgres_url_factory(), clock=clock))
    inbox = store.inbox()
    # update ids whose keys sort the other way round ("idem:7:u:9" > "idem:7:u:10")
    batch = [entry(9, "chat:a"), entry(10, "chat:a"), entry(9, "chat:a"), entry(8, None)]
    assert await inbox.admit_many(batch, retention=RETENTION) == [True, True, False, True]
    assert await inbox.admit_many([], retention=RETENTION) == []
    taken = [await inbox.take(lease=LEASE) for _ in range(3)]
    assert [t.id if t else None for t in taken] == ["idem:7:u:9", "idem:7:u:8", None]
    assert taken[1] is not None and taken[1].ordering_key == "idem:7:u:8"  # its own unit
    assert taken[0] is not None and await inbox.ack(taken[0])
    nxt = await inbox.take(lease=LEASE)
    assert nxt is not None and nxt.id == "idem:7:u:10" and nxt.seq > taken[0].seq


@pytest.mark.parametrize(
    "situation",
    ["absent", "completed", "failed", "in progress", "lease over", "retention over"],
)
async def test_admission_writes_the_record_logic_admitted_record_writes(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
    situation: str,
) -> None:
    url = postgres_url_factory()
    store = closing(PostgresStore.from_url(url, clock=clock))
    key = "idem:7:u:1"
    if situation != "absent":
        claim = await store.claim(key, fingerprint="fp", lease=10.0, retention=100.0)
        assert claim.outcome is Outcome.ACQUIRED
        if situation == "completed":
            await store.complete(key, claim.token, b"r", retention=100.0)
        elif situation == "failed":
            await store.fail(key, claim.token, b"e", retention=100.0)
        elif situation == "lease over":
            clock.advance(11)
        elif situation == "retention over":
            clock.advance(101)
    before = await raw_record(prefix_of(url), key)
    expected = logic.admitted_record(before, key, clock(), RETENTION)

    admitted = await store.inbox().admit(entry(1), retention=RETENTION)

    after = await raw_record(prefix_of(url), key)
    assert admitted is (expected is not None)
    assert after == (expected if expected is not None else before)
    assert await store.inbox().depth() == (1 if admitted else 0)


async def test_readmission_after_the_record_expired_replaces_the_entry_keeping_its_token(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    store = closing(PostgresStore.from_url(postgres_url_factory(), clock=clock))
    inbox = store.inbox()
    assert await inbox.admit(entry(1), retention=60.0)
    stale = await inbox.take(lease=600.0)
    assert stale is not None and stale.token == 1
    clock.advance(61)  # the update guard forgot the update; its entry is still in flight
    assert await inbox.admit(entry(1), retention=60.0)
    assert await inbox.depth() == 1
    assert not await inbox.ack(stale)  # the old holder cannot finish the new entry
    fresh = await inbox.take(lease=LEASE)
    assert fresh is not None
    assert (fresh.id, fresh.attempts, fresh.token) == (stale.id, 1, 2)
    assert fresh.seq > stale.seq


async def test_admissions_of_one_chat_commit_in_seq_order(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    """An admission that drew its seq but has not committed holds its chat's advisory
    lock: a later admission of that chat waits (so it cannot become visible, and be
    taken, before the earlier entry); other chats do not wait."""
    url = postgres_url_factory()
    store = closing(PostgresStore.from_url(url))  # server clock: the SQL has 4 parameters
    inbox = inbox_of(store)
    conn = await asyncpg.connect(postgres_dsn())
    try:
        tx = conn.transaction()
        await tx.start()
        first = entry(1, "chat:a")
        wrote = await conn.fetch(
            inbox._sql["admit"], first.update_key, "chat:a", first.payload, RETENTION
        )
        assert [r["id"] for r in wrote] == [first.update_key]  # seq drawn, not committed

        later = asyncio.create_task(inbox.admit(entry(2, "chat:a"), retention=RETENTION))
        await asyncio.sleep(0.3)
        assert not later.done()  # waits for the chat's lock
        assert await inbox.admit(entry(3, "chat:b"), retention=RETENTION)  # does not wait
        other = await inbox.take(lease=LEASE)
        assert other is not None and other.id == "idem:7:u:3"
        assert await inbox.take(lease=LEASE) is None  # chat a: nothing visible yet
        await tx.commit()
    finally:
        await conn.close()
    assert await asyncio.wait_for(later, 10) is True
    head = await inbox.take(lease=LEASE)
    assert head is not None and head.id == "idem:7:u:1"
    assert await inbox.take(lease=LEASE) is None  # entry 2 waits behind entry 1
    assert await inbox.ack(head)
    nxt = await inbox.take(lease=LEASE)
    assert nxt is not None and nxt.id == "idem:7:u:2" and nxt.seq > head.seq


# ----------------------------------------------------------------- redrive


async def test_a_redriven_dead_letter_goes_to_the_tail_of_its_chat(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    store = closing(PostgresStore.from_url(postgres_url_factory(), clock=clock))
    inbox = store.inbox()
    for uid in (1, 2, 3):
        await inbox.admit(entry(uid, "chat:a"), retention=RETENTION)
    poison = await inbox.take(lease=LEASE)
    assert poison is not None and await inbox.bury(poison, error="bad")
    busy = await inbox.take(lease=LEASE)
    assert busy is not None and busy.id == "idem:7:u:2"
    assert await inbox.redrive(poison.id)
    # at its old place it would be the head of a chat with entry 2 in flight
    assert await inbox.take(lease=LEASE) is None
    assert await inbox.ack(busy)
    order = []
    for _ in range(2):
        t = await inbox.take(lease=LEASE)
        assert t is not None
        order.append((t.id, t.attempts, t.last_error))
        assert await inbox.ack(t)
    assert order == [("idem:7:u:3", 1, None), (poison.id, 1, "bad")]
    assert not await inbox.redrive(poison.id)  # acked: nothing to redrive
    assert not await inbox.redrive("idem:7:u:404")


# ----------------------------------------------------------------- concurrency


async def test_20_takers_on_20_connections_never_share_an_entry_or_a_chat(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    """20 workers, each on its own connection (server clock), drain 5 chats while 4 more
    connections keep admitting to the same chats. A monitor on another connection checks
    the table itself: never two entries of one chat in flight."""
    url = postgres_url_factory()
    table = f"{prefix_of(url)}_inbox"
    one_conn = with_option(url, "min_size=1&max_size=1")
    takers = [closing(PostgresStore.from_url(one_conn)).inbox() for _ in range(20)]
    admitters = [closing(PostgresStore.from_url(one_conn)).inbox() for _ in range(4)]
    chats = [f"chat:{c}" for c in range(5)]
    initial = [entry(uid, chats[uid % 5]) for uid in range(100)]
    assert await admitters[0].admit_many(initial, retention=RETENTION) == [True] * 100
    total = 200
    in_flight: dict[str, str] = {}
    processed: dict[str, list[tuple[int, str]]] = {c: [] for c in chats}
    taken_ids: list[str] = []
    violations: list[str] = []
    done = asyncio.Event()

    async def admit_more(i: int) -> None:
        rng = random.Random(i)
        for uid in range(100 + i, 200, 4):
            await admitters[i].admit(entry(uid, chats[uid % 5]), retention=RETENTION)
            await asyncio.sleep(rng.random() * 0.004)

    async def work(inbox: Inbox, seed: int) -> None:
        rng = random.Random(seed)
        while not done.is_set():
            got = await inbox.take(lease=LEASE)
            if got is None:
                await asyncio.sleep(0.002)
                continue
            if got.ordering_key in in_flight:
                violations.append(f"{got.id} taken while {in_flight[got.ordering_key]} held")
            in_flight[got.ordering_key] = got.id
            taken_ids.append(got.id)
            processed[got.ordering_key].append((got.seq, got.id))
            if (got.attempts, got.token) != (1, 1):
                violations.append(f"{got.id} taken again: {got}")
            await asyncio.sleep(rng.random() * 0.003)
            del in_flight[got.ordering_key]  # before the ack commits: no false alarm
            if not await inbox.ack(got):
                violations.append(f"{got.id} could not be acked")
            if len(taken_ids) == total:
                done.set()

    async def monitor() -> None:
        conn = await asyncpg.connect(postgres_dsn())
        try:
            while not done.is_set():
                rows = await conn.fetch(
                    f"SELECT ordering_key, count(*) FROM {table} WHERE status = 'in_flight' "
                    "GROUP BY ordering_key HAVING count(*) > 1"
                )
                violations.extend(f"in the table: {dict(r)}" for r in rows)
                await asyncio.sleep(0.001)
        finally:
            await conn.close()

    tasks = [asyncio.create_task(work(t, i)) for i, t in enumerate(takers)]
    tasks.append(asyncio.create_task(monitor()))
    await asyncio.gather(*(admit_more(i) for i in range(4)))
    await asyncio.wait_for(done.wait(), 60)
    await asyncio.gather(*tasks)

    assert violations == []
    assert len(taken_ids) == len(set(taken_ids)) == total
    for chat, seen in processed.items():
        assert seen == sorted(seen), f"{chat} processed out of admission order"
        assert len(seen) == total // 5
    assert await takers[0].depth() == 0


async def test_racing_takers_of_expired_leases_take_each_entry_once(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    url = with_option(postgres_url_factory(), "min_size=1&max_size=1")
    inboxes = [closing(PostgresStore.from_url(url, clock=clock)).inbox() for _ in range(20)]
    for uid in range(10):
        await inboxes[0].admit(entry(uid, f"chat:{uid}"), retention=RETENTION)
    first = await asyncio.gather(*(i.take(lease=LEASE) for i in inboxes))
    assert sorted(t.id for t in first if t) == sorted(f"idem:7:u:{u}" for u in range(10))
    clock.advance(LEASE)  # every worker died
    second = await asyncio.gather(*(i.take(lease=LEASE) for i in inboxes))
    heirs = [t for t in second if t]
    assert len(heirs) == len({t.id for t in heirs}) == 10
    assert {(t.attempts, t.token) for t in heirs} == {(2, 2)}


# ----------------------------------------------------------------- schema


async def test_migrate_creates_the_inbox_table_idempotently(fresh_prefix: str) -> None:
    await migrate(postgres_dsn(), table_prefix=fresh_prefix)
    await migrate(postgres_dsn(), table_prefix=fresh_prefix)
    conn = await asyncpg.connect(postgres_dsn())
    try:
        cols = await conn.fetch(
            "SELECT column_name, data_type, is_nullable, is_identity "
            "FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position",
            f"{fresh_prefix}_inbox",
        )
        indexes = await conn.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = $1",
            f"{fresh_prefix}_inbox",
        )
    finally:
        await conn.close()
    assert tuple(c["column_name"] for c in cols) == INBOX_COLUMNS
    assert {c["column_name"]: (c["data_type"], c["is_nullable"]) for c in cols} == {
        "seq": ("bigint", "NO"),
        "id": ("text", "NO"),
        "ordering_key": ("text", "NO"),
        "payload": ("bytea", "NO"),
        "status": ("text", "NO"),
        "attempts": ("integer", "NO"),
        "token": ("bigint", "NO"),
        "available_at": ("double precision", "NO"),
        "lease_expires_at": ("double precision", "NO"),
        "last_error": ("text", "YES"),
        "admitted_at": ("double precision", "NO"),
    }
    assert cols[0]["is_identity"] == "YES"
    by_name = {i["indexname"]: i["indexdef"] for i in indexes}
    assert set(by_name) == {
        f"{fresh_prefix}_inbox_pkey",
        f"{fresh_prefix}_inbox_id_key",
        f"{fresh_prefix}_inbox_heads_idx",
        f"{fresh_prefix}_inbox_busy_idx",
        f"{fresh_prefix}_inbox_status_idx",
    }
    assert "(status, seq)" in by_name[f"{fresh_prefix}_inbox_status_idx"]
    heads = by_name[f"{fresh_prefix}_inbox_heads_idx"]
    assert "(ordering_key, seq)" in heads and "WHERE (status <> 'dead'::text)" in heads
    busy = by_name[f"{fresh_prefix}_inbox_busy_idx"]
    assert "(ordering_key)" in busy and "(attempts > 0)" in busy


def test_ddl_adds_the_inbox_after_the_records() -> None:
    ddl = create_ddl("idem")
    assert ddl[0].startswith("CREATE TABLE IF NOT EXISTS idem_records")
    assert ddl[2].startswith("CREATE TABLE IF NOT EXISTS idem_inbox")
    assert "GENERATED BY DEFAULT AS IDENTITY" in ddl[2]
    assert ddl[3:7] == [
        # a table made before admitted_at gains it (0 for the entries already there)
        "ALTER TABLE idem_inbox ADD COLUMN IF NOT EXISTS admitted_at "
        "DOUBLE PRECISION NOT NULL DEFAULT 0",
        "CREATE INDEX IF NOT EXISTS idem_inbox_busy_idx ON idem_inbox (ordering_key) "
        "WHERE status <> 'dead' AND attempts > 0",
        "CREATE INDEX IF NOT EXISTS idem_inbox_heads_idx ON idem_inbox (ordering_key, seq) "
        "WHERE status <> 'dead'",
        "CREATE INDEX IF NOT EXISTS idem_inbox_status_idx ON idem_inbox (status, seq)",
    ]


async def test_auto_create_makes_the_inbox_table(
    fresh_prefix: str, closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    url = with_option(postgres_dsn(), f"table_prefix={fresh_prefix}&auto_create=1")
    inbox = closing(PostgresStore.from_url(url)).inbox()
    assert await inbox.admit(entry(1), retention=RETENTION)
    assert await inbox.depth() == 1


async def test_a_missing_inbox_table_is_a_configuration_error_naming_it(
    fresh_prefix: str, closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    await migrate(postgres_dsn(), table_prefix=fresh_prefix)
    conn = await asyncpg.connect(postgres_dsn())
    try:
        await conn.execute(f"DROP TABLE {fresh_prefix}_inbox")  # migrated before the inbox
    finally:
        await conn.close()
    store = closing(
        PostgresStore.from_url(with_option(postgres_dsn(), f"table_prefix={fresh_prefix}"))
    )
    with pytest.raises(ConfigurationError, match=f"'{fresh_prefix}_inbox' does not exist"):
        await store.inbox().take(lease=LEASE)
    with pytest.raises(ConfigurationError, match="telegram-idem migrate"):
        await store.inbox().admit(entry(1), retention=RETENTION)
    assert await raw_record(fresh_prefix, "idem:7:u:1") is None  # one statement: no claim
    await store.migrate()
    assert await store.inbox().admit(entry(1), retention=RETENTION)


async def test_a_closed_store_s_inbox_raises_store_error(
    postgres_url_factory: Callable[[], str],
) -> None:
    store = PostgresStore.from_url(postgres_url_factory())
    inbox = store.inbox()
    assert store.inbox() is inbox
    await store.close()
    with pytest.raises(StoreError):
        await inbox.take(lease=LEASE)
    with pytest.raises(StoreError):
        await inbox.admit(entry(1), retention=RETENTION)


# ----------------------------------------------------------------- model check


def _comparable(e: InboxEntry | None) -> InboxEntry | None:
    return None if e is None else replace(e, seq=0)


async def test_random_operations_match_the_memory_inbox(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    """Every answer equals the memory inbox's on the same clock. Left out: redrive (the
    tail here, its old place in memory) and re-admission after the guard record expired
    (the token is kept here, reset in memory); both have their own tests above."""
    pg = closing(PostgresStore.from_url(postgres_url_factory(), clock=clock)).inbox()
    mem = MemoryStore(clock=clock).inbox()
    rng = random.Random(20240607)
    held: list[InboxEntry] = []
    for step in range(400):
        got: tuple[Any, Any]
        op = rng.choice(["admit", "admit", "batch", "take", "take", "done", "extend", "time"])
        if op == "admit":
            e = entry(rng.randrange(60), rng.choice(["chat:a", "chat:b", "chat:c", None]))
            got = (
                await pg.admit(e, retention=RETENTION * 1000),
                await mem.admit(e, retention=RETENTION * 1000),
            )
        elif op == "batch":
            b = [entry(rng.randrange(60), rng.choice(["chat:a", "user:1"])) for _ in range(4)]
            got = (
                await pg.admit_many(b, retention=RETENTION * 1000),
                await mem.admit_many(b, retention=RETENTION * 1000),
            )
        elif op == "take":
            lease = rng.choice([5.0, 20.0])
            a, b2 = await pg.take(lease=lease), await mem.take(lease=lease)
            got = _comparable(a), _comparable(b2)
            if a is not None:
                held.append(a)
        elif op in ("done", "extend") and held:
            h = held.pop(rng.randrange(len(held)))
            how = rng.choice(["ack", "retry", "bury"]) if op == "done" else "extend"
            if how == "ack":
                got = await pg.ack(h), await mem.ack(h)
            elif how == "retry":
                got = (
                    await pg.retry(h, delay=3.0, error="e"),
                    await mem.retry(h, delay=3.0, error="e"),
                )
            elif how == "bury":
                got = await pg.bury(h, error="x"), await mem.bury(h, error="x")
            else:
                got = await pg.extend(h, lease=10.0), await mem.extend(h, lease=10.0)
                held.append(h)
        else:
            clock.advance(rng.choice([1.0, 4.0, 30.0]))
            got = (
                (await pg.depth(), [_comparable(d) for d in await pg.dead_letters()]),
                (await mem.depth(), [_comparable(d) for d in await mem.dead_letters()]),
            )
        assert got[0] == got[1], f"step {step}: {op}"
