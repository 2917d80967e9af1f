"""The PostgreSQL store's schema, defined once with SQLAlchemy Core, and its migration.

One table per table prefix, ``<table_prefix>_records`` (default ``idem_records``)::

    key               text              PRIMARY KEY
    status            text              NOT NULL  CHECK in (in_progress, completed, failed)
    fencing_token     bigint            NOT NULL
    lease_expires_at  double precision  NOT NULL  -- seconds since the epoch
    expires_at        double precision  NOT NULL  -- seconds since the epoch (retention)
    fingerprint       text              NULL
    result            bytea             NULL
    attempts          integer           NOT NULL
    INDEX <table_prefix>_records_expires_at_idx (expires_at)   -- purge scans it

Locks (``…:lock:…`` keys) and callback tokens are records too, under other key
prefixes, with the same state machine and the same expiry: they need no table of their
own. A separate table would only pay off if one kind needed another index or another
retention policy, and none does.

The DDL is compiled for the ``postgresql`` dialect (no engine, no psycopg) and run
through asyncpg. :func:`migrate` is idempotent (``CREATE … IF NOT EXISTS``) and safe to
run from several processes at once: it runs in one transaction holding an advisory lock
derived from the table prefix.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Double,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex, CreateTable, DropTable

from telegram_idem.errors import ConfigurationError

__all__ = [
    "COLUMNS",
    "DEFAULT_TABLE_PREFIX",
    "create_ddl",
    "create_schema",
    "drop_ddl",
    "migrate",
    "records_table",
    "table_name",
    "validate_table_prefix",
]

DEFAULT_TABLE_PREFIX = "idem"

_PREFIX_RE = re.compile(r"[a-z_][a-z0-9_]{0,39}")
_DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]


def validate_table_prefix(prefix: str) -> str:
    """Return ``prefix`` if it can start an unquoted PostgreSQL identifier.

    Allowed: 1–40 characters of ``a-z 0-9 _``, not starting with a digit (so
    ``<prefix>_records_expires_at_idx`` stays within PostgreSQL's 63-byte names).

    Raises:
        ConfigurationError: any other prefix.
    """
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise ConfigurationError(
            f"table_prefix must be 1-40 characters of a-z, 0-9, _ not starting with a digit, "
            f"got {prefix!r}"
        )
    return prefix


def table_name(table_prefix: str = DEFAULT_TABLE_PREFIX) -> str:
    """``<table_prefix>_records``. Raises :class:`ConfigurationError` for a bad prefix."""
    return f"{validate_table_prefix(table_prefix)}_records"


def records_table(
    metadata: MetaData | None = None, *, table_prefix: str = DEFAULT_TABLE_PREFIX
) -> Table:
    """The records table for ``table_prefix``, attached to ``metadata`` (a new one if None).

    Raises:
        ConfigurationError: a bad ``table_prefix``.
    """
    name = table_name(table_prefix)
    return Table(
        name,
        metadata if metadata is not None else MetaData(),
        Column("key", Text, primary_key=True),
        Column("status", Text, nullable=False),
        Column("fencing_token", BigInteger, nullable=False),
        Column("lease_expires_at", Double, nullable=False),
        Column("expires_at", Double, nullable=False),
        Column("fingerprint", Text, nullable=True),
        Column("result", LargeBinary, nullable=True),
        Column("attempts", Integer, nullable=False),
        CheckConstraint(
            "status IN ('in_progress', 'completed', 'failed')", name=f"{name}_status_check"
        ),
        Index(f"{name}_expires_at_idx", "expires_at"),
    )


COLUMNS: tuple[str, ...] = tuple(c.name for c in records_table().columns)
"""The records table's columns in order; the store's SQL selects exactly these."""


def create_ddl(table_prefix: str = DEFAULT_TABLE_PREFIX) -> list[str]:
    """``CREATE TABLE/INDEX IF NOT EXISTS`` statements, compiled for PostgreSQL.

    Raises:
        ConfigurationError: a bad ``table_prefix``.
    """
    table = records_table(table_prefix=table_prefix)
    out = [str(CreateTable(table, if_not_exists=True).compile(dialect=_DIALECT)).strip()]
    out += [
        str(CreateIndex(index, if_not_exists=True).compile(dialect=_DIALECT)).strip()
        for index in sorted(table.indexes, key=lambda i: str(i.name))
    ]
    return out


def drop_ddl(table_prefix: str = DEFAULT_TABLE_PREFIX) -> list[str]:
    """``DROP TABLE IF EXISTS`` for the prefix's table (its index goes with it).

    Raises:
        ConfigurationError: a bad ``table_prefix``.
    """
    table = records_table(table_prefix=table_prefix)
    return [str(DropTable(table, if_exists=True).compile(dialect=_DIALECT)).strip()]


async def create_schema(connection: Any, *, table_prefix: str = DEFAULT_TABLE_PREFIX) -> None:
    """Create the schema on an open asyncpg connection (or pool connection), idempotently.

    Runs in one transaction holding ``pg_advisory_xact_lock`` on the prefix, so
    concurrent migrations (several workers starting with ``auto_create=1``) do not race
    on the catalog.

    Raises:
        ConfigurationError: a bad ``table_prefix``.
        asyncpg.PostgresError: the server refused (e.g. no CREATE privilege).
    """
    statements = create_ddl(table_prefix)
    async with connection.transaction():
        await connection.execute(
            "SELECT pg_advisory_xact_lock(hashtext($1))", f"telegram_idem:{table_prefix}"
        )
        for statement in statements:
            await connection.execute(statement)


async def migrate(
    dsn: str,
    *,
    table_prefix: str = DEFAULT_TABLE_PREFIX,
    connect_kwargs: dict[str, Any] | None = None,
) -> None:
    """Create the store's table and index if absent. Idempotent; safe to run concurrently.

    Args:
        dsn: an asyncpg/libpq DSN, ``postgresql://user:password@host:5432/db``. A
            *store* URL carries store options (``table_prefix=…``) that asyncpg does
            not understand: for those use ``PostgresStore.from_url(url).migrate()`` or
            ``telegram-idem migrate URL``.
        table_prefix: the table is ``<table_prefix>_records``.
        connect_kwargs: extra keyword arguments for ``asyncpg.connect`` (``ssl=…``).

    Raises:
        ConfigurationError: a bad ``table_prefix``, or store options in ``dsn``.
        OSError, asyncpg.PostgresError: the server could not be reached or refused.
    """
    from telegram_idem.backends.postgres import STORE_OPTIONS
    from telegram_idem.backends.url import url_options

    validate_table_prefix(table_prefix)
    if STORE_OPTIONS & url_options(dsn).keys():
        raise ConfigurationError(
            "migrate() takes a plain DSN; for a store URL with options use "
            "`telegram-idem migrate URL` or PostgresStore.from_url(url).migrate()"
        )
    import asyncpg  # type: ignore[import-untyped]

    connection = await asyncpg.connect(dsn, **(connect_kwargs or {}))
    try:
        await create_schema(connection, table_prefix=table_prefix)
    finally:
        await connection.close()
