"""The outbox of :class:`~telegram_idem.backends.sqlite.SQLiteStore`: tables in the same
file (``idem_outbox``, ``idem_outbox_parked``), each primitive one ``BEGIN IMMEDIATE``
transaction of the store's
:class:`~telegram_idem.backends.sqlite._connection.SQLiteConnection`.

Several processes may share the file: a take reads the chats' heads and leases one under
the write lock, so two relays never hold two entries of one chat, nor one entry twice.
:meth:`SQLiteOutbox.enqueue_in` writes the same rows inside the bot's own transaction, so
the call commits (or rolls back) with the bot's writes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from telegram_idem._text import storable_text
from telegram_idem.backends.sqlite._connection import SQLiteConnection
from telegram_idem.backends.sqlite._enqueue import (
    COLUMNS,
    enqueue_steps,
    entry_of,
    run_steps,
)
from telegram_idem.backends.sqlite._join import Joined, run_steps_in
from telegram_idem.errors import ConfigurationError
from telegram_idem.outbox import CallStatus, NewCall, Outbox, OutboxEntry

__all__ = ["SQLiteOutbox"]

T = TypeVar("T")

_LIVE = "status IN ('pending', 'in_flight')"
# The takeable heads of a bot's chats: the oldest live entry of each chat, if it is due
# (pending) or its lease has ended (in flight); lowest priority, then oldest, first.
_TAKE = f"""
SELECT {COLUMNS} FROM idem_outbox e
WHERE e.bot_id = :bot_id AND e.{_LIVE} {{chat}}
  AND e.seq = (SELECT MIN(o.seq) FROM idem_outbox o
               WHERE o.bot_id = e.bot_id AND o.ordering_key = e.ordering_key AND o.{_LIVE})
  AND ((e.status = 'pending' AND e.available_at <= :now)
       OR (e.status = 'in_flight' AND e.lease_expires_at <= :now))
ORDER BY e.priority, e.seq LIMIT :limit
"""
_LEASE = (
    "UPDATE idem_outbox SET status = 'in_flight', attempts = attempts + 1, token = token + 1, "
    f"lease_expires_at = :now + :lease WHERE key = :key RETURNING {COLUMNS}"
)
# A delivered or superseded entry past its retention is gone, deleted yet or not.
_KEPT = "(expires_at IS NULL OR expires_at > :now)"
_HELD = "key = :key AND token = :token AND status = 'in_flight'"
_PURGE = (
    "DELETE FROM idem_outbox WHERE seq IN "
    "(SELECT seq FROM idem_outbox WHERE expires_at <= :now LIMIT :limit)"
)


class SQLiteOutbox(Outbox):
    """Durable outbox in the store's SQLite file (the rules of
    :class:`~telegram_idem.outbox.Outbox`).

    Delivered and superseded entries past their retention are deleted in batches of the
    store's ``purge_batch`` rows inside every ``purge_every``-th enqueue.

    Args:
        connection: the store's connection (its thread, transactions and clock).
        purge_every: purge expired entries inside every ``purge_every``-th enqueue.
    """

    def __init__(self, connection: SQLiteConnection, *, purge_every: int = 1000) -> None:
        self._db = connection
        self._purge_every = purge_every
        self._enqueues = 0
        self._set_up = False  # the file is set up (the store's first use is behind)
        self._joined = Joined(connection.path, repr(self))

    def __repr__(self) -> str:
        return f"{self._db.name}.outbox()"

    async def _write(self, op: str, body: Callable[[sqlite3.Connection, float], T]) -> T:
        db = self._db
        return await db.call(op, lambda: db.transaction(body))

    async def _read(self, op: str, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        db = self._db

        def read(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = conn.execute(
                sql, {**params, "now": db.clock()}
            ).fetchall()
            return rows

        return await db.call(op, lambda: db.run(read))

    async def enqueue(self, call: NewCall) -> tuple[OutboxEntry, bool]:
        def body(conn: sqlite3.Connection, now: float) -> tuple[OutboxEntry, bool]:
            out = run_steps(conn, enqueue_steps(call, now))
            self._enqueues += 1
            if self._enqueues % self._purge_every == 0:
                conn.execute(_PURGE, {"now": now, "limit": self._db.purge_batch})
            return out

        return await self._write("enqueue", body)

    async def enqueue_in(self, conn: object, call: NewCall) -> tuple[OutboxEntry, bool]:
        """:meth:`enqueue` inside the bot's own open transaction on ``conn``: the entry is
        written with the bot's writes and a relay sees it only once the bot commits; a
        rollback (of the transaction, or of a savepoint around this call) leaves nothing.
        Never commits or rolls back.

        The first statement is a write, so the decision is taken under SQLite's write
        lock even in a ``DEFERRED`` transaction. On an error the transaction may hold
        part of the enqueue: roll it back. SQLite has one writer at a time: until the
        bot's transaction ends, the store's own writes (claims, takes, another
        ``enqueue``) wait for it, so commit before awaiting them.

        The store sets its file up (WAL mode, its tables) on its first use; if that first
        use is this call inside a transaction that already holds the file's lock, it
        cannot, and says so at once (a :class:`ConfigurationError`) rather than wait.

        Args:
            conn: a :class:`sqlite3.Connection` (statements run on the calling thread) or
                an ``aiosqlite.Connection``, on the store's database file, inside a
                transaction (or in ``sqlite3``'s default mode, which opens one before
                the first write).
            call: the call to store.

        Returns:
            As :meth:`enqueue`.

        Raises:
            ConfigurationError: ``conn`` is neither connection type, is on another
                database file (compared by ``PRAGMA database_list``, paths resolved, on
                the connection's first use: see
                :mod:`~telegram_idem.backends.sqlite._join`), or is in autocommit mode
                outside a transaction, or the store's file is not set up and cannot be
                now (see above).
            StoreError: SQLite could not answer (a lock wait past the ``busy_timeout``
                of ``conn``), or the store was closed before this call set its file up.

        Cost: after the store's first use, no wait on the store's thread (so, once set
        up, it writes on ``conn`` even after the store is closed: nothing goes through
        the store); on a connection already checked, one statement for a new key (two
        for a key stored already or a ``collapse_key``), run directly on ``conn``.
        """
        db = self._db
        # Once the store is open its file is set up: never queue on its thread here, where
        # claims may be waiting for the write lock this very transaction holds.
        if not self._set_up and not db.is_open:
            await db.call("enqueue_in", self._set_up_file)

        async def job() -> tuple[OutboxEntry, bool]:
            return await run_steps_in(conn, enqueue_steps(call, db.clock()), self._joined)

        return await db.call("enqueue_in", job)

    async def _set_up_file(self) -> None:
        """The store's file set up (once: later enqueues run on the bot's connection
        only, with no wait on the store's thread)."""
        try:  # the outbox's tables must exist; the bot's transaction may hold the lock
            await self._db.open(wait=False)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
            raise ConfigurationError(
                f"{self!r}.enqueue_in: the store has not set up its file yet and cannot "
                "while another connection (the bot's transaction, likely) holds its lock: "
                "use the store once before the bot's first transaction (any call, e.g. "
                "await outbox.counts())"
            ) from exc
        self._set_up = True

    def _take_in(
        self, conn: sqlite3.Connection, now: float, params: dict[str, Any]
    ) -> list[OutboxEntry]:
        chat = "AND e.ordering_key = :chat" if params.get("chat") is not None else ""
        rows = conn.execute(_TAKE.format(chat=chat), {**params, "now": now}).fetchall()
        taken: list[OutboxEntry] = []
        for row in rows:
            lease = {"key": row[0], "now": now, "lease": params["lease"]}
            taken.append(entry_of(conn.execute(_LEASE, lease).fetchone()))
        return taken

    async def take(
        self, *, bot_id: int, lease: float, ordering_key: str | None = None
    ) -> OutboxEntry | None:
        params = {"bot_id": bot_id, "lease": lease, "chat": ordering_key, "limit": 1}
        taken = await self._write("take", lambda c, now: self._take_in(c, now, params))
        return taken[0] if taken else None

    async def take_many(self, *, bot_id: int, lease: float, limit: int) -> Sequence[OutboxEntry]:
        params = {"bot_id": bot_id, "lease": lease, "chat": None, "limit": limit}
        return await self._write("take_many", lambda c, now: self._take_in(c, now, params))

    async def _held(self, op: str, entry: OutboxEntry, sql: str, params: dict[str, Any]) -> bool:
        def body(conn: sqlite3.Connection, now: float) -> bool:
            args = {"key": entry.key, "token": entry.token, "now": now, **params}
            return conn.execute(sql, args).rowcount == 1

        return await self._write(op, body)

    async def deliver(self, entry: OutboxEntry, *, result: bytes) -> bool:
        sql = (
            "UPDATE idem_outbox SET status = 'delivered', result = :result, settled_at = :now, "
            f"expires_at = :now + retention, lease_expires_at = 0 WHERE {_HELD}"
        )
        return await self._held("deliver", entry, sql, {"result": result})

    async def retry(
        self,
        entry: OutboxEntry,
        *,
        delay: float,
        error: str,
        params: bytes | None = None,
        ordering_key: str | None = None,
    ) -> bool:
        sql = (
            "UPDATE idem_outbox SET status = 'pending', available_at = :now + :delay, "
            "lease_expires_at = 0, last_error = :error, params = COALESCE(:params, params), "
            f"ordering_key = COALESCE(:chat, ordering_key), "
            # Moved to another chat: to its back (a new seq), behind its call in flight.
            "seq = CASE WHEN :chat IS NULL OR :chat = ordering_key THEN seq "
            f"ELSE (SELECT MAX(seq) + 1 FROM idem_outbox) END WHERE {_HELD}"
        )
        args = {
            "delay": delay,
            "error": storable_text(error),
            "params": params,
            "chat": ordering_key,
        }
        return await self._held("retry", entry, sql, args)

    async def settle(
        self,
        entry: OutboxEntry,
        *,
        status: Literal[CallStatus.DEAD, CallStatus.UNKNOWN],
        error: str,
    ) -> bool:
        """As :meth:`Outbox.settle`.

        Raises:
            ValueError: ``status`` is neither ``DEAD`` nor ``UNKNOWN``.
            StoreError: the database could not answer.
        """
        if status not in (CallStatus.DEAD, CallStatus.UNKNOWN):
            raise ValueError(f"settle makes an entry dead or unknown, not {status!r}")
        sql = (
            "UPDATE idem_outbox SET status = :status, settled_at = :now, lease_expires_at = 0, "
            f"last_error = :error WHERE {_HELD}"
        )
        args = {"status": status.value, "error": storable_text(error)}
        return await self._held("settle", entry, sql, args)

    async def park(self, entry: OutboxEntry, *, error: str) -> bool:
        def body(conn: sqlite3.Connection, now: float) -> bool:
            args = {"key": entry.key, "token": entry.token, "now": now}
            row = conn.execute(
                f"SELECT bot_id, ordering_key FROM idem_outbox WHERE {_HELD}", args
            ).fetchone()
            if row is None:
                return False
            chat = {"bot_id": row[0], "chat": row[1], "now": now}
            conn.execute(
                "INSERT OR IGNORE INTO idem_outbox_parked (bot_id, ordering_key, parked_at) "
                "VALUES (:bot_id, :chat, :now)",
                chat,
            )
            conn.execute(
                "UPDATE idem_outbox SET status = 'parked', settled_at = :now, "
                "lease_expires_at = 0, last_error = :error WHERE key = :key",
                {**args, "error": storable_text(error)},
            )
            conn.execute(
                "UPDATE idem_outbox SET status = 'parked', settled_at = :now "
                "WHERE bot_id = :bot_id AND ordering_key = :chat AND status = 'pending'",
                chat,
            )
            return True

        return await self._write("park", body)

    async def extend(self, entry: OutboxEntry, *, lease: float) -> bool:
        sql = f"UPDATE idem_outbox SET lease_expires_at = :now + :lease WHERE {_HELD}"
        return await self._held("extend", entry, sql, {"lease": lease})

    async def get(self, key: str) -> OutboxEntry | None:
        rows = await self._read(
            "get", f"SELECT {COLUMNS} FROM idem_outbox WHERE key = :key AND {_KEPT}", {"key": key}
        )
        return entry_of(rows[0]) if rows else None

    async def entries(
        self, *, status: CallStatus, bot_id: int | None = None, limit: int = 100
    ) -> list[OutboxEntry]:
        sql = (
            f"SELECT {COLUMNS} FROM idem_outbox WHERE status = :status AND {_KEPT} "
            "AND (:bot_id IS NULL OR bot_id = :bot_id) ORDER BY seq LIMIT :limit"
        )
        args = {"status": CallStatus(status).value, "bot_id": bot_id, "limit": limit}
        return [entry_of(r) for r in await self._read("entries", sql, args)]

    async def redrive(self, key: str) -> bool:
        def body(conn: sqlite3.Connection, now: float) -> bool:
            # Back of its chat (a new seq): a later entry of the chat may be in flight.
            cur = conn.execute(
                "UPDATE idem_outbox SET status = 'pending', attempts = 0, available_at = :now, "
                "lease_expires_at = 0, settled_at = 0, "
                "seq = (SELECT MAX(seq) + 1 FROM idem_outbox) "
                "WHERE key = :key AND status IN ('dead', 'unknown', 'parked')",
                {"key": key, "now": now},
            )
            return cur.rowcount == 1

        return await self._write("redrive", body)

    async def resolve(self, key: str, *, result: bytes) -> bool:
        def body(conn: sqlite3.Connection, now: float) -> bool:
            cur = conn.execute(
                "UPDATE idem_outbox SET status = 'delivered', result = :result, "
                "settled_at = :now, expires_at = :now + retention "
                "WHERE key = :key AND status = 'unknown'",
                {"key": key, "result": result, "now": now},
            )
            return cur.rowcount == 1

        return await self._write("resolve", body)

    async def unpark(self, *, bot_id: int, ordering_key: str) -> int:
        def body(conn: sqlite3.Connection, now: float) -> int:
            chat = {"bot_id": bot_id, "chat": ordering_key, "now": now}
            conn.execute(
                "DELETE FROM idem_outbox_parked WHERE bot_id = :bot_id AND ordering_key = :chat",
                chat,
            )
            # To the back of the chat in their order (new seqs): a call of the chat
            # redriven while it was parked may be in flight.
            rows = conn.execute(
                "SELECT seq FROM idem_outbox WHERE bot_id = :bot_id AND ordering_key = :chat "
                "AND status = 'parked' ORDER BY seq",
                chat,
            ).fetchall()
            for (seq,) in rows:
                conn.execute(
                    "UPDATE idem_outbox SET status = 'pending', available_at = :now, "
                    "settled_at = 0, seq = (SELECT MAX(seq) + 1 FROM idem_outbox) "
                    "WHERE seq = :seq",
                    {"now": now, "seq": seq},
                )
            return len(rows)

        return await self._write("unpark", body)

    async def parked_units(self, *, bot_id: int | None = None) -> list[tuple[int, str]]:
        sql = (
            "SELECT bot_id, ordering_key FROM idem_outbox_parked "
            "WHERE :bot_id IS NULL OR bot_id = :bot_id ORDER BY bot_id, ordering_key"
        )
        return [(r[0], r[1]) for r in await self._read("parked_units", sql, {"bot_id": bot_id})]

    async def counts(self, *, bot_id: int | None = None) -> dict[CallStatus, int]:
        sql = (
            f"SELECT status, COUNT(*) FROM idem_outbox WHERE {_KEPT} "
            "AND (:bot_id IS NULL OR bot_id = :bot_id) GROUP BY status"
        )
        rows = await self._read("counts", sql, {"bot_id": bot_id})
        return {CallStatus(status): n for status, n in rows}
