"""PostgreSQL outbox and flood budget specifics: ``enqueue_in`` on the bot's own
transaction (asyncpg, SQLAlchemy ``AsyncConnection`` and ``AsyncSession``), takers racing
on one chat from many connections and from two processes, and flood budgets shared by
many connections and two processes.

The outbox contract itself runs in tests/stores/test_outbox_conformance.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
from fixtures_postgres import with_option
from pg_counting import Trips, counting_connection_class
from services import postgres_dsn
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, create_async_engine

from telegram_idem import ConfigurationError
from telegram_idem.backends.postgres import PostgresFloodBudget, PostgresOutbox, PostgresStore
from telegram_idem.flood import Bucket
from telegram_idem.outbox import AmbiguousPolicy, CallStatus, NewCall

pytestmark = pytest.mark.postgres

LEASE = 30.0
BOT = 7


def call(key: str, chat: int = 1, *, collapse: str | None = None) -> NewCall:
    return NewCall(
        key=key,
        bot_id=BOT,
        method="sendMessage",
        params=b'{"chat_id":%d}' % chat,
        ordering_key=f"chat:{chat}",
        collapse_key=collapse,
        policy=AmbiguousPolicy.HOLD,
    )


def prefix_of(url: str) -> str:
    return dict(p.split("=", 1) for p in urlsplit(url).query.split("&"))["table_prefix"]


def outbox_of(store: PostgresStore) -> PostgresOutbox:
    outbox = store.outbox()
    assert isinstance(outbox, PostgresOutbox)
    return outbox


@pytest.fixture
async def closing() -> AsyncIterator[Callable[[PostgresStore], PostgresStore]]:
    made: list[PostgresStore] = []

    def keep(store: PostgresStore) -> PostgresStore:
        made.append(store)
        return store

    yield keep
    for store in made:
        await store.close()


@pytest.fixture
async def setup(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> AsyncIterator[tuple[PostgresOutbox, str]]:
    """The outbox of a migrated store, and a business table ``<prefix>_orders`` beside it."""
    url = postgres_url_factory()
    orders = f"{prefix_of(url)}_orders"
    conn = await asyncpg.connect(postgres_dsn())
    await conn.execute(f"CREATE TABLE {orders} (id int PRIMARY KEY)")
    yield outbox_of(closing(PostgresStore.from_url(url))), orders
    await conn.execute(f"DROP TABLE IF EXISTS {orders}")
    await conn.close()


async def orders_in(table: str) -> list[int]:
    conn = await asyncpg.connect(postgres_dsn())
    try:
        return [r[0] for r in await conn.fetch(f"SELECT id FROM {table} ORDER BY id")]
    finally:
        await conn.close()


# ----------------------------------------------------------------- one shape over 3 kinds


class Tx:
    """One kind of caller transaction: ``begin()`` opens it (a context manager that
    commits on exit, or rolls back with ``rollback()``), ``nested()`` a savepoint, and
    ``conn`` is what ``enqueue_in`` gets. ``exec`` runs the caller's own SQL in it."""

    conn: object

    def begin(self) -> AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    def nested(self) -> AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    async def exec(self, sql: str) -> None:
        raise NotImplementedError

    async def rollback(self, tx: Any) -> None:
        raise NotImplementedError


class Rollback(Exception):
    """Raised inside a block to roll it back."""


class AsyncpgTx(Tx):
    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.raw = conn

    def begin(self) -> AbstractAsyncContextManager[Any]:
        return self.raw.transaction()

    def nested(self) -> AbstractAsyncContextManager[Any]:
        return self.raw.transaction()  # inside a transaction: a savepoint

    async def exec(self, sql: str) -> None:
        await self.raw.execute(sql)


class SAConnTx(Tx):
    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn
        self.sa = conn

    def begin(self) -> AbstractAsyncContextManager[Any]:
        return self.sa.begin()

    def nested(self) -> AbstractAsyncContextManager[Any]:
        return self.sa.begin_nested()

    async def exec(self, sql: str) -> None:
        await self.sa.execute(text(sql))


class SASessionTx(Tx):
    def __init__(self, session: AsyncSession) -> None:
        self.conn = session
        self.session = session

    def begin(self) -> AbstractAsyncContextManager[Any]:
        return self.session.begin()

    def nested(self) -> AbstractAsyncContextManager[Any]:
        return self.session.begin_nested()

    async def exec(self, sql: str) -> None:
        await self.session.execute(text(sql))


def sa_url() -> str:
    return postgres_dsn().replace("postgresql://", "postgresql+asyncpg://", 1)


@pytest.fixture(params=["asyncpg", "sqlalchemy-connection", "sqlalchemy-session"])
async def tx(request: pytest.FixtureRequest) -> AsyncIterator[Tx]:
    """A caller's connection of each kind, on the store's database."""
    if request.param == "asyncpg":
        conn = await asyncpg.connect(postgres_dsn())
        yield AsyncpgTx(conn)
        await conn.close()
        return
    engine = create_async_engine(sa_url())
    try:
        if request.param == "sqlalchemy-connection":
            async with engine.connect() as sa_conn:
                yield SAConnTx(sa_conn)
        else:
            async with AsyncSession(engine) as session:
                yield SASessionTx(session)
    finally:
        await engine.dispose()


async def test_commit_stores_the_entry_and_the_business_row_together(
    tx: Tx, setup: tuple[PostgresOutbox, str]
) -> None:
    outbox, orders = setup
    async with tx.begin():
        await tx.exec(f"INSERT INTO {orders} VALUES (1)")
        entry, written = await outbox.enqueue_in(tx.conn, call("k1"))
        assert written and entry.status is CallStatus.PENDING
        # not committed yet: the store's own connections see nothing, a relay takes nothing
        assert await outbox.get("k1") is None
        assert await outbox.take(bot_id=BOT, lease=LEASE) is None
    assert await orders_in(orders) == [1]
    stored = await outbox.get("k1")
    assert stored is not None and stored.seq == entry.seq
    taken = await outbox.take(bot_id=BOT, lease=LEASE)
    assert taken is not None and taken.key == "k1"


async def test_rollback_leaves_nothing(tx: Tx, setup: tuple[PostgresOutbox, str]) -> None:
    outbox, orders = setup
    with pytest.raises(Rollback):
        async with tx.begin():
            await tx.exec(f"INSERT INTO {orders} VALUES (1)")
            await outbox.enqueue_in(tx.conn, call("k1"))
            raise Rollback
    assert await orders_in(orders) == []
    assert await outbox.get("k1") is None
    assert await outbox.counts() == {}
    # the chat's lock went with the transaction: a later enqueue does not wait
    assert (await asyncio.wait_for(outbox.enqueue(call("k2")), 5))[1]


async def test_a_savepoint_rolled_back_removes_only_its_entry(
    tx: Tx, setup: tuple[PostgresOutbox, str]
) -> None:
    outbox, orders = setup
    async with tx.begin():
        await outbox.enqueue_in(tx.conn, call("outer"))
        with pytest.raises(Rollback):
            async with tx.nested():
                await tx.exec(f"INSERT INTO {orders} VALUES (2)")
                await outbox.enqueue_in(tx.conn, call("inner"))
                raise Rollback
        await tx.exec(f"INSERT INTO {orders} VALUES (1)")
    assert await orders_in(orders) == [1]
    assert await outbox.get("outer") is not None
    assert await outbox.get("inner") is None


async def test_an_outer_rollback_removes_an_inner_savepoint_s_entry(
    tx: Tx, setup: tuple[PostgresOutbox, str]
) -> None:
    outbox, orders = setup
    with pytest.raises(Rollback):
        async with tx.begin():
            async with tx.nested():
                await tx.exec(f"INSERT INTO {orders} VALUES (1)")
                await outbox.enqueue_in(tx.conn, call("inner"))
            raise Rollback
    assert await orders_in(orders) == []
    assert await outbox.get("inner") is None


async def test_a_second_transaction_enqueueing_the_key_waits_and_gets_the_first_entry(
    tx: Tx, setup: tuple[PostgresOutbox, str]
) -> None:
    outbox, _ = setup
    other = await asyncpg.connect(postgres_dsn())
    try:
        async with tx.begin():
            first, written = await outbox.enqueue_in(tx.conn, call("dup"))
            assert written

            async def second() -> tuple[Any, bool]:
                async with other.transaction():
                    return await outbox.enqueue_in(other, call("dup"))

            task = asyncio.create_task(second())
            await asyncio.sleep(0.3)
            assert not task.done()  # blocked on the first transaction
        entry, written = await asyncio.wait_for(task, 10)
    finally:
        await other.close()
    assert not written
    assert entry.seq == first.seq and entry.key == "dup"
    assert await outbox.counts() == {CallStatus.PENDING: 1}


async def test_a_second_transaction_stores_its_own_entry_when_the_first_rolls_back(
    setup: tuple[PostgresOutbox, str],
) -> None:
    outbox, _ = setup
    a, b = await asyncpg.connect(postgres_dsn()), await asyncpg.connect(postgres_dsn())
    try:
        tx_a = a.transaction()
        await tx_a.start()
        await outbox.enqueue_in(a, call("dup"))

        async def second() -> tuple[Any, bool]:
            async with b.transaction():
                return await outbox.enqueue_in(b, call("dup"))

        task = asyncio.create_task(second())
        await asyncio.sleep(0.3)
        assert not task.done()
        await tx_a.rollback()
        _, written = await asyncio.wait_for(task, 10)
    finally:
        await a.close()
        await b.close()
    assert written
    assert await outbox.counts() == {CallStatus.PENDING: 1}


async def test_a_collapsed_entry_is_superseded_only_when_the_caller_commits(
    tx: Tx, setup: tuple[PostgresOutbox, str]
) -> None:
    outbox, _ = setup
    await outbox.enqueue(call("old", collapse="edit:1:5"))
    with pytest.raises(Rollback):
        async with tx.begin():
            await outbox.enqueue_in(tx.conn, call("new", collapse="edit:1:5"))
            raise Rollback
    old = await outbox.get("old")
    assert old is not None and old.status is CallStatus.PENDING
    async with tx.begin():
        await outbox.enqueue_in(tx.conn, call("new", collapse="edit:1:5"))
    old = await outbox.get("old")
    assert old is not None and old.status is CallStatus.SUPERSEDED


async def test_a_call_without_a_collapse_key_is_one_round_trip_on_a_checked_connection(
    setup: tuple[PostgresOutbox, str],
) -> None:
    outbox, _ = setup
    trips = Trips()
    conn = await asyncpg.connect(postgres_dsn(), connection_class=counting_connection_class(trips))
    try:
        async with conn.transaction():
            await outbox.enqueue_in(conn, call("warm"))  # the table check, once
            await outbox.enqueue_in(conn, call("warm-c", collapse="c:0"))  # statements prepared
            trips.clear()
            await outbox.enqueue_in(conn, call("k1"))
            assert trips.names == ["bind_execute"], trips.calls
            trips.clear()
            _, written = await outbox.enqueue_in(conn, call("k1", 2))  # stored already
            assert not written and trips.names == ["bind_execute"], trips.calls
            trips.clear()
            await outbox.enqueue_in(conn, call("k2", collapse="c:1"))  # lock, then enqueue
            assert trips.names == ["bind_execute", "bind_execute"], trips.calls
    finally:
        await conn.close()
    assert await outbox.counts() == {CallStatus.PENDING: 4}


async def test_an_enqueue_waiting_for_the_chat_while_it_is_unparked_stores_a_pending_call(
    setup: tuple[PostgresOutbox, str],
) -> None:
    """The one-statement enqueue reads the parked mark under the chat's lock: a mark an
    unpark deleted while the enqueue waited for it is not read from the older snapshot
    (the call would be stored parked in a chat no longer parked, and stay there)."""
    outbox, _ = setup
    held = await outbox.enqueue(call("first"))
    taken = await outbox.take(bot_id=BOT, lease=LEASE)
    assert taken is not None and taken.key == held[0].key
    assert await outbox.park(taken, error="Forbidden: bot was blocked by the user")
    unparker, bot = await asyncpg.connect(postgres_dsn()), await asyncpg.connect(postgres_dsn())
    try:
        unparking = unparker.transaction()
        await unparking.start()  # an unpark in progress: the chat's lock, the mark gone
        await unparker.execute(
            "SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))",
            outbox.table,
            f"{BOT}:u:chat:1",
        )
        await unparker.execute(f"DELETE FROM {outbox.parked_table}")

        async def enqueue() -> tuple[Any, bool]:
            async with bot.transaction():
                return await outbox.enqueue_in(bot, call("later"))

        task = asyncio.create_task(enqueue())
        await asyncio.sleep(0.3)
        assert not task.done()  # waiting for the chat's lock, its snapshot taken
        await unparking.commit()
        entry, written = await asyncio.wait_for(task, 10)
    finally:
        await unparker.close()
        await bot.close()
    assert written and entry.status is CallStatus.PENDING


# ----------------------------------------------------------------- refusals


async def test_an_unknown_connection_type_is_refused_naming_the_accepted_ones(
    setup: tuple[PostgresOutbox, str],
) -> None:
    outbox, _ = setup
    with pytest.raises(ConfigurationError, match=r"asyncpg Connection.*SQLAlchemy AsyncConnection"):
        await outbox.enqueue_in(object(), call("k"))


async def test_an_asyncpg_connection_outside_a_transaction_is_refused(
    setup: tuple[PostgresOutbox, str],
) -> None:
    outbox, _ = setup
    conn = await asyncpg.connect(postgres_dsn())
    try:
        with pytest.raises(ConfigurationError, match="no open transaction"):
            await outbox.enqueue_in(conn, call("k"))
    finally:
        await conn.close()
    assert await outbox.get("k") is None


async def test_a_database_without_the_store_s_tables_is_refused_and_the_transaction_lives(
    tx: Tx,
    postgres_url_factory: Callable[[], str],
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    # A store whose tables were never made (a prefix of its own): the caller's database
    # has no such tables. The check reads the catalog, so the caller's transaction is
    # not aborted and goes on.
    url = with_option(postgres_dsn(), f"table_prefix=t{os.urandom(6).hex()}")
    outbox = outbox_of(closing(PostgresStore.from_url(url)))
    async with tx.begin():
        with pytest.raises(ConfigurationError, match="not in the database"):
            await outbox.enqueue_in(tx.conn, call("k"))
        await tx.exec("SELECT 1")


# ----------------------------------------------------------------- racing takers


async def test_takers_on_20_connections_keep_one_call_in_flight_per_chat(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    """20 takers (own connection each) drain one busy chat and 3 quiet ones while 2 more
    connections keep enqueueing to them; a monitor on another connection reads the table:
    never two entries of one chat in flight, and each chat delivered in enqueue order."""
    url = postgres_url_factory()
    table = f"{prefix_of(url)}_outbox"
    one = with_option(url, "min_size=1&max_size=1")
    takers = [outbox_of(closing(PostgresStore.from_url(one))) for _ in range(20)]
    writers = [outbox_of(closing(PostgresStore.from_url(one))) for _ in range(2)]
    chat_of = [0] * 6 + [1, 2, 3]  # chat 0 gets two thirds of the calls
    total = 180
    for n in range(90):
        await writers[0].enqueue(call(f"k{n}", chat_of[n % 9]))
    in_flight: dict[str, str] = {}
    order: dict[str, list[int]] = {}
    violations: list[str] = []
    delivered: list[str] = []
    done = asyncio.Event()

    async def write_more(i: int) -> None:
        for n in range(90 + i, total, 2):
            await writers[i].enqueue(call(f"k{n}", chat_of[n % 9]))
            await asyncio.sleep(0.001)

    async def work(outbox: PostgresOutbox) -> None:
        while not done.is_set():
            got = await outbox.take(bot_id=BOT, lease=LEASE)
            if got is None:
                await asyncio.sleep(0.002)
                continue
            if got.ordering_key in in_flight:
                violations.append(f"{got.key} taken while {in_flight[got.ordering_key]} held")
            in_flight[got.ordering_key] = got.key
            order.setdefault(got.ordering_key, []).append(got.seq)
            await asyncio.sleep(0.002)
            del in_flight[got.ordering_key]  # before the deliver commits: no false alarm
            if not await outbox.deliver(got, result=b"{}"):
                violations.append(f"{got.key} could not be delivered")
            delivered.append(got.key)
            if len(delivered) == total:
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

    tasks = [asyncio.create_task(work(t)) for t in takers]
    tasks.append(asyncio.create_task(monitor()))
    await asyncio.gather(*(write_more(i) for i in range(2)))
    await asyncio.wait_for(done.wait(), 60)
    await asyncio.gather(*tasks)
    assert violations == []
    assert sorted(delivered) == sorted(f"k{n}" for n in range(total))
    for chat, seqs in order.items():
        assert seqs == sorted(seqs), f"{chat} delivered out of enqueue order"
    assert await takers[0].counts() == {CallStatus.DELIVERED: total}


_PROCESS_TAKER = textwrap.dedent(
    """
    import asyncio, sys
    import asyncpg
    from telegram_idem.backends.postgres import PostgresStore

    async def main(url, dsn, log, n_tasks):
        stores = [PostgresStore.from_url(url) for _ in range(n_tasks)]
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=n_tasks)
        idle = 0

        async def work(outbox):
            nonlocal idle
            while idle < 200:
                got = await outbox.take(bot_id=7, lease=30.0)
                if got is None:
                    idle += 1
                    await asyncio.sleep(0.005)
                    continue
                idle = 0
                await pool.execute(
                    f"INSERT INTO {log} (chat, seq) VALUES ($1, $2)", got.ordering_key, got.seq
                )
                await asyncio.sleep(0.001)
                assert await outbox.deliver(got, result=b"{}")

        await asyncio.gather(*(work(s.outbox()) for s in stores))
        await pool.close()
        for s in stores:
            await s.close()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
    """
)


async def test_takers_in_two_processes_keep_one_call_in_flight_per_chat(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    """Two processes of 5 takers each drain 4 chats. Each taker logs (chat, seq) in a
    table *while it holds the call*, before delivering: the log's order per chat is
    the order calls were held, so it must follow enqueue order, and a monitor sees no two
    entries of one chat in flight."""
    url = postgres_url_factory()
    prefix = prefix_of(url)
    log = f"{prefix}_log"
    outbox = outbox_of(closing(PostgresStore.from_url(url)))
    total = 120
    for n in range(total):
        await outbox.enqueue(call(f"k{n}", n % 4))
    conn = await asyncpg.connect(postgres_dsn())
    await conn.execute(f"CREATE TABLE {log} (id bigserial PRIMARY KEY, chat text, seq bigint)")
    violations: list[str] = []
    stop = asyncio.Event()

    async def monitor() -> None:
        watch = await asyncpg.connect(postgres_dsn())
        try:
            while not stop.is_set():
                rows = await watch.fetch(
                    f"SELECT ordering_key FROM {prefix}_outbox WHERE status = 'in_flight' "
                    "GROUP BY ordering_key HAVING count(*) > 1"
                )
                violations.extend(r[0] for r in rows)
                await asyncio.sleep(0.001)
        finally:
            await watch.close()

    try:
        watcher = asyncio.create_task(monitor())
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable, "-c", _PROCESS_TAKER, url, postgres_dsn(), log, "5"
            )
            for _ in range(2)
        ]
        codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 120)
        stop.set()
        await watcher
        assert codes == [0, 0]
        rows = await conn.fetch(f"SELECT chat, seq FROM {log} ORDER BY id")
    finally:
        await conn.execute(f"DROP TABLE IF EXISTS {log}")
        await conn.close()
    assert violations == []
    assert len(rows) == total
    by_chat: dict[str, list[int]] = {}
    for r in rows:
        by_chat.setdefault(r["chat"], []).append(r["seq"])
    for chat, seqs in by_chat.items():
        assert seqs == sorted(seqs), f"{chat} held out of enqueue order"
    assert await outbox.counts() == {CallStatus.DELIVERED: total}


# ----------------------------------------------------------------- flood budget


def flood_of(store: PostgresStore) -> PostgresFloodBudget:
    budget = store.flood_budget()
    assert isinstance(budget, PostgresFloodBudget)
    return budget


async def test_a_burst_is_shared_exactly_by_20_connections(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    """A bucket of burst 5 and a long interval, reserved by 20 connections at once (its
    row new: the first reservations race on creating it) and with a second bucket of
    burst 3 in every reservation: exactly 3 pass (all or none), the first bucket keeps 2."""
    url = with_option(postgres_url_factory(), "min_size=1&max_size=1")
    budgets = [flood_of(closing(PostgresStore.from_url(url))) for _ in range(20)]
    wide, narrow = Bucket("f:wide", 100.0, 5), Bucket("f:narrow", 100.0, 3)
    waits = await asyncio.gather(*(b.reserve([wide, narrow]) for b in budgets))
    assert sum(w == 0.0 for w in waits) == 3
    assert all(w > 0 for w in waits if w)
    alone = await asyncio.gather(*(b.reserve([wide]) for b in budgets))
    assert sum(w == 0.0 for w in alone) == 2


async def test_two_connections_reserve_in_either_key_order_without_deadlock(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    url = with_option(postgres_url_factory(), "min_size=1&max_size=1")
    a, b = (flood_of(closing(PostgresStore.from_url(url))) for _ in range(2))
    x, y = Bucket("f:x", 0.0001, 1000), Bucket("f:y", 0.0001, 1000)

    async def spin(budget: PostgresFloodBudget, buckets: list[Bucket]) -> None:
        for _ in range(100):
            assert await budget.reserve(buckets) == 0.0

    await asyncio.wait_for(asyncio.gather(spin(a, [x, y]), spin(b, [y, x])), 30)


_PROCESS_RESERVER = textwrap.dedent(
    """
    import asyncio, sys, time
    from telegram_idem.backends.postgres import PostgresStore
    from telegram_idem.flood import Bucket

    async def main(url, start, seconds):
        store = PostgresStore.from_url(url)
        budget = store.flood_budget()
        bucket = Bucket("f:shared", 0.05, 3)
        await budget.paused_for("f:warm")  # connect before the start
        while time.time() < start:
            await asyncio.sleep(0.001)
        passed = 0
        while time.time() < start + seconds:
            if await budget.reserve([bucket]) == 0.0:
                passed += 1
        await store.close()
        print(passed)

    asyncio.run(main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3])))
    """
)


async def test_a_budget_is_shared_by_two_processes(postgres_url_factory: Callable[[], str]) -> None:
    """Two processes spend one bucket (burst 3, one call per 50 ms) as fast as they can for
    2 s (starting together, 3 s from now, once both have connected): together at most
    burst + 2 / 0.05 calls pass (one more for the edges), and each gets some. (The lower
    bound is loose: the machine may be busy.)"""
    url = postgres_url_factory()
    start, seconds = time.time() + 3.0, 2.0
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _PROCESS_RESERVER,
            url,
            repr(start),
            repr(seconds),
            stdout=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    outs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), 60)
    assert [p.returncode for p in procs] == [0, 0]
    passed = [int(out.decode().strip()) for out, _ in outs]
    assert sum(passed) <= 3 + seconds / 0.05 + 1
    assert sum(passed) >= seconds / 0.05 * 0.5  # the budget was in use, not starved
    assert all(n > 0 for n in passed)


async def test_a_pause_closes_the_gate_for_every_connection(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    url = postgres_url_factory()
    a, b = (flood_of(closing(PostgresStore.from_url(url))) for _ in range(2))
    gate = Bucket.gate("f:pause")
    assert await a.reserve([gate]) == 0.0
    await a.pause("f:pause", 30)
    await b.pause("f:pause", 5)  # never shortens
    wait = await b.reserve([gate, Bucket("f:chat", 1.0, 1)])
    assert 29 < wait <= 30
    assert 29 < await b.paused_for("f:pause") <= 30
    # nothing was reserved while the gate was closed
    assert await b.paused_for("f:unknown") == 0.0
