"""The PostgreSQL store's records written inside the bot's own transaction on the
store's database (``async with idem.transaction(conn)``): :class:`PostgresJoinedRecords`.

Accepted connections are the outbox's ``enqueue_in``'s: an asyncpg ``Connection`` or
pool connection inside ``async with conn.transaction():``, or an SQLAlchemy
``AsyncConnection`` / ``AsyncSession`` on PostgreSQL (its statements go through
SQLAlchemy, so they run inside the transaction SQLAlchemy begins, and inside its
savepoints).

The statements are the store's own (:mod:`telegram_idem.backends.postgres._sql`), with
the store's clock (the server's by default): the claim is one ``INSERT … ON CONFLICT``
whose conflict branch locks the key's row, so a concurrent claim of the same key from
another transaction waits on the unique index until this one commits or rolls back; it
then reads what was committed (a replay) or, after a rollback, inserts its own. Run the
transaction in READ COMMITTED (PostgreSQL's default): each statement's snapshot then sees
the row the first transaction committed (REPEATABLE READ and SERIALIZABLE raise a
serialization failure instead, a :class:`~telegram_idem.errors.StoreError`).

Cost per action: one round trip for the claim, one for the completion (plus one per
connection, the first time, to check the store's table is in its database).
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import asyncpg
import asyncpg.pool

from telegram_idem._keys import bounded_key
from telegram_idem._records import Claim
from telegram_idem.backends.postgres._outbox import (
    Fetch,
    _asyncpg_fetch,
    _driver_connection,
    _sqlalchemy_fetch,
    _sqlalchemy_types,
    _unwrap,
)
from telegram_idem.errors import ConfigurationError, StoreError

if TYPE_CHECKING:
    from telegram_idem.backends.postgres._store import PostgresStore

__all__ = ["ACCEPTED", "PostgresJoinedRecords"]

T = TypeVar("T")

ACCEPTED = (
    "an asyncpg Connection (or pool connection) inside `async with conn.transaction()`, "
    "or a SQLAlchemy AsyncConnection or AsyncSession on PostgreSQL"
)
"""How messages name the connection kinds :class:`PostgresJoinedRecords` takes."""

_CHECK = "SELECT current_database() AS db, to_regclass($1::text) IS NOT NULL AS present"

_checked: weakref.WeakKeyDictionary[asyncpg.Connection, set[str]] = weakref.WeakKeyDictionary()
"""The tables found in each asyncpg connection's database (remembered while it lives)."""


class _Rows:
    """A ``fetch(sql, *args)`` object over a :data:`Fetch` (what the store's claim loop
    calls its connection with)."""

    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        return await self._fetch(sql, args)


class PostgresJoinedRecords:
    """The records of ``store`` written on the bot's connection ``conn``, inside its
    transaction (:class:`~telegram_idem._joined.JoinedRecords`; see the module
    docstring). Made by :meth:`PostgresStore.joined`.

    Args:
        store: the store (its table, statements, clock and error translation).
        conn: the bot's connection (one of :data:`ACCEPTED`).

    Raises:
        ConfigurationError: ``conn`` is of another kind, or an SQLAlchemy connection on
            another database than PostgreSQL.
    """

    def __init__(self, store: PostgresStore, conn: object) -> None:
        self.store = store
        self.conn = conn
        self._asyncpg = isinstance(conn, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy)
        if self._asyncpg:
            self._fetch: Fetch = _asyncpg_fetch(conn)
            return
        types = _sqlalchemy_types()
        if types and isinstance(conn, types):
            bind = conn.get_bind() if hasattr(conn, "get_bind") else None
            name = getattr(getattr(bind or conn, "dialect", None), "name", None)
            if name != "postgresql":
                raise ConfigurationError(
                    f"{store!r}.transaction: the SQLAlchemy connection is on {name!r}, "
                    "not on the store's PostgreSQL database"
                )
            self._fetch = _sqlalchemy_fetch(conn)
            return
        raise ConfigurationError(
            f"{store!r}.transaction cannot join a transaction on a "
            f"{type(conn).__module__}.{type(conn).__qualname__}: pass {ACCEPTED}, on the "
            "store's database"
        )

    def __repr__(self) -> str:
        return f"{self.store!r}.joined({type(self.conn).__name__})"

    async def _guarded(self, op: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Run on the bot's connection: asyncpg's errors and SQLAlchemy's DBAPI errors
        (by the exception they wrap) become the library's."""
        try:
            return await fn()
        except (ConfigurationError, StoreError):
            raise
        except Exception as exc:
            error = self.store.connection.translate(f"transaction.{op}", _unwrap(exc))
            if error is None:
                raise
            raise error from exc

    async def check(self) -> None:
        """Accept the connection: inside a transaction (an SQLAlchemy one is begun, as
        SQLAlchemy would on its first statement), on the database that holds the store's
        table (checked once per asyncpg connection).

        Raises:
            ConfigurationError: an asyncpg connection outside a transaction, or a
                database without the store's table.
            StoreError: the database could not answer.
        """
        await self._guarded("check", self._check)

    async def _check(self) -> None:
        conn: Any = self.conn
        if self._asyncpg:
            if not conn.is_in_transaction():
                raise ConfigurationError(
                    f"{self.store!r}.transaction: the asyncpg connection has no open "
                    "transaction (the records would commit at once): enter "
                    "`async with conn.transaction():` first"
                )
        else:
            from sqlalchemy.ext.asyncio import AsyncSession

            sa = await conn.connection() if isinstance(conn, AsyncSession) else conn
            if not sa.in_transaction():
                await sa.begin()
        table = self.store.table
        driver = await _driver_connection(self.conn)
        if driver is not None and table in _checked.get(driver, ()):
            return
        rows = await self._fetch(_CHECK, [table])
        if not rows or not rows[0]["present"]:
            db = rows[0]["db"] if rows else "?"
            raise ConfigurationError(
                f"{self.store!r}.transaction: the connection is on database {db!r}, where "
                f"the store's table {table!r} is not: join a transaction on the store's own "
                "database (run `telegram-idem migrate <store URL>` there)"
            )
        if driver is not None:
            _checked.setdefault(driver, set()).add(table)

    async def claim(
        self, key: str, *, fingerprint: str | None, lease: float, retention: float
    ) -> Claim:
        """Claim ``key`` in the transaction (see ``Store.claim``): the store's claim
        statement, run again while it races a transaction that committed the key after
        its snapshot was taken."""
        key = bounded_key(key)
        rows = _Rows(self._fetch)
        claims = await self._guarded(
            "claim",
            lambda: self.store._claim_rounds(rows, [key], {key: fingerprint}, lease, retention),
        )
        return claims[0]

    async def _update(self, name: str, *args: Any) -> bool:
        sql = self.store._sql[name]
        params: Sequence[Any] = (*args, *self.store.connection.now_args())
        rows = await self._guarded(name, lambda: self._fetch(sql, params))
        return bool(rows)

    async def complete(self, key: str, token: int, result: bytes, *, retention: float) -> bool:
        """Complete ``key`` in the transaction (see ``Store.complete``)."""
        return await self._update("complete", bounded_key(key), token, result, retention)

    async def fail(self, key: str, token: int, error: bytes, *, retention: float) -> bool:
        """Store a failure for ``key`` in the transaction (see ``Store.fail``)."""
        return await self._update("fail", bounded_key(key), token, error, retention)

    async def release(self, key: str, token: int) -> bool:
        """Release ``key`` in the transaction (see ``Store.release``)."""
        return await self._update("release", bounded_key(key), token)
