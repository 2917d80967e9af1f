"""SQLite store specifics: several stores (and threads) on one file, outages, a closed
store, purge. The record contract itself runs in tests/stores/test_conformance.py."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from telegram_idem import Claim, ManualClock, Outcome, Status, Store, StoreError
from telegram_idem.backends.sqlite import SQLiteStore

pytestmark = pytest.mark.sqlite

LEASE = 30.0
RETENTION = 3600.0
KEY = "idem:7000000001:a:approve:4130:5550001001"


async def claim(
    store: Store,
    key: str = KEY,
    fp: str | None = None,
    *,
    lease: float = LEASE,
    retention: float = RETENTION,
) -> Claim:
    return await store.claim(key, fingerprint=fp, lease=lease, retention=retention)


async def test_two_sqlite_stores_on_one_file_see_each_other(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = tmp_path / "shared.db"
    a, b = SQLiteStore(path, clock=clock), SQLiteStore(path, clock=clock)
    try:
        first = await claim(a, fp="fp-a")
        assert first.outcome is Outcome.ACQUIRED
        assert (await claim(b, fp="fp-a")).outcome is Outcome.IN_PROGRESS
        assert (await claim(b, fp="fp-b")).outcome is Outcome.CONFLICT
        assert await a.complete(KEY, first.token, b"false", retention=RETENTION)
        replay = await claim(b, fp="fp-a")
        assert replay.outcome is Outcome.REPLAY
        assert replay.record.result == b"false"
        got = await b.get(KEY)
        assert got is not None and got.status is Status.COMPLETED
    finally:
        await a.close()
        await b.close()
    reopened = SQLiteStore(path, clock=clock)
    try:
        replay = await claim(reopened, fp="fp-a")
        assert replay.outcome is Outcome.REPLAY  # the record is on disk
    finally:
        await reopened.close()


async def test_concurrent_claims_from_four_sqlite_stores_acquire_once(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = tmp_path / "contended.db"
    stores = [SQLiteStore(path, clock=clock) for _ in range(4)]
    try:
        claims = await asyncio.gather(*(claim(stores[i % 4]) for i in range(20)))
    finally:
        for s in stores:
            await s.close()
    assert [c.outcome for c in claims].count(Outcome.ACQUIRED) == 1


def test_concurrent_claims_from_threads_acquire_once(tmp_path: Path, clock: ManualClock) -> None:
    """Four threads, each with its own event loop and SQLiteStore on one file (as four
    worker processes would), five claims each: one acquires."""
    path = tmp_path / "threads.db"
    outcomes: list[Outcome] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)
    lock = threading.Lock()

    async def worker() -> list[Outcome]:
        s = SQLiteStore(path, clock=clock, busy_timeout=30.0)
        try:
            barrier.wait()
            got = await asyncio.gather(*(claim(s) for _ in range(5)))
            return [c.outcome for c in got]
        finally:
            await s.close()

    def run() -> None:
        try:
            got = asyncio.run(worker())
            with lock:
                outcomes.extend(got)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(outcomes) == 20
    assert outcomes.count(Outcome.ACQUIRED) == 1
    assert outcomes.count(Outcome.IN_PROGRESS) == 19


async def test_sqlite_outage_is_a_store_error_with_the_original(
    tmp_path: Path, clock: ManualClock
) -> None:
    broken = SQLiteStore(tmp_path, clock=clock)  # a directory is not a database file
    try:
        with pytest.raises(StoreError) as info:
            await claim(broken)
        assert isinstance(info.value.original, sqlite3.OperationalError)
        assert info.value.__cause__ is info.value.original
        with pytest.raises(StoreError):
            await broken.get(KEY)
        with pytest.raises(StoreError):
            await broken.complete(KEY, 1, b"1", retention=RETENTION)
    finally:
        await broken.close()


async def test_closed_sqlite_store_raises_store_error(tmp_path: Path, clock: ManualClock) -> None:
    s = SQLiteStore(tmp_path / "closed.db", clock=clock)
    first = await claim(s)
    await s.close()
    await s.close()  # idempotent
    for call in (
        lambda: claim(s),
        lambda: s.claim_many([KEY], lease=LEASE, retention=RETENTION),
        lambda: s.complete(KEY, first.token, b"1", retention=RETENTION),
        lambda: s.release(KEY, first.token),
        lambda: s.extend(KEY, first.token, lease=LEASE),
        lambda: s.get(KEY),
        s.purge,
    ):
        with pytest.raises(StoreError):
            await call()


async def test_sqlite_purge_deletes_expired_records(tmp_path: Path, clock: ManualClock) -> None:
    s = SQLiteStore(tmp_path / "purge.db", clock=clock)
    try:
        for i in range(3):
            await claim(s, f"k{i}", lease=5.0, retention=10.0 + i * 100)
        clock.advance(50)
        assert await s.purge() == 1
        assert await s.purge() == 0
        assert await s.get("k1") is not None
    finally:
        await s.close()


def test_set_up_waits_out_a_lock_sqlite_reports_without_its_busy_handler(
    tmp_path: Path,
) -> None:
    """A connection with no busy wait at all (``timeout=0``) sets a file up while
    another holds it exclusively for a moment: the set-up retries until its deadline
    instead of failing on the first "database is locked" (what 50 stores opening one new
    file at once hit, because SQLite answers ``PRAGMA journal_mode=WAL`` that way
    without calling the busy handler)."""
    from telegram_idem.backends.sqlite._connection import _set_up

    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
    release.start()
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            _set_up(conn, deadline=0.0)
        _set_up(conn, deadline=time.monotonic() + 5)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        assert {"idem_records", "idem_inbox", "idem_outbox"} <= tables
    finally:
        release.join()
        conn.close()
        holder.close()
