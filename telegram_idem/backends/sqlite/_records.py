"""The SQLite store: the decision loop of :class:`~telegram_idem.backends._local.LocalStore`
over the ``idem_records`` table of one :class:`SQLiteConnection`."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from telegram_idem._clock import Clock, system_clock
from telegram_idem._joined import JoinedRecords
from telegram_idem._records import Record
from telegram_idem.backends._local import LocalStore, RecordAccess
from telegram_idem.backends._url import StoreURL
from telegram_idem.backends.sqlite._browse import SQLiteBrowsing
from telegram_idem.backends.sqlite._connection import SQLiteConnection
from telegram_idem.backends.sqlite._flood import SQLiteFloodBudget
from telegram_idem.backends.sqlite._inbox import SQLiteInbox
from telegram_idem.backends.sqlite._join import Joined
from telegram_idem.backends.sqlite._joined_records import SQLiteJoinedRecords
from telegram_idem.backends.sqlite._ledger import SQLiteLedger
from telegram_idem.backends.sqlite._outbox import SQLiteOutbox
from telegram_idem.backends.sqlite._schema import RecordRows

__all__ = ["SQLiteStore"]

T = TypeVar("T")


class SQLiteStore(SQLiteBrowsing, LocalStore):
    """Records in one SQLite file. Serves ``sqlite:///…``. Lists, counts and deletes
    records by key prefix and checks its tables
    (:class:`~telegram_idem.backends.sqlite._browse.SQLiteBrowsing`).

    Args:
        path: database file (created with its schema if absent) or ``":memory:"``.
        clock: seconds since the epoch. All processes sharing the file should share a
            clock source (the host's); leases are judged by it.
        busy_timeout: seconds to wait for another process's write lock before
            :class:`~telegram_idem.errors.StoreError`.
        purge_every: purge expired records after this many writes.
        purge_batch: most rows one purge deletes.
    """

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
        super().__init__(clock=clock)
        self.path = str(path)
        self._connection = SQLiteConnection(
            self.path,
            name=repr(self),
            clock=clock,
            busy_timeout=busy_timeout,
            purge_every=purge_every,
            purge_batch=purge_batch,
            guard=self._call,
        )
        self._inbox: SQLiteInbox | None = None
        self._outbox: SQLiteOutbox | None = None
        self._flood: SQLiteFloodBudget | None = None
        self._joined: Joined | None = None
        self._ledger: SQLiteLedger | None = None
        self._purge_every = purge_every

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> SQLiteStore:
        """``sqlite:///relative.db``, ``sqlite:////abs.db``, ``sqlite:///:memory:``
        with optional ``?busy_timeout=<seconds ≥ 0>``.

        Raises:
            ConfigurationError: another scheme, no path, a host part, a malformed
                ``busy_timeout``, or an unknown option.
        """
        parsed = StoreURL.parse(url, schemes=cls.schemes)
        parts = parsed.parts
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if parts.netloc or not path:
            raise parsed.error("a SQLite URL is sqlite:///file.db (a path, no host)")
        busy = parsed.take_seconds("busy_timeout", 5.0, allow_zero=True)
        parsed.finish()
        assert busy is not None
        return cls(path, clock=clock or system_clock, busy_timeout=busy)

    @property
    def connection(self) -> SQLiteConnection:
        """The file's connection, thread and transaction, shared with :meth:`inbox`,
        :meth:`outbox` and :meth:`flood_budget`."""
        return self._connection

    def inbox(self) -> SQLiteInbox:
        """The durable inbox in this file (created on first use)."""
        if self._inbox is None:
            self._inbox = SQLiteInbox(self._connection)
        return self._inbox

    def outbox(self) -> SQLiteOutbox:
        """The durable outbox in this file (created on first use; the same object on every
        call). Its :meth:`~SQLiteOutbox.enqueue_in` joins the bot's own transaction on
        this file."""
        if self._outbox is None:
            self._outbox = SQLiteOutbox(self._connection, purge_every=self._purge_every)
        return self._outbox

    def flood_budget(self) -> SQLiteFloodBudget:
        """The flood budget in this file, shared by every process using it (created on
        first use; the same object on every call)."""
        if self._flood is None:
            self._flood = SQLiteFloodBudget(self._connection, forget_every=self._purge_every)
        return self._flood

    def joined(self, conn: object) -> JoinedRecords:
        """The records written on the bot's connection ``conn``, inside its transaction
        on this file (``async with idem.transaction(conn)``; see
        :class:`~telegram_idem.backends.sqlite._joined_records.SQLiteJoinedRecords`).

        Args:
            conn: a ``sqlite3.Connection``, an ``aiosqlite.Connection``, or an
                SQLAlchemy ``AsyncConnection`` / ``AsyncSession`` on
                ``sqlite+aiosqlite``, on this store's file.

        Raises:
            ConfigurationError: ``conn`` is of another kind (its file and its
                transaction are checked when the block is entered).
        """
        if self._joined is None:
            self._joined = Joined(
                self.path,
                repr(self),
                op="transaction",
                why="the records must commit in the file the store reads",
            )
        return SQLiteJoinedRecords(self, conn, self._joined, self._translate)

    def ledger(self) -> SQLiteLedger:
        """The effect ledger in this file, shared by every process using it (created on
        first use; the same object on every call)."""
        if self._ledger is None:
            self._ledger = SQLiteLedger(self._connection)
        return self._ledger

    async def _transaction(self, body: Callable[[RecordAccess, float], T]) -> T:
        return await self._connection.transaction(lambda conn, now: body(RecordRows(conn), now))

    async def _read(self, key: str) -> Record | None:
        return await self._connection.run(lambda conn: RecordRows(conn).read(key))

    async def purge(self) -> int:
        """Delete up to ``purge_batch`` expired records now; returns how many.

        Raises:
            StoreError: the database could not answer.
        """
        connection = self._connection

        def job(conn: sqlite3.Connection) -> int:
            return RecordRows(conn).purge(self.clock(), connection.purge_batch)

        return await self._call("purge", lambda: connection.run(job))

    async def close(self) -> None:
        """Close the connection and its thread. Idempotent; later calls raise StoreError."""
        await self._connection.close()
