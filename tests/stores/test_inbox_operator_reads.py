"""The inbox's operator reads, store by store, where the conformance suite cannot look:
databases made before ``admitted_at`` existed (SQLite upgrades its file on open,
PostgreSQL's ``migrate`` upgrades the table and a store on an un-upgraded table says to
run it, a Redis entry hash without the field reads as 0), the PostgreSQL plans of the
listings, and Redis listings read in several bounded scripts.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from fixtures_postgres import drop_tables, postgres_reachable_or_missing, with_option
from services import UrlFactory, postgres_dsn

from telegram_idem import ConfigurationError, ManualClock
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.backends.postgres import (
    PostgresInbox,
    PostgresStore,
    create_ddl,
    inbox_table_name,
)
from telegram_idem.backends.redis import RedisInbox, RedisStore
from telegram_idem.backends.redis import _inbox as redis_inbox
from telegram_idem.backends.sqlite import SQLiteStore
from telegram_idem.backends.sqlite._inbox import _listing as sqlite_listing
from telegram_idem.inbox import EntryStatus, Inbox, NewEntry

RETENTION = 3600.0
LEASE = 30.0


def entry(update_id: int, chat: str | None = "chat:1") -> NewEntry:
    payload = json.dumps({"update_id": update_id, "message": {"text": "hi"}}).encode()
    return NewEntry(f"idem:7:u:{update_id}", chat, payload)


# ----------------------------------------------------------------- SQLite

# idem_inbox as the versions before admitted_at made it (and its index).
_OLD_SQLITE_INBOX = """
CREATE TABLE idem_inbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    ordering_key TEXT NOT NULL,
    payload BLOB NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    token INTEGER NOT NULL,
    available_at REAL NOT NULL,
    lease_expires_at REAL NOT NULL,
    last_error TEXT
);
CREATE INDEX idem_inbox_heads ON idem_inbox (ordering_key, seq) WHERE status != 'dead';
INSERT INTO idem_inbox (id, ordering_key, payload, status, attempts, token, available_at,
                        lease_expires_at, last_error)
VALUES ('idem:7:u:1', 'chat:1', X'7B7D', 'dead', 1, 1, 0, 0, 'old failure'),
       ('idem:7:u:2', 'chat:1', X'7B7D', 'pending', 0, 0, 0, 0, NULL);
"""


def _columns(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[1] for row in conn.execute("PRAGMA table_info(idem_inbox)")]
    finally:
        conn.close()


async def test_sqlite_adds_admitted_at_to_an_older_file_on_open(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(_OLD_SQLITE_INBOX)
    conn.close()
    assert "admitted_at" not in _columns(path)

    store = SQLiteStore(path, clock=clock)
    try:
        inbox = store.inbox()
        old = await inbox.get("idem:7:u:1")
        assert old is not None
        assert (old.status, old.last_error, old.admitted_at) == (
            EntryStatus.DEAD,
            "old failure",
            0.0,
        )
        assert await inbox.admit(entry(3, "chat:2"), retention=RETENTION)
        stats = await inbox.stats()
        assert dict(stats.counts) == {
            EntryStatus.PENDING: 2,
            EntryStatus.IN_FLIGHT: 0,
            EntryStatus.DEAD: 1,
        }
        assert dict(stats.oldest_admitted_at) == {
            EntryStatus.PENDING: 0.0,  # admitted before it was recorded
            EntryStatus.DEAD: 0.0,
        }
        new = await inbox.get("idem:7:u:3")
        assert new is not None and new.admitted_at == clock.now
        assert [e.id for e in await inbox.entries()] == ["idem:7:u:1", "idem:7:u:2", "idem:7:u:3"]
    finally:
        await store.close()
    assert _columns(path)[-1] == "admitted_at"

    again = SQLiteStore(path, clock=clock)  # an upgraded file is opened as it is
    try:
        assert len(await again.inbox().entries()) == 3
    finally:
        await again.close()


@pytest.mark.parametrize(
    ("status", "key", "index"),
    [
        (None, None, None),  # rowid (seq) order, cut by the limit
        (EntryStatus.DEAD, None, "idem_inbox_status"),
        (EntryStatus.PENDING, None, "idem_inbox_status"),
        (EntryStatus.PENDING, "chat:1", "idem_inbox_heads"),
        (EntryStatus.DEAD, "chat:1", "idem_inbox_status"),
        (None, "chat:1", "idem_inbox_heads"),
    ],
)
async def test_sqlite_listings_read_in_index_order(
    tmp_path: Path, status: EntryStatus | None, key: str | None, index: str | None
) -> None:
    store = SQLiteStore(tmp_path / "bot.db")
    try:
        await store.inbox().depth()  # opens the file and makes the tables
    finally:
        await store.close()
    sql, args = sqlite_listing(status, key)
    conn = sqlite3.connect(tmp_path / "bot.db")
    try:
        plan = [str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", (*args, 10))]
    finally:
        conn.close()
    assert not any("TEMP B-TREE" in step for step in plan), plan  # no sort of all rows
    if index is not None:
        assert any(index in step for step in plan), plan


# ----------------------------------------------------------------- PostgreSQL


@pytest.fixture
async def fresh_prefix() -> AsyncIterator[str]:
    """A table prefix with NO tables made; dropped after."""
    postgres_reachable_or_missing()
    prefix = f"t{os.urandom(6).hex()}"
    yield prefix
    await drop_tables(postgres_dsn(), [prefix])


@pytest.mark.postgres
async def test_postgres_migrate_upgrades_an_older_inbox_and_says_so_until_then(
    fresh_prefix: str, clock: ManualClock
) -> None:
    table = inbox_table_name(fresh_prefix)
    conn = await asyncpg.connect(postgres_dsn())
    try:
        for statement in create_ddl(fresh_prefix):
            await conn.execute(statement)
        # the table as the versions before admitted_at made it, with an entry in it
        await conn.execute(f"ALTER TABLE {table} DROP COLUMN admitted_at")
        await conn.execute(
            f"INSERT INTO {table} (id, ordering_key, payload, status, attempts, token, "
            "available_at, lease_expires_at, last_error) "
            "VALUES ('idem:7:u:1', 'chat:1', '\\x7b7d', 'dead', 1, 1, 0, 0, 'old failure')"
        )
    finally:
        await conn.close()

    url = with_option(postgres_dsn(), f"table_prefix={fresh_prefix}")
    store = PostgresStore.from_url(url, clock=clock)
    try:
        inbox = store.inbox()
        with pytest.raises(ConfigurationError, match="telegram-idem migrate"):
            await inbox.admit(entry(2), retention=RETENTION)
        with pytest.raises(ConfigurationError, match="telegram-idem migrate"):
            await inbox.entries()
        await store.migrate()
        await store.migrate()  # idempotent
        old = await inbox.get("idem:7:u:1")
        assert old is not None and (old.status, old.admitted_at) == (EntryStatus.DEAD, 0.0)
        assert await inbox.admit(entry(2), retention=RETENTION)
        new = await inbox.get("idem:7:u:2")
        assert new is not None and new.admitted_at == clock.now
        stats = await inbox.stats()
        assert dict(stats.oldest_admitted_at) == {
            EntryStatus.DEAD: 0.0,
            EntryStatus.PENDING: clock.now,
        }
    finally:
        await store.close()


async def _plan(conn: Any, sql: str, *args: Any) -> str:
    rows = await conn.fetch(f"EXPLAIN (FORMAT JSON) {sql}", *args)
    return json.dumps(json.loads(rows[0][0]))


@pytest.mark.postgres
async def test_postgres_listings_read_an_index_not_the_whole_table(
    postgres_url_factory: UrlFactory, clock: ManualClock
) -> None:
    url = postgres_url_factory()
    store = PostgresStore.from_url(url, clock=clock)
    try:
        inbox = store.inbox()
        assert isinstance(inbox, PostgresInbox)
        await inbox.admit_many(
            [entry(uid, f"chat:{uid % 50}") for uid in range(5000)], retention=RETENTION
        )
        for _ in range(5):
            taken = await inbox.take(lease=LEASE)
            assert taken is not None and await inbox.bury(taken, error="bad")
        sql = inbox._sql  # the statements the inbox runs
        table = inbox.table
        conn = await asyncpg.connect(postgres_dsn())
        try:
            await conn.execute(f"ANALYZE {table}")
            plans = {
                "dead": await _plan(conn, sql["entries_status"], 100, "dead"),
                "in_flight": await _plan(conn, sql["entries_status"], 100, "in_flight"),
                "pending": await _plan(conn, sql["entries_status"], 100, "pending"),
                "chat": await _plan(conn, sql["entries_live_key"], 100, "chat:7", "pending"),
                "chat any": await _plan(conn, sql["entries_key"], 100, "chat:7"),
            }
        finally:
            await conn.close()
    finally:
        await store.close()
    for name, plan in plans.items():
        assert "Seq Scan" not in plan, (name, plan)
        assert "Index" in plan, (name, plan)
    assert f"{table}_status_idx" in plans["dead"]
    assert f"{table}_heads_idx" in plans["chat"]


# ----------------------------------------------------------------- Redis


@pytest.mark.redis
async def test_redis_reads_entries_of_an_older_version_and_files_them_for_stats(
    redis_url_factory: UrlFactory, clock: ManualClock
) -> None:
    store = RedisStore.from_url(redis_url_factory(), clock=clock)
    try:
        inbox = store.inbox()
        assert isinstance(inbox, RedisInbox)
        await inbox.admit_many([entry(1, "a"), entry(2, "b"), entry(3, "c")], retention=RETENTION)
        dead = await inbox.take(lease=LEASE)
        assert dead is not None and await inbox.bury(dead, error="bad")
        held = await inbox.take(lease=LEASE)
        assert held is not None
        # the inbox as a version before admitted_at left it: no adm field, no T:a:<status>
        old = [inbox.key(f"a:{s.value}") for s in EntryStatus]
        hashes = [inbox.key(f"e:idem:7:u:{uid}") for uid in (1, 2, 3)]

        async def downgrade(client: Any) -> None:
            await client.delete(*old)
            for h in hashes:
                await client.hdel(h, "adm")

        await store.connection.execute(downgrade)
        got = await inbox.get("idem:7:u:3")
        assert got is not None and got.admitted_at == 0.0
        stats = await inbox.stats()  # files the entries under their status once
        assert dict(stats.counts) == dict.fromkeys(EntryStatus, 1)
        assert dict(stats.oldest_admitted_at) == dict.fromkeys(EntryStatus, 0.0)
        assert [u.oldest_admitted_at for u in await inbox.backlog()] == [0.0, 0.0]
        clock.advance(5)
        assert await inbox.admit(entry(4, "d"), retention=RETENTION)
        assert await inbox.ack(held)
        stats = await inbox.stats()
        assert dict(stats.counts) == {
            EntryStatus.PENDING: 2,
            EntryStatus.IN_FLIGHT: 0,
            EntryStatus.DEAD: 1,
        }
        assert dict(stats.oldest_admitted_at) == {
            EntryStatus.PENDING: 0.0,
            EntryStatus.DEAD: 0.0,
        }
        assert await inbox.drop(dead.id)
        assert (await inbox.stats()).counts[EntryStatus.DEAD] == 0
    finally:
        await store.close()


async def _scenario(inbox: Inbox) -> None:
    await inbox.admit_many(
        [entry(uid, f"chat:{uid % 4}") for uid in range(1, 41)], retention=RETENTION
    )
    for _ in range(3):
        taken = await inbox.take(lease=LEASE)
        assert taken is not None and await inbox.bury(taken, error="bad")
    await inbox.take(lease=LEASE)  # one in flight


_FILTERS: list[dict[str, Any]] = [
    {},
    {"status": EntryStatus.PENDING},
    {"status": EntryStatus.IN_FLIGHT},
    {"status": EntryStatus.DEAD},
    {"ordering_key": "chat:2"},
    {"ordering_key": "chat:1", "status": EntryStatus.DEAD},
    {"ordering_key": "chat:3", "status": EntryStatus.PENDING},
]


@pytest.mark.redis
@pytest.mark.parametrize("limit", [1, 3, 7, 100])
async def test_redis_listings_read_in_bounded_scripts_agree_with_memory(
    redis_url_factory: UrlFactory,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    limit: int,
) -> None:
    monkeypatch.setattr(redis_inbox, "ENTRIES_BUDGET", 2)  # many scripts per listing
    store = RedisStore.from_url(redis_url_factory(), clock=clock)
    model = MemoryStore(clock=clock)
    try:
        await _scenario(store.inbox())
        await _scenario(model.inbox())
        for filters in _FILTERS:
            got = await store.inbox().entries(limit=limit, **filters)
            want = await model.inbox().entries(limit=limit, **filters)
            assert [e.id for e in got] == [e.id for e in want], filters
            assert [e.status for e in got] == [e.status for e in want], filters
    finally:
        await store.close()
        await model.close()
