"""The effect ledger of :class:`~telegram_idem.backends.postgres.PostgresStore`:
:class:`PostgresLedger`, one row per at-most-once effect in ``<table_prefix>_ledger``,
shared by every process on the database.

Every method is one statement (one round trip once prepared), applying the rules of
:mod:`telegram_idem.ledger` natively (the in-process stores run the same rules as
:mod:`telegram_idem._ledger_logic`; the conformance suite checks both):

- **start**: ``INSERT … ON CONFLICT (key) DO NOTHING RETURNING`` in a CTE, and the
  existing row read in the same statement when nothing was written. Two starts of one key
  serialise on the primary key: at most one writes. In a race the loser's snapshot may
  not see the winner's row (committed after the statement began): the answer is then
  empty and the statement runs again (a new statement, a new snapshot), so a start never
  answers "written" without writing nor "no row" when a row stopped it;
- **mark_unknown**: ``UPDATE … WHERE state <> 'settled' AND token <= $token RETURNING``,
  and the row as it stands when nothing changed;
- **settle**: ``UPDATE … WHERE state <> 'settled' RETURNING 1`` (the first resolution
  stands);
- **finish**: ``DELETE … WHERE key = $1 AND token = $2 RETURNING 1`` (fenced);
- **get** and **entries**: one ``SELECT`` each; the listing is ``ORDER BY started_at, key
  LIMIT n`` over the ``(started_at, key)`` index, the prefix matched with
  ``starts_with`` (``%`` and ``_`` are characters, not patterns).

A row read back after a write that changed nothing is read ``FOR SHARE``: under READ
COMMITTED that waits for a concurrent writer of the row and answers its newest version
(a row a concurrent ``finish`` deleted is skipped), never a stale one.

Time: "now" is fixed once per statement in the ``c`` CTE, the server's clock or the
store's injected clock sent as the last parameter (as every other statement of the store,
see :mod:`telegram_idem.backends.postgres._sql`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from telegram_idem._keys import bounded_key
from telegram_idem.backends.postgres._connection import PostgresConnection
from telegram_idem.backends.postgres._schema import LEDGER_COLUMNS
from telegram_idem.backends.postgres._sql import NOW_CTE, render_statements
from telegram_idem.errors import StoreError
from telegram_idem.ledger import (
    Ledger,
    LedgerEntry,
    LedgerState,
    check_limit,
    check_settle,
    storable_text,
)

__all__ = ["PostgresLedger"]

_MAX_ROUNDS = 20
_COLS = ", ".join(LEDGER_COLUMNS)
_L_COLS = ", ".join(f"l.{c}" for c in LEDGER_COLUMNS)
_STARTED, _UNKNOWN, _SETTLED = (s.value for s in LedgerState)

_START = (
    NOW_CTE
    + f""",
ins AS (
  INSERT INTO {{ledger}} AS l ({_COLS})
  SELECT $1::text, '{_STARTED}', $2::bigint, c.now, $3::text, 1, c.now, '', NULL, false FROM c
  ON CONFLICT (key) DO NOTHING
  RETURNING {_L_COLS}
),
old AS (SELECT {_L_COLS} FROM {{ledger}} AS l WHERE l.key = $1::text FOR SHARE)
SELECT true AS written, ins.* FROM ins
UNION ALL
SELECT false, old.* FROM old WHERE NOT EXISTS (SELECT 1 FROM ins)"""
)

_MARK_UNKNOWN = (
    NOW_CTE
    + f""",
up AS (
  UPDATE {{ledger}} AS l
  SET state = '{_UNKNOWN}', token = $2::bigint, detail = $3::text,
      attempts = l.attempts + 1, updated_at = c.now
  FROM c
  WHERE l.key = $1::text AND l.state <> '{_SETTLED}' AND l.token <= $2::bigint
  RETURNING {_L_COLS}
),
old AS (
  SELECT {_L_COLS} FROM {{ledger}} AS l
  WHERE l.key = $1::text AND NOT EXISTS (SELECT 1 FROM up) FOR SHARE
)
SELECT * FROM up
UNION ALL
SELECT * FROM old"""
)

_SETTLE = (
    NOW_CTE
    + f"""
UPDATE {{ledger}} AS l
SET state = '{_SETTLED}', token = $2::bigint, result = $3::bytea, not_applied = $4::boolean,
    updated_at = c.now
FROM c
WHERE l.key = $1::text AND l.state <> '{_SETTLED}'
RETURNING 1"""
)

_FINISH = "DELETE FROM {ledger} WHERE key = $1::text AND token = $2::bigint RETURNING 1"
_GET = f"SELECT {_COLS} FROM {{ledger}} WHERE key = $1::text"
_ENTRIES = f"""SELECT {_COLS} FROM {{ledger}}
WHERE state = ANY($1::text[]) AND starts_with(key, $2::text)
ORDER BY started_at, key
LIMIT $3::integer"""

# (template, index of the "now" parameter when the store has a clock; 0 = reads no clock)
_STATEMENTS: dict[str, tuple[str, int]] = {
    "start": (_START, 4),
    "mark_unknown": (_MARK_UNKNOWN, 4),
    "settle": (_SETTLE, 5),
    "finish": (_FINISH, 0),
    "get": (_GET, 0),
    "entries": (_ENTRIES, 0),
}


def _entry(row: Any) -> LedgerEntry:
    return LedgerEntry(
        key=row["key"],
        state=LedgerState(row["state"]),
        token=int(row["token"]),
        started_at=float(row["started_at"]),
        holder=row["holder"],
        attempts=int(row["attempts"]),
        updated_at=float(row["updated_at"]),
        detail=row["detail"],
        result=None if row["result"] is None else bytes(row["result"]),
        not_applied=bool(row["not_applied"]),
    )


class PostgresLedger(Ledger):
    """:class:`~telegram_idem.ledger.Ledger` in ``<table_prefix>_ledger``, on the store's
    connection (its pool, clock and error translation).

    Args:
        connection: the store's connection (``PostgresStore.connection``).

    Every method is one statement (see the module docstring) and raises
    :class:`~telegram_idem.errors.StoreError` when the server cannot answer and
    :class:`~telegram_idem.errors.ConfigurationError` when the table is missing (``telegram-idem
    migrate URL`` creates it with the store's other tables).
    """

    def __init__(self, connection: PostgresConnection) -> None:
        self.connection = connection
        self.table = connection.ledger_table
        self._sql = render_statements(
            _STATEMENTS, server_clock=connection.server_clock, fields={"ledger": self.table}
        )

    def __repr__(self) -> str:
        return f"PostgresLedger({self.connection.label}, table={self.table!r})"

    async def _fetch(self, name: str, *args: Any) -> list[Any]:
        """One statement as operation ``ledger.<name>``; its rows."""
        sql = self._sql[name]
        uses_clock = _STATEMENTS[name][1] > 0
        params = (*args, *self.connection.now_args()) if uses_clock else args

        async def run(conn: Any) -> list[Any]:
            rows: list[Any] = await conn.fetch(sql, *params)
            return rows

        return await self.connection.call(f"ledger.{name}", run)

    async def start(self, key: str, *, token: int, holder: str) -> LedgerEntry | None:
        key, holder = bounded_key(key), storable_text(holder)
        for _ in range(_MAX_ROUNDS):
            rows = await self._fetch("start", key, int(token), holder)
            if rows:
                row = rows[0]
                return None if row["written"] else _entry(row)
            # Raced: a row committed after this statement's snapshot stopped the insert.
        raise StoreError(f"{self!r}: start of {key!r} still racing after {_MAX_ROUNDS} rounds")

    async def mark_unknown(self, key: str, *, token: int, detail: str) -> LedgerEntry | None:
        rows = await self._fetch(
            "mark_unknown", bounded_key(key), int(token), storable_text(detail)
        )
        return _entry(rows[0]) if rows else None

    async def settle(
        self, key: str, *, token: int, result: bytes | None, not_applied: bool
    ) -> bool:
        check_settle(result, not_applied)
        payload = None if result is None else bytes(result)
        rows = await self._fetch("settle", bounded_key(key), int(token), payload, not_applied)
        return bool(rows)

    async def finish(self, key: str, *, token: int) -> bool:
        return bool(await self._fetch("finish", bounded_key(key), int(token)))

    async def get(self, key: str) -> LedgerEntry | None:
        rows = await self._fetch("get", bounded_key(key))
        return _entry(rows[0]) if rows else None

    async def entries(
        self,
        *,
        states: Sequence[LedgerState] = (LedgerState.STARTED, LedgerState.UNKNOWN),
        prefix: str = "",
        limit: int = 100,
    ) -> list[LedgerEntry]:
        check_limit(limit)
        wanted = [LedgerState(s).value for s in states]
        if not wanted or storable_text(prefix) != prefix:
            return []  # a stored (bounded) key holds no NUL and no lone surrogate
        rows = await self._fetch("entries", wanted, prefix, int(limit))
        return [_entry(r) for r in rows]
