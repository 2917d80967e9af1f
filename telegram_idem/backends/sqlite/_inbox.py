"""The inbox of :class:`~telegram_idem.backends.sqlite.SQLiteStore`: a table in the same
file, written in the same ``BEGIN IMMEDIATE`` transactions as the update guard records
(through the store's :class:`~telegram_idem.backends.sqlite._connection.SQLiteConnection`).

Several processes may share the file: taking an entry is one write transaction, so two
workers never take the same entry, and the head-of-chat rule holds across processes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from telegram_idem import _inbox_logic as logic
from telegram_idem._text import storable_text
from telegram_idem.backends.sqlite._connection import SQLiteConnection
from telegram_idem.backends.sqlite._schema import RecordRows
from telegram_idem.inbox import EntryStatus, Inbox, InboxEntry, InboxStats, NewEntry, UnitBacklog
from telegram_idem.ledger import check_limit

__all__ = ["SQLiteInbox"]

T = TypeVar("T")

_COLUMNS = (
    "id, seq, ordering_key, payload, status, attempts, token, available_at, "
    "lease_expires_at, last_error, admitted_at"
)
# The head of each live ordering key, if it is takeable: oldest first.
_TAKE = f"""
SELECT {_COLUMNS} FROM idem_inbox e
WHERE e.status != 'dead'
  AND e.seq = (SELECT MIN(o.seq) FROM idem_inbox o
               WHERE o.ordering_key = e.ordering_key AND o.status != 'dead')
  AND ((e.status = 'pending' AND e.available_at <= :now)
       OR (e.status = 'in_flight' AND e.lease_expires_at <= :now))
ORDER BY e.seq LIMIT 1
"""
_HELD = "id = :id AND token = :token AND status = 'in_flight'"


def _entry(row: tuple[Any, ...]) -> InboxEntry:
    eid, seq, key, payload, status, attempts, token, avail, lease, err, admitted = row
    return InboxEntry(
        eid, seq, key, payload, EntryStatus(status), attempts, token, avail, lease, err, admitted
    )


def _listing(status: EntryStatus | None, key: str | None) -> tuple[str, tuple[Any, ...]]:
    """The statement of :meth:`SQLiteInbox.entries` (its last parameter the limit), each
    read in ``seq`` order from an index: one status from ``idem_inbox_status``, one
    ordering key's live entries from ``idem_inbox_heads``; everything by ``seq``."""
    select = f"SELECT {_COLUMNS} FROM idem_inbox"
    if key is None:
        if status is None:
            return f"{select} ORDER BY seq LIMIT ?", ()
        return f"{select} WHERE status = ? ORDER BY seq LIMIT ?", (EntryStatus(status).value,)
    live = f"{select} WHERE ordering_key = ? AND status != 'dead'"
    dead = f"{select} WHERE status = 'dead' AND ordering_key = ?"
    if status is None:
        both = f"SELECT * FROM ({live}) UNION ALL SELECT * FROM ({dead})"
        return f"SELECT * FROM ({both}) ORDER BY seq LIMIT ?", (key, key)
    if EntryStatus(status) is EntryStatus.DEAD:
        return f"{dead} ORDER BY seq LIMIT ?", (key,)
    return f"{live} AND status = ? ORDER BY seq LIMIT ?", (key, EntryStatus(status).value)


class SQLiteInbox(Inbox):
    """Durable inbox in the store's SQLite file.

    Args:
        connection: the store's connection (its records table is written in the same
            transactions).
    """

    def __init__(self, connection: SQLiteConnection) -> None:
        self._db = connection

    async def _write(self, op: str, body: Callable[[sqlite3.Connection, float], T]) -> T:
        db = self._db
        return await db.call(op, lambda: db.transaction(body))

    async def _read(self, op: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        db = self._db
        return await db.call(op, lambda: db.run(fn))

    def _admit_in(
        self, conn: sqlite3.Connection, entry: NewEntry, now: float, retention: float
    ) -> bool:
        records = RecordRows(conn)
        record = logic.admitted_record(
            records.read(entry.update_key), entry.update_key, now, retention
        )
        if record is None:
            return False
        records.write(record)
        conn.execute(
            "INSERT OR REPLACE INTO idem_inbox (id, ordering_key, payload, status, attempts, token, "
            "available_at, lease_expires_at, admitted_at) VALUES (?, ?, ?, 'pending', 0, 0, ?, 0, ?)",
            (entry.update_key, logic.ordering_unit(entry), entry.payload, now, now),
        )
        return True

    async def admit(self, entry: NewEntry, *, retention: float) -> bool:
        return await self._write("admit", lambda c, now: self._admit_in(c, entry, now, retention))

    async def admit_many(self, entries: Sequence[NewEntry], *, retention: float) -> list[bool]:
        return await self._write(
            "admit_many", lambda c, now: [self._admit_in(c, e, now, retention) for e in entries]
        )

    async def take(self, *, lease: float) -> InboxEntry | None:
        def body(conn: sqlite3.Connection, now: float) -> InboxEntry | None:
            row = conn.execute(_TAKE, {"now": now}).fetchone()
            if row is None:
                return None
            held = logic.taken(_entry(row), now, lease)
            conn.execute(
                "UPDATE idem_inbox SET status = 'in_flight', attempts = ?, token = ?, "
                "lease_expires_at = ? WHERE id = ?",
                (held.attempts, held.token, held.lease_expires_at, held.id),
            )
            return held

        return await self._write("take", body)

    async def _held_update(
        self, op: str, entry: InboxEntry, sql: str, params: dict[str, Any]
    ) -> bool:
        def body(conn: sqlite3.Connection, now: float) -> bool:
            args = {"id": entry.id, "token": entry.token, "now": now, **params}
            return conn.execute(sql, args).rowcount == 1

        return await self._write(op, body)

    async def ack(self, entry: InboxEntry) -> bool:
        return await self._held_update("ack", entry, f"DELETE FROM idem_inbox WHERE {_HELD}", {})

    async def retry(
        self, entry: InboxEntry, *, delay: float, error: str, refund: bool = False
    ) -> bool:
        sql = (
            "UPDATE idem_inbox SET status = 'pending', available_at = :now + :delay, "
            "attempts = CASE WHEN :refund THEN max(attempts - 1, 0) ELSE attempts END, "
            f"lease_expires_at = 0, last_error = :error WHERE {_HELD}"
        )
        params = {"delay": delay, "error": storable_text(error), "refund": int(refund)}
        return await self._held_update("retry", entry, sql, params)

    async def bury(self, entry: InboxEntry, *, error: str) -> bool:
        sql = f"UPDATE idem_inbox SET status = 'dead', last_error = :error WHERE {_HELD}"
        return await self._held_update("bury", entry, sql, {"error": storable_text(error)})

    async def extend(self, entry: InboxEntry, *, lease: float) -> bool:
        sql = f"UPDATE idem_inbox SET lease_expires_at = :now + :lease WHERE {_HELD}"
        return await self._held_update("extend", entry, sql, {"lease": lease})

    async def dead_letters(self, *, limit: int = 100) -> list[InboxEntry]:
        rows = await self._read(
            "dead_letters",
            lambda c: c.execute(
                f"SELECT {_COLUMNS} FROM idem_inbox WHERE status = 'dead' ORDER BY seq LIMIT ?",
                (limit,),
            ).fetchall(),
        )
        return [_entry(r) for r in rows]

    async def redrive(self, entry_id: str) -> bool:
        def body(conn: sqlite3.Connection, now: float) -> bool:
            # Back of its chat (a new seq): a later entry of the chat may be in flight.
            cur = conn.execute(
                "UPDATE idem_inbox SET status = 'pending', attempts = 0, available_at = ?, "
                "seq = (SELECT MAX(seq) + 1 FROM idem_inbox) WHERE id = ? AND status = 'dead'",
                (now, entry_id),
            )
            return cur.rowcount == 1

        return await self._write("redrive", body)

    async def depth(self) -> int:
        def count(conn: sqlite3.Connection) -> int:
            row: tuple[int] = conn.execute(
                "SELECT COUNT(*) FROM idem_inbox WHERE status != 'dead'"
            ).fetchone()
            return row[0]

        return await self._read("depth", count)

    async def get(self, entry_id: str) -> InboxEntry | None:
        row = await self._read(
            "get",
            lambda c: c.execute(
                f"SELECT {_COLUMNS} FROM idem_inbox WHERE id = ?", (entry_id,)
            ).fetchone(),
        )
        return None if row is None else _entry(row)

    async def entries(
        self,
        *,
        status: EntryStatus | None = None,
        ordering_key: str | None = None,
        limit: int = 100,
    ) -> list[InboxEntry]:
        check_limit(limit)
        sql, args = _listing(status, ordering_key)
        rows = await self._read("entries", lambda c: c.execute(sql, (*args, limit)).fetchall())
        return [_entry(r) for r in rows]

    async def drop(self, entry_id: str) -> bool:
        def body(conn: sqlite3.Connection, now: float) -> bool:
            cur = conn.execute(
                "DELETE FROM idem_inbox WHERE id = ? AND status = 'dead'", (entry_id,)
            )
            return cur.rowcount == 1

        return await self._write("drop", body)

    async def stats(self) -> InboxStats:
        def read(conn: sqlite3.Connection) -> InboxStats:
            # One statement, one snapshot; the clock is read beside it.
            rows = conn.execute(
                "SELECT status, COUNT(*), MIN(admitted_at) FROM idem_inbox GROUP BY status"
            ).fetchall()
            counts = dict.fromkeys(EntryStatus, 0)
            oldest: dict[EntryStatus, float] = {}
            for status, n, admitted in rows:
                counts[EntryStatus(status)] = n
                oldest[EntryStatus(status)] = admitted
            return InboxStats(counts=counts, oldest_admitted_at=oldest, now=self._db.clock())

        return await self._read("stats", read)

    async def backlog(self, *, limit: int = 100) -> list[UnitBacklog]:
        check_limit(limit)

        def read(conn: sqlite3.Connection) -> list[UnitBacklog]:
            # The live entries only, through the partial index idem_inbox_heads.
            rows = conn.execute(
                "SELECT ordering_key, SUM(status = 'pending'), SUM(status = 'in_flight'), "
                "MIN(admitted_at) FROM idem_inbox INDEXED BY idem_inbox_heads "
                "WHERE status != 'dead' GROUP BY ordering_key "
                "ORDER BY COUNT(*) DESC, MIN(admitted_at) LIMIT ?",
                (limit,),
            ).fetchall()
            return [UnitBacklog(k, int(p), int(f), float(a)) for k, p, f, a in rows]

        return await self._read("backlog", read)
