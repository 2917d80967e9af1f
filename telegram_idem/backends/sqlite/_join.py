"""Joining the bot's own SQLite transaction: the connections accepted, the database they
must be on, and the enqueue statements run there without committing.

Accepted: a :class:`sqlite3.Connection` (its statements run on the calling thread, as
the bot's own do) and an ``aiosqlite.Connection`` (on aiosqlite's thread). aiosqlite is
never imported here: a connection of it can only exist once its module is loaded.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from telegram_idem.backends.sqlite._enqueue import Steps, plain_rows, run_steps
from telegram_idem.errors import ConfigurationError
from telegram_idem.outbox import OutboxEntry

if TYPE_CHECKING:
    import aiosqlite

__all__ = ["ACCEPTED", "check_database", "check_open", "run_steps_in"]

ACCEPTED = "a sqlite3.Connection or an aiosqlite.Connection"
"""How messages name the connection types :func:`run_steps_in` takes."""

_LEGACY = getattr(sqlite3, "LEGACY_TRANSACTION_CONTROL", -1)


def _same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def check_database(rows: Iterable[Sequence[Any]], path: str, name: str) -> None:
    """Accept a connection whose ``PRAGMA database_list`` is ``rows`` if its ``main``
    database is the file ``path`` (both resolved: symlinks, relative paths).

    Raises:
        ConfigurationError: another file, or an in-memory or temporary database (the
            store's own ``:memory:`` database cannot be shared with any connection).
    """
    main = next((str(row[2] or "") for row in rows if row[1] == "main"), "")
    if path == ":memory:" or not main or not _same_file(main, path):
        raise ConfigurationError(
            f"{name}.enqueue_in: the connection is on {main or 'an in-memory database'!r}, "
            f"not on the store's database {path!r}: the entry must commit in the file the "
            "relay reads"
        )


def check_open(conn: sqlite3.Connection | aiosqlite.Connection, name: str) -> None:
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
            f"{name}.enqueue_in needs an open transaction: the connection is in autocommit "
            "mode outside one (run BEGIN first)"
        )


async def _aiosqlite_rows(
    conn: aiosqlite.Connection, sql: str, params: Any = ()
) -> list[tuple[Any, ...]]:
    cur = await conn.cursor()
    cur.row_factory = None  # plain tuples, whatever the bot's connection makes
    try:
        await cur.execute(sql, params)
        return [tuple(row) for row in await cur.fetchall()]
    finally:
        await cur.close()


def _as_aiosqlite(conn: object) -> aiosqlite.Connection | None:
    module = sys.modules.get("aiosqlite")
    if module is not None and isinstance(conn, module.Connection):
        connection: aiosqlite.Connection = conn
        return connection
    return None


async def run_steps_in(
    conn: object, steps: Steps, *, path: str, name: str
) -> tuple[OutboxEntry, bool]:
    """Run ``steps`` on the bot's connection ``conn``, inside its open transaction, after
    checking it is on the database file ``path``. Never commits or rolls back.

    Args:
        conn: a :class:`sqlite3.Connection` or an ``aiosqlite.Connection``.
        steps: the statements (:func:`~telegram_idem.backends.sqlite._enqueue.enqueue_steps`).
        path: the store's database file.
        name: how messages name the outbox.

    Raises:
        ConfigurationError: ``conn`` is of another type (the message names the accepted
            ones), on another database, or not in a transaction.
        sqlite3.Error: from SQLite, untranslated.
    """
    if isinstance(conn, sqlite3.Connection):
        check_database(plain_rows(conn, "PRAGMA database_list"), path, name)
        check_open(conn, name)
        return run_steps(conn, steps)
    aio = _as_aiosqlite(conn)
    if aio is None:
        raise ConfigurationError(
            f"{name}.enqueue_in takes {ACCEPTED} on the store's database, "
            f"got {type(conn).__module__}.{type(conn).__qualname__}"
        )
    check_database(await _aiosqlite_rows(aio, "PRAGMA database_list"), path, name)
    check_open(aio, name)
    try:
        sql, params = next(steps)
        while True:
            sql, params = steps.send(await _aiosqlite_rows(aio, sql, params))
    except StopIteration as done:
        result: tuple[OutboxEntry, bool] = done.value
        return result
