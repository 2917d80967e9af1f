"""Joining the bot's own SQLite transaction: the connections accepted, the database they
must be on, and the enqueue statements run there without committing.

Accepted: a :class:`sqlite3.Connection` (its statements run on the calling thread, as
the bot's own do), an ``aiosqlite.Connection`` (on aiosqlite's thread), and an SQLAlchemy
``AsyncConnection`` / ``AsyncSession`` on ``sqlite+aiosqlite`` (on the aiosqlite
connection under it, inside the transaction SQLAlchemy begins). aiosqlite is
never imported here: a connection of it can only exist once its module is loaded.

A connection's main database never changes while it is open, so :class:`Joined` checks it
once per connection (``PRAGMA database_list``, both paths resolved) and remembers the
connections that passed without keeping them alive: an ``aiosqlite.Connection`` (or a
subclass of :class:`sqlite3.Connection`) by a weak reference; a plain
:class:`sqlite3.Connection` cannot be weakly referenced, so it is given a SQL function
(:data:`MARK`) whose Python callable only that connection holds, and is remembered by its
``id`` and a weak reference to that callable: the callable dies with the connection (or
when it is closed), before its ``id`` can be reused, so a later connection at the same
address is checked anew.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from telegram_idem.backends.sqlite._enqueue import Steps, plain_rows, run_steps
from telegram_idem.errors import ConfigurationError
from telegram_idem.outbox import OutboxEntry

if TYPE_CHECKING:
    import aiosqlite

__all__ = [
    "ACCEPTED",
    "MARK",
    "Joined",
    "as_aiosqlite",
    "check_database",
    "check_open",
    "is_sqlalchemy",
    "run_steps_in",
    "sqlalchemy_dialect",
    "sqlalchemy_driver",
]

ACCEPTED = (
    "a sqlite3.Connection, an aiosqlite.Connection, or a SQLAlchemy AsyncConnection or "
    "AsyncSession on sqlite+aiosqlite"
)
"""How messages name the connection types :func:`run_steps_in` takes."""

MARK = "telegram_idem_joined"
"""The SQL function (no arguments, returns ``NULL``) :class:`Joined` registers on a plain
:class:`sqlite3.Connection` it checked: its mark that the connection is on the file."""

_LEGACY = getattr(sqlite3, "LEGACY_TRANSACTION_CONTROL", -1)


def _same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def check_database(
    rows: Iterable[Sequence[Any]],
    path: str,
    name: str,
    op: str = "enqueue_in",
    why: str = "the entry must commit in the file the relay reads",
) -> None:
    """Accept a connection whose ``PRAGMA database_list`` is ``rows`` if its ``main``
    database is the file ``path`` (both resolved: symlinks, relative paths). Messages
    name ``{name}.{op}`` and say ``why``.

    Raises:
        ConfigurationError: another file, or an in-memory or temporary database (the
            store's own ``:memory:`` database cannot be shared with any connection).
    """
    main = next((str(row[2] or "") for row in rows if row[1] == "main"), "")
    if path == ":memory:" or not main or not _same_file(main, path):
        raise ConfigurationError(
            f"{name}.{op}: the connection is on {main or 'an in-memory database'!r}, "
            f"not on the store's database {path!r}: {why}"
        )


def check_open(
    conn: sqlite3.Connection | aiosqlite.Connection, name: str, op: str = "enqueue_in"
) -> None:
    """Accept a connection whose next write runs inside a transaction: one is open, or
    ``sqlite3``'s legacy transaction control opens one before the write.

    Raises:
        ConfigurationError: the connection is in autocommit mode outside a transaction
            (each statement would commit alone).
    """
    if conn.in_transaction:
        return
    autocommit = getattr(conn, "autocommit", _LEGACY)
    if autocommit is True or (autocommit == _LEGACY and conn.isolation_level is None):
        raise ConfigurationError(
            f"{name}.{op} needs an open transaction: the connection is in autocommit "
            "mode outside one (run BEGIN first)"
        )


def _new_mark() -> Callable[[], None]:
    def mark() -> None:  # a callable of its own per connection: its identity is the mark
        return None

    return mark


class Joined:
    """The bot connections found on the store's file ``path``, each checked once (see
    the module docstring); a connection that failed is checked again on its next use.

    Args:
        path: the store's database file.
        name: how messages name the outbox (or the store).
        op: how messages name the operation.
        why: what messages say a connection on another file would break.
    """

    def __init__(
        self,
        path: str,
        name: str,
        op: str = "enqueue_in",
        why: str = "the entry must commit in the file the relay reads",
    ) -> None:
        self.path = path
        self.name = name
        self.op = op
        self.why = why
        self._weak: weakref.WeakKeyDictionary[object, None] = weakref.WeakKeyDictionary()
        self._marks: dict[int, weakref.ref[Callable[[], None]]] = {}

    def _known(self, conn: object) -> bool:
        mark = self._marks.get(id(conn))
        if mark is not None and mark() is not None:
            return True
        try:
            return conn in self._weak
        except TypeError:  # not weakly referenceable: only a mark can know it
            return False

    def _remember_sqlite3(self, conn: sqlite3.Connection) -> None:
        try:
            self._weak[conn] = None
            return
        except TypeError:  # a plain sqlite3.Connection
            pass
        mark, key = _new_mark(), id(conn)
        conn.create_function(MARK, 0, mark)
        marks = self._marks

        def gone(ref: weakref.ref[Callable[[], None]]) -> None:
            if marks.get(key) is ref:
                del marks[key]

        marks[key] = weakref.ref(mark, gone)

    def check_sqlite3(self, conn: sqlite3.Connection) -> None:
        """Accept ``conn`` if it is on the store's file (checked on its first use).

        Raises:
            ConfigurationError: as :func:`check_database`.
            sqlite3.Error: from SQLite (a closed connection), untranslated.
        """
        if self._known(conn):
            return
        check_database(
            plain_rows(conn, "PRAGMA database_list"), self.path, self.name, self.op, self.why
        )
        self._remember_sqlite3(conn)

    async def check_aiosqlite(self, conn: aiosqlite.Connection) -> None:
        """As :meth:`check_sqlite3`, for an ``aiosqlite.Connection``.

        Raises:
            ConfigurationError: as :func:`check_database`.
            sqlite3.Error, ValueError: from aiosqlite (a closed connection), untranslated.
        """
        if self._known(conn):
            return
        cur = await conn.cursor()
        try:
            cur.row_factory = None
            await cur.execute("PRAGMA database_list")
            rows = [tuple(row) for row in await cur.fetchall()]
        finally:
            await cur.close()
        check_database(rows, self.path, self.name, self.op, self.why)
        self._weak[conn] = None


def as_aiosqlite(conn: object) -> aiosqlite.Connection | None:
    """``conn`` if it is an ``aiosqlite.Connection`` (aiosqlite loaded), else ``None``."""
    module = sys.modules.get("aiosqlite")
    if module is not None and isinstance(conn, module.Connection):
        connection: aiosqlite.Connection = conn
        return connection
    return None


async def _run_aiosqlite(conn: aiosqlite.Connection, steps: Steps) -> tuple[OutboxEntry, bool]:
    cur = await conn.cursor()
    cur.row_factory = None  # plain tuples, whatever the bot's connection makes
    try:
        sql, params = next(steps)
        while True:
            await cur.execute(sql, params)
            rows = [tuple(row) for row in await cur.fetchall()]
            sql, params = steps.send(rows)
    except StopIteration as done:
        result: tuple[OutboxEntry, bool] = done.value
        return result
    finally:
        await cur.close()


def _sqlalchemy_types() -> tuple[type, ...]:
    if "sqlalchemy" not in sys.modules:  # no SQLAlchemy object can exist yet
        return ()
    try:
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    except ImportError:  # pragma: no cover - sqlalchemy without its asyncio part
        return ()
    return (AsyncConnection, AsyncSession)


def is_sqlalchemy(conn: object) -> bool:
    """``conn`` is an SQLAlchemy ``AsyncConnection`` or ``AsyncSession``."""
    types = _sqlalchemy_types()
    return bool(types) and isinstance(conn, types)


def sqlalchemy_dialect(conn: object) -> str | None:
    """The dialect name (``"sqlite"``) of an SQLAlchemy connection or session."""
    bind = conn.get_bind() if hasattr(conn, "get_bind") else None
    name = getattr(getattr(bind or conn, "dialect", None), "name", None)
    return name if isinstance(name, str) else None


async def sqlalchemy_driver(conn: object, name: str) -> sqlite3.Connection | aiosqlite.Connection:
    """The driver connection under an SQLAlchemy ``AsyncConnection`` or ``AsyncSession``
    on SQLite, once SQLAlchemy has begun its transaction (as its first statement would):
    statements run on it share SQLAlchemy's transaction and savepoints.

    Raises:
        ConfigurationError: another dialect, or a driver that is not aiosqlite.
    """
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    dialect = sqlalchemy_dialect(conn)
    if dialect != "sqlite":
        raise ConfigurationError(
            f"{name}: the SQLAlchemy connection is on {dialect!r}, not on the store's SQLite file"
        )
    sa = await conn.connection() if isinstance(conn, AsyncSession) else conn
    assert isinstance(sa, AsyncConnection)
    if not sa.in_transaction():
        await sa.begin()
    driver = (await sa.get_raw_connection()).driver_connection
    aio = as_aiosqlite(driver)
    if aio is not None:
        return aio
    if isinstance(driver, sqlite3.Connection):  # pragma: no cover - a sync driver under async
        return driver
    raise ConfigurationError(
        f"{name}: the SQLAlchemy connection's driver is {type(driver).__name__}, not "
        "aiosqlite (use sqlite+aiosqlite://)"
    )


async def run_steps_in(conn: object, steps: Steps, joined: Joined) -> tuple[OutboxEntry, bool]:
    """Run ``steps`` on the bot's connection ``conn``, inside its open transaction, once
    ``joined`` accepts it (on the store's file). Never commits or rolls back.

    Args:
        conn: a :class:`sqlite3.Connection`, an ``aiosqlite.Connection``, or an
            SQLAlchemy ``AsyncConnection`` / ``AsyncSession`` on ``sqlite+aiosqlite``
            (run on its aiosqlite connection: :func:`sqlalchemy_driver`).
        steps: the statements (:func:`~telegram_idem.backends.sqlite._enqueue.enqueue_steps`).
        joined: the outbox's checked connections (its file, its name for messages).

    Raises:
        ConfigurationError: ``conn`` is of another type (the message names the accepted
            ones), on another database, or not in a transaction.
        sqlite3.Error: from SQLite, untranslated.
    """
    if is_sqlalchemy(conn):
        conn = await sqlalchemy_driver(conn, f"{joined.name}.enqueue_in")
    if isinstance(conn, sqlite3.Connection):
        joined.check_sqlite3(conn)
        check_open(conn, joined.name)
        return run_steps(conn, steps)
    aio = as_aiosqlite(conn)
    if aio is None:
        raise ConfigurationError(
            f"{joined.name}.enqueue_in takes {ACCEPTED} on the store's database, "
            f"got {type(conn).__module__}.{type(conn).__qualname__}"
        )
    await joined.check_aiosqlite(aio)
    check_open(aio, joined.name)
    return await _run_aiosqlite(aio, steps)
