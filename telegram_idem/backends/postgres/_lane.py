"""The pool connection the PostgreSQL store keeps between its calls (its "lane").

Taking a connection from an asyncpg pool and giving it back is a large share of a short
call: ``Pool.release`` runs under ``asyncio.shield`` (a task per call), an acquire with
a timeout under ``asyncio.wait_for`` (another task), and each task costs event-loop
turns. ``benchmarks/pg_profile.py`` times ``claim()`` with and without it. So
:class:`~telegram_idem.backends.postgres._connection.PostgresConnection` keeps the
connection of its last call and runs the next call on it when it is free; a call that
finds it busy takes another from the pool as before. The kept connection is handed back
to the pool after :data:`LANE_IDLE` seconds without a call, when a call on it fails
(after terminating it on a driver error), when a call leaves a transaction open, and on
close. The pool's ``max_size`` still bounds the connections: the lane is one of them,
and it is used only when ``max_size`` ≥ 2, so that code taking connections from the
pool directly (tools, tests) always finds one without waiting for the lane to go idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Final

__all__ = ["LANE_IDLE", "Lane"]

log = logging.getLogger("telegram_idem.store.postgres")

LANE_IDLE: Final = 0.25
"""Seconds without a call after which the kept connection goes back to the pool."""


class Lane:
    """At most one pool connection kept for the next call.

    Args:
        enabled: keep a connection at all (the pool's ``max_size`` ≥ 2).
        release_timeout: seconds a hand-back may take (asyncpg's release budget).
    """

    def __init__(self, *, enabled: bool, release_timeout: float) -> None:
        self.enabled = enabled
        self.release_timeout = release_timeout
        self._pool: Any = None
        self._conn: Any = None
        self._busy = False
        self._used = False
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None
        self._returns: set[asyncio.Task[None]] = set()

    @property
    def free(self) -> bool:
        """A connection is kept and no call is running on it."""
        return self._conn is not None and not self._busy

    def take(self) -> Any:
        """The kept connection, now marked busy, or ``None`` (none kept, or busy)."""
        conn = self._conn
        if conn is None or self._busy:
            return None
        self._busy = self._used = True
        return conn

    def adopt(self, pool: Any, conn: Any) -> bool:
        """Keep ``conn`` (just taken from ``pool``, now busy) if no connection is kept;
        ``True`` if it became the lane."""
        if not self.enabled or self._closed or self._conn is not None:
            return False
        self._pool, self._conn = pool, conn
        self._busy = self._used = True
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(LANE_IDLE, self._tick)
        return True

    def keep(self, conn: Any) -> bool:
        """After a call on the lane ``conn`` succeeded: ``True`` if it stays kept (and is
        free again); ``False`` if the caller must give it back to the pool (the lane was
        closed meanwhile, or the call left a transaction open)."""
        self._busy = False
        if self._conn is conn and not conn.is_in_transaction():
            return True
        self.drop(conn)
        return False

    def drop(self, conn: Any) -> None:
        """Stop keeping ``conn`` (the caller gives it back to the pool)."""
        if self._conn is conn:
            self._conn = None
            self._busy = False

    def _tick(self) -> None:
        self._timer = None
        conn = self._conn
        if conn is None or self._closed:
            return
        if self._busy or self._used:
            self._used = False
            self._timer = asyncio.get_running_loop().call_later(LANE_IDLE, self._tick)
            return
        self._conn = None
        task = asyncio.get_running_loop().create_task(self._give_back(self._pool, conn))
        self._returns.add(task)
        task.add_done_callback(self._returns.discard)

    async def _give_back(self, pool: Any, conn: Any) -> None:
        try:
            await pool.release(conn, timeout=self.release_timeout)
        except Exception as exc:  # the pool terminates a connection it cannot reset
            log.debug("handing the kept connection back to the pool: %r", exc)

    async def close(self) -> None:
        """Give the kept connection back (a call running on it gives it back when it
        ends) and wait for hand-backs under way. Idempotent."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conn, busy = self._conn, self._busy
        self._conn = None
        if conn is not None and not busy:
            await self._give_back(self._pool, conn)
        if self._returns:
            with contextlib.suppress(Exception):
                await asyncio.gather(*self._returns, return_exceptions=True)
