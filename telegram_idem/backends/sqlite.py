"""SQLite store (``sqlite:///path/to/file.db``): the embedded default.

One file in WAL mode, shared safely by several processes: every claim is one
``BEGIN IMMEDIATE`` transaction (read, decide by :mod:`telegram_idem.machine`, write), so
two processes can never both acquire a key. Calls run on one dedicated thread per store.
Records past retention are purged in batches of ``purge_batch`` rows every
``purge_every`` writes, so no purge holds the write lock for long.

URL: ``sqlite:///relative.db``, ``sqlite:////abs/path.db``, ``sqlite:///:memory:``;
query ``?busy_timeout=5`` (seconds to wait for another writer).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from telegram_idem import machine
from telegram_idem.backends.base import Store
from telegram_idem.backends.sqlite_inbox import INBOX_SCHEMA, SQLiteInbox
from telegram_idem.backends.url import reject_unknown, url_options
from telegram_idem.clock import Clock, system_clock
from telegram_idem.errors import ConfigurationError, StoreError
from telegram_idem.inbox.base import Inbox
from telegram_idem.records import Claim, Record, Status

__all__ = ["SQLiteStore"]

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS idem_records (
    key TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    fencing_token INTEGER NOT NULL,
    lease_expires_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    fingerprint TEXT,
    result BLOB,
    attempts INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idem_records_expires ON idem_records (expires_at);
"""
_COLUMNS = "key, status, fencing_token, lease_expires_at, expires_at, fingerprint, result, attempts"
_SELECT = f"SELECT {_COLUMNS} FROM idem_records WHERE key = ?"
_UPSERT = f"INSERT OR REPLACE INTO idem_records ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
_PURGE = (
    "DELETE FROM idem_records WHERE key IN "
    "(SELECT key FROM idem_records WHERE expires_at <= ? LIMIT ?)"
)


def _row_to_record(row: tuple[Any, ...] | None) -> Record | None:
    if row is None:
        return None
    key, status, token, lease_at, exp_at, fp, result, attempts = row
    return Record(key, Status(status), token, lease_at, exp_at, fp, result, attempts)


def _record_to_row(r: Record) -> tuple[Any, ...]:
    return (
        r.key,
        r.status.value,
        r.fencing_token,
        r.lease_expires_at,
        r.expires_at,
        r.fingerprint,
        r.result,
        r.attempts,
    )


class SQLiteStore(Store):
    """Records in one SQLite file.

    Args:
        path: database file (created with its schema if absent) or ``":memory:"``.
        clock: seconds since the epoch. All processes sharing the file should share a
            clock source (the host's); leases are judged by it.
        busy_timeout: seconds to wait for another process's write lock before
            :class:`~telegram_idem.errors.StoreError`.
        purge_every: purge expired records after this many writes.
        purge_batch: most rows one purge deletes.
    """

    schemes = ("sqlite",)
    driver_errors = (sqlite3.OperationalError, sqlite3.InterfaceError, OSError)
    driver_base = (sqlite3.Error,)

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Clock = system_clock,
        busy_timeout: float = 5.0,
        purge_every: int = 1000,
        purge_batch: int = 500,
    ) -> None:
        self.path = str(path)
        self._clock = clock
        self._busy_timeout = busy_timeout
        self._purge_every = purge_every
        self._purge_batch = purge_batch
        self._writes = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="idem-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._inbox: Inbox | None = None

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> SQLiteStore:
        """``sqlite:///relative.db``, ``sqlite:////abs.db``, ``sqlite:///:memory:``
        with optional ``?busy_timeout=<seconds>``.

        Raises:
            ConfigurationError: no path, a host part, or a malformed option.
        """
        parts = urlsplit(url)
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if parts.netloc or not path:
            raise ConfigurationError(f"a SQLite URL is sqlite:///file.db, got {url!r}")
        options = url_options(url)
        try:
            busy = float(options.pop("busy_timeout", "5"))
        except ValueError:
            raise ConfigurationError(f"busy_timeout must be seconds in {url!r}") from None
        reject_unknown(url, options)
        return cls(path, clock=clock or system_clock, busy_timeout=busy)

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            conn.executescript(INBOX_SCHEMA)
            self._conn = conn
        return self._conn

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise StoreError(f"SQLiteStore({self.path!r}) is closed")

        def job() -> T:
            return fn(self._connect())

        return await asyncio.get_running_loop().run_in_executor(self._executor, job)

    def _transaction(self, conn: sqlite3.Connection, body: Callable[[float], T]) -> T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            out = body(self._clock())
            self._writes += 1
            if self._writes % self._purge_every == 0:
                conn.execute(_PURGE, (self._clock(), self._purge_batch))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return out

    @staticmethod
    def _read(conn: sqlite3.Connection, key: str) -> Record | None:
        return _row_to_record(conn.execute(_SELECT, (key,)).fetchone())

    def _claim_in(
        self,
        conn: sqlite3.Connection,
        key: str,
        fp: str | None,
        lease: float,
        retention: float,
        now: float,
    ) -> Claim:
        claim, new = machine.decide_claim(
            self._read(conn, key),
            key=key,
            fingerprint=fp,
            now=now,
            lease=lease,
            retention=retention,
        )
        if new is not None:
            self._write_record(conn, new)
        return claim

    @staticmethod
    def _write_record(conn: sqlite3.Connection, record: Record) -> None:
        conn.execute(_UPSERT, _record_to_row(record))

    def inbox(self) -> Inbox:
        """The durable inbox in this file (created on first use)."""
        if self._inbox is None:
            self._inbox = SQLiteInbox(self)
        return self._inbox

    async def _claim(
        self, key: str, fingerprint: str | None, lease: float, retention: float
    ) -> Claim:
        return await self._run(
            lambda c: self._transaction(
                c, lambda now: self._claim_in(c, key, fingerprint, lease, retention, now)
            )
        )

    async def _claim_many(self, keys: Sequence[str], lease: float, retention: float) -> list[Claim]:
        return await self._run(
            lambda c: self._transaction(
                c, lambda now: [self._claim_in(c, k, None, lease, retention, now) for k in keys]
            )
        )

    async def _update(
        self, key: str, step: Callable[[Record | None, float], Record | None]
    ) -> bool:
        def body(conn: sqlite3.Connection, now: float) -> bool:
            new = step(self._read(conn, key), now)
            if new is None:
                return False
            conn.execute(_UPSERT, _record_to_row(new))
            return True

        return await self._run(lambda c: self._transaction(c, lambda now: body(c, now)))

    async def _complete(self, key: str, token: int, result: bytes, retention: float) -> bool:
        return await self._update(
            key,
            lambda r, now: machine.do_complete(
                r, token=token, result=result, now=now, retention=retention
            ),
        )

    async def _fail(self, key: str, token: int, error: bytes, retention: float) -> bool:
        return await self._update(
            key,
            lambda r, now: machine.do_fail(
                r, token=token, error=error, now=now, retention=retention
            ),
        )

    async def _release(self, key: str, token: int) -> bool:
        return await self._update(key, lambda r, now: machine.do_release(r, token=token, now=now))

    async def _extend(self, key: str, token: int, lease: float) -> bool:
        return await self._update(
            key, lambda r, now: machine.do_extend(r, token=token, now=now, lease=lease)
        )

    async def _get(self, key: str) -> Record | None:
        record = await self._run(lambda c: self._read(c, key))
        return record if machine.is_live(record, self._clock()) else None

    async def _now(self) -> float:
        return self._clock()

    async def purge(self) -> int:
        """Delete up to ``purge_batch`` expired records now; returns how many.

        Raises:
            StoreError: the database could not answer.
        """

        def job(conn: sqlite3.Connection) -> int:
            return conn.execute(_PURGE, (self._clock(), self._purge_batch)).rowcount

        return await self._call("purge", lambda: self._run(job))

    async def close(self) -> None:
        """Close the connection and its thread. Idempotent; later calls raise StoreError."""
        self._closed = True
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=False)
