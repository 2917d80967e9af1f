"""The PostgreSQL store's browsing and health check (the
:class:`~telegram_idem.backends.Browsable` and :class:`~telegram_idem.backends.Checkable`
abilities), each one statement on the store's
:class:`~telegram_idem.backends.postgres.PostgresConnection`.

A prefix is matched with ``key LIKE $1 ESCAPE '\\'``, the prefix's ``\\``, ``%`` and
``_`` escaped (:func:`~telegram_idem.backends._browse.like_prefix`): it is never a
pattern. Listing is in the database's collation order (``ORDER BY key``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import MetaData

from telegram_idem._records import Record
from telegram_idem.backends._browse import check_limit, like_prefix, stored_prefix
from telegram_idem.backends._health import StoreHealth
from telegram_idem.backends.postgres._connection import PostgresConnection
from telegram_idem.backends.postgres._schema import (
    COLUMNS,
    flood_table,
    inbox_table,
    ledger_table,
    outbox_parked_table,
    outbox_table,
    records_table,
)
from telegram_idem.backends.postgres._sql import SERVER_NOW, record_of

__all__ = ["PostgresBrowsing", "expected_columns"]

_COLUMNS = ", ".join(COLUMNS)
_FOUND = """
SELECT t.name, a.attname
FROM unnest($1::text[]) AS t(name)
JOIN pg_attribute a ON a.attrelid = to_regclass(t.name)
WHERE a.attnum > 0 AND NOT a.attisdropped
"""
"""The columns of each of the named tables that exist (found on the search path)."""


def expected_columns(table_prefix: str) -> dict[str, tuple[str, ...]]:
    """Every table of ``table_prefix`` and its columns, from the schema's SQLAlchemy
    definitions (:mod:`telegram_idem.backends.postgres._schema`), in migration order."""
    metadata = MetaData()
    tables = [
        make(metadata, table_prefix=table_prefix)
        for make in (
            records_table,
            inbox_table,
            outbox_table,
            outbox_parked_table,
            flood_table,
            ledger_table,
        )
    ]
    return {t.name: tuple(c.name for c in t.columns) for t in tables}


class PostgresBrowsing:
    """Mixed into :class:`~telegram_idem.backends.postgres.PostgresStore`."""

    connection: PostgresConnection
    table: str
    table_prefix: str

    def _now_sql(self, position: int) -> tuple[str, tuple[float, ...]]:
        """The SQL of "now" (the server's clock, or parameter ``$position``) and its
        parameters."""
        args = self.connection.now_args()
        return (SERVER_NOW, ()) if not args else (f"${position}", args)

    async def records(self, *, prefix: str, limit: int = 100) -> list[Record]:
        """The live records whose key starts with ``prefix``, the first ``limit`` in
        ``ORDER BY key`` order (:class:`~telegram_idem.backends.Browsable`).

        Raises:
            ConfigurationError: ``limit`` < 1, or the table is missing.
            StoreError: the database could not answer.
        """
        check_limit(limit)
        now, now_args = self._now_sql(3)
        sql = (
            f"SELECT {_COLUMNS} FROM {self.table} WHERE key LIKE $1 ESCAPE '\\' "
            f"AND expires_at > {now} ORDER BY key LIMIT $2"
        )
        pattern = like_prefix(stored_prefix(prefix))

        async def run(conn: Any) -> list[Record]:
            return [record_of(row) for row in await conn.fetch(sql, pattern, limit, *now_args)]

        return await self.connection.call("records", run)

    async def count_records(self, *, prefix: str, expired: bool = False) -> int:
        """How many records are stored under ``prefix`` (with ``expired``: only those
        past retention).

        Raises:
            ConfigurationError: the table is missing.
            StoreError: the database could not answer.
        """
        now, now_args = self._now_sql(2)
        sql = f"SELECT count(*) FROM {self.table} WHERE key LIKE $1 ESCAPE '\\'"
        if expired:
            sql += f" AND expires_at <= {now}"
        else:
            now_args = ()
        pattern = like_prefix(stored_prefix(prefix))

        async def run(conn: Any) -> int:
            return int(await conn.fetchval(sql, pattern, *now_args))

        return await self.connection.call("count_records", run)

    async def delete_records(self, *, prefix: str, limit: int = 1000) -> int:
        """Delete up to ``limit`` records stored under ``prefix`` (the first in key
        order; rows a concurrent claim holds locked are skipped, ``SKIP LOCKED``);
        returns how many.

        Raises:
            ConfigurationError: ``limit`` < 1, or the table is missing.
            StoreError: the database could not answer.
        """
        check_limit(limit)
        sql = (
            f"DELETE FROM {self.table} WHERE key = ANY(ARRAY(SELECT key FROM {self.table} "
            "WHERE key LIKE $1 ESCAPE '\\' ORDER BY key LIMIT $2 FOR UPDATE SKIP LOCKED))"
        )
        pattern = like_prefix(stored_prefix(prefix))

        async def run(conn: Any) -> int:
            status: str = await conn.execute(sql, pattern, limit)
            return int(status.rsplit(" ", 1)[-1])

        return await self.connection.call("delete_records", run)

    async def health(self) -> StoreHealth:
        """The server's version, and the store's tables (found on the search path) and
        their columns against the schema's definitions; creates nothing.

        Raises:
            ConfigurationError: wrong credentials, database or privileges.
            StoreError: the database could not answer.
        """
        expected = expected_columns(self.table_prefix)

        async def run(conn: Any) -> tuple[str, list[Any]]:
            version = await conn.fetchval("SELECT current_setting('server_version')")
            rows = await conn.fetch(_FOUND, list(expected))
            return str(version), list(rows)

        version, rows = await self.connection.call("health", run)
        found: dict[str, set[str]] = {}
        for row in rows:
            found.setdefault(row["name"], set()).add(row["attname"])
        problems = [
            f"table {name} lacks columns {', '.join(lacking)}"
            for name, wanted in expected.items()
            if name in found and (lacking := [c for c in wanted if c not in found[name]])
        ]
        return StoreHealth(
            server=f"PostgreSQL {version}",
            compared="tables and their columns (the schema keeps no version number)",
            expected=tuple(expected),
            found=tuple(name for name in expected if name in found),
            problems=tuple(problems),
        )
