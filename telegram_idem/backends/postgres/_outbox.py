"""The outbox of :class:`~telegram_idem.backends.postgres.PostgresStore`:
:class:`PostgresOutbox`, over the store's connection, and :meth:`PostgresOutbox.enqueue_in`
on the bot's own transaction (asyncpg, SQLAlchemy ``AsyncConnection`` / ``AsyncSession``).

The statements, and why take keeps one call in flight per chat under concurrency, are in
:mod:`telegram_idem.backends.postgres._outbox_sql`.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

import asyncpg
import asyncpg.pool

from telegram_idem import _outbox_logic as logic
from telegram_idem._text import storable_text
from telegram_idem.backends.postgres._connection import PostgresConnection
from telegram_idem.backends.postgres._foreign import Fetch
from telegram_idem.backends.postgres._foreign import asyncpg_fetch as _asyncpg_fetch
from telegram_idem.backends.postgres._foreign import driver_connection as _driver_connection
from telegram_idem.backends.postgres._foreign import sqlalchemy_fetch as _sqlalchemy_fetch
from telegram_idem.backends.postgres._foreign import sqlalchemy_types as _sqlalchemy_types
from telegram_idem.backends.postgres._foreign import unwrap as _unwrap
from telegram_idem.backends.postgres._outbox_sql import (
    WITHOUT_NOW,
    build_outbox_sql,
    collapse_lock,
    unit_lock,
)
from telegram_idem.errors import ConfigurationError, StoreError
from telegram_idem.outbox import AmbiguousPolicy, CallStatus, NewCall, Outbox, OutboxEntry

__all__ = ["PostgresOutbox"]

_MAX_ROUNDS = 20
_ACCEPTED = (
    "an asyncpg Connection (or pool connection) inside `async with conn.transaction()`, "
    "or a SQLAlchemy AsyncConnection or AsyncSession on PostgreSQL"
)


def _entry(row: Any) -> OutboxEntry:
    return OutboxEntry(
        key=row["key"],
        bot_id=row["bot_id"],
        seq=row["seq"],
        method=row["method"],
        params=bytes(row["params"]),
        ordering_key=row["ordering_key"],
        collapse_key=row["collapse_key"],
        policy=AmbiguousPolicy(row["policy"]),
        priority=row["priority"],
        retention=row["retention"],
        status=CallStatus(row["status"]),
        attempts=row["attempts"],
        token=row["token"],
        created_at=row["created_at"],
        available_at=row["available_at"],
        lease_expires_at=row["lease_expires_at"],
        settled_at=row["settled_at"],
        result=None if row["result"] is None else bytes(row["result"]),
        last_error=row["last_error"],
    )


class PostgresOutbox(Outbox):
    """Durable outbox in ``<table_prefix>_outbox`` (parked chats in
    ``<table_prefix>_outbox_parked``), over the store's connection (its pool, clock and
    error translation).

    Args:
        connection: the store's connection (``PostgresStore.connection``).

    ``take``, ``deliver``, ``retry`` (in its chat), ``settle``, ``extend``, ``get``,
    ``entries``, ``resolve``, ``parked_units`` and ``counts`` are one statement each;
    ``enqueue`` of a call without a collapse key is one statement that takes its chat's
    advisory lock first; ``enqueue`` with one, ``park``, ``redrive``, ``unpark`` and a
    retry into another chat are a transaction of two (the lock, then the write: see
    :mod:`telegram_idem.backends.postgres._outbox_sql`). Errors are the store's:
    :class:`~telegram_idem.errors.StoreError` when the server cannot answer,
    :class:`~telegram_idem.errors.ConfigurationError` when a table is missing (run
    ``telegram-idem migrate URL``: it creates every table).
    """

    def __init__(self, connection: PostgresConnection) -> None:
        self.connection = connection
        self.table = connection.outbox_table
        self.parked_table = connection.outbox_parked_table
        self._sql = build_outbox_sql(
            self.table, self.parked_table, server_clock=connection.server_clock
        )
        # The callers' asyncpg connections on which the tables were found (enqueue_in).
        self._checked: weakref.WeakKeyDictionary[asyncpg.Connection, None] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"PostgresOutbox({self.connection.label}, table={self.table!r})"

    # ------------------------------------------------------------------ plumbing

    async def _fetch(self, op: str, name: str, *args: Any) -> list[Any]:
        sql = self._sql[name]
        params = args if name in WITHOUT_NOW else (*args, *self.connection.now_args())

        async def run(conn: Any) -> list[Any]:
            rows: list[Any] = await conn.fetch(sql, *params)
            return rows

        return await self.connection.call(f"outbox.{op}", run)

    async def _locked(self, op: str, locks: list[str], name: str, *args: Any) -> list[Any]:
        """Take the advisory ``locks``, then run ``name``, in one transaction."""
        lock, sql = self._sql["lock"], self._sql[name]
        params = (*args, *self.connection.now_args())

        async def run(conn: Any) -> list[Any]:
            async with conn.transaction():
                await conn.fetchval(lock, locks)
                rows: list[Any] = await conn.fetch(sql, *params)
                return rows

        return await self.connection.call(f"outbox.{op}", run)

    def _enqueue_args(self, call: NewCall) -> tuple[Any, ...]:
        return (
            call.key,
            int(call.bot_id),
            call.method,
            call.params,
            call.unit,
            call.collapse_key,
            AmbiguousPolicy(call.policy).value,
            int(call.priority),
            float(call.retention),
            logic.superseded_result(call.key),
            *self.connection.now_args(),
        )

    @staticmethod
    def _locks(call: NewCall) -> list[str]:
        locks = [unit_lock(call.bot_id, call.unit)]
        if call.collapse_key is not None:
            locks.append(collapse_lock(call.bot_id, call.collapse_key))
        return locks

    async def _enqueue_on(self, fetch: Fetch, call: NewCall) -> tuple[OutboxEntry, bool]:
        """Enqueue on an open transaction: a call without a collapse key in one statement
        that takes its chat's lock first; else LOCK then ENQUEUE. The enqueue statement
        runs again while it races (the key was committed by a transaction its snapshot
        could not see)."""
        if call.collapse_key is None:
            sql = self._sql["enqueue_locked"]
            args: tuple[Any, ...] = (
                *self._enqueue_args(call)[:9],
                unit_lock(call.bot_id, call.unit),
                *self.connection.now_args(),
            )
        else:  # latest wins: the supersede must read a snapshot taken under the lock
            await fetch(self._sql["lock"], [self._locks(call)])
            sql, args = self._sql["enqueue"], self._enqueue_args(call)
        for _ in range(_MAX_ROUNDS):
            rows = await fetch(sql, args)
            if rows:
                return _entry(rows[0]), bool(rows[0]["written"])
        raise StoreError(f"{self!r}: enqueue of {call.key!r} still racing after {_MAX_ROUNDS}")

    # ------------------------------------------------------------------ relay side

    async def enqueue(self, call: NewCall) -> tuple[OutboxEntry, bool]:
        async def run(conn: Any) -> tuple[OutboxEntry, bool]:
            async with conn.transaction():
                return await self._enqueue_on(_asyncpg_fetch(conn), call)

        entry, written = await self.connection.call("outbox.enqueue", run)
        if written:
            self.connection.wrote()
        return entry, written

    async def enqueue_in(self, conn: object, call: NewCall) -> tuple[OutboxEntry, bool]:
        """:meth:`enqueue` on the caller's open transaction on ``conn``: the entry (and the
        superseding of older pending entries with its collapse key) commits or rolls back
        with the caller's writes, and a relay sees it only after the caller commits. It
        never commits, rolls back or opens a transaction of its own; a savepoint rolled
        back removes only what was written inside it.

        Args:
            conn: an ``asyncpg.Connection`` or pool connection inside an open transaction
                (``async with conn.transaction():``), or a SQLAlchemy ``AsyncConnection``
                or ``AsyncSession`` on PostgreSQL (its transaction begins as SQLAlchemy
                begins one: commit it as usual).
            call: the call to store.

        Cost: one round trip for a call without a ``collapse_key`` (two with one), plus
        one the first time a connection is used, to check the store's tables are in its
        database (remembered for as long as the underlying asyncpg connection lives; a
        table dropped later fails the insert instead, which aborts the transaction).

        Until the caller commits, its transaction holds the chat's advisory lock: other
        enqueues to that chat wait for it (takes do not). Run it in READ COMMITTED (the
        default); a second transaction enqueueing the same key waits for the first and
        then returns the first's entry (``written`` false), or stores its own if the first
        rolled back.

        Raises:
            ConfigurationError: ``conn`` is none of those (an asyncpg connection outside a
                transaction too), or the store's outbox tables are not in its database.
            StoreError: the database could not answer.
        """
        fetch = self._fetch_for(conn)

        async def run() -> tuple[OutboxEntry, bool]:
            driver = await _driver_connection(conn)
            if driver is None or driver not in self._checked:
                rows = await fetch(self._sql["exists"], [self.table, self.parked_table])
                if not rows or not next(iter(rows[0].values())):
                    raise ConfigurationError(
                        f"{self!r}: the tables {self.table!r} and {self.parked_table!r} are "
                        "not in the database of the connection given to enqueue_in: join a "
                        "transaction on the store's own database (run `telegram-idem "
                        "migrate <store URL>` there)"
                    )
                if driver is not None:
                    self._checked[driver] = None
            return await self._enqueue_on(fetch, call)

        return await self._call_foreign("outbox.enqueue_in", run)

    def _fetch_for(self, conn: object) -> Fetch:
        if isinstance(conn, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
            if not conn.is_in_transaction():
                raise ConfigurationError(
                    f"{self!r}.enqueue_in: the asyncpg connection has no open transaction "
                    "(its insert would commit at once): call it inside "
                    "`async with conn.transaction():`"
                )
            return _asyncpg_fetch(conn)
        types = _sqlalchemy_types()
        if types and isinstance(conn, types):
            dialect = conn.get_bind().dialect if hasattr(conn, "get_bind") else None
            name = getattr(dialect, "name", None) or getattr(
                getattr(conn, "dialect", None), "name", None
            )
            if name != "postgresql":
                raise ConfigurationError(
                    f"{self!r}.enqueue_in: the SQLAlchemy connection is on {name!r}, not PostgreSQL"
                )
            return _sqlalchemy_fetch(conn)
        raise ConfigurationError(
            f"{self!r}.enqueue_in cannot join a transaction on a {type(conn).__name__}: "
            f"pass {_ACCEPTED}"
        )

    async def _call_foreign(
        self, op: str, fn: Callable[[], Awaitable[tuple[OutboxEntry, bool]]]
    ) -> tuple[OutboxEntry, bool]:
        """Run on the caller's connection: asyncpg's errors and SQLAlchemy's DBAPI errors
        (translated by the exception they wrap) become the library's."""
        try:
            return await fn()
        except (ConfigurationError, StoreError):
            raise
        except Exception as exc:
            original = _unwrap(exc)
            error = self.connection.translate(op, original)
            if error is None:
                raise
            raise error from exc

    async def take(
        self, *, bot_id: int, lease: float, ordering_key: str | None = None
    ) -> OutboxEntry | None:
        rows = await self._fetch("take", "take", int(bot_id), float(lease), ordering_key, 1)
        return _entry(rows[0]) if rows else None

    async def take_many(self, *, bot_id: int, lease: float, limit: int) -> Sequence[OutboxEntry]:
        if limit < 1:
            return []
        rows = await self._fetch("take_many", "take", int(bot_id), float(lease), None, limit)
        return sorted((_entry(r) for r in rows), key=lambda e: (e.priority, e.seq))

    async def _held(self, op: str, name: str, entry: OutboxEntry, *args: Any) -> bool:
        rows = await self._fetch(op, name, entry.key, int(entry.token), *args)
        done = bool(rows)
        if done:
            self.connection.wrote()
        return done

    async def deliver(self, entry: OutboxEntry, *, result: bytes) -> bool:
        return await self._held("deliver", "deliver", entry, bytes(result))

    async def retry(
        self,
        entry: OutboxEntry,
        *,
        delay: float,
        error: str,
        params: bytes | None = None,
        ordering_key: str | None = None,
    ) -> bool:
        text = storable_text(error)
        if ordering_key is None or ordering_key == entry.ordering_key:
            return await self._held("retry", "retry", entry, float(delay), text, params)
        rows = await self._locked(
            "retry",
            [unit_lock(entry.bot_id, ordering_key)],
            "retry_move",
            entry.key,
            int(entry.token),
            float(delay),
            text,
            params,
            ordering_key,
        )
        return bool(rows)

    async def settle(
        self,
        entry: OutboxEntry,
        *,
        status: Literal[CallStatus.DEAD, CallStatus.UNKNOWN],
        error: str,
    ) -> bool:
        if status not in (CallStatus.DEAD, CallStatus.UNKNOWN):
            raise ValueError(f"settle takes DEAD or UNKNOWN, got {status!r}")
        return await self._held(
            "settle", "settle", entry, CallStatus(status).value, storable_text(error)
        )

    async def park(self, entry: OutboxEntry, *, error: str) -> bool:
        rows = await self._locked(
            "park",
            [unit_lock(entry.bot_id, entry.ordering_key)],
            "park",
            entry.key,
            int(entry.token),
            storable_text(error),
        )
        return bool(rows) and rows[0][0] > 0

    async def extend(self, entry: OutboxEntry, *, lease: float) -> bool:
        return await self._held("extend", "extend", entry, float(lease))

    # ------------------------------------------------------------------ operator side

    async def get(self, key: str) -> OutboxEntry | None:
        rows = await self._fetch("get", "get", key)
        return _entry(rows[0]) if rows else None

    async def entries(
        self, *, status: CallStatus, bot_id: int | None = None, limit: int = 100
    ) -> list[OutboxEntry]:
        rows = await self._fetch(
            "entries", "entries", CallStatus(status).value, bot_id, max(int(limit), 0)
        )
        return [_entry(r) for r in rows]

    async def redrive(self, key: str) -> bool:
        lock, sql = self._sql["lock_of_entry"], self._sql["redrive"]
        params = (key, *self.connection.now_args())

        async def run(conn: Any) -> bool:
            async with conn.transaction():
                await conn.fetchval(lock, key)
                return await conn.fetchval(sql, *params) is not None

        return await self.connection.call("outbox.redrive", run)

    async def resolve(self, key: str, *, result: bytes) -> bool:
        return bool(await self._fetch("resolve", "resolve", key, bytes(result)))

    async def unpark(self, *, bot_id: int, ordering_key: str) -> int:
        rows = await self._locked(
            "unpark", [unit_lock(bot_id, ordering_key)], "unpark", int(bot_id), ordering_key
        )
        return len(rows)

    async def parked_units(self, *, bot_id: int | None = None) -> list[tuple[int, str]]:
        rows = await self._fetch("parked_units", "parked_units", bot_id)
        return [(r["bot_id"], r["ordering_key"]) for r in rows]

    async def counts(self, *, bot_id: int | None = None) -> dict[CallStatus, int]:
        rows = await self._fetch("counts", "counts", bot_id)
        return {CallStatus(r["status"]): int(r["n"]) for r in rows}

    # ------------------------------------------------------------------ maintenance

    def _purge_run(self, batch: int) -> Callable[[Any], Awaitable[int]]:
        sql = self._sql["purge"]
        params = (int(batch), *self.connection.now_args())

        async def run(conn: Any) -> int:
            status: str = await conn.execute(sql, *params)
            return int(status.rsplit(" ", 1)[-1])

        return run

    async def purge_once(self, batch: int) -> int:
        """Delete up to ``batch`` delivered or superseded entries past their retention
        (errors untranslated: for the background purge).

        Args:
            batch: the most entries deleted.
        """
        return await self.connection.run(self._purge_run(batch))

    async def purge(self, batch: int = 500) -> int:
        """Delete up to ``batch`` delivered or superseded entries whose retention is over;
        returns how many (rows locked by a concurrent writer are skipped).

        Args:
            batch: the most entries deleted (≥ 1).

        Raises:
            ConfigurationError: ``batch`` < 1, or the table is missing.
            StoreError: the database could not answer.
        """
        if batch < 1:
            raise ConfigurationError(f"batch must be ≥ 1, got {batch}")
        return await self.connection.call("outbox.purge", self._purge_run(batch))
