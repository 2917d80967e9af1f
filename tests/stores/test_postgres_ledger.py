"""PostgreSQL effect-ledger specifics: one round trip per method, the answers of a start
or a mark_unknown racing another writer of the row (never a stale row, never an empty
answer), the server's clock, the listing served by its index, a missing table, and the
ledger table added by ``migrate()`` to a schema that lacks it.

The ledger contract itself runs in tests/stores/test_ledger_conformance.py.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

import asyncpg
import pytest
from fixtures_postgres import (
    PrivatePostgres,
    drop_tables,
    postgres_reachable_or_missing,
    private_postgres_fixture,  # noqa: F401 (the private_postgres fixture)
    with_option,
)
from pg_counting import Trips, counting_connection_class
from services import postgres_dsn

from telegram_idem import ConfigurationError, ManualClock, StoreError
from telegram_idem.backends.postgres import (
    LEDGER_COLUMNS,
    PostgresLedger,
    PostgresStore,
    create_ddl,
    ledger_table_name,
    migrate,
)
from telegram_idem.ledger import LedgerState

pytestmark = pytest.mark.postgres

KEY = "idem:7:a:pay:42:s:charge"


def prefix_of(url: str) -> str:
    return dict(p.split("=", 1) for p in urlsplit(url).query.split("&"))["table_prefix"]


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
async def fresh_prefix() -> AsyncIterator[str]:
    """A table prefix with no table made; its tables dropped after."""
    postgres_reachable_or_missing()
    prefix = f"t{os.urandom(6).hex()}"
    yield prefix
    await drop_tables(postgres_dsn(), [prefix])


def ledger_of(store: PostgresStore) -> PostgresLedger:
    ledger = store.ledger()
    assert isinstance(ledger, PostgresLedger)
    return ledger


# ----------------------------------------------------------------- the store's part


async def test_the_store_gives_one_ledger_object_on_its_connection(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    url = postgres_url_factory()
    store = closing(PostgresStore.from_url(url))
    ledger = ledger_of(store)
    assert store.ledger() is ledger
    assert ledger.connection is store.connection
    assert ledger.table == f"{prefix_of(url)}_ledger" == store.connection.ledger_table
    assert ledger.table in repr(ledger) and "password" not in repr(ledger)


async def test_each_method_is_one_round_trip(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    trips = Trips()
    url = with_option(postgres_url_factory(), "min_size=1&max_size=1")
    store = closing(PostgresStore.from_url(url, clock=clock))
    store.connection.connect_kwargs["connection_class"] = counting_connection_class(trips)
    ledger = ledger_of(store)

    async def every_method(key: str) -> None:
        assert await ledger.start(key, token=1, holder="h:1") is None
        assert await ledger.start(key, token=2, holder="h:2") is not None  # the row answered
        assert await ledger.mark_unknown(key, token=2, detail="found") is not None
        assert await ledger.mark_unknown(key, token=1, detail="late") is not None  # unchanged
        assert await ledger.settle(key, token=3, result=b"r", not_applied=False)
        assert await ledger.get(key) is not None
        assert await ledger.entries(prefix=key) == []
        assert await ledger.finish(key, token=3)

    await every_method("warm")  # a new connection prepares each statement once
    trips.clear()
    await every_method(KEY)
    assert trips.names == ["bind_execute"] * 8, trips.calls


async def test_a_start_that_loses_a_race_answers_the_winners_row(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    """The winner's row is committed after the loser's statement began: the insert stops
    on it, the statement's snapshot cannot read it, and the start runs again."""
    url = postgres_url_factory()
    ledger = ledger_of(closing(PostgresStore.from_url(url, clock=clock)))
    winner = await asyncpg.connect(postgres_dsn())
    try:
        tx = winner.transaction()
        await tx.start()
        await winner.execute(
            f"INSERT INTO {ledger.table} ({', '.join(LEDGER_COLUMNS)}) "
            "VALUES ($1, 'started', 5, 100, 'winner:1', 1, 100, '', NULL, false)",
            KEY,
        )
        loser = asyncio.create_task(ledger.start(KEY, token=6, holder="loser:2"))
        await asyncio.sleep(0.3)
        assert not loser.done()  # waits on the winner's uncommitted key
        await tx.commit()
        answer = await asyncio.wait_for(loser, 10)
    finally:
        await winner.close()
    assert answer is not None and (answer.token, answer.holder) == (5, "winner:1")
    row = await ledger.get(KEY)
    assert row == answer


async def test_rounds_of_racing_starts_on_four_pools_write_one_row_each(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    """Rounds of 16 concurrent starts over four pools, each round's row finished by its
    writer before the next round: exactly one write per round, every other answer the
    writer's row (a loser that raced runs its statement again, never answers nothing)."""
    url = postgres_url_factory()
    ledgers = [ledger_of(closing(PostgresStore.from_url(url))) for _ in range(4)]
    token = 0
    for _ in range(15):
        tokens = list(range(token + 1, token + 17))
        token += 16
        answers = await asyncio.gather(
            *(ledgers[t % 4].start(KEY, token=t, holder=f"h:{t}") for t in tokens)
        )
        written = [t for t, a in zip(tokens, answers, strict=True) if a is None]
        assert len(written) == 1, answers
        assert {a.token for a in answers if a is not None} <= {written[0]}
        assert await ledgers[0].finish(KEY, token=written[0])
        assert await ledgers[1].get(KEY) is None


async def test_a_start_meeting_a_row_being_changed_answers_its_newest_version(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    url = postgres_url_factory()
    ledger = ledger_of(closing(PostgresStore.from_url(url, clock=clock)))
    await ledger.start(KEY, token=1, holder="h:1")
    other = await asyncpg.connect(postgres_dsn())
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute(
            f"UPDATE {ledger.table} SET state = 'unknown', token = 2, attempts = 2 WHERE key = $1",
            KEY,
        )
        starting = asyncio.create_task(ledger.start(KEY, token=3, holder="h:3"))
        await asyncio.sleep(0.3)
        await tx.commit()
        answer = await asyncio.wait_for(starting, 10)
    finally:
        await other.close()
    assert answer is not None and (answer.state, answer.token, answer.attempts) == (
        LedgerState.UNKNOWN,
        2,
        2,
    )


async def test_a_mark_unknown_racing_a_settle_answers_the_settled_row(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    """The settle commits while mark_unknown waits for the row: the resolution stands and
    mark_unknown answers it, not the row as its snapshot had it."""
    url = postgres_url_factory()
    ledger = ledger_of(closing(PostgresStore.from_url(url, clock=clock)))
    await ledger.start(KEY, token=1, holder="h:1")
    resolver = await asyncpg.connect(postgres_dsn())
    try:
        tx = resolver.transaction()
        await tx.start()
        await resolver.execute(
            f"UPDATE {ledger.table} SET state = 'settled', token = 4, result = $2 WHERE key = $1",
            KEY,
            b"paid",
        )
        marking = asyncio.create_task(ledger.mark_unknown(KEY, token=5, detail="found"))
        await asyncio.sleep(0.3)
        assert not marking.done()
        await tx.commit()
        answer = await asyncio.wait_for(marking, 10)
    finally:
        await resolver.close()
    assert answer is not None
    assert (answer.state, answer.token, answer.result, answer.detail) == (
        LedgerState.SETTLED,
        4,
        b"paid",
        "",
    )
    assert await ledger.get(KEY) == answer


async def test_a_mark_unknown_of_a_row_finished_meanwhile_answers_none(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    url = postgres_url_factory()
    ledger = ledger_of(closing(PostgresStore.from_url(url, clock=clock)))
    await ledger.start(KEY, token=1, holder="h:1")
    other = await asyncpg.connect(postgres_dsn())
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute(f"DELETE FROM {ledger.table} WHERE key = $1", KEY)
        marking = asyncio.create_task(ledger.mark_unknown(KEY, token=5, detail="found"))
        await asyncio.sleep(0.3)
        await tx.commit()
        assert await asyncio.wait_for(marking, 10) is None
    finally:
        await other.close()
    assert await ledger.get(KEY) is None


async def test_the_servers_clock_times_the_rows(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    url = postgres_url_factory()
    ledger = ledger_of(closing(PostgresStore.from_url(url)))  # no clock: the server's
    assert ledger.connection.server_clock
    before = time.time()
    await ledger.start(KEY, token=1, holder="h:1")
    row = await ledger.get(KEY)
    assert row is not None and before - 5 < row.started_at == row.updated_at < time.time() + 5
    await asyncio.sleep(0.05)
    unknown = await ledger.mark_unknown(KEY, token=2, detail="d")
    assert unknown is not None and unknown.updated_at > row.updated_at
    assert unknown.started_at == row.started_at


async def test_ties_in_the_listing_go_by_code_point_and_an_unstorable_prefix_matches_nothing(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    url = postgres_url_factory()
    ledger = ledger_of(closing(PostgresStore.from_url(url, clock=clock)))
    keys = ["k:b", "k:B", "k:a", "k:_", "k:é", "k:Z"]
    for key in keys:
        await ledger.start(key, token=1, holder="h")  # one started_at for all
    assert [e.key for e in await ledger.entries()] == sorted(keys)
    assert await ledger.entries(prefix="k:\x00") == []
    assert await ledger.entries(prefix="k:\ud800") == []


async def test_the_listing_reads_its_index_in_order(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    url = postgres_url_factory()
    ledger = ledger_of(closing(PostgresStore.from_url(url, clock=clock)))
    conn = await asyncpg.connect(postgres_dsn())
    try:
        await conn.execute(
            f"INSERT INTO {ledger.table} SELECT 'idem:7:b:' || n, 'unknown', 1, n, 'h', 2, n, "
            "'', NULL, false FROM generate_series(1, 5000) AS n"
        )
        await conn.execute(f"ANALYZE {ledger.table}")
        plan = "\n".join(
            r[0]
            for r in await conn.fetch(
                "EXPLAIN " + ledger._sql["entries"], ["started", "unknown"], "", 100
            )
        )
    finally:
        await conn.close()
    # the oldest first, read in index order and stopped at the limit: no sort of the table
    assert f"Index Scan using {ledger.table}_started_idx" in plan, plan
    assert "Sort" not in plan, plan


# ----------------------------------------------------------------- errors


async def test_an_outage_is_a_store_error_and_the_ledger_recovers(
    private_postgres: PrivatePostgres, closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    """Stops a private server (never the shared one: other runs use it meanwhile)."""
    await migrate(private_postgres.url, table_prefix="ledger")
    url = with_option(private_postgres.url, "table_prefix=ledger&connect_timeout=3")
    ledger = ledger_of(closing(PostgresStore.from_url(url)))
    assert await ledger.start(KEY, token=1, holder="h:1") is None
    private_postgres.stop()
    try:
        for call in (
            lambda: ledger.start("other", token=1, holder="h"),
            lambda: ledger.mark_unknown(KEY, token=2, detail="d"),
            lambda: ledger.settle(KEY, token=2, result=None, not_applied=True),
            lambda: ledger.finish(KEY, token=1),
            lambda: ledger.get(KEY),
            lambda: ledger.entries(),
        ):
            with pytest.raises(StoreError) as info:
                await call()
            assert isinstance(info.value.original, PostgresStore.driver_errors)
            assert "ledger." in str(info.value)
    finally:
        private_postgres.start()
    deadline = time.monotonic() + 30
    while True:  # pooled connections died with the server: the pool reconnects
        try:
            row = await ledger.get(KEY)
            break
        except StoreError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    assert row is not None and row.state is LedgerState.STARTED  # nothing was changed


async def test_a_closed_store_s_ledger_raises_store_error(
    postgres_url_factory: Callable[[], str],
) -> None:
    store = PostgresStore.from_url(postgres_url_factory())
    ledger = ledger_of(store)
    await ledger.start(KEY, token=1, holder="h")
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await ledger.get(KEY)


# ----------------------------------------------------------------- schema / migrate


async def test_a_missing_ledger_table_is_a_configuration_error_naming_it(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    url = postgres_url_factory()
    ledger = ledger_of(closing(PostgresStore.from_url(url)))
    conn = await asyncpg.connect(postgres_dsn())
    try:
        await conn.execute(f"DROP TABLE {ledger.table}")
    finally:
        await conn.close()
    with pytest.raises(ConfigurationError, match="telegram-idem migrate") as info:
        await ledger.start(KEY, token=1, holder="h")
    assert repr(ledger.table) in str(info.value)
    with pytest.raises(ConfigurationError, match=ledger.table):
        await ledger.entries()


async def _catalog(conn: asyncpg.Connection, prefix: str) -> dict[str, int]:
    """Every table and index of ``prefix``: name → oid (a re-created one gets a new oid)."""
    rows = await conn.fetch(
        "SELECT relname, oid::bigint AS oid FROM pg_class WHERE relname LIKE $1 "
        "AND relkind IN ('r', 'i')",
        f"{prefix}\\_%",
    )
    return {r["relname"]: r["oid"] for r in rows}


async def test_migrate_adds_the_ledger_to_an_older_schema_and_then_creates_nothing(
    fresh_prefix: str, closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    ledger_name = ledger_table_name(fresh_prefix)
    older = [s for s in create_ddl(fresh_prefix) if ledger_name not in s]
    assert len(older) < len(create_ddl(fresh_prefix))
    conn = await asyncpg.connect(postgres_dsn())
    try:
        for statement in older:  # the schema as the previous version made it
            await conn.execute(statement)
        store = closing(
            PostgresStore.from_url(with_option(postgres_dsn(), f"table_prefix={fresh_prefix}"))
        )
        claim = await store.claim("kept", lease=30, retention=3600)
        before = await _catalog(conn, fresh_prefix)
        assert ledger_name not in before

        await store.migrate()
        after = await _catalog(conn, fresh_prefix)
        assert set(after) - set(before) == {
            ledger_name,
            f"{ledger_name}_pkey",
            f"{ledger_name}_started_idx",
        }
        assert {k: after[k] for k in before} == before  # the other tables untouched
        record = await store.get("kept")
        assert record is not None and record.fencing_token == claim.token

        await migrate(postgres_dsn(), table_prefix=fresh_prefix)  # a second migration
        assert await _catalog(conn, fresh_prefix) == after

        cols = await conn.fetch(
            "SELECT column_name, data_type, is_nullable, collation_name "
            "FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position",
            ledger_name,
        )
        index = await conn.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE indexname = $1", f"{ledger_name}_started_idx"
        )
    finally:
        await conn.close()
    assert tuple(c["column_name"] for c in cols) == LEDGER_COLUMNS
    assert {c["column_name"]: (c["data_type"], c["is_nullable"]) for c in cols} == {
        "key": ("text", "NO"),
        "state": ("text", "NO"),
        "token": ("bigint", "NO"),
        "started_at": ("double precision", "NO"),
        "holder": ("text", "NO"),
        "attempts": ("integer", "NO"),
        "updated_at": ("double precision", "NO"),
        "detail": ("text", "NO"),
        "result": ("bytea", "YES"),
        "not_applied": ("boolean", "NO"),
    }
    assert cols[0]["collation_name"] == "C"
    assert "(started_at, key)" in index
    ledger = ledger_of(store)
    assert await ledger.start(KEY, token=1, holder="h") is None


async def test_the_state_column_refuses_other_states(
    postgres_url_factory: Callable[[], str],
) -> None:
    prefix = prefix_of(postgres_url_factory())
    conn = await asyncpg.connect(postgres_dsn())
    try:
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(
                f"INSERT INTO {prefix}_ledger ({', '.join(LEDGER_COLUMNS)}) "
                "VALUES ('k', 'done', 1, 0, 'h', 1, 0, '', NULL, false)"
            )
    finally:
        await conn.close()


def test_the_ddl_appends_the_ledger_after_the_tables_it_had() -> None:
    ddl = create_ddl("idem")
    assert ddl[-2].startswith("CREATE TABLE IF NOT EXISTS idem_ledger")
    assert 'key TEXT COLLATE "C" NOT NULL' in ddl[-2]
    assert ddl[-1] == (
        "CREATE INDEX IF NOT EXISTS idem_ledger_started_idx ON idem_ledger (started_at, key)"
    )
