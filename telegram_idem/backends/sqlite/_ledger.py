"""The effect ledger of :class:`~telegram_idem.backends.sqlite.SQLiteStore`: one row per
at-most-once effect in ``idem_ledger``, in the store's file.

Each method reads the row, decides by :mod:`telegram_idem._ledger_logic` and writes, in
one ``BEGIN IMMEDIATE`` transaction on the store's clock: every process sharing the file
sees one ledger.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from telegram_idem._keys import bounded_key
from telegram_idem._ledger_logic import do_finish, do_mark_unknown, do_settle, do_start
from telegram_idem.backends.sqlite._connection import SQLiteConnection
from telegram_idem.ledger import Ledger, LedgerEntry, LedgerState, check_limit

__all__ = ["SQLiteLedger"]

_COLUMNS = (
    "key, state, token, started_at, holder, attempts, updated_at, detail, result, not_applied"
)


def _entry(row: Sequence[Any]) -> LedgerEntry:
    return LedgerEntry(
        key=row[0],
        state=LedgerState(row[1]),
        token=int(row[2]),
        started_at=float(row[3]),
        holder=row[4],
        attempts=int(row[5]),
        updated_at=float(row[6]),
        detail=row[7],
        result=None if row[8] is None else bytes(row[8]),
        not_applied=bool(row[9]),
    )


def _read(conn: sqlite3.Connection, key: str) -> LedgerEntry | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM idem_ledger WHERE key = ?", (key,)).fetchone()
    return None if row is None else _entry(row)


def _write(conn: sqlite3.Connection, e: LedgerEntry) -> None:
    conn.execute(
        f"INSERT OR REPLACE INTO idem_ledger ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            e.key,
            e.state.value,
            e.token,
            e.started_at,
            e.holder,
            e.attempts,
            e.updated_at,
            e.detail,
            e.result,
            int(e.not_applied),
        ),
    )


class SQLiteLedger(Ledger):
    """:class:`~telegram_idem.ledger.Ledger` in the store's SQLite file.

    Args:
        connection: the store's connection (its thread, transactions and clock).
    """

    def __init__(self, connection: SQLiteConnection) -> None:
        self._db = connection

    def __repr__(self) -> str:
        return f"{self._db.name}.ledger()"

    async def start(self, key: str, *, token: int, holder: str) -> LedgerEntry | None:
        key = bounded_key(key)

        def body(conn: sqlite3.Connection, now: float) -> LedgerEntry | None:
            answer, new = do_start(_read(conn, key), key=key, token=token, holder=holder, now=now)
            if new is not None:
                _write(conn, new)
            return answer

        db = self._db
        return await db.call("ledger.start", lambda: db.transaction(body))

    async def mark_unknown(self, key: str, *, token: int, detail: str) -> LedgerEntry | None:
        key = bounded_key(key)

        def body(conn: sqlite3.Connection, now: float) -> LedgerEntry | None:
            row, changed = do_mark_unknown(_read(conn, key), token=token, detail=detail, now=now)
            if changed and row is not None:
                _write(conn, row)
            return row

        db = self._db
        return await db.call("ledger.mark_unknown", lambda: db.transaction(body))

    async def settle(
        self, key: str, *, token: int, result: bytes | None, not_applied: bool
    ) -> bool:
        key = bounded_key(key)

        def body(conn: sqlite3.Connection, now: float) -> bool:
            new = do_settle(
                _read(conn, key), token=token, result=result, not_applied=not_applied, now=now
            )
            if new is None:
                return False
            _write(conn, new)
            return True

        db = self._db
        return await db.call("ledger.settle", lambda: db.transaction(body))

    async def finish(self, key: str, *, token: int) -> bool:
        key = bounded_key(key)

        def body(conn: sqlite3.Connection, now: float) -> bool:
            if not do_finish(_read(conn, key), token=token):
                return False
            conn.execute("DELETE FROM idem_ledger WHERE key = ?", (key,))
            return True

        db = self._db
        return await db.call("ledger.finish", lambda: db.transaction(body))

    async def get(self, key: str) -> LedgerEntry | None:
        key = bounded_key(key)
        db = self._db
        return await db.call("ledger.get", lambda: db.run(lambda conn: _read(conn, key)))

    async def entries(
        self,
        *,
        states: Sequence[LedgerState] = (LedgerState.STARTED, LedgerState.UNKNOWN),
        prefix: str = "",
        limit: int = 100,
    ) -> list[LedgerEntry]:
        check_limit(limit)
        wanted = [s.value for s in states]
        if not wanted:
            return []
        marks = ", ".join("?" * len(wanted))
        # Prefix by range, not LIKE: keys may hold % and _.
        sql = (
            f"SELECT {_COLUMNS} FROM idem_ledger WHERE state IN ({marks}) "
            "AND substr(key, 1, ?) = ? ORDER BY started_at, key LIMIT ?"
        )
        args: list[Any] = [*wanted, len(prefix), prefix, limit]

        def read(conn: sqlite3.Connection) -> list[LedgerEntry]:
            return [_entry(r) for r in conn.execute(sql, args)]

        db = self._db
        return await db.call("ledger.entries", lambda: db.run(read))
