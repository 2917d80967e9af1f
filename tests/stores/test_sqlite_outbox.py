"""SQLite outbox specifics: ``enqueue_in`` joining the bot's own ``sqlite3`` and
``aiosqlite`` transactions (commit, rollback, savepoints, duplicates, the wrong file),
and several processes sharing one file (takes hold one entry per chat at a time; one
flood budget). The outbox rules themselves run in tests/stores/test_outbox_conformance.py.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sqlite3
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import aiosqlite
import pytest

from telegram_idem import ConfigurationError, ManualClock
from telegram_idem.backends.sqlite import SQLiteOutbox, SQLiteStore
from telegram_idem.flood import Bucket
from telegram_idem.outbox import AmbiguousPolicy, CallStatus, NewCall, encode_params

pytestmark = pytest.mark.sqlite

BOT = 7000000001
LEASE = 30.0
Isolation = Literal["DEFERRED"] | None
"""sqlite3's default transaction control (``BEGIN DEFERRED`` before a write), or none."""

BUSINESS = "CREATE TABLE IF NOT EXISTS posts (id INTEGER PRIMARY KEY, title TEXT NOT NULL)"


def call(name: str, chat: int = 42, *, collapse: str | None = None) -> NewCall:
    """A ``sendMessage`` to ``chat`` under the effect key ``idem:<bot>:e:<name>``."""
    params = encode_params({"chat_id": chat, "text": name})
    return NewCall(
        key=f"idem:{BOT}:e:{name}",
        bot_id=BOT,
        method="sendMessage",
        params=params,
        ordering_key=f"chat:{chat}",
        collapse_key=collapse,
        policy=AmbiguousPolicy.HOLD,
    )


class BotDB:
    """The bot's own connection to a database file, sync (sqlite3) or async (aiosqlite),
    in sqlite3's default transaction control (a DML statement opens a transaction)."""

    conn: object

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    async def commit(self) -> None:
        raise NotImplementedError

    async def rollback(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class SyncDB(BotDB):
    def __init__(self, path: Path, isolation_level: Isolation = "DEFERRED") -> None:
        self.sync = sqlite3.connect(path, timeout=5, isolation_level=isolation_level)
        self.conn = self.sync

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.sync.execute(sql, params).fetchall()]

    async def commit(self) -> None:
        self.sync.commit()

    async def rollback(self) -> None:
        self.sync.rollback()

    async def close(self) -> None:
        self.sync.close()


class AioDB(BotDB):
    def __init__(self, conn: aiosqlite.Connection) -> None:
        self.aio = conn
        self.conn = conn

    @classmethod
    async def open(cls, path: Path, isolation_level: Isolation = "DEFERRED") -> AioDB:
        return cls(await aiosqlite.connect(path, timeout=5, isolation_level=isolation_level))

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        async with self.aio.execute(sql, params) as cur:
            return [tuple(r) for r in await cur.fetchall()]

    async def commit(self) -> None:
        await self.aio.commit()

    async def rollback(self) -> None:
        await self.aio.rollback()

    async def close(self) -> None:
        await self.aio.close()


async def open_db(kind: str, path: Path, isolation_level: Isolation = "DEFERRED") -> BotDB:
    if kind == "sqlite3":
        return SyncDB(path, isolation_level)
    return await AioDB.open(path, isolation_level)


@pytest.fixture
async def store(tmp_path: Path, clock: ManualClock) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "bot.db", clock=clock)
    await s.connection.open()  # as a running bot's store has: the file is set up
    yield s
    await s.close()


@pytest.fixture
def outbox(store: SQLiteStore) -> SQLiteOutbox:
    return store.outbox()


@pytest.fixture(params=["sqlite3", "aiosqlite"])
async def bot_db(request: pytest.FixtureRequest, store: SQLiteStore) -> AsyncIterator[BotDB]:
    """The bot's connection to the store's file, with a ``posts`` table of its own."""
    db = await open_db(request.param, Path(store.path))
    await db.execute(BUSINESS)
    await db.commit()
    yield db
    await db.close()


async def posts(store: SQLiteStore) -> list[str]:
    """The titles committed in the bot's table, read through another connection."""
    rows = await store.connection.run(lambda c: c.execute("SELECT title FROM posts").fetchall())
    return [r[0] for r in rows]


async def test_store_has_one_outbox_and_one_flood_budget(store: SQLiteStore) -> None:
    assert store.outbox() is store.outbox()
    assert store.flood_budget() is store.flood_budget()


async def test_commit_makes_the_entry_and_the_business_row_visible_together(
    bot_db: BotDB, store: SQLiteStore, outbox: SQLiteOutbox
) -> None:
    await bot_db.execute("INSERT INTO posts (title) VALUES ('hello')")
    entry, stored = await outbox.enqueue_in(bot_db.conn, call("reply"))
    assert stored and entry.status is CallStatus.PENDING and entry.key == call("reply").key

    # Not committed yet: another connection sees neither the row nor the entry.
    assert await outbox.get(entry.key) is None
    assert await outbox.counts() == {}
    assert await posts(store) == []

    await bot_db.commit()
    assert await posts(store) == ["hello"]
    taken = await outbox.take(bot_id=BOT, lease=LEASE)
    assert taken is not None and taken.key == entry.key and taken.seq == entry.seq
    assert taken.params == call("reply").params


async def test_rollback_leaves_no_entry(
    bot_db: BotDB, store: SQLiteStore, outbox: SQLiteOutbox
) -> None:
    await bot_db.execute("INSERT INTO posts (title) VALUES ('hello')")
    await outbox.enqueue_in(bot_db.conn, call("reply"))
    await bot_db.rollback()
    assert await outbox.get(call("reply").key) is None
    assert await outbox.take(bot_id=BOT, lease=LEASE) is None
    assert await posts(store) == []


async def test_enqueue_in_never_commits_the_callers_transaction(
    bot_db: BotDB, outbox: SQLiteOutbox
) -> None:
    # enqueue_in as the transaction's first write: it is still the bot's to end.
    await outbox.enqueue_in(bot_db.conn, call("first"))
    await bot_db.execute("INSERT INTO posts (title) VALUES ('after')")
    await bot_db.rollback()
    assert await outbox.get(call("first").key) is None


async def test_enqueue_in_issues_no_transaction_statement_on_the_bots_connection(
    store: SQLiteStore, outbox: SQLiteOutbox
) -> None:
    conn = sqlite3.connect(store.path)
    try:
        conn.execute(BUSINESS)
        conn.execute("INSERT INTO posts (title) VALUES ('hello')")  # the bot's transaction
        seen: list[str] = []
        conn.set_trace_callback(seen.append)
        await outbox.enqueue_in(conn, call("a", collapse="c"))
        await outbox.enqueue_in(conn, call("b", collapse="c"))
        await outbox.enqueue_in(conn, call("a"))
        conn.set_trace_callback(None)
        assert conn.in_transaction
        words = {sql.split()[0].upper() for sql in seen}
        assert words <= {"PRAGMA", "INSERT", "SELECT", "UPDATE"}, seen
        conn.rollback()
    finally:
        conn.close()
    assert await outbox.counts() == {}


async def traced(db: BotDB, seen: list[str] | None) -> None:
    """Record every statement ``db``'s connection runs into ``seen`` (``None``: stop)."""

    def callback(sql: str) -> None:
        if seen is not None:
            seen.append(sql)

    if isinstance(db, AioDB):
        await db.aio.set_trace_callback(callback)
    else:
        assert isinstance(db.conn, sqlite3.Connection)
        db.conn.set_trace_callback(callback)


async def test_a_connection_is_checked_once_then_a_new_call_is_one_statement(
    bot_db: BotDB, outbox: SQLiteOutbox
) -> None:
    await bot_db.execute("INSERT INTO posts (title) VALUES ('paid')")  # the bot's transaction
    seen: list[str] = []
    await traced(bot_db, seen)
    await outbox.enqueue_in(bot_db.conn, call("first"))
    assert [sql.split()[0] for sql in seen] == ["PRAGMA", "INSERT"], seen
    for name in ("second", "third"):
        seen.clear()
        await outbox.enqueue_in(bot_db.conn, call(name))
        assert [sql.split()[0] for sql in seen] == ["INSERT"], seen
    seen.clear()
    _, stored = await outbox.enqueue_in(bot_db.conn, call("second"))  # stored already
    assert not stored and [sql.split()[0] for sql in seen] == ["INSERT", "SELECT"], seen
    await traced(bot_db, None)
    await bot_db.commit()
    assert (await outbox.counts())[CallStatus.PENDING] == 3


async def test_enqueue_in_does_not_wait_for_the_store_s_own_thread(
    bot_db: BotDB, store: SQLiteStore, outbox: SQLiteOutbox
) -> None:
    await outbox.enqueue_in(bot_db.conn, call("first"))  # the store's set-up check, once
    await bot_db.commit()
    busy = asyncio.create_task(store.connection.run(lambda _: time.sleep(1.5)))
    await asyncio.sleep(0.05)  # the store's thread is busy now
    started = time.monotonic()
    _, stored = await outbox.enqueue_in(bot_db.conn, call("second"))
    assert stored and time.monotonic() - started < 1.0
    assert not busy.done()
    await bot_db.commit()
    await busy


async def test_a_closed_connection_s_check_does_not_pass_to_one_at_its_address(
    tmp_path: Path, store: SQLiteStore, outbox: SQLiteOutbox
) -> None:
    # CPython reuses a freed connection's address at once: a check remembered by id()
    # alone would accept the next connection there, on whatever file it is.
    reused = 0
    for i in range(5):
        mine = sqlite3.connect(store.path)
        await outbox.enqueue_in(mine, call(f"mine-{i}"))
        mine.commit()
        address = id(mine)
        mine.close()
        del mine
        gc.collect()
        other = sqlite3.connect(tmp_path / "other.db")
        try:
            reused += id(other) == address
            with pytest.raises(ConfigurationError, match=r"other\.db"):
                await outbox.enqueue_in(other, call(f"lost-{i}"))
        finally:
            other.close()
            del other
            gc.collect()
    assert reused  # the case the test is about happened
    assert (await outbox.counts())[CallStatus.PENDING] == 5


async def test_a_stale_holder_of_an_expired_key_cannot_record_over_its_new_call(
    outbox: SQLiteOutbox, clock: ManualClock
) -> None:
    first, _ = await outbox.enqueue(replace(call("reply"), retention=10.0))
    stale = await outbox.take(bot_id=BOT, lease=LEASE)
    assert stale is not None and await outbox.deliver(stale, result=b"true")
    clock.advance(11)  # the delivered entry's retention is over: the key stores anew
    again, stored = await outbox.enqueue(call("reply"))
    assert stored and again.seq > first.seq and again.status is CallStatus.PENDING
    taken = await outbox.take(bot_id=BOT, lease=LEASE)
    assert taken is not None and taken.token > stale.token
    assert not await outbox.deliver(stale, result=b"stale")


async def test_each_outbox_and_budget_primitive_is_one_immediate_transaction(
    store: SQLiteStore, outbox: SQLiteOutbox
) -> None:
    seen: list[str] = []
    await store.connection.run(lambda c: c.set_trace_callback(seen.append))
    budget = store.flood_budget()
    await outbox.enqueue(call("a"))
    taken = await outbox.take(bot_id=BOT, lease=LEASE)
    assert taken is not None
    assert await outbox.deliver(taken, result=b"true")
    await budget.reserve([Bucket("idem:1:f:x", 1.0, 2.0), Bucket("idem:1:f:y", 1.0, 2.0)])
    await budget.pause("idem:1:f:gate", 5.0)
    await store.connection.run(lambda c: c.set_trace_callback(None))
    edges = [sql for sql in seen if sql in ("BEGIN IMMEDIATE", "COMMIT", "ROLLBACK")]
    assert edges == ["BEGIN IMMEDIATE", "COMMIT"] * 5, seen
    assert seen[0] == "BEGIN IMMEDIATE" and seen[-1] == "COMMIT"


async def test_a_duplicate_key_in_a_second_transaction_returns_the_first_entry(
    bot_db: BotDB, outbox: SQLiteOutbox
) -> None:
    first, stored = await outbox.enqueue_in(bot_db.conn, call("reply"))
    await bot_db.commit()
    assert stored

    again, stored_again = await outbox.enqueue_in(bot_db.conn, call("reply"))
    await bot_db.commit()
    assert not stored_again
    assert (again.seq, again.created_at, again.status) == (
        first.seq,
        first.created_at,
        CallStatus.PENDING,
    )
    assert await outbox.counts() == {CallStatus.PENDING: 1}


async def test_collapse_and_parking_hold_inside_the_bots_transaction(
    bot_db: BotDB, outbox: SQLiteOutbox
) -> None:
    old, _ = await outbox.enqueue_in(bot_db.conn, call("edit-1", collapse="edit:42:9"))
    new, _ = await outbox.enqueue_in(bot_db.conn, call("edit-2", collapse="edit:42:9"))
    await bot_db.commit()
    replaced = await outbox.get(old.key)
    assert replaced is not None and replaced.status is CallStatus.SUPERSEDED
    assert replaced.result is not None
    assert json.loads(replaced.result) == {"superseded_by": new.key}

    head = await outbox.take(bot_id=BOT, lease=LEASE)
    assert head is not None and head.key == new.key
    assert await outbox.park(head, error="Forbidden: bot was blocked by the user")
    parked, stored = await outbox.enqueue_in(bot_db.conn, call("later"))
    await bot_db.commit()
    assert stored and parked.status is CallStatus.PARKED


@pytest.mark.parametrize("kind", ["sqlite3", "aiosqlite"])
async def test_a_rolled_back_savepoint_leaves_no_entry_in_a_committed_transaction(
    kind: str, store: SQLiteStore, outbox: SQLiteOutbox
) -> None:
    db = await open_db(kind, Path(store.path), isolation_level=None)  # explicit BEGIN
    try:
        await db.execute(BUSINESS)
        await db.execute("BEGIN")
        await db.execute("INSERT INTO posts (title) VALUES ('kept')")
        await db.execute("SAVEPOINT notify")
        await outbox.enqueue_in(db.conn, call("dropped"))
        await db.execute("ROLLBACK TO notify")
        await db.execute("RELEASE notify")
        await outbox.enqueue_in(db.conn, call("kept"))
        await db.execute("COMMIT")
    finally:
        await db.close()
    assert await posts(store) == ["kept"]
    assert await outbox.get(call("dropped").key) is None
    kept = await outbox.get(call("kept").key)
    assert kept is not None and kept.status is CallStatus.PENDING


@pytest.mark.parametrize("kind", ["sqlite3", "aiosqlite"])
async def test_a_file_the_store_never_set_up_is_refused_at_once_inside_a_locked_transaction(
    kind: str, tmp_path: Path, clock: ManualClock
) -> None:
    path = tmp_path / "fresh.db"
    store = SQLiteStore(path, clock=clock)  # busy_timeout 5 s: the error must not wait it out
    db = await open_db(kind, path)
    try:
        await db.execute(BUSINESS)
        await db.execute("INSERT INTO posts (title) VALUES ('hello')")  # holds the lock
        started = asyncio.get_running_loop().time()
        with pytest.raises(ConfigurationError, match="use the store once before"):
            await store.outbox().enqueue_in(db.conn, call("reply"))
        assert asyncio.get_running_loop().time() - started < 2.0
        await db.rollback()
        # Once the store has set the file up, the same transaction shape joins.
        await store.outbox().counts()
        await db.execute("INSERT INTO posts (title) VALUES ('hello')")
        _, stored = await store.outbox().enqueue_in(db.conn, call("reply"))
        await db.commit()
        assert stored and await store.outbox().get(call("reply").key) is not None
    finally:
        await db.close()
        await store.close()


@pytest.mark.parametrize("kind", ["sqlite3", "aiosqlite"])
async def test_a_connection_to_another_file_is_refused(
    kind: str, tmp_path: Path, outbox: SQLiteOutbox
) -> None:
    db = await open_db(kind, tmp_path / "other.db")
    try:
        with pytest.raises(ConfigurationError, match=r"other\.db"):
            await outbox.enqueue_in(db.conn, call("reply"))
    finally:
        await db.close()
    memory = sqlite3.connect(":memory:")
    try:
        with pytest.raises(ConfigurationError, match="in-memory"):
            await outbox.enqueue_in(memory, call("reply"))
    finally:
        memory.close()


async def test_the_same_file_by_another_path_is_accepted(
    tmp_path: Path, outbox: SQLiteOutbox, store: SQLiteStore
) -> None:
    link = tmp_path / "link.db"
    link.symlink_to(Path(store.path).resolve())
    conn = sqlite3.connect(str(tmp_path / "." / "link.db"))
    try:
        _, stored = await outbox.enqueue_in(conn, call("reply"))
        conn.commit()
    finally:
        conn.close()
    assert stored and await outbox.get(call("reply").key) is not None


@pytest.mark.parametrize("kind", ["sqlite3", "aiosqlite"])
async def test_an_autocommit_connection_outside_a_transaction_is_refused(
    kind: str, store: SQLiteStore, outbox: SQLiteOutbox
) -> None:
    db = await open_db(kind, Path(store.path), isolation_level=None)
    try:
        with pytest.raises(ConfigurationError, match="open transaction"):
            await outbox.enqueue_in(db.conn, call("reply"))
    finally:
        await db.close()
    assert await outbox.get(call("reply").key) is None


async def test_an_unknown_connection_type_is_refused_naming_the_accepted_ones(
    outbox: SQLiteOutbox, store: SQLiteStore
) -> None:
    with pytest.raises(ConfigurationError, match=r"sqlite3\.Connection, an aiosqlite\.Connection"):
        await outbox.enqueue_in(store.path, call("reply"))


async def test_the_bots_row_factory_does_not_change_the_entry(
    store: SQLiteStore, outbox: SQLiteOutbox
) -> None:
    conn = sqlite3.connect(store.path)
    conn.row_factory = lambda cur, row: {d[0]: v for d, v in zip(cur.description, row, strict=True)}
    try:
        entry, _ = await outbox.enqueue_in(conn, call("reply"))
        conn.commit()
    finally:
        conn.close()
    assert entry == await outbox.get(entry.key)


# --- several processes on one file -------------------------------------------------------

RELAY = textwrap.dedent(
    """
    import asyncio, json, sqlite3, sys, time
    from telegram_idem.backends.sqlite import SQLiteStore
    from telegram_idem.outbox import CallStatus

    async def main(path, marks_path, out_path, bot):
        store = SQLiteStore(path, busy_timeout=30)
        outbox = store.outbox()
        marks = sqlite3.connect(marks_path, timeout=30, isolation_level=None)
        delivered, overlaps = [], 0
        while True:
            entry = await outbox.take(bot_id=bot, lease=60)
            if entry is None:
                counts = await outbox.counts(bot_id=bot)
                if not counts.get(CallStatus.PENDING) and not counts.get(CallStatus.IN_FLIGHT):
                    break
                await asyncio.sleep(0.002)
                continue
            try:  # this chat is now held here; a second holder would fail this insert
                marks.execute("INSERT INTO held (chat) VALUES (?)", (entry.ordering_key,))
                mine = True
            except sqlite3.IntegrityError:
                overlaps, mine = overlaps + 1, False
            time.sleep(0.001)
            if mine:
                marks.execute("DELETE FROM held WHERE chat = ?", (entry.ordering_key,))
            assert await outbox.deliver(entry, result=b"true")
            delivered.append(entry.key)
        await store.close()
        with open(out_path, "w") as out:
            json.dump({"delivered": delivered, "overlaps": overlaps}, out)

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
    """
)

SPENDER = textwrap.dedent(
    """
    import asyncio, sys, time
    from telegram_idem.backends.sqlite import SQLiteStore
    from telegram_idem.flood import Bucket

    async def main(path, n, burst, start_at):
        store = SQLiteStore(path, busy_timeout=30)
        budget = store.flood_budget()
        bucket = Bucket("idem:7000000001:f:chat:42", 3600.0, burst)
        await budget.paused_for("warm-up")  # connected before the start
        time.sleep(max(0.0, start_at - time.time()))  # both processes start together
        passed = 0
        for _ in range(n):
            if await budget.reserve([bucket]) == 0.0:
                passed += 1
        await store.close()
        print(passed)

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])))
    """
)


async def run_processes(script: str, argvs: list[list[str]]) -> list[str]:
    """Start one Python process per argument list at once; their stdout, in order."""
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            script,
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for argv in argvs
    ]
    outs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), 120)
    for proc, (_, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err.decode()
    return [out.decode() for out, _ in outs]


async def test_two_processes_never_hold_two_entries_of_one_chat(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    store = SQLiteStore(path)
    outbox = store.outbox()
    chats, per_chat = 4, 40
    for i in range(per_chat):
        for chat in range(chats):
            await outbox.enqueue(call(f"m{chat}-{i}", chat=chat))
    marks = tmp_path / "marks.db"
    with sqlite3.connect(marks) as conn:
        conn.execute("CREATE TABLE held (chat TEXT PRIMARY KEY)")
    conn.close()

    outs = [tmp_path / f"relay{n}.json" for n in range(2)]
    await run_processes(RELAY, [[str(path), str(marks), str(out), str(BOT)] for out in outs])
    results = [json.loads(out.read_text()) for out in outs]

    assert [r["overlaps"] for r in results] == [0, 0]
    assert all(r["delivered"] for r in results), "both processes took entries"
    delivered = [k for r in results for k in r["delivered"]]
    assert sorted(delivered) == sorted(
        call(f"m{c}-{i}", chat=c).key for c in range(chats) for i in range(per_chat)
    )  # each once
    done = await outbox.entries(status=CallStatus.DELIVERED, limit=1000)
    for chat in range(chats):
        mine = [e for e in done if e.ordering_key == f"chat:{chat}"]
        by_time = sorted(mine, key=lambda e: e.settled_at)
        assert [e.seq for e in by_time] == sorted(e.seq for e in mine)  # enqueue order
    await store.close()


async def test_two_processes_spend_one_flood_budget(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    store = SQLiteStore(path)
    await store.flood_budget().paused_for("warm-up")  # the file and its tables exist
    await store.close()
    burst, start_at = 40, time.time() + 1.5
    argv = [str(path), "200", str(burst), str(start_at)]
    outs = await run_processes(SPENDER, [argv, argv])
    assert sum(int(out) for out in outs) == burst  # however the processes interleave
