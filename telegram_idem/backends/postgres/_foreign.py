"""The bot's own PostgreSQL connections, as the store's statements run on them: an
asyncpg ``Connection`` or pool connection, or an SQLAlchemy ``AsyncConnection`` /
``AsyncSession`` on asyncpg (through SQLAlchemy, inside the transaction it begins).

Shared by :meth:`PostgresOutbox.enqueue_in
<telegram_idem.backends.postgres.PostgresOutbox.enqueue_in>` and the joined records
(:mod:`telegram_idem.backends.postgres._joined_records`).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import asyncpg.pool

__all__ = [
    "Fetch",
    "asyncpg_fetch",
    "driver_connection",
    "named",
    "sqlalchemy_fetch",
    "sqlalchemy_types",
    "unwrap",
]

_PARAM = re.compile(r"\$(\d+)(?:::(\w+(?:\[\])?))?")


Fetch = Callable[[str, Sequence[Any]], Awaitable[list[Any]]]
"""Run one statement (``$n`` placeholders) on some connection, returning its rows."""


def named(sql: str) -> str:
    """``sql`` with ``$n`` / ``$n::type`` placeholders as SQLAlchemy ``text()`` binds
    (``:pn`` / ``CAST(:pn AS type)``)."""

    def bind(m: re.Match[str]) -> str:
        name = f":p{m.group(1)}"
        return f"CAST({name} AS {m.group(2)})" if m.group(2) else name

    return _PARAM.sub(bind, sql)


def asyncpg_fetch(conn: Any) -> Fetch:
    async def fetch(sql: str, args: Sequence[Any]) -> list[Any]:
        rows: list[Any] = await conn.fetch(sql, *args)
        return rows

    return fetch


def sqlalchemy_fetch(conn: Any) -> Fetch:
    from sqlalchemy import text

    async def fetch(sql: str, args: Sequence[Any]) -> list[Any]:
        params = {f"p{i}": value for i, value in enumerate(args, start=1)}
        result = await conn.execute(text(named(sql)), params)
        return list(result.mappings().all()) if result.returns_rows else []

    return fetch


def sqlalchemy_types() -> tuple[type, ...]:
    try:
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    except ImportError:  # pragma: no cover - sqlalchemy comes with the postgres extra
        return ()
    return (AsyncConnection, AsyncSession)


async def driver_connection(conn: object) -> asyncpg.Connection | None:
    """The asyncpg connection under ``conn`` (itself; a pool proxy's; a SQLAlchemy
    connection's or session's current one), or ``None`` when it cannot be told: the
    identity the table check is remembered by, for as long as that connection lives."""
    # The proxy first: asyncpg makes isinstance(proxy, Connection) true, but a proxy
    # cannot be weakly referenced (nor does it live as long as its connection).
    if isinstance(conn, asyncpg.pool.PoolConnectionProxy):
        inner = getattr(conn, "_con", None)  # the proxy has no public accessor
        return inner if type(inner) is not asyncpg.pool.PoolConnectionProxy else None
    if isinstance(conn, asyncpg.Connection):
        return conn
    if not sqlalchemy_types():
        return None  # pragma: no cover - sqlalchemy comes with the postgres extra
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(conn, AsyncSession):
        conn = await conn.connection()
    if not isinstance(conn, AsyncConnection):
        return None
    driver = (await conn.get_raw_connection()).driver_connection
    return driver if isinstance(driver, asyncpg.Connection) else None


def unwrap(exc: BaseException) -> Exception:
    """The driver exception inside a SQLAlchemy ``DBAPIError`` (its ``orig``, whose own
    ``__cause__`` is asyncpg's for SQLAlchemy's asyncpg adapter), else ``exc``."""
    orig = getattr(exc, "orig", None)
    if isinstance(orig, BaseException):
        cause = orig.__cause__
        if isinstance(cause, asyncpg.PostgresError | asyncpg.InterfaceError):
            return cause
        if isinstance(orig, Exception):
            return orig
    return exc if isinstance(exc, Exception) else Exception(str(exc))
