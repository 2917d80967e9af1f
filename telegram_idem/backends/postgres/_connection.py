"""The connection every part of the PostgreSQL store shares: pool, clock, errors, purge.

:class:`PostgresConnection` is what the records store
(:class:`~telegram_idem.backends.postgres.PostgresStore`) and its inbox
(:class:`~telegram_idem.backends.postgres.PostgresInbox`) hold; neither touches the other.
The outbox (:class:`~telegram_idem.backends.postgres.PostgresOutbox`) and the flood
budget (:class:`~telegram_idem.backends.postgres.PostgresFloodBudget`) are more objects
over the same connection.
It owns:

- the asyncpg pool, created on first use (with ``auto_create``, the schema too), closed
  by :meth:`PostgresConnection.close`;
- the clock: :attr:`~PostgresConnection.server_clock` (every statement reads the
  server's) or the injected clock, sent as the last parameter (:meth:`now_args`);
- one round trip with its errors translated (:meth:`call` = :meth:`run` +
  :meth:`translate`), on the connection kept from the last call when it is free
  (:mod:`~telegram_idem.backends.postgres._lane`; no pool acquire per call): a
  connection that saw a driver error is discarded, never reused;
- purge bookkeeping: :meth:`wrote` counts writes and, every ``purge_every``, starts
  the purge its records part registered (:meth:`purge_with`) in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncpg

from telegram_idem._clock import Clock
from telegram_idem.backends import _driver as driver
from telegram_idem.backends.postgres._errors import POSTGRES_ERRORS, translate
from telegram_idem.backends.postgres._lane import Lane
from telegram_idem.backends.postgres._schema import (
    create_schema,
    flood_table_name,
    inbox_table_name,
    ledger_table_name,
    outbox_parked_table_name,
    outbox_table_name,
    table_name,
)
from telegram_idem.backends.postgres._sql import SERVER_NOW
from telegram_idem.errors import ConfigurationError, IdemError, StoreError

__all__ = ["PoolOptions", "PostgresConnection"]

log = logging.getLogger("telegram_idem.store.postgres")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PoolOptions:
    """How the connection opens and uses its pool (see ``PostgresStore`` for each).

    Attributes:
        min_size: connections the pool keeps open (≥ 0).
        max_size: most connections the pool opens (≥ 1, ≥ ``min_size``).
        auto_create: create the tables when the pool is made.
        command_timeout: seconds a statement may take (> 0).
        connect_timeout: seconds to open one connection (> 0).
        statement_cache_size: asyncpg's prepared statement cache per connection (≥ 0).
        purge_every: writes between background purges (≥ 0; 0 = never).
        purge_batch: most rows one background purge deletes (≥ 1).
        connect_kwargs: more keyword arguments for ``asyncpg.create_pool``.

    Raises:
        ConfigurationError: a value out of range.
    """

    min_size: int = 1
    max_size: int = 10
    auto_create: bool = False
    command_timeout: float = 10.0
    connect_timeout: float = 10.0
    statement_cache_size: int = 100
    purge_every: int = 1000
    purge_batch: int = 500
    connect_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (isinstance(self.min_size, int) and isinstance(self.max_size, int)):
            raise ConfigurationError("min_size and max_size must be integers")
        if self.min_size < 0 or self.max_size < 1 or self.min_size > self.max_size:
            raise ConfigurationError(
                "need 0 ≤ min_size ≤ max_size and max_size ≥ 1, "
                f"got {self.min_size}, {self.max_size}"
            )
        if not self.command_timeout > 0 or not self.connect_timeout > 0:
            raise ConfigurationError("command_timeout and connect_timeout must be > 0 seconds")
        if self.statement_cache_size < 0 or self.purge_every < 0 or self.purge_batch < 1:
            raise ConfigurationError(
                "need statement_cache_size ≥ 0, purge_every ≥ 0 and purge_batch ≥ 1"
            )

    @property
    def acquire_timeout(self) -> float:
        """Seconds to wait for a pool connection: opening one, then a statement's worth."""
        return self.connect_timeout + self.command_timeout


async def _keep_session(connection: Any) -> None:
    """Pool reset hook: the store never changes session state, so a release costs no query.

    (asyncpg still rolls back an open transaction before calling this.)
    """


class PostgresConnection:
    """One asyncpg pool and what every part of the store does with it.

    Args:
        dsn: an asyncpg DSN without store options (it may hold the password: it is
            never shown).
        label: how messages name the store (its ``repr``: host, database, table).
        table_prefix: the tables are ``<table_prefix>_records``, ``_inbox``, ``_outbox``,
            ``_outbox_parked``, ``_flood`` and ``_ledger``.
        options: pool and purge settings.
        clock: seconds since the epoch; ``None`` = the server's clock.

    Raises:
        ConfigurationError: a bad ``table_prefix``.
    """

    def __init__(
        self,
        dsn: str,
        *,
        label: str,
        table_prefix: str,
        options: PoolOptions,
        clock: Clock | None = None,
    ) -> None:
        self.dsn = dsn
        self.label = label
        self.table_prefix = table_prefix
        self.records_table = table_name(table_prefix)
        self.inbox_table = inbox_table_name(table_prefix)
        self.outbox_table = outbox_table_name(table_prefix)
        self.outbox_parked_table = outbox_parked_table_name(table_prefix)
        self.flood_table = flood_table_name(table_prefix)
        self.ledger_table = ledger_table_name(table_prefix)
        self.options = options
        self.connect_kwargs = dict(options.connect_kwargs)
        """Keyword arguments for ``asyncpg.create_pool`` beyond the options (read when
        the pool is made: change before the first call)."""
        self.clock = clock
        self._pool: Any = None
        self._pool_lock = asyncio.Lock()
        self._closed = False
        self._writes = 0
        self._purge: Callable[[int], Awaitable[int]] | None = None
        self._purge_task: asyncio.Task[None] | None = None
        self._lane = Lane(enabled=options.max_size >= 2, release_timeout=options.acquire_timeout)

    def __repr__(self) -> str:
        return f"PostgresConnection({self.label})"

    # ------------------------------------------------------------------ clock

    @property
    def server_clock(self) -> bool:
        """True when statements read the server's clock (no clock was injected)."""
        return self.clock is None

    def now_args(self) -> tuple[float, ...]:
        """The trailing "now" parameter of a statement: none with the server's clock,
        else the injected clock's reading."""
        return () if self.clock is None else (float(self.clock()),)

    async def now(self) -> float:
        """The clock leases are judged by, in seconds since the epoch (one round trip
        with the server's clock). Raises what :meth:`run` raises, untranslated."""
        if self.clock is not None:
            return float(self.clock())

        async def read(conn: Any) -> Any:
            return await conn.fetchval(f"SELECT {SERVER_NOW}::float8")

        return float(await self.run(read))

    # ------------------------------------------------------------------ round trips

    async def pool(self) -> Any:
        """The asyncpg pool, made on first use (creating the schema with ``auto_create``).

        Raises:
            StoreError: the connection is closed.
            asyncpg.PostgresError, OSError: the server refused or could not be reached
                (untranslated: :meth:`call` translates).
        """
        if self._closed:
            raise StoreError(f"{self.label} is closed")
        if self._pool is not None:
            return self._pool
        async with self._pool_lock:
            if self._closed:
                raise StoreError(f"{self.label} is closed")
            if self._pool is None:
                self._pool = await self._open()
            return self._pool

    async def _open(self) -> Any:
        options = self.options
        kwargs: dict[str, Any] = {
            "min_size": options.min_size,
            "max_size": options.max_size,
            "command_timeout": options.command_timeout,
            "timeout": options.connect_timeout,
            "statement_cache_size": options.statement_cache_size,
            "reset": _keep_session,
        }
        kwargs.update(self.connect_kwargs)
        pool = await asyncpg.create_pool(self.dsn, **kwargs)
        if options.auto_create:
            try:
                async with pool.acquire(timeout=options.acquire_timeout) as conn:
                    await create_schema(conn, table_prefix=self.table_prefix)
            except BaseException:
                pool.terminate()
                raise
        return pool

    async def run(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``fn(connection)`` on a pool connection: the one kept from the last call
        when it is free (:mod:`~telegram_idem.backends.postgres._lane`), else one taken
        from the pool. A connection that raised a driver error is terminated (the pool
        opens a new one), never handed to the next caller.

        Args:
            fn: the query(ies), given a pool connection.

        Raises:
            TypeError: an argument asyncpg cannot encode (its client-side DataError).
            StoreError: the connection is closed.
            Exception: what ``fn`` or the pool raised, untranslated.
        """
        try:
            pool = await self.pool()
            lane = self._lane
            conn = lane.take()
            kept = conn is not None
            if not kept:
                # asyncio.timeout, not acquire(timeout=): asyncpg's wait_for is a task per call
                async with asyncio.timeout(self.options.acquire_timeout):
                    conn = await pool.acquire()
                kept = lane.adopt(pool, conn)
            try:
                result = await fn(conn)
            except BaseException as exc:
                if isinstance(exc, POSTGRES_ERRORS.transient):
                    # The connection may be half-dead (server shut down, protocol state
                    # lost): never hand it to the next caller; the pool opens a new one.
                    # (A connection asyncpg already closed is back in the pool: skip it.)
                    with contextlib.suppress(Exception):
                        conn.terminate()
                if kept:
                    lane.drop(conn)
                await pool.release(conn, timeout=self.options.acquire_timeout)
                raise
            if not (kept and lane.keep(conn)):
                await pool.release(conn, timeout=self.options.acquire_timeout)
            return result
        except asyncpg.InterfaceError as exc:
            if isinstance(exc, ValueError):  # asyncpg's client-side DataError: a bad argument
                raise TypeError(f"{self.label}: {exc}") from exc
            raise

    def translate(self, op: str, exc: Exception) -> IdemError | None:
        """The library error for ``exc`` raised by ``op`` (a missing table and a value
        beyond PostgreSQL's limits get their own message), or ``None`` if not asyncpg's.

        Args:
            op: the operation's name, for error messages (``claim``, ``inbox.take``…).
            exc: what the operation raised.
        """
        return translate(f"{self.label}.{op}", exc, tables=self.tables)

    @property
    def tables(self) -> tuple[str, ...]:
        """Every table of the store, the records table first."""
        return (
            self.records_table,
            self.inbox_table,
            self.outbox_table,
            self.outbox_parked_table,
            self.flood_table,
            self.ledger_table,
        )

    def call(self, op: str, fn: Callable[[Any], Awaitable[T]]) -> Awaitable[T]:
        """:meth:`run` ``fn(connection)`` as operation ``op``, its errors translated.

        Args:
            op: the operation's name, for error messages (``claim``, ``inbox.take``…).
            fn: the query(ies), given a pool connection.

        Raises:
            StoreError: the server cannot answer, or the connection is closed.
            ConfigurationError: a missing table, wrong credentials, database or privileges.
        """
        return driver.call(op, lambda: self.run(fn), self.translate)

    # ------------------------------------------------------------------ purge

    def purge_with(self, purge: Callable[[int], Awaitable[int]]) -> None:
        """Register the background purge: ``purge(batch)`` deletes up to ``batch``
        expired rows and returns how many (run untranslated; failures are logged).

        Args:
            purge: the purge coroutine function, ``purge(batch) -> deleted``.
        """
        self._purge = purge

    @property
    def purge_task(self) -> asyncio.Task[None] | None:
        """The background purge running or last run, if any."""
        return self._purge_task

    def wrote(self) -> None:
        """Count one write; every ``purge_every`` writes, start a background purge."""
        self._writes += 1
        every = self.options.purge_every
        if every and self._writes % every == 0:
            self._start_background_purge()

    def _start_background_purge(self) -> None:
        pool = self._pool
        if pool is None or self._closed or self._purge is None:
            return
        if self._purge_task is not None and not self._purge_task.done():
            return
        # Only on a spare connection: the kept one free, an idle one, or room to open one.
        if (
            not self._lane.free
            and pool.get_idle_size() == 0
            and pool.get_size() >= pool.get_max_size()
        ):
            return
        self._purge_task = asyncio.get_running_loop().create_task(
            self._background_purge(self._purge),
            name=f"telegram-idem purge {self.records_table}",
        )

    async def _background_purge(self, purge: Callable[[int], Awaitable[int]]) -> None:
        try:
            deleted = await purge(self.options.purge_batch)
            log.debug("purged %d expired records from %s", deleted, self.records_table)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a purge failure must never surface in a claim
            log.warning("background purge of %s failed: %r", self.records_table, exc)

    # ------------------------------------------------------------------ closing

    async def close(self) -> None:
        """Stop the background purge and close the pool. Idempotent; later calls raise
        :class:`StoreError`."""
        self._closed = True
        task, self._purge_task = self._purge_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._lane.close()
        async with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), timeout=self.options.command_timeout)
            except Exception as exc:  # a connection still busy, or already gone
                log.debug("closing the pool of %s: %r; terminating it", self.label, exc)
                pool.terminate()
