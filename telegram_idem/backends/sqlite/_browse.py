"""The SQLite store's browsing and health check (the
:class:`~telegram_idem.backends.Browsable` and :class:`~telegram_idem.backends.Checkable`
abilities), on its :class:`~telegram_idem.backends.sqlite.SQLiteConnection`.

A prefix selects a key range of the primary key (``key >= prefix AND key <
next_prefix``, :func:`~telegram_idem.backends._browse.next_prefix`): SQLite compares
text by its UTF-8 bytes, so that range is exactly the keys starting with the prefix,
read in index order; no ``LIKE`` (which ignores ASCII case in SQLite) and no pattern.
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
from pathlib import Path
from typing import Any

from telegram_idem._records import Record, Status
from telegram_idem.backends._browse import check_limit, next_prefix, stored_prefix
from telegram_idem.backends._health import StoreHealth
from telegram_idem.backends.sqlite._connection import SQLiteConnection
from telegram_idem.backends.sqlite._schema import (
    FLOOD_SCHEMA,
    INBOX_SCHEMA,
    LEDGER_SCHEMA,
    OUTBOX_SCHEMA,
    RECORDS_SCHEMA,
)

__all__ = ["SQLiteBrowsing", "expected_tables"]

_COLUMNS = "key, status, fencing_token, lease_expires_at, expires_at, fingerprint, result, attempts"
_TABLE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*?)\n\)", re.S)
_NOT_COLUMNS = {"PRIMARY", "UNIQUE", "CHECK", "FOREIGN", "CONSTRAINT"}


def expected_tables() -> dict[str, tuple[str, ...]]:
    """Every table the store creates and its columns, read from the schema scripts of
    :mod:`telegram_idem.backends.sqlite._schema` (so the check follows them)."""
    tables: dict[str, tuple[str, ...]] = {}
    for script in (RECORDS_SCHEMA, INBOX_SCHEMA, OUTBOX_SCHEMA, FLOOD_SCHEMA, LEDGER_SCHEMA):
        for name, body in _TABLE.findall(script):
            words = (line.split()[0] for line in body.splitlines() if line.strip())
            tables[name] = tuple(w for w in words if w.upper() not in _NOT_COLUMNS)
    return tables


def _range(prefix: str) -> tuple[str, list[Any]]:
    """The ``WHERE`` condition (and its parameters) of the keys starting with ``prefix``."""
    start = stored_prefix(prefix)
    if not start:
        return "1", []
    end = next_prefix(start)
    if end is None:
        return "key >= ?", [start]
    return "key >= ? AND key < ?", [start, end]


def _record(row: tuple[Any, ...]) -> Record:
    key, status, token, lease_at, exp_at, fp, result, attempts = row
    return Record(key, Status(status), token, lease_at, exp_at, fp, result, attempts)


class SQLiteBrowsing:
    """Mixed into :class:`~telegram_idem.backends.sqlite.SQLiteStore`."""

    _connection: SQLiteConnection

    async def records(self, *, prefix: str, limit: int = 100) -> list[Record]:
        """The live records whose key starts with ``prefix``, the first ``limit`` in key
        (UTF-8 byte) order, read from the primary key's index
        (:class:`~telegram_idem.backends.Browsable`).

        Raises:
            ConfigurationError: ``limit`` < 1.
            StoreError: the file could not be read.
        """
        check_limit(limit)
        where, args = _range(prefix)
        connection = self._connection
        sql = (
            f"SELECT {_COLUMNS} FROM idem_records WHERE {where} AND expires_at > ? "
            "ORDER BY key LIMIT ?"
        )

        def job(conn: sqlite3.Connection) -> list[Record]:
            rows = conn.execute(sql, (*args, connection.clock(), limit)).fetchall()
            return [_record(row) for row in rows]

        return await connection.call("records", lambda: connection.run(job))

    async def count_records(self, *, prefix: str, expired: bool = False) -> int:
        """How many records are stored under ``prefix`` (with ``expired``: only those
        past retention).

        Raises:
            StoreError: the file could not be read.
        """
        where, args = _range(prefix)
        connection = self._connection
        sql = f"SELECT count(*) FROM idem_records WHERE {where}"
        if expired:
            sql += " AND expires_at <= ?"

        def job(conn: sqlite3.Connection) -> int:
            now = [connection.clock()] if expired else []
            row = conn.execute(sql, (*args, *now)).fetchone()
            return int(row[0])

        return await connection.call("count_records", lambda: connection.run(job))

    async def delete_records(self, *, prefix: str, limit: int = 1000) -> int:
        """Delete up to ``limit`` records stored under ``prefix`` (the first in key
        order), in one write transaction; returns how many.

        Raises:
            ConfigurationError: ``limit`` < 1.
            StoreError: the file could not be written (``busy_timeout`` ran out).
        """
        check_limit(limit)
        where, args = _range(prefix)
        connection = self._connection
        sql = (
            "DELETE FROM idem_records WHERE key IN "
            f"(SELECT key FROM idem_records WHERE {where} ORDER BY key LIMIT ?)"
        )

        def body(conn: sqlite3.Connection, now: float) -> int:
            return conn.execute(sql, (*args, limit)).rowcount

        return await connection.call("delete_records", lambda: connection.transaction(body))

    async def health(self) -> StoreHealth:
        """The file's tables and their columns against the store's schema, its journal
        mode (WAL is what several processes need) and the SQLite library's version.

        The file is read through a read-only connection of its own, so the check
        creates and changes nothing: a file that does not exist is reported, not made,
        and a table of an older layout is reported, not set up.

        Raises:
            StoreError: the file could not be read (locked past ``busy_timeout``).
        """
        connection = self._connection
        expected = expected_tables()
        server = f"SQLite {sqlite3.sqlite_version}"
        compared = "tables and their columns (SQLite keeps no schema version here)"
        path = connection.path

        def job(conn: sqlite3.Connection) -> tuple[dict[str, set[str]], str]:
            names = [
                row[0]
                for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            ]
            columns = {
                name: {row[1] for row in conn.execute(f"PRAGMA table_info('{name}')")}
                for name in names
                if name in expected
            }
            mode = conn.execute("PRAGMA journal_mode").fetchone()
            return columns, str(mode[0]) if mode else "?"

        def read_only() -> tuple[dict[str, set[str]], str] | None:
            file = Path(path)
            if not file.exists():
                return None
            uri = f"{file.resolve().as_uri()}?mode=ro"
            conn = sqlite3.connect(uri, uri=True, timeout=connection.busy_timeout)
            try:
                return job(conn)
            finally:
                conn.close()

        answer: tuple[dict[str, set[str]], str] | None
        if path == ":memory:":
            answer = await connection.call("health", lambda: connection.run(job))
        else:
            answer = await connection.call("health", lambda: asyncio.to_thread(read_only))
        if answer is None:
            folder = os.path.dirname(os.path.abspath(path))  # noqa: ASYNC240 (no I/O)
            made = (
                "a store creates it on first use"
                if os.path.isdir(folder)  # noqa: ASYNC240 (one stat, for the message)
                else f"and its folder {folder} does not exist either, so no store can create it"
            )
            return StoreHealth(
                server=server,
                compared=compared,
                expected=tuple(expected),
                problems=(f"file {path} does not exist ({made})",),
            )
        found, mode = answer
        problems: list[str] = []
        for name, wanted in expected.items():
            lacking = [c for c in wanted if name in found and c not in found[name]]
            if lacking:
                problems.append(f"table {name} lacks columns {', '.join(lacking)}")
        if path != ":memory:" and mode.lower() != "wal":
            problems.append(f"journal_mode is {mode}, not wal (several processes need WAL)")
        return StoreHealth(
            server=server,
            compared=compared,
            expected=tuple(expected),
            found=tuple(name for name in expected if name in found),
            problems=tuple(problems),
        )
