"""The SQLite store's records written inside the bot's own transaction on the store's
file (``async with idem.transaction(conn)``): :class:`SQLiteJoinedRecords`.

Accepted connections: a :class:`sqlite3.Connection` (statements run on the calling
thread, as the bot's own do), an ``aiosqlite.Connection`` (on its thread), and an
SQLAlchemy ``AsyncConnection`` or ``AsyncSession`` on ``sqlite+aiosqlite`` (its
statements run on the aiosqlite connection under it, so they share its transaction and
its savepoints). Each must be on the store's own file (checked once per connection, as
the outbox's ``enqueue_in`` checks it: :mod:`telegram_idem.backends.sqlite._join`).

Every primitive is a short sequence of statements (:func:`claim_steps`,
:func:`update_steps`) driven by a blocking or an awaiting driver, never written twice.
The decisions are :mod:`telegram_idem.machine`'s, judged by the store's clock. The
claim's first statement is a write (an ``INSERT`` that does nothing for a stored key),
so SQLite's write lock is held before the record is read, even in a ``DEFERRED``
transaction, and ``sqlite3``'s legacy transaction control opens the bot's transaction
before it: a concurrent duplicate in another connection waits for the lock (its
``busy_timeout``) until this transaction ends, then reads what it committed.

A new key is one statement; a stored key two (the insert, then the read) and a third
when the decision writes (a takeover). ``complete``, ``fail`` and ``release`` are one
``UPDATE`` each, checked by fencing token as :mod:`telegram_idem.machine` checks it.
"""

from __future__ import annotations

import sqlite3
import weakref
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from telegram_idem import machine
from telegram_idem._clock import Clock
from telegram_idem._keys import bounded_key
from telegram_idem._records import Claim, Outcome, Record, Status
from telegram_idem.backends._driver import Translate
from telegram_idem.backends.sqlite._connection import SQLiteConnection
from telegram_idem.backends.sqlite._enqueue import plain_rows
from telegram_idem.backends.sqlite._join import (
    Joined,
    as_aiosqlite,
    check_open,
    is_sqlalchemy,
    sqlalchemy_dialect,
    sqlalchemy_driver,
)
from telegram_idem.errors import ConfigurationError

if TYPE_CHECKING:
    import aiosqlite

__all__ = ["ACCEPTED", "SQLiteJoinedRecords", "StoreSide", "claim_steps", "update_steps"]


class StoreSide(Protocol):
    """What the joined records use of :class:`~telegram_idem.backends.sqlite.SQLiteStore`
    (so this module needs nothing of the store's: the store imports it)."""

    @property
    def connection(self) -> SQLiteConnection:
        """The store's connection (its thread, transactions and clock)."""
        ...

    @property
    def path(self) -> str:
        """The store's file."""
        ...

    @property
    def clock(self) -> Clock:
        """The store's clock."""
        ...


T = TypeVar("T")

ACCEPTED = (
    "a sqlite3.Connection, an aiosqlite.Connection, or a SQLAlchemy AsyncConnection or "
    "AsyncSession on sqlite+aiosqlite"
)
"""How messages name the connection kinds :class:`SQLiteJoinedRecords` takes."""

Statement = tuple[str, Mapping[str, object]]
Steps = Generator[Statement, list[tuple[Any, ...]], T]
"""Yields statements, receives each one's rows (plain tuples), returns the answer."""

_COLUMNS = "key, status, fencing_token, lease_expires_at, expires_at, fingerprint, result, attempts"
# Starts with INSERT (sqlite3's legacy control opens the transaction before it) and takes
# the write lock whether or not it inserts.
_INSERT = f"""
INSERT INTO idem_records ({_COLUMNS})
VALUES (:key, 'in_progress', 1, :now + :lease, :now + :retention, :fp, NULL, 1)
ON CONFLICT (key) DO NOTHING
RETURNING {_COLUMNS}
"""
_SELECT = f"SELECT {_COLUMNS} FROM idem_records WHERE key = :key"
_WRITE = """
UPDATE idem_records SET status = :status, fencing_token = :token,
    lease_expires_at = :lease_at, expires_at = :expires_at, fingerprint = :fp,
    result = :result, attempts = :attempts
WHERE key = :key
"""
_HELD = (
    "WHERE key = :key AND fencing_token = :token AND status = 'in_progress' "
    "AND expires_at > :now RETURNING 1"
)
_UPDATES = {
    "complete": "UPDATE idem_records SET status = 'completed', result = :result, "
    "expires_at = :now + :retention " + _HELD,
    "fail": "UPDATE idem_records SET status = 'failed', result = :result, "
    "expires_at = :now + :retention " + _HELD,
    "release": "UPDATE idem_records SET lease_expires_at = :now, fingerprint = NULL " + _HELD,
}


def _record(row: tuple[Any, ...]) -> Record:
    key, status, token, lease_at, exp_at, fp, result, attempts = row
    return Record(
        key,
        Status(status),
        token,
        float(lease_at),
        float(exp_at),
        fp,
        None if result is None else bytes(result),
        attempts,
    )


def claim_steps(
    key: str, fingerprint: str | None, lease: float, retention: float, now: float
) -> Steps[Claim]:
    """The statements of one claim of ``key`` at ``now`` (seconds on the store's clock),
    deciding as :func:`telegram_idem.machine.decide_claim`."""
    params = {"key": key, "fp": fingerprint, "now": now, "lease": lease, "retention": retention}
    rows = yield _INSERT, params
    if rows:
        return Claim(Outcome.ACQUIRED, _record(rows[0]))
    rows = yield _SELECT, {"key": key}
    existing = _record(rows[0]) if rows else None
    claim, new = machine.decide_claim(
        existing, key=key, fingerprint=fingerprint, now=now, lease=lease, retention=retention
    )
    if new is not None:
        yield (
            _WRITE,
            {
                "key": new.key,
                "status": new.status.value,
                "token": new.fencing_token,
                "lease_at": new.lease_expires_at,
                "expires_at": new.expires_at,
                "fp": new.fingerprint,
                "result": new.result,
                "attempts": new.attempts,
            },
        )
    return claim


def update_steps(name: str, params: Mapping[str, object]) -> Steps[bool]:
    """The one statement of ``complete``, ``fail`` or ``release``: ``True`` if the
    token still held the key (as :mod:`telegram_idem.machine`'s ``_held``)."""
    rows = yield _UPDATES[name], params
    return bool(rows)


def _run_blocking(conn: sqlite3.Connection, steps: Steps[T]) -> T:
    try:
        sql, params = next(steps)
        while True:
            sql, params = steps.send(plain_rows(conn, sql, params))
    except StopIteration as done:
        result: T = done.value
        return result


async def _run_aiosqlite(conn: aiosqlite.Connection, steps: Steps[T]) -> T:
    cur = await conn.cursor()
    cur.row_factory = None  # plain tuples, whatever the bot's connection makes
    try:
        sql, params = next(steps)
        while True:
            await cur.execute(sql, params)
            rows = [tuple(row) for row in await cur.fetchall()]
            sql, params = steps.send(rows)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        await cur.close()


def _unwrap(exc: Exception) -> Exception:
    """The ``sqlite3`` error inside an SQLAlchemy ``DBAPIError`` (its ``orig``), else
    ``exc``."""
    orig = getattr(exc, "orig", None)
    return orig if isinstance(orig, sqlite3.Error) else exc


_set_up: weakref.WeakSet[StoreSide] = weakref.WeakSet()
"""The stores whose file is set up (their tables exist)."""


class SQLiteJoinedRecords:
    """The records of ``store`` written on the bot's connection ``conn``, inside its
    transaction (:class:`~telegram_idem._joined.JoinedRecords`; see the module
    docstring). Made by :meth:`SQLiteStore.joined`.

    Args:
        store: the store (its file, clock and error translation).
        conn: the bot's connection (one of :data:`ACCEPTED`).
        checked: the connections already found on the store's file.
        translate: the store's driver-error translation (``Store._translate``).

    Raises:
        ConfigurationError: ``conn`` is of another kind, or an SQLAlchemy connection on
            another database than SQLite.
    """

    def __init__(
        self, store: StoreSide, conn: object, checked: Joined, translate: Translate
    ) -> None:
        self.store = store
        self.conn = conn
        self._checked = checked
        self._translate = translate
        self._sa = False
        if isinstance(conn, sqlite3.Connection) or as_aiosqlite(conn) is not None:
            return
        if is_sqlalchemy(conn):
            name = sqlalchemy_dialect(conn)
            if name != "sqlite":
                raise ConfigurationError(
                    f"{store!r}.transaction: the SQLAlchemy connection is on {name!r}, not "
                    f"on the store's SQLite file {store.path!r}"
                )
            self._sa = True
            return
        raise ConfigurationError(
            f"{store!r}.transaction cannot join a transaction on a "
            f"{type(conn).__module__}.{type(conn).__qualname__}: pass {ACCEPTED}, on the "
            f"store's file {store.path!r}"
        )

    def __repr__(self) -> str:
        return f"{self.store!r}.joined({type(self.conn).__name__})"

    async def _driver(self) -> sqlite3.Connection | aiosqlite.Connection:
        """The driver connection the statements run on (an SQLAlchemy connection's
        aiosqlite connection; SQLAlchemy begins its transaction first, as it would)."""
        if not self._sa:
            return self.conn  # type: ignore[return-value]
        return await sqlalchemy_driver(self.conn, f"{self.store!r}.transaction")

    async def _guarded(self, op: str, fn: Callable[[], Awaitable[T]]) -> T:
        async def unwrapped() -> T:
            try:
                return await fn()
            except ConfigurationError:
                raise
            except Exception as exc:
                inner = _unwrap(exc)
                if inner is exc:
                    raise
                raise inner from exc

        return await self.store.connection.call(f"transaction.{op}", unwrapped)

    def _blocking(self, op: str, fn: Callable[[], T]) -> T:
        """``fn()`` on the calling thread (a sqlite3 connection), its driver error
        translated as the store translates its own (without a coroutine per call)."""
        try:
            return fn()
        except sqlite3.Error as exc:
            error = self._translate(f"transaction.{op}", exc)
            if error is None:
                raise
            raise error from exc

    async def check(self) -> None:
        """Accept the connection: the store's file set up (once per store), the
        connection on it (once per connection) and inside a transaction, or in
        ``sqlite3``'s default mode that opens one before the first write.

        Raises:
            ConfigurationError: another file; autocommit outside a transaction; the
                store's file not set up yet while the bot's transaction holds its lock.
            StoreError: SQLite could not answer.
        """

        conn = self.conn
        if isinstance(conn, sqlite3.Connection) and self.store in _set_up:
            name = repr(self.store)
            self._blocking("check", lambda: self._checked.check_sqlite3(conn))
            check_open(conn, name, "transaction")
            return

        async def job() -> None:
            # An open store has set its file up: never queue on its thread here, where
            # claims may wait for the write lock this very transaction holds.
            if self.store not in _set_up and not self.store.connection.is_open:
                await self._set_up_file()
            driver = await self._driver()
            if isinstance(driver, sqlite3.Connection):
                self._checked.check_sqlite3(driver)
            else:
                await self._checked.check_aiosqlite(driver)
            check_open(driver, repr(self.store), "transaction")

        await self._guarded("check", job)

    async def _set_up_file(self) -> None:
        try:  # the records table must exist; the bot's transaction may hold the lock
            await self.store.connection.open(wait=False)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
            raise ConfigurationError(
                f"{self.store!r}.transaction: the store has not set up its file yet and "
                "cannot while another connection (the bot's transaction, likely) holds its "
                "lock: use the store once before the bot's first transaction"
            ) from exc
        _set_up.add(self.store)

    async def _run(self, op: str, steps: Steps[T]) -> T:
        conn = self.conn
        if isinstance(conn, sqlite3.Connection):
            return self._blocking(op, lambda: _run_blocking(conn, steps))

        async def job() -> T:
            driver = await self._driver()
            if isinstance(driver, sqlite3.Connection):
                return _run_blocking(driver, steps)
            return await _run_aiosqlite(driver, steps)

        return await self._guarded(op, job)

    async def claim(
        self, key: str, *, fingerprint: str | None, lease: float, retention: float
    ) -> Claim:
        """Claim ``key`` in the transaction (see ``Store.claim``)."""
        steps = claim_steps(bounded_key(key), fingerprint, lease, retention, self.store.clock())
        return await self._run("claim", steps)

    async def complete(self, key: str, token: int, result: bytes, *, retention: float) -> bool:
        """Complete ``key`` in the transaction (see ``Store.complete``)."""
        return await self._update("complete", key, token, result, retention)

    async def fail(self, key: str, token: int, error: bytes, *, retention: float) -> bool:
        """Store a failure for ``key`` in the transaction (see ``Store.fail``)."""
        return await self._update("fail", key, token, error, retention)

    async def release(self, key: str, token: int) -> bool:
        """Release ``key`` in the transaction (see ``Store.release``)."""
        return await self._update("release", key, token, None, 0.0)

    async def _update(
        self, name: str, key: str, token: int, result: bytes | None, retention: float
    ) -> bool:
        params = {
            "key": bounded_key(key),
            "token": token,
            "result": result,
            "retention": retention,
            "now": self.store.clock(),
        }
        return await self._run(name, update_steps(name, params))
