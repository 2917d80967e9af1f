"""The flood budget of :class:`~telegram_idem.backends.postgres.PostgresStore`:
:class:`PostgresFloodBudget`, GCRA buckets in ``<table_prefix>_flood`` shared by every
process on the database.

**Reserve** is one statement once the buckets' rows exist: ``lk`` locks the rows
(``SELECT … ORDER BY key FOR UPDATE``: in key order, so two reservations cannot
deadlock; a row a concurrent reservation changed is read in its newest version), ``c``
reads the clock only after every lock is held (its aggregate over ``lk`` makes it wait
for them), ``calc`` applies :func:`telegram_idem.flood.decide`'s rule and ``up`` writes
the new ``tat`` of every bucket only when all of them allow the call. A bucket without a
row is inserted first (``tat = 0``, which the rule reads as "now": a full bucket) by an
``INSERT … ON CONFLICT DO NOTHING`` in key order, and the statement runs again: a
reservation never decides on a key it could not lock.

``pause`` is one upsert keeping the later ``tat``; ``paused_for`` one read. Keys whose
``tat`` is more than a minute in the past may be deleted (:meth:`PostgresFloodBudget.purge`;
a missing key is a full bucket, which is what its ``tat`` said).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from telegram_idem.backends.postgres._connection import PostgresConnection
from telegram_idem.backends.postgres._sql import render_statements
from telegram_idem.errors import ConfigurationError, StoreError
from telegram_idem.flood import Bucket, FloodBudget

__all__ = ["PostgresFloodBudget"]

_MAX_ROUNDS = 20
_FORGET_AFTER = 60.0
"""Seconds a ``tat`` may lie in the past before its key may be forgotten."""

_RESERVE = """WITH b AS MATERIALIZED (
  SELECT u.key, u.iv, u.burst
  FROM unnest($1::text[], $2::float8[], $3::float8[]) AS u(key, iv, burst)
),
lk AS MATERIALIZED (
  SELECT f.key, f.tat FROM {flood} AS f WHERE f.key = ANY($1::text[]) ORDER BY f.key
  FOR UPDATE
),
c AS MATERIALIZED (SELECT {now}::float8 + 0 * count(*) AS now, count(*) AS found FROM lk),
calc AS MATERIALIZED (
  SELECT b.key, greatest(coalesce(lk.tat, c.now), c.now) + b.iv AS nt, b.iv, b.burst, c.now
  FROM b LEFT JOIN lk ON lk.key = b.key, c
),
d AS MATERIALIZED (
  SELECT coalesce(max(calc.nt - calc.burst * calc.iv - calc.now), 0)::float8 AS wait,
         (SELECT found FROM c) AS found
  FROM calc
),
up AS (
  UPDATE {flood} AS f SET tat = calc.nt FROM calc, d
  WHERE f.key = calc.key AND d.wait <= 0 AND d.found = $4::bigint
  RETURNING 1
)
SELECT d.wait, d.found FROM d"""

_INSERT = """INSERT INTO {flood} (key, tat)
SELECT k.key, 0 FROM (SELECT DISTINCT key FROM unnest($1::text[]) AS u(key) ORDER BY key) AS k
ON CONFLICT (key) DO NOTHING"""

_NOW = "WITH c AS MATERIALIZED (SELECT {now}::float8 AS now)\n"
_PAUSE = (
    _NOW
    + """INSERT INTO {flood} AS f (key, tat) SELECT $1::text, c.now + $2::float8 FROM c
ON CONFLICT (key) DO UPDATE SET tat = greatest(f.tat, excluded.tat)"""
)
_PAUSED_FOR = (
    _NOW
    + """SELECT greatest(coalesce((SELECT tat FROM {flood} WHERE key = $1::text), 0) - c.now,
                0)::float8 FROM c"""
)
_PURGE = (
    _NOW
    + """DELETE FROM {flood} WHERE key = ANY(ARRAY(
  SELECT key FROM {flood} WHERE tat < (SELECT now FROM c) - $2::float8
  LIMIT $1::integer FOR UPDATE SKIP LOCKED
))"""
)

_STATEMENTS: dict[str, tuple[str, int]] = {
    "reserve": (_RESERVE, 5),
    "insert": (_INSERT, 0),
    "pause": (_PAUSE, 3),
    "paused_for": (_PAUSED_FOR, 2),
    "purge": (_PURGE, 3),
}


class PostgresFloodBudget(FloodBudget):
    """GCRA budgets in ``<table_prefix>_flood`` on the store's connection (its pool,
    clock and error translation), shared by every process using the database.

    Args:
        connection: the store's connection (``PostgresStore.connection``).

    Every method raises :class:`~telegram_idem.errors.StoreError` when the server cannot
    answer and :class:`~telegram_idem.errors.ConfigurationError` when the table is missing
    (``telegram-idem migrate URL`` creates it).
    """

    def __init__(self, connection: PostgresConnection) -> None:
        self.connection = connection
        self.table = connection.flood_table
        self._sql = render_statements(
            _STATEMENTS, server_clock=connection.server_clock, fields={"flood": self.table}
        )

    def __repr__(self) -> str:
        return f"PostgresFloodBudget({self.connection.label}, table={self.table!r})"

    async def reserve(self, buckets: Sequence[Bucket]) -> float:
        if not buckets:
            return 0.0
        keys = [b.key for b in buckets]
        args = (
            keys,
            [float(b.interval) for b in buckets],
            [float(b.burst) for b in buckets],
            len(set(keys)),
        )
        reserve, insert = self._sql["reserve"], self._sql["insert"]

        async def run(conn: Any) -> float:
            for _ in range(_MAX_ROUNDS):
                row = await conn.fetchrow(reserve, *args, *self.connection.now_args())
                if row["found"] == args[3]:
                    wait = float(row["wait"])
                    return wait if wait > 0 else 0.0
                await conn.execute(insert, keys)
            raise StoreError(f"{self!r}: buckets {keys} kept vanishing ({_MAX_ROUNDS} rounds)")

        return await self.connection.call("flood.reserve", run)

    async def pause(self, key: str, seconds: float) -> None:
        sql, params = self._sql["pause"], (key, float(seconds), *self.connection.now_args())

        async def run(conn: Any) -> None:
            await conn.execute(sql, *params)

        await self.connection.call("flood.pause", run)

    async def paused_for(self, key: str) -> float:
        sql, params = self._sql["paused_for"], (key, *self.connection.now_args())

        async def run(conn: Any) -> float:
            return float(await conn.fetchval(sql, *params))

        return await self.connection.call("flood.paused_for", run)

    async def purge(self, batch: int = 500) -> int:
        """Delete up to ``batch`` keys whose ``tat`` is more than a minute in the past;
        returns how many.

        Args:
            batch: the most keys deleted (≥ 1).

        Raises:
            ConfigurationError: ``batch`` < 1, or the table is missing.
            StoreError: the database could not answer.
        """
        if batch < 1:
            raise ConfigurationError(f"batch must be ≥ 1, got {batch}")
        sql = self._sql["purge"]
        params = (int(batch), _FORGET_AFTER, *self.connection.now_args())

        async def run(conn: Any) -> int:
            status: str = await conn.execute(sql, *params)
            return int(status.rsplit(" ", 1)[-1])

        return await self.connection.call("flood.purge", run)
