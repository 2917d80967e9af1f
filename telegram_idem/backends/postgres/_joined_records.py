"""The PostgreSQL store's records written inside the bot's own transaction on the
store's database (``async with idem.transaction(conn)``): :class:`PostgresJoinedRecords`.

Accepted connections are the outbox's ``enqueue_in``'s: an asyncpg ``Connection`` or
pool connection inside ``async with conn.transaction():``, or an SQLAlchemy
``AsyncConnection`` / ``AsyncSession`` on PostgreSQL (its statements go through
SQLAlchemy, so they run inside the transaction SQLAlchemy begins, and inside its
savepoints).

The statements are the store's own (:mod:`telegram_idem.backends.postgres._sql`), with
the store's clock (the server's by default), after one of this module's for a key with
no row yet: a plain ``INSERT … ON CONFLICT DO NOTHING``. Both insert, so a concurrent
claim of the same key from another transaction waits on the unique index until this one
commits or rolls back; it then reads what was committed (a replay) or, after a rollback,
inserts its own. Run the
transaction in READ COMMITTED (PostgreSQL's default): each statement's snapshot then sees
the row the first transaction committed (REPEATABLE READ and SERIALIZABLE raise a
serialization failure instead, a :class:`~telegram_idem.errors.StoreError`).

Cost per action: one round trip for the claim of a new key (a plain insert; a key with a
row takes one more, the store's claim), one for the completion (plus one per connection,
the first time, to check the store's table is in its database).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import asyncpg
import asyncpg.pool

from telegram_idem._keys import bounded_key
from telegram_idem._records import Claim, Outcome, Record, Status
from telegram_idem.backends.postgres._connection import PostgresConnection
from telegram_idem.backends.postgres._foreign import (
    Fetch,
    asyncpg_fetch,
    driver_connection,
    sqlalchemy_fetch,
    sqlalchemy_types,
    unwrap,
)
from telegram_idem.backends.postgres._schema import COLUMNS
from telegram_idem.backends.postgres._sql import NOW_CTE, now_placeholder
from telegram_idem.errors import ConfigurationError, StoreError

__all__ = ["ACCEPTED", "ClaimRounds", "PostgresJoinedRecords", "StoreSide", "new_key_sql"]


class StoreSide(Protocol):
    """What the joined records use of :class:`~telegram_idem.backends.postgres.PostgresStore`
    (so this module needs nothing of the store's: the store imports it)."""

    @property
    def connection(self) -> PostgresConnection:
        """The store's connection (pool, clock, error translation)."""
        ...

    @property
    def table(self) -> str:
        """The records table's name."""
        ...


T = TypeVar("T")

ACCEPTED = (
    "an asyncpg Connection (or pool connection) inside `async with conn.transaction()`, "
    "or a SQLAlchemy AsyncConnection or AsyncSession on PostgreSQL"
)
"""How messages name the connection kinds :class:`PostgresJoinedRecords` takes."""

ClaimRounds = Callable[
    [Any, list[str], dict[str, str | None] | None, float, float], Awaitable[list[Claim]]
]
"""``PostgresStore._claim_rounds``: (connection, keys, fingerprints, lease, retention) →
one claim per key."""

_CHECK = "SELECT current_database() AS db, to_regclass($1::text) IS NOT NULL AS present"

_NEW = (
    NOW_CTE
    + """
INSERT INTO {table} ({cols})
SELECT $1::text, 'in_progress', 1, c.now + $3::float8, c.now + $4::float8, $2::text, NULL, 1
FROM c
ON CONFLICT (key) DO NOTHING
RETURNING {cols}"""
)


@functools.lru_cache(maxsize=64)
def new_key_sql(table: str, server_clock: bool) -> str:
    """The claim of a key with no row yet, for ``table``: a plain insert that does
    nothing on a conflict (and waits, like any insert, on a concurrent transaction's
    uncommitted row of the key); the store's own claim decides every other case."""
    return (
        _NEW.replace("{now}", now_placeholder(server_clock, 5))
        .replace("{table}", table)
        .replace("{cols}", ", ".join(COLUMNS))
    )


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
        store: the store (its table, clock and error translation).
        conn: the bot's connection (one of :data:`ACCEPTED`).
        sql: the store's records statements, by name
            (:func:`~telegram_idem.backends.postgres._sql.build_records_sql`).
        claim_rounds: the store's claim loop, run on a connection-like object with
            ``fetch(sql, *args)``.

    Raises:
        ConfigurationError: ``conn`` is of another kind, or an SQLAlchemy connection on
            another database than PostgreSQL.
    """

    def __init__(
        self,
        store: StoreSide,
        conn: object,
        *,
        sql: Mapping[str, str],
        claim_rounds: ClaimRounds,
    ) -> None:
        self.store = store
        self.conn = conn
        self._sql = sql
        self._claim_rounds = claim_rounds
        self._asyncpg = isinstance(conn, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy)
        if self._asyncpg:
            self._fetch: Fetch = asyncpg_fetch(conn)
            return
        types = sqlalchemy_types()
        if types and isinstance(conn, types):
            bind = conn.get_bind() if hasattr(conn, "get_bind") else None
            name = getattr(getattr(bind or conn, "dialect", None), "name", None)
            if name != "postgresql":
                raise ConfigurationError(
                    f"{store!r}.transaction: the SQLAlchemy connection is on {name!r}, "
                    "not on the store's PostgreSQL database"
                )
            self._fetch = sqlalchemy_fetch(conn)
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
            error = self.store.connection.translate(f"transaction.{op}", unwrap(exc))
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
        driver = await driver_connection(self.conn)
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
        """Claim ``key`` in the transaction (see ``Store.claim``): a plain insert for a
        key with no row (:func:`new_key_sql`, the common case); else the store's claim
        statement, run again while it races a transaction that committed the key after
        its snapshot was taken."""
        key = bounded_key(key)
        return await self._guarded("claim", lambda: self._claim(key, fingerprint, lease, retention))

    async def _claim(
        self, key: str, fingerprint: str | None, lease: float, retention: float
    ) -> Claim:
        connection = self.store.connection
        sql = new_key_sql(self.store.table, connection.server_clock)
        rows = await self._fetch(sql, (key, fingerprint, lease, retention, *connection.now_args()))
        if rows:
            row = rows[0]
            record = Record(
                key=row["key"],
                status=Status(row["status"]),
                fencing_token=row["fencing_token"],
                lease_expires_at=row["lease_expires_at"],
                expires_at=row["expires_at"],
                fingerprint=row["fingerprint"],
                result=row["result"],
                attempts=row["attempts"],
            )
            return Claim(Outcome.ACQUIRED, record)
        claims = await self._claim_rounds(
            _Rows(self._fetch), [key], {key: fingerprint}, lease, retention
        )
        return claims[0]

    async def _update(self, name: str, *args: Any) -> bool:
        sql = self._sql[name]
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
