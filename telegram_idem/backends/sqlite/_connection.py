"""One SQLite file as a store uses it, shared by the store's records, its inbox, its
outbox and its flood budget."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, TypeVar

from telegram_idem._clock import Clock
from telegram_idem.backends.sqlite._schema import (
    FLOOD_SCHEMA,
    INBOX_SCHEMA,
    LEDGER_SCHEMA,
    OUTBOX_SCHEMA,
    RECORDS_SCHEMA,
    RecordRows,
    upgrade_inbox,
)
from telegram_idem.errors import StoreError

__all__ = ["ErrorGuard", "SQLiteConnection"]

T = TypeVar("T")


class ErrorGuard(Protocol):
    """Runs one operation and turns a driver exception it raises into the library's
    error (the store's :meth:`~telegram_idem.backends._base.Store._call`)."""

    def __call__(self, op: str, fn: Callable[[], Awaitable[T]], /) -> Awaitable[T]: ...


class SQLiteConnection:
    """The connection to one file, the one thread it is used from, the transaction that
    every write runs in, and the clock that judges inside it.

    The connection is opened on first use (the file, its parent directory and the
    tables are created if absent), in WAL mode with ``synchronous=NORMAL``. Every call
    runs on one dedicated thread, so the event loop never blocks on SQLite.

    Args:
        path: the database file, or ``":memory:"``.
        name: how messages name the store (its ``repr``).
        clock: seconds since the epoch, read inside each transaction.
        busy_timeout: seconds to wait for another process's write lock.
        purge_every: purge expired records inside every ``purge_every``-th transaction.
        purge_batch: most records one purge deletes.
        guard: translates driver exceptions (see :meth:`call`).
    """

    def __init__(
        self,
        path: str,
        *,
        name: str,
        clock: Clock,
        busy_timeout: float,
        purge_every: int,
        purge_batch: int,
        guard: ErrorGuard,
    ) -> None:
        self.path = path
        self.name = name
        self.clock = clock
        self.purge_batch = purge_batch
        self._busy_timeout = busy_timeout
        self._purge_every = purge_every
        self._guard = guard
        self._writes = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="idem-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    def _connect(self, wait: bool = True) -> sqlite3.Connection:
        if self._conn is None:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            timeout = self._busy_timeout if wait else 0.0
            conn = sqlite3.connect(
                self.path, timeout=timeout, isolation_level=None, check_same_thread=False
            )
            try:
                _set_up(conn, deadline=time.monotonic() + timeout)
                conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    @property
    def is_open(self) -> bool:
        """Whether the connection is open, its file and tables set up (no I/O)."""
        return self._conn is not None

    async def open(self, *, wait: bool = True) -> None:
        """Open the connection now, unless it is open (the file and its tables are
        created if absent; on a file already set up this takes no lock).

        Args:
            wait: wait up to ``busy_timeout`` for another connection's lock while
                setting the file up; ``False``: fail at once instead.

        Raises:
            StoreError: the connection is closed.
            sqlite3.Error, OSError: from SQLite (``OperationalError`` "database is
                locked": another connection holds the lock the set-up needs),
                untranslated (see :meth:`call`).
        """
        if self._closed:
            raise StoreError(f"{self.name} is closed")
        await asyncio.get_running_loop().run_in_executor(self._executor, self._connect, wait)

    async def call(self, op: str, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()``, a driver exception becoming
        :class:`~telegram_idem.errors.StoreError` or
        :class:`~telegram_idem.errors.ConfigurationError` (the store's translation;
        messages name the store and ``op``).

        Args:
            op: the operation's name, for error messages (``claim``, ``inbox.take``…).
            fn: the work, untranslated.
        """
        return await self._guard(op, fn)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(connection)`` on the connection's thread, outside any transaction.

        Args:
            fn: the work, given the ``sqlite3`` connection.

        Raises:
            StoreError: the connection is closed.
            sqlite3.Error, OSError: from SQLite, untranslated (see :meth:`call`).
        """
        if self._closed:
            raise StoreError(f"{self.name} is closed")

        def job() -> T:
            return fn(self._connect())

        return await asyncio.get_running_loop().run_in_executor(self._executor, job)

    async def transaction(self, body: Callable[[sqlite3.Connection, float], T]) -> T:
        """``body(connection, now)`` in one ``BEGIN IMMEDIATE`` transaction on the
        connection's thread: the write lock is taken before ``body`` reads, ``now`` is
        the clock read after it is taken, and every ``purge_every``-th transaction also
        purges a batch of expired records. An exception from ``body`` rolls back.

        Args:
            body: the work, given the ``sqlite3`` connection and ``now`` (seconds since the
                epoch).

        Raises:
            StoreError: the connection is closed.
            sqlite3.Error, OSError: from SQLite (a ``busy_timeout`` wait that ran out:
                ``OperationalError``), untranslated (see :meth:`call`).
        """
        return await self.run(lambda conn: self._in_transaction(conn, body))

    def _in_transaction(
        self, conn: sqlite3.Connection, body: Callable[[sqlite3.Connection, float], T]
    ) -> T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            out = body(conn, self.clock())
            self._writes += 1
            if self._writes % self._purge_every == 0:
                RecordRows(conn).purge(self.clock(), self.purge_batch)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return out

    async def close(self) -> None:
        """Close the connection and its thread. Idempotent; later calls raise
        :class:`~telegram_idem.errors.StoreError`."""
        self._closed = True
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=False)


def _set_up(conn: sqlite3.Connection, *, deadline: float) -> None:
    """WAL mode and the tables on a new connection, retried until ``deadline``
    (``time.monotonic()`` seconds) while another connection holds a lock.

    SQLite answers ``PRAGMA journal_mode=WAL`` with "database is locked" *without*
    calling the busy handler while another connection sets the file up or checkpoints
    it, so the connection's ``timeout`` alone does not cover it: many processes (or
    store objects) opening one new file at once saw that error. The mode is only
    changed when it is not WAL already (a read), and the whole set-up is repeated with a
    short back-off until it succeeds or ``deadline`` passes; then the last error is
    raised.
    """
    pause = 0.005
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode").fetchone()
            if mode is None or str(mode[0]).lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            for script in (
                RECORDS_SCHEMA,
                INBOX_SCHEMA,
                OUTBOX_SCHEMA,
                FLOOD_SCHEMA,
                LEDGER_SCHEMA,
            ):
                conn.executescript(script)
            upgrade_inbox(conn)  # a file from before admitted_at
            return
        except sqlite3.OperationalError as exc:
            text = str(exc).lower()
            if ("locked" not in text and "busy" not in text) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
