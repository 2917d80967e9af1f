"""PostgreSQL store specifics: round trips, schema, purge, outage, PgBouncer mode, CLI, URLs.

The state machine itself is checked by the conformance suite (tests/stores/test_conformance.py).
Round trips are counted at asyncpg's protocol layer: every protocol call below
(``prepare``, ``bind_execute``, ``query``…) sends its messages with one Sync and waits for
ReadyForQuery, i.e. it is exactly one network round trip.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
from click.testing import CliRunner
from fixtures_postgres import (
    PrivatePostgres,
    drop_tables,
    postgres_reachable_or_missing,
    private_postgres_fixture,  # noqa: F401 (the private_postgres fixture)
    run_sync,
    with_option,
)
from pg_counting import Trips, counting_connection_class
from services import postgres_dsn

from telegram_idem import ConfigurationError, ManualClock, Outcome, Status, StoreError
from telegram_idem._cli import cli
from telegram_idem.backends import store_from_url
from telegram_idem.backends.postgres import COLUMNS, PostgresStore, create_ddl, migrate

pytestmark = pytest.mark.postgres

LEASE = 30.0
RETENTION = 3600.0

# ----------------------------------------------------------------- helpers


def prefix_of(url: str) -> str:
    return dict(p.split("=", 1) for p in urlsplit(url).query.split("&"))["table_prefix"]


async def table_exists(prefix: str) -> bool:
    conn = await asyncpg.connect(postgres_dsn())
    try:
        exists: bool = await conn.fetchval(
            "SELECT to_regclass($1) IS NOT NULL", f"{prefix}_records"
        )
        return exists
    finally:
        await conn.close()


async def count_rows(prefix: str) -> int:
    conn = await asyncpg.connect(postgres_dsn())
    try:
        return int(await conn.fetchval(f"SELECT count(*) FROM {prefix}_records"))
    finally:
        await conn.close()


async def server_now() -> float:
    conn = await asyncpg.connect(postgres_dsn())
    try:
        return float(await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8"))
    finally:
        await conn.close()


@pytest.fixture
async def fresh_prefix() -> AsyncIterator[str]:
    """A table prefix with NO table made (tests of auto_create / migrate); dropped after."""
    postgres_reachable_or_missing()
    prefix = f"t{os.urandom(6).hex()}"
    yield prefix
    await drop_tables(postgres_dsn(), [prefix])


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


# ----------------------------------------------------------------- round trips


async def test_each_primitive_is_one_round_trip(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    trips = Trips()
    url = with_option(postgres_url_factory(), "min_size=1&max_size=1")
    store = closing(PostgresStore.from_url(url, clock=clock))
    store.connection.connect_kwargs["connection_class"] = counting_connection_class(trips)

    # warm every statement once (a new connection prepares each statement on first use)
    warm = await store.claim("warm", lease=LEASE, retention=RETENTION)
    await store.complete("warm", warm.token, b"0", retention=RETENTION)
    w2 = await store.claim("warm2", lease=LEASE, retention=RETENTION)
    await store.extend("warm2", w2.token, lease=LEASE)
    await store.release("warm2", w2.token)
    w3 = await store.claim("warm2", lease=LEASE, retention=RETENTION)
    await store.fail("warm2", w3.token, b"e", retention=RETENTION)
    await store.get("warm")
    await store.claim_many(["warm3"], lease=LEASE, retention=RETENTION)

    trips.clear()
    first = await store.claim("k", fingerprint="fp", lease=LEASE, retention=RETENTION)
    assert first.outcome is Outcome.ACQUIRED
    assert trips.names == ["bind_execute"], "claim (acquire)"

    trips.clear()
    busy = await store.claim("k", fingerprint="fp", lease=LEASE, retention=RETENTION)
    assert busy.outcome is Outcome.IN_PROGRESS
    assert trips.names == ["bind_execute"], "claim (in progress)"

    trips.clear()
    assert await store.complete("k", first.token, b'{"ok":1}', retention=RETENTION)
    assert trips.names == ["bind_execute"], "complete"

    trips.clear()
    replay = await store.claim("k", fingerprint="fp", lease=LEASE, retention=RETENTION)
    assert (replay.outcome, replay.record.result) == (Outcome.REPLAY, b'{"ok":1}')
    assert trips.names == ["bind_execute"], "duplicate with stored result"

    trips.clear()
    conflict = await store.claim("k", fingerprint="other", lease=LEASE, retention=RETENTION)
    assert conflict.outcome is Outcome.CONFLICT
    assert trips.names == ["bind_execute"], "conflict"

    second = await store.claim("k2", lease=LEASE, retention=RETENTION)
    calls: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("extend", lambda: store.extend("k2", second.token, lease=LEASE)),
        ("release", lambda: store.release("k2", second.token)),
        ("get", lambda: store.get("k2")),
        ("stale complete", lambda: store.complete("k2", 999, b"x", retention=RETENTION)),
    ]
    for name, call in calls:
        trips.clear()
        await call()
        assert trips.names == ["bind_execute"], name

    keys = [f"idem:1:u:{i}" for i in range(100)]
    trips.clear()
    claims = await store.claim_many(keys, lease=LEASE, retention=RETENTION)
    assert [c.outcome for c in claims] == [Outcome.ACQUIRED] * 100
    assert trips.names == ["bind_execute"], "claim_many(100)"
    trips.clear()
    again = await store.claim_many(keys, lease=LEASE, retention=RETENTION)
    assert [c.outcome for c in again] == [Outcome.IN_PROGRESS] * 100
    assert trips.names == ["bind_execute"], "claim_many(100) of held keys"


async def test_first_use_on_a_new_connection_prepares_then_executes(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    trips = Trips()
    store = closing(PostgresStore.from_url(postgres_url_factory(), clock=clock))
    store.connection.connect_kwargs["connection_class"] = counting_connection_class(trips)
    await store.get("x")  # opens the pool
    trips.clear()
    await store.claim("k", lease=LEASE, retention=RETENTION)
    assert trips.names == ["prepare", "bind_execute"]  # named statement, cached from now on
    assert trips.calls[0][1]  # a named (cached) statement


# ----------------------------------------------------------------- schema / migrate


async def test_missing_table_is_a_configuration_error_naming_migrate(
    fresh_prefix: str, closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    store = closing(
        PostgresStore.from_url(with_option(postgres_dsn(), f"table_prefix={fresh_prefix}"))
    )
    with pytest.raises(ConfigurationError, match="telegram-idem migrate") as info:
        await store.claim("k", lease=LEASE, retention=RETENTION)
    assert "auto_create=1" in str(info.value)
    with pytest.raises(ConfigurationError):
        await store.get("k")
    with pytest.raises(ConfigurationError):
        await store.complete("k", 1, b"1", retention=RETENTION)
    assert not await table_exists(fresh_prefix)  # nothing but migrate/auto_create creates it


async def test_auto_create_makes_the_table_on_first_use(
    fresh_prefix: str, closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    url = with_option(postgres_dsn(), f"table_prefix={fresh_prefix}&auto_create=1")
    stores = [closing(PostgresStore.from_url(url)) for _ in range(4)]
    assert not await table_exists(fresh_prefix)
    # four stores racing to create it: the advisory lock serialises the DDL
    claims = await asyncio.gather(*(s.claim("k", lease=LEASE, retention=RETENTION) for s in stores))
    assert [c.outcome for c in claims].count(Outcome.ACQUIRED) == 1
    assert await table_exists(fresh_prefix)


async def test_migrate_is_idempotent_and_makes_the_declared_schema(fresh_prefix: str) -> None:
    await migrate(postgres_dsn(), table_prefix=fresh_prefix)
    await migrate(postgres_dsn(), table_prefix=fresh_prefix)
    conn = await asyncpg.connect(postgres_dsn())
    try:
        cols = await conn.fetch(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            "WHERE table_name = $1 ORDER BY ordinal_position",
            f"{fresh_prefix}_records",
        )
        indexes = await conn.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = $1",
            f"{fresh_prefix}_records",
        )
    finally:
        await conn.close()
    assert tuple(c["column_name"] for c in cols) == COLUMNS
    assert {c["column_name"]: (c["data_type"], c["is_nullable"]) for c in cols} == {
        "key": ("text", "NO"),
        "status": ("text", "NO"),
        "fencing_token": ("bigint", "NO"),
        "lease_expires_at": ("double precision", "NO"),
        "expires_at": ("double precision", "NO"),
        "fingerprint": ("text", "YES"),
        "result": ("bytea", "YES"),
        "attempts": ("integer", "NO"),
    }
    by_name = {i["indexname"]: i["indexdef"] for i in indexes}
    assert f"{fresh_prefix}_records_pkey" in by_name
    assert "(expires_at)" in by_name[f"{fresh_prefix}_records_expires_at_idx"]


def test_ddl_is_compiled_for_postgresql_with_if_not_exists() -> None:
    ddl = create_ddl("idem")
    assert ddl[0].startswith("CREATE TABLE IF NOT EXISTS idem_records")
    assert "BYTEA" in ddl[0] and "DOUBLE PRECISION" in ddl[0] and "BIGINT" in ddl[0]
    assert ddl[1] == (
        "CREATE INDEX IF NOT EXISTS idem_records_expires_at_idx ON idem_records (expires_at)"
    )


async def test_migrate_refuses_a_store_url() -> None:
    with pytest.raises(ConfigurationError, match="telegram-idem migrate"):
        await migrate(with_option(postgres_dsn(), "table_prefix=x"))
    with pytest.raises(ConfigurationError):
        await migrate(postgres_dsn(), table_prefix="Bad-Prefix")


# ----------------------------------------------------------------- CLI


def test_cli_migrate_creates_the_table(fresh_prefix: str) -> None:
    url = with_option(postgres_dsn(), f"table_prefix={fresh_prefix}")
    runner = CliRunner()
    result = runner.invoke(cli, ["migrate", url])
    assert result.exit_code == 0, result.output
    assert f"{fresh_prefix}_records" in result.output
    assert run_sync(lambda: table_exists(fresh_prefix))
    again = runner.invoke(cli, ["migrate", url])  # idempotent
    assert again.exit_code == 0, again.output


def test_cli_migrate_needs_nothing_for_sqlite_and_memory(tmp_path: Path) -> None:
    runner = CliRunner()
    for url in ("memory://", f"sqlite:///{tmp_path / 'x.db'}"):
        result = runner.invoke(cli, ["migrate", url])
        assert result.exit_code == 0, result.output
        assert "nothing to migrate" in result.output


def test_cli_migrate_bad_url_exits_4() -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["migrate", with_option(postgres_dsn(), "tabel_prefix=x")])
    assert result.exit_code == 4
    assert "unknown option" in result.output
    result = runner.invoke(cli, ["migrate", "mysql://localhost/db"])
    assert result.exit_code == 4


def test_cli_migrate_unreachable_server_exits_3() -> None:
    result = CliRunner().invoke(cli, ["migrate", "postgresql://postgres@127.0.0.1:1/test"])
    assert result.exit_code == 3
    assert "failed" in result.output


# ----------------------------------------------------------------- purge


async def test_purge_deletes_expired_records_in_batches(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    url = with_option(postgres_url_factory(), "purge_every=0")
    store = closing(PostgresStore.from_url(url, clock=clock))
    for i in range(7):
        await store.claim(f"short{i}", lease=5.0, retention=10.0)
    held = await store.claim("long", lease=5.0, retention=1000.0)
    done = await store.claim("done", lease=5.0, retention=10.0)
    await store.complete("done", done.token, b"1", retention=1000.0)
    clock.advance(50)
    assert [await store.purge(batch=3) for _ in range(4)] == [3, 3, 1, 0]
    assert await count_rows(prefix_of(url)) == 2
    assert (await store.get("long")) is not None
    assert (await store.claim("done", lease=5.0, retention=10.0)).outcome is Outcome.REPLAY
    assert held.token == 1
    with pytest.raises(ConfigurationError):
        await store.purge(batch=0)


async def test_background_purge_runs_every_n_writes(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    url = with_option(postgres_url_factory(), "purge_every=5&purge_batch=100")
    store = closing(PostgresStore.from_url(url, clock=clock))
    for i in range(4):
        await store.claim(f"old{i}", lease=1.0, retention=2.0)
    clock.advance(10)
    assert await count_rows(prefix_of(url)) == 4
    await store.claim("new", lease=1.0, retention=100.0)  # the 5th write starts a purge
    task = store.connection.purge_task
    assert task is not None
    await task
    assert await count_rows(prefix_of(url)) == 1


async def test_purge_skips_rows_locked_by_a_claim(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    url = postgres_url_factory()
    store = closing(PostgresStore.from_url(url, clock=clock))
    await store.claim("a", lease=1.0, retention=2.0)
    await store.claim("b", lease=1.0, retention=2.0)
    clock.advance(10)
    conn = await asyncpg.connect(postgres_dsn())
    try:
        async with conn.transaction():
            await conn.execute(f"SELECT 1 FROM {prefix_of(url)}_records WHERE key = 'a' FOR UPDATE")
            started = time.monotonic()
            assert await store.purge() == 1  # "b"; "a" is locked and skipped, without waiting
            assert time.monotonic() - started < 2.0
    finally:
        await conn.close()
    assert await store.purge() == 1


# ----------------------------------------------------------------- clocks


async def test_server_clock_decides_leases(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    store = closing(PostgresStore.from_url(postgres_url_factory()))  # clock=None: the server's
    before = await server_now()
    first = await store.claim("k", fingerprint="fp", lease=LEASE, retention=RETENTION)
    after = await server_now()
    assert first.outcome is Outcome.ACQUIRED
    assert before + LEASE <= first.record.lease_expires_at <= after + LEASE
    assert first.record.expires_at - first.record.lease_expires_at == pytest.approx(
        RETENTION - LEASE
    )
    assert (await store.claim("k", lease=LEASE, retention=RETENTION)).outcome is Outcome.IN_PROGRESS
    assert await store.release("k", first.token)
    again = await store.claim("k", fingerprint="other", lease=LEASE, retention=RETENTION)
    assert (again.outcome, again.token, again.record.attempts) == (Outcome.ACQUIRED, 2, 2)
    short = await store.claim("short", lease=0.05, retention=0.05)
    await asyncio.sleep(0.2)
    assert await store.get("short") is None
    taken = await store.claim("short", lease=LEASE, retention=RETENTION)
    assert (taken.outcome, taken.token) == (Outcome.ACQUIRED, short.token + 1)


# ----------------------------------------------------------------- concurrency


async def test_50_claims_of_one_key_through_50_connections_acquire_once(
    private_postgres: PrivatePostgres, closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    # half of a server's default max_connections (100): on a private server, so that
    # other runs sharing the machine's server are never refused a connection
    await migrate(private_postgres.url, table_prefix="fifty")
    url = with_option(private_postgres.url, "table_prefix=fifty&min_size=50&max_size=50")
    store = closing(PostgresStore.from_url(url))  # server clock
    await store.get("warm")  # opens all 50 connections
    pids: set[int] = set()

    async def claim_on_own_connection(barrier: asyncio.Barrier) -> Any:
        pool = await store.connection.pool()
        async with pool.acquire() as conn:  # hold 50 distinct connections at once
            pids.add(conn.get_server_pid())
            await barrier.wait()
            rows = await store._claim_rounds(conn, ["one"], {"one": "fp"}, LEASE, RETENTION)
            return rows[0]

    barrier = asyncio.Barrier(50)
    claims = await asyncio.gather(*(claim_on_own_connection(barrier) for _ in range(50)))
    assert len(pids) == 50
    outcomes = [c.outcome for c in claims]
    assert outcomes.count(Outcome.ACQUIRED) == 1
    assert outcomes.count(Outcome.IN_PROGRESS) == 49
    assert len({c.token for c in claims}) == 1


async def test_claim_many_batches_racing_on_overlapping_keys(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    url = with_option(postgres_url_factory(), "max_size=2")
    stores = [closing(PostgresStore.from_url(url)) for _ in range(8)]
    keys = [f"idem:1:u:{i}" for i in range(40)]
    batches = []
    for i in range(8):  # overlapping batches, each in its own random order
        batch = random.Random(i).sample(keys, 30)
        batches.append(batch)
    missing = set(keys) - {k for b in batches for k in b}
    batches[0] = batches[0] + sorted(missing)
    results = await asyncio.gather(
        *(
            s.claim_many(b, lease=LEASE, retention=RETENTION)
            for s, b in zip(stores, batches, strict=True)
        )
    )
    acquired: dict[str, int] = {}
    for batch, claims in zip(batches, results, strict=True):
        assert [c.record.key for c in claims] == batch
        for c in claims:
            if c.outcome is Outcome.ACQUIRED:
                acquired[c.record.key] = acquired.get(c.record.key, 0) + 1
            else:
                assert c.outcome is Outcome.IN_PROGRESS
    assert acquired == {k: 1 for k in keys}


# ----------------------------------------------------------------- PgBouncer mode


async def test_statement_cache_size_0_uses_only_unnamed_statements(
    postgres_url_factory: Callable[[], str],
    clock: ManualClock,
    closing: Callable[[PostgresStore], PostgresStore],
) -> None:
    trips = Trips()
    url = with_option(postgres_url_factory(), "statement_cache_size=0&max_size=1")
    store = closing(PostgresStore.from_url(url, clock=clock))
    store.connection.connect_kwargs["connection_class"] = counting_connection_class(trips)
    first = await store.claim("k", fingerprint="fp", lease=LEASE, retention=RETENTION)
    assert await store.complete("k", first.token, b"r", retention=RETENTION)
    trips.clear()
    replay = await store.claim("k", fingerprint="fp", lease=LEASE, retention=RETENTION)
    assert (replay.outcome, replay.record.result) == (Outcome.REPLAY, b"r")
    # Describe, then Parse+Bind+Execute again in one batch: no named statement survives
    # a transaction boundary, which is what PgBouncer's transaction pooling needs.
    assert trips.names == ["prepare", "bind_execute"]
    claims = await store.claim_many(["a", "b"], lease=LEASE, retention=RETENTION)
    assert [c.outcome for c in claims] == [Outcome.ACQUIRED, Outcome.ACQUIRED]
    assert all(name == "" for call, name in trips.calls if call == "prepare")
    pool = await store.connection.pool()
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM pg_prepared_statements") == 0


# ----------------------------------------------------------------- outage


async def test_outage_is_a_store_error_and_the_same_store_recovers(
    private_postgres: PrivatePostgres, closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    """Stops a private server (never the shared one: other runs use it meanwhile)."""
    shared_started = await shared_server_started()
    await migrate(private_postgres.url, table_prefix="outage")
    url = with_option(
        private_postgres.url, "table_prefix=outage&min_size=2&max_size=4&connect_timeout=3"
    )
    store = closing(PostgresStore.from_url(url))
    held = await store.claim("before", lease=LEASE, retention=RETENTION)
    assert held.outcome is Outcome.ACQUIRED
    private_postgres.stop()
    try:
        for call in (
            lambda: store.claim("during", lease=LEASE, retention=RETENTION),
            lambda: store.claim_many(["m1", "m2"], lease=LEASE, retention=RETENTION),
            lambda: store.complete("before", held.token, b"1", retention=RETENTION),
            lambda: store.get("before"),
            lambda: store.purge(),
        ):
            with pytest.raises(StoreError) as info:
                await call()
            assert isinstance(info.value.original, PostgresStore.driver_errors)
            assert info.value.__cause__ is info.value.original
    finally:
        private_postgres.start()
    deadline = time.monotonic() + 30
    while True:  # pooled connections died with the server: the pool reconnects
        try:
            record = await store.get("before")
            break
        except StoreError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    assert record is not None and record.status is Status.IN_PROGRESS
    during = await store.claim("during", lease=LEASE, retention=RETENTION)
    assert during.outcome is Outcome.ACQUIRED  # the claim during the outage wrote nothing
    again = await store.claim("before", lease=LEASE, retention=RETENTION)
    assert (again.outcome, again.token) == (Outcome.IN_PROGRESS, held.token)
    assert await store.complete("before", held.token, b"1", retention=RETENTION)
    assert await shared_server_started() == shared_started  # the shared server ran on


async def shared_server_started() -> object:
    """The shared server's ``pg_postmaster_start_time()``, or None if it is unreachable."""
    try:
        conn = await asyncpg.connect(postgres_dsn(), timeout=5)
    except (OSError, asyncpg.PostgresError):
        return None
    try:
        return await conn.fetchval("SELECT pg_postmaster_start_time()")
    finally:
        await conn.close()


async def test_unreachable_server_is_a_store_error_with_the_original() -> None:
    store = PostgresStore("postgresql://postgres@127.0.0.1:1/test", connect_timeout=2)
    try:
        with pytest.raises(StoreError) as info:
            await store.claim("k", lease=LEASE, retention=RETENTION)
        assert isinstance(info.value.original, OSError)
        with pytest.raises(StoreError):
            await store.get("k")
    finally:
        await store.close()


async def test_wrong_database_is_a_configuration_error() -> None:
    postgres_reachable_or_missing()
    parts = urlsplit(postgres_dsn())
    store = PostgresStore(parts._replace(path="/no_such_db_telegram_idem").geturl())
    try:
        with pytest.raises(ConfigurationError):
            await store.get("k")
    finally:
        await store.close()


async def test_closed_store_raises_store_error(
    postgres_url_factory: Callable[[], str], clock: ManualClock
) -> None:
    store = PostgresStore.from_url(postgres_url_factory(), clock=clock)
    first = await store.claim("k", lease=LEASE, retention=RETENTION)
    await store.close()
    await store.close()  # idempotent
    for call in (
        lambda: store.claim("k", lease=LEASE, retention=RETENTION),
        lambda: store.claim_many(["k"], lease=LEASE, retention=RETENTION),
        lambda: store.complete("k", first.token, b"1", retention=RETENTION),
        lambda: store.release("k", first.token),
        lambda: store.extend("k", first.token, lease=LEASE),
        lambda: store.get("k"),
        lambda: store.purge(),
    ):
        with pytest.raises(StoreError):
            await call()


# ----------------------------------------------------------------- URLs


def test_url_options_are_parsed_and_stripped_from_the_dsn() -> None:
    store = store_from_url(
        "postgres://bot:s3cret@db.example:6432/bot?table_prefix=bot1&auto_create=1"
        "&min_size=2&max_size=20&statement_cache_size=0&command_timeout=2.5"
        "&connect_timeout=4&purge_every=10&purge_batch=50&sslmode=require"
        "&application_name=mybot"
    )
    assert isinstance(store, PostgresStore)
    assert store.table == "bot1_records"
    assert store.connection.dsn == (
        "postgres://bot:s3cret@db.example:6432/bot?sslmode=require&application_name=mybot"
    )
    options = store.connection.options
    assert (options.min_size, options.max_size, options.statement_cache_size) == (2, 20, 0)
    assert (options.command_timeout, options.connect_timeout) == (2.5, 4.0)
    assert (options.purge_every, options.purge_batch, options.auto_create) == (10, 50, True)
    assert store.connection.clock is None  # the server's clock
    assert "s3cret" not in repr(store)


def test_url_defaults() -> None:
    store = store_from_url("postgresql://postgres@127.0.0.1/test")
    assert isinstance(store, PostgresStore)
    assert store.table == "idem_records"
    options = store.connection.options
    assert (options.min_size, options.max_size, options.statement_cache_size) == (1, 10, 100)
    assert options.auto_create is False


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://h/db?tabel_prefix=x",  # typo
        "postgresql://h/db?table_prefix=Bad-Name",
        "postgresql://h/db?table_prefix=1abc",
        "postgresql://h/db?table_prefix=",
        f"postgresql://h/db?table_prefix={'x' * 41}",
        "postgresql://h/db?auto_create=maybe",
        "postgresql://h/db?min_size=one",
        "postgresql://h/db?min_size=5&max_size=2",
        "postgresql://h/db?max_size=0",
        "postgresql://h/db?statement_cache_size=-1",
        "postgresql://h/db?command_timeout=soon",
        "postgresql://h/db?command_timeout=0",
        "postgresql://h/db?purge_batch=0",
        "postgresql://h:notaport/db",
        "postgresql://h/db?options=-c%20search_path%3Dx",
    ],
)
def test_bad_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError):
        store_from_url(url)


def test_constructor_rejects_store_options_in_the_dsn() -> None:
    with pytest.raises(ConfigurationError, match="keyword"):
        PostgresStore("postgresql://h/db?table_prefix=x")
    with pytest.raises(ConfigurationError):
        PostgresStore("redis://h/0")


def test_url_errors_never_show_the_password() -> None:
    with pytest.raises(ConfigurationError) as info:
        store_from_url("postgresql://bot:s3cret@db/bot?tabel_prefix=x")
    assert "s3cret" not in str(info.value)
    assert "bot:***@db" in str(info.value)
