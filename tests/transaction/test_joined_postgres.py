"""``async with idem.transaction(conn)`` on the PostgreSQL store: the action's claim and
completion, a step's record and an outbox entry commit or roll back with the bot's own
rows, on asyncpg and SQLAlchemy ``AsyncConnection`` / ``AsyncSession``, against the real
server (tables under a unique prefix); a concurrent duplicate waits on the key."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
from services import postgres_dsn
from transaction.joined_support import Rollback, Tx, postgres_tx, sqlite_engine

from telegram_idem import (
    ConfigurationError,
    ConflictError,
    Idem,
    InProgressError,
    Status,
)
from telegram_idem.backends.postgres import PostgresStore
from telegram_idem.outbox import CallStatus, HttpBotAPI, Outbound
from telegram_idem.testing.bot_api import FakeBotAPI

pytestmark = pytest.mark.postgres

KINDS = ["asyncpg", "sa-connection", "sa-session"]


def prefix_of(url: str) -> str:
    return dict(p.split("=", 1) for p in urlsplit(url).query.split("&"))["table_prefix"]


class Shop:
    """A guard on a migrated PostgreSQL store, and the bot's table beside it."""

    def __init__(self, idem: Idem, orders: str) -> None:
        self.idem = idem
        self.orders = orders

    async def rows(self) -> list[int]:
        conn = await asyncpg.connect(postgres_dsn())
        try:
            return [r[0] for r in await conn.fetch(f"SELECT id FROM {self.orders} ORDER BY id")]
        finally:
            await conn.close()

    async def place(self, tx: Tx, n: int, runs: list[int], key: str | None = None) -> Any:
        """The bot's action: one order row, recorded under ``order:<n>``."""

        async def work() -> dict[str, int]:
            runs.append(n)
            await tx.exec(f"INSERT INTO {self.orders} VALUES ({n})")
            return {"order": n}

        return await self.idem.run(key or f"order:{n}", work)


@pytest.fixture
async def shop(postgres_url_factory: Callable[[], str]) -> AsyncIterator[Shop]:
    url = postgres_url_factory()
    orders = f"{prefix_of(url)}_orders"
    conn = await asyncpg.connect(postgres_dsn())
    await conn.execute(f"CREATE TABLE {orders} (id int PRIMARY KEY)")
    idem = Idem(PostgresStore.from_url(url), heartbeat=False)
    yield Shop(idem, orders)
    await idem.close()
    await conn.execute(f"DROP TABLE IF EXISTS {orders}")
    await conn.close()


@pytest.fixture(params=KINDS)
async def tx(request: pytest.FixtureRequest) -> AsyncIterator[Tx]:
    async with postgres_tx(request.param, postgres_dsn()) as made:
        yield made


async def test_commit_keeps_the_row_the_record_and_the_outbox_entry(tx: Tx, shop: Shop) -> None:
    idem, runs = shop.idem, list[int]()
    outbox = idem.store.outbox()
    async with FakeBotAPI() as fake, HttpBotAPI("1:t", base_url=fake.url) as api:
        out = Outbound(outbox, api, bot_id=1, keys=idem.keys)

        async def buy() -> str:
            await shop.place(tx, 1, runs, key="inner:1")
            return await out.enqueue("sendMessage", {"chat_id": 5, "text": "thanks"})

        async with tx.begin():
            async with idem.transaction(tx.conn):
                effect = await idem.run("order:1", buy)
            assert await idem.store.get("order:1") is None  # not committed yet
            assert await outbox.get(effect) is None
        record = await idem.store.get("order:1")
        assert record is not None and record.status is Status.COMPLETED
        entry = await outbox.get(effect)
        assert entry is not None and entry.status is CallStatus.PENDING
        assert await shop.rows() == [1]
        # a later duplicate replays, joined or not
        async with tx.begin():
            async with idem.transaction(tx.conn):
                assert await idem.run("order:1", buy) == effect
        assert await idem.run("order:1", buy) == effect
        assert runs == [1] and await outbox.counts() == {CallStatus.PENDING: 1}
        assert fake.calls_of("sendMessage") == []


async def test_rollback_leaves_nothing_and_a_retry_runs(tx: Tx, shop: Shop) -> None:
    runs: list[int] = []
    with pytest.raises(Rollback):
        async with tx.begin():
            async with shop.idem.transaction(tx.conn):
                await shop.place(tx, 1, runs)
                raise Rollback
    assert await shop.rows() == []
    assert await shop.idem.store.get("order:1") is None
    async with tx.begin():
        async with shop.idem.transaction(tx.conn):
            await shop.place(tx, 1, runs)
    assert runs == [1, 1] and await shop.rows() == [1]


async def test_a_savepoint_rolled_back_removes_only_what_it_wrote(tx: Tx, shop: Shop) -> None:
    async with tx.begin():
        async with shop.idem.transaction(tx.conn):
            await shop.place(tx, 1, [])
            with pytest.raises(Rollback):
                async with tx.nested():
                    await shop.place(tx, 2, [])
                    raise Rollback
    assert await shop.rows() == [1]
    assert await shop.idem.store.get("order:1") is not None
    assert await shop.idem.store.get("order:2") is None


async def test_an_outer_rollback_removes_a_released_savepoint_s_writes(tx: Tx, shop: Shop) -> None:
    with pytest.raises(Rollback):
        async with tx.begin():
            async with shop.idem.transaction(tx.conn):
                async with tx.nested():
                    await shop.place(tx, 1, [])
                raise Rollback
    assert await shop.rows() == []
    assert await shop.idem.store.get("order:1") is None


async def test_a_step_inside_a_joined_action_commits_with_it(tx: Tx, shop: Shop) -> None:
    idem, effects = shop.idem, []

    async def credit() -> str:
        effects.append("credit")
        await tx.exec(f"INSERT INTO {shop.orders} VALUES (7)")
        return "credited"

    async def action() -> str:
        return await idem.step("credit", credit)

    step_key = idem.keys.step("order:7", "credit")
    with pytest.raises(Rollback):
        async with tx.begin():
            async with idem.transaction(tx.conn):
                await idem.run("order:7", action)
                raise Rollback
    assert await idem.store.get(step_key) is None
    async with tx.begin():
        async with idem.transaction(tx.conn):
            assert await idem.run("order:7", action) == "credited"
    step = await idem.store.get(step_key)
    assert step is not None and step.status is Status.COMPLETED
    assert effects == ["credit", "credit"] and await shop.rows() == [7]


async def test_a_failing_action_caught_and_committed_is_released(tx: Tx, shop: Shop) -> None:
    async def fails() -> None:
        raise ValueError("declined")

    async with tx.begin():
        async with shop.idem.transaction(tx.conn):
            with pytest.raises(ValueError):
                await shop.idem.run("order:3", fails)
    record = await shop.idem.store.get("order:3")
    assert record is not None and record.status is Status.IN_PROGRESS and record.result is None
    runs: list[int] = []
    async with tx.begin():
        async with shop.idem.transaction(tx.conn):
            await shop.place(tx, 3, runs)
    record = await shop.idem.store.get("order:3")
    assert record is not None and record.status is Status.COMPLETED
    assert record.fencing_token == 2 and runs == [3]


async def test_a_failed_statement_inside_the_action_surfaces_its_own_error(shop: Shop) -> None:
    conn = await asyncpg.connect(postgres_dsn())
    try:

        async def bad() -> None:
            await conn.execute("SELECT 1/0")

        with pytest.raises(asyncpg.DivisionByZeroError):
            async with conn.transaction():
                async with shop.idem.transaction(conn):
                    await shop.idem.run("order:4", bad)
    finally:
        await conn.close()
    assert await shop.idem.store.get("order:4") is None


async def test_a_fingerprint_conflict_and_a_holder_outside_are_told(shop: Shop) -> None:
    idem = shop.idem
    await idem.run("order:1", _nothing, fingerprint="a")
    claim = await idem.store.claim("order:2", lease=60, retention=600)  # held outside
    async with postgres_tx("asyncpg", postgres_dsn()) as tx:
        async with tx.begin():
            async with idem.transaction(tx.conn):
                with pytest.raises(ConflictError):
                    await idem.run("order:1", _nothing, fingerprint="b")
        async with tx.begin():
            async with idem.transaction(tx.conn):
                with pytest.raises(InProgressError) as caught:
                    await idem.run("order:2", _nothing)
    assert caught.value.record is not None
    assert caught.value.record.fencing_token == claim.token


async def _nothing() -> None:
    return None


# ------------------------------------------------------------------ concurrency


async def test_a_concurrent_duplicate_blocks_on_the_key_then_replays(tx: Tx, shop: Shop) -> None:
    runs: list[int] = []
    other = await asyncpg.connect(postgres_dsn())
    try:
        async with tx.begin():
            async with shop.idem.transaction(tx.conn):
                await shop.place(tx, 1, runs)

                async def second() -> Any:
                    async with other.transaction():
                        async with shop.idem.transaction(other):
                            return await shop.idem.run("order:1", _nothing)

                task = asyncio.create_task(second())
                await asyncio.sleep(0.3)
                assert not task.done()  # waits on the first transaction's key
        assert await asyncio.wait_for(task, 10) == {"order": 1}
    finally:
        await other.close()
    assert runs == [1] and await shop.rows() == [1]


async def test_a_concurrent_duplicate_acquires_after_the_first_rolls_back(shop: Shop) -> None:
    a, b = await asyncpg.connect(postgres_dsn()), await asyncpg.connect(postgres_dsn())
    runs: list[int] = []
    try:
        first = a.transaction()
        await first.start()
        async with shop.idem.transaction(a):
            await shop.place(_Raw(a), 1, runs)

        async def second() -> Any:
            async with b.transaction():
                async with shop.idem.transaction(b):
                    return await shop.place(_Raw(b), 1, runs)

        task = asyncio.create_task(second())
        await asyncio.sleep(0.3)
        assert not task.done()
        await first.rollback()
        assert await asyncio.wait_for(task, 10) == {"order": 1}
    finally:
        await a.close()
        await b.close()
    assert runs == [1, 1] and await shop.rows() == [1]
    record = await shop.idem.store.get("order:1")
    assert record is not None and record.fencing_token == 1  # the first never committed


class _Raw(Tx):
    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = self.raw = conn

    async def exec(self, sql: str, params: dict[str, Any] | None = None) -> None:
        await self.raw.execute(sql)


async def test_claim_and_completion_are_one_statement_each(shop: Shop) -> None:
    conn = await asyncpg.connect(postgres_dsn())
    seen: list[str] = []
    try:
        async with conn.transaction():
            async with shop.idem.transaction(conn):  # the first use checks the table
                await shop.idem.run("warm", _nothing)
        conn.add_query_logger(lambda record: seen.append(record.query))
        async with conn.transaction():
            async with shop.idem.transaction(conn):
                await shop.idem.run("order:1", _nothing)
        # besides the bot's BEGIN and COMMIT: the claim, then the completion
        ours = [q for q in seen if not q.startswith(("BEGIN", "COMMIT"))]
        assert len(ours) == 2, seen
        assert "INSERT INTO" in ours[0] and "UPDATE" in ours[1]
    finally:
        await conn.close()


# ------------------------------------------------------------------ what cannot join


async def test_an_asyncpg_connection_outside_a_transaction_is_refused(shop: Shop) -> None:
    conn = await asyncpg.connect(postgres_dsn())
    try:
        with pytest.raises(ConfigurationError, match="no open transaction"):
            async with shop.idem.transaction(conn):
                pass
    finally:
        await conn.close()


async def test_a_connection_to_another_database_is_refused(shop: Shop) -> None:
    other = urlsplit(postgres_dsn())._replace(path="/postgres").geturl()
    conn = await asyncpg.connect(other)
    try:
        async with conn.transaction():
            with pytest.raises(ConfigurationError, match="'postgres'") as caught:
                async with shop.idem.transaction(conn):
                    pass
        store = shop.idem.store
        assert isinstance(store, PostgresStore) and store.table in str(caught.value)
    finally:
        await conn.close()


async def test_an_sqlalchemy_connection_to_sqlite_is_refused(shop: Shop, tmp_path: Any) -> None:
    engine = sqlite_engine(str(tmp_path / "x.db"))
    try:
        async with engine.connect() as conn:
            with pytest.raises(ConfigurationError, match="'sqlite'"):
                async with shop.idem.transaction(conn):
                    pass
    finally:
        await engine.dispose()


async def test_an_unsupported_kind_is_refused(shop: Shop) -> None:
    with pytest.raises(ConfigurationError, match="cannot join a transaction on a builtins"):
        async with shop.idem.transaction(object()):
            pass


def test_a_redis_store_cannot_join() -> None:
    from telegram_idem.backends.redis import RedisStore

    store = RedisStore.from_url("redis://127.0.0.1:6379/0?key_prefix=joined-test")
    with pytest.raises(ConfigurationError, match="join your database transaction"):
        from telegram_idem.backends import joined_of

        joined_of(store, object())


async def test_a_pool_connection_joins_like_a_connection(shop: Shop) -> None:
    """A pool connection (asyncpg's proxy, which cannot be weakly referenced) joins, and
    the outbox's enqueue on it too."""
    pool = await asyncpg.create_pool(postgres_dsn(), min_size=1, max_size=1)
    assert pool is not None
    outbox = shop.idem.store.outbox()
    try:
        async with FakeBotAPI() as fake, HttpBotAPI("1:t", base_url=fake.url) as api:
            out = Outbound(outbox, api, bot_id=1, keys=shop.idem.keys)
            async with pool.acquire() as conn, conn.transaction():
                async with shop.idem.transaction(conn):

                    async def work() -> str:
                        await conn.execute(f"INSERT INTO {shop.orders} VALUES (11)")
                        return await out.enqueue("sendMessage", {"chat_id": 5, "text": "ok"})

                    effect = await shop.idem.run("order:11", work)
    finally:
        await pool.close()
    record = await shop.idem.store.get("order:11")
    assert record is not None and record.status is Status.COMPLETED
    assert await outbox.get(effect) is not None
    assert await shop.rows() == [11]


async def test_gathered_actions_on_one_joined_connection_are_refused_clearly(
    tx: Tx, shop: Shop
) -> None:
    """asyncpg refuses a second statement while one runs with a raw ``InterfaceError``
    that leaves the connection inside its transaction: the second task's run is refused
    before it touches the connection, and the first commits."""
    idem = shop.idem
    started = asyncio.Event()

    async def slow() -> str:
        started.set()
        await asyncio.sleep(0.05)
        await tx.exec(f"INSERT INTO {shop.orders} VALUES (21)")
        return "a"

    async def second() -> str:
        await started.wait()
        return await idem.run("order:22", _nothing_ok)

    async with tx.begin():
        async with idem.transaction(tx.conn):
            outcomes = await asyncio.gather(
                idem.run("order:21", slow), second(), return_exceptions=True
            )
    assert outcomes[0] == "a"
    assert isinstance(outcomes[1], ConfigurationError)
    assert await shop.rows() == [21] and await idem.store.get("order:22") is None


async def _nothing_ok() -> str:
    return "b"
