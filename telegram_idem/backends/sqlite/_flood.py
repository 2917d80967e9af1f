"""The flood budget of :class:`~telegram_idem.backends.sqlite.SQLiteStore`: one ``tat``
per bucket key in ``idem_flood``, in the store's file.

A reservation reads its buckets, decides by :func:`telegram_idem.flood.decide` and
writes, all in one ``BEGIN IMMEDIATE`` transaction: every process sharing the file spends
one budget, and no two of them spend the same call.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from telegram_idem.backends.sqlite._connection import SQLiteConnection
from telegram_idem.flood import Bucket, FloodBudget, decide

__all__ = ["SQLiteFloodBudget"]

FORGET_AFTER = 60.0
"""Seconds past its ``tat`` after which a key may be deleted (it is a full bucket)."""


class SQLiteFloodBudget(FloodBudget):
    """GCRA budgets in the store's SQLite file (the rules of
    :class:`~telegram_idem.flood.FloodBudget`).

    Keys whose ``tat`` is more than a minute old are deleted, a batch of the store's
    ``purge_batch`` rows inside every ``forget_every``-th reservation.

    Args:
        connection: the store's connection (its thread, transactions and clock).
        forget_every: forget stale keys inside every ``forget_every``-th reservation.
    """

    def __init__(self, connection: SQLiteConnection, *, forget_every: int = 1000) -> None:
        self._db = connection
        self._forget_every = forget_every
        self._reservations = 0

    def __repr__(self) -> str:
        return f"{self._db.name}.flood_budget()"

    def _reserve_in(self, conn: sqlite3.Connection, now: float, buckets: Sequence[Bucket]) -> float:
        keys = sorted({b.key for b in buckets})
        marks = ", ".join("?" * len(keys))
        stored: dict[str, float] = dict(
            conn.execute(f"SELECT key, tat FROM idem_flood WHERE key IN ({marks})", keys)
        )
        wait, tats = decide([stored.get(b.key) for b in buckets], buckets, now)
        if wait == 0.0:
            conn.executemany(
                "INSERT INTO idem_flood (key, tat) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET tat = excluded.tat",
                [(b.key, tat) for b, tat in zip(buckets, tats, strict=True)],
            )
        self._reservations += 1
        if self._reservations % self._forget_every == 0:
            conn.execute(
                "DELETE FROM idem_flood WHERE key IN "
                "(SELECT key FROM idem_flood WHERE tat < ? LIMIT ?)",
                (now - FORGET_AFTER, self._db.purge_batch),
            )
        return wait

    async def reserve(self, buckets: Sequence[Bucket]) -> float:
        if not buckets:
            return 0.0
        db = self._db
        return await db.call(
            "reserve", lambda: db.transaction(lambda c, now: self._reserve_in(c, now, buckets))
        )

    async def pause(self, key: str, seconds: float) -> None:
        def body(conn: sqlite3.Connection, now: float) -> None:
            conn.execute(
                "INSERT INTO idem_flood (key, tat) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET tat = MAX(tat, excluded.tat)",
                (key, now + seconds),
            )

        db = self._db
        await db.call("pause", lambda: db.transaction(body))

    async def paused_for(self, key: str) -> float:
        db = self._db

        def read(conn: sqlite3.Connection) -> float:
            row: tuple[float] | None = conn.execute(
                "SELECT tat FROM idem_flood WHERE key = ?", (key,)
            ).fetchone()
            return 0.0 if row is None else max(0.0, row[0] - db.clock())

        return await db.call("paused_for", lambda: db.run(read))
