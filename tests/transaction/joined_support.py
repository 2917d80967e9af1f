"""The bot's transactions of each kind the joined stores accept, one shape over all of
them (``Tx``), for the tests of ``idem.transaction(conn)``.

A :class:`Tx` opens the bot's transaction (``begin()``, a context manager that commits on
exit and rolls back on an exception), a savepoint inside it (``nested()``), runs the
bot's own SQL in it (``exec``), and ``conn`` is what ``idem.transaction`` gets.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import aiosqlite
import asyncpg
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine

__all__ = ["Rollback", "Tx", "postgres_tx", "sqlite_engine", "sqlite_tx"]


class Rollback(Exception):
    """Raised inside a block to roll it back."""


class Tx:
    """One kind of bot transaction (see the module docstring)."""

    conn: object

    def begin(self) -> AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    def nested(self) -> AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    async def exec(self, sql: str, params: dict[str, Any] | None = None) -> None:
        raise NotImplementedError


class Sqlite3Tx(Tx):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = self.raw = conn

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[None]:
        self.raw.execute("BEGIN")
        try:
            yield
        except BaseException:
            self.raw.execute("ROLLBACK")
            raise
        self.raw.execute("COMMIT")

    @asynccontextmanager
    async def nested(self) -> AsyncIterator[None]:
        self.raw.execute("SAVEPOINT sp")
        try:
            yield
        except BaseException:
            self.raw.execute("ROLLBACK TO sp")
            self.raw.execute("RELEASE sp")
            raise
        self.raw.execute("RELEASE sp")

    async def exec(self, sql: str, params: dict[str, Any] | None = None) -> None:
        self.raw.execute(sql, params or {})


class AiosqliteTx(Tx):
    def __init__(self, conn: aiosqlite.Connection) -> None:
        self.conn = self.raw = conn

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[None]:
        await self.raw.execute("BEGIN")
        try:
            yield
        except BaseException:
            await self.raw.execute("ROLLBACK")
            raise
        await self.raw.execute("COMMIT")

    @asynccontextmanager
    async def nested(self) -> AsyncIterator[None]:
        await self.raw.execute("SAVEPOINT sp")
        try:
            yield
        except BaseException:
            await self.raw.execute("ROLLBACK TO sp")
            await self.raw.execute("RELEASE sp")
            raise
        await self.raw.execute("RELEASE sp")

    async def exec(self, sql: str, params: dict[str, Any] | None = None) -> None:
        await self.raw.execute(sql, params or {})


class AsyncpgTx(Tx):
    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = self.raw = conn

    def begin(self) -> AbstractAsyncContextManager[Any]:
        return self.raw.transaction()

    def nested(self) -> AbstractAsyncContextManager[Any]:
        return self.raw.transaction()  # inside a transaction: a savepoint

    async def exec(self, sql: str, params: dict[str, Any] | None = None) -> None:
        assert not params, "asyncpg statements here take literal values"
        await self.raw.execute(sql)


class SAConnTx(Tx):
    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = self.sa = conn

    def begin(self) -> AbstractAsyncContextManager[Any]:
        return self.sa.begin()

    def nested(self) -> AbstractAsyncContextManager[Any]:
        return self.sa.begin_nested()

    async def exec(self, sql: str, params: dict[str, Any] | None = None) -> None:
        await self.sa.execute(text(sql), params or {})


class SASessionTx(Tx):
    def __init__(self, session: AsyncSession) -> None:
        self.conn = self.session = session

    def begin(self) -> AbstractAsyncContextManager[Any]:
        return self.session.begin()

    def nested(self) -> AbstractAsyncContextManager[Any]:
        return self.session.begin_nested()

    async def exec(self, sql: str, params: dict[str, Any] | None = None) -> None:
        await self.session.execute(text(sql), params or {})


def sqlite_engine(path: str) -> AsyncEngine:
    """An SQLAlchemy engine on ``path`` with SQLAlchemy's documented recipe for pysqlite
    transactions (the driver's own BEGIN off, SQLAlchemy's BEGIN on), which savepoints
    (``begin_nested``) need."""
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}")

    @event.listens_for(engine.sync_engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine.sync_engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


@asynccontextmanager
async def sqlite_tx(kind: str, path: str) -> AsyncIterator[Tx]:
    """A bot transaction of ``kind`` (``sqlite3``, ``aiosqlite``, ``sa-connection``,
    ``sa-session``) on the file ``path``."""
    if kind == "sqlite3":
        conn = sqlite3.connect(path, isolation_level=None, timeout=10)
        try:
            yield Sqlite3Tx(conn)
        finally:
            conn.close()
        return
    if kind == "aiosqlite":
        async with aiosqlite.connect(path, isolation_level=None, timeout=10) as aconn:
            yield AiosqliteTx(aconn)
        return
    engine = sqlite_engine(path)
    try:
        if kind == "sa-connection":
            async with engine.connect() as sa_conn:
                yield SAConnTx(sa_conn)
        else:
            async with AsyncSession(engine) as session:
                yield SASessionTx(session)
    finally:
        await engine.dispose()


@asynccontextmanager
async def postgres_tx(kind: str, dsn: str) -> AsyncIterator[Tx]:
    """A bot transaction of ``kind`` (``asyncpg``, ``sa-connection``, ``sa-session``) on
    the PostgreSQL database ``dsn``."""
    if kind == "asyncpg":
        conn = await asyncpg.connect(dsn)
        try:
            yield AsyncpgTx(conn)
        finally:
            await conn.close()
        return
    engine = create_async_engine(dsn.replace("postgresql://", "postgresql+asyncpg://", 1))
    try:
        if kind == "sa-connection":
            async with engine.connect() as sa_conn:
                yield SAConnTx(sa_conn)
        else:
            async with AsyncSession(engine) as session:
                yield SASessionTx(session)
    finally:
        await engine.dispose()
