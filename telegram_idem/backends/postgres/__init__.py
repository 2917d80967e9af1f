"""PostgreSQL store (``postgresql://…``, ``postgres://…``), on asyncpg.

Every primitive is one SQL statement, so one network round trip once the connection has
the statement prepared (asyncpg prepares each statement once per connection and caches
it):

- claim: ``INSERT … ON CONFLICT (key) DO UPDATE … WHERE <acquirable> RETURNING`` inside a
  CTE that also returns the existing row when nothing was written; the outcome
  (acquired / replay / conflict / in progress / failed) is decided from that one answer;
- ``claim_many``: the same statement over ``unnest($1::text[])``, one statement per batch;
- complete / fail / release / extend: ``UPDATE … WHERE key = $1 AND fencing_token = $2
  AND status = 'in_progress' AND expires_at > now RETURNING 1``;
- get: one ``SELECT``; purge: ``DELETE … WHERE key = ANY(ARRAY(SELECT … LIMIT n FOR
  UPDATE SKIP LOCKED))``.

The durable inbox (:meth:`PostgresStore.inbox`, a :class:`PostgresInbox`) lives in
``<table_prefix>_inbox`` beside the records; the outbox (:meth:`PostgresStore.outbox`, a
:class:`PostgresOutbox`, whose ``enqueue_in`` joins the bot's own asyncpg or SQLAlchemy
transaction) in ``<table_prefix>_outbox`` and ``<table_prefix>_outbox_parked``; the
flood budgets (:meth:`PostgresStore.flood_budget`, a :class:`PostgresFloodBudget`) in
``<table_prefix>_flood``; the effect ledger (:meth:`PostgresStore.ledger`, a
:class:`PostgresLedger`: at-most-once effects started, unknown or settled) in
``<table_prefix>_ledger``. The store and its parts are objects over one
:class:`PostgresConnection` (``store.connection``): the pool, the clock, the error
translation and the purge bookkeeping.

Time: with ``clock=None`` (the default, and what ``from_url`` gives unless a clock is
passed) every statement reads the *server's* clock once
(``extract(epoch FROM clock_timestamp())``), so workers on different hosts judge leases
by one clock. With a clock, its reading is sent as a parameter.

The tables must exist: create them with ``telegram-idem migrate URL``,
:meth:`PostgresStore.migrate`, :func:`migrate` (a plain DSN), or ``auto_create=1``. The
schema is defined once with SQLAlchemy Core (:func:`records_table`, :func:`inbox_table`,
:func:`create_ddl`). See docs/store-postgres.md.

URL::

    postgresql://user:password@host:5432/db?table_prefix=idem&auto_create=0
        &min_size=1&max_size=10&statement_cache_size=100&command_timeout=10
        &connect_timeout=10&purge_every=1000&purge_batch=500

Store options (:data:`STORE_OPTIONS`, all optional) are removed before the DSN is given
to asyncpg. These libpq/asyncpg connection options (:data:`PASSTHROUGH_OPTIONS`) pass
through: ``host port dbname database user password passfile sslmode sslcert sslkey
sslrootcert sslcrl sslpassword sslnegotiation ssl_min_protocol_version
ssl_max_protocol_version target_session_attrs krbsrvname gsslib service application_name
search_path``. Anything else raises ``ConfigurationError``. Behind PgBouncer in
transaction pooling mode (before 1.21, or without ``max_prepared_statements``) add
``statement_cache_size=0``.

Modules (private, one job each): ``_url`` (the URL), ``_errors`` (asyncpg's exceptions),
``_connection``, ``_sql`` (the records statements), ``_store`` (the records store),
``_inbox_sql`` and ``_inbox`` (the inbox), ``_outbox_sql`` and ``_outbox`` (the outbox),
``_flood`` (the flood budget), ``_ledger`` (the effect ledger), ``_schema`` (tables and migration).
"""

from __future__ import annotations

from telegram_idem.backends.postgres._connection import PoolOptions, PostgresConnection
from telegram_idem.backends.postgres._flood import PostgresFloodBudget
from telegram_idem.backends.postgres._inbox import PostgresInbox
from telegram_idem.backends.postgres._ledger import PostgresLedger
from telegram_idem.backends.postgres._outbox import PostgresOutbox
from telegram_idem.backends.postgres._schema import (
    COLUMNS,
    DEFAULT_TABLE_PREFIX,
    INBOX_COLUMNS,
    LEDGER_COLUMNS,
    OUTBOX_COLUMNS,
    create_ddl,
    create_schema,
    drop_ddl,
    flood_table,
    flood_table_name,
    inbox_table,
    inbox_table_name,
    ledger_table,
    ledger_table_name,
    migrate,
    outbox_parked_table,
    outbox_parked_table_name,
    outbox_table,
    outbox_table_name,
    records_table,
    table_name,
    validate_table_prefix,
)
from telegram_idem.backends.postgres._store import PostgresStore
from telegram_idem.backends.postgres._url import PASSTHROUGH_OPTIONS, STORE_OPTIONS

__all__ = [
    "COLUMNS",
    "DEFAULT_TABLE_PREFIX",
    "INBOX_COLUMNS",
    "LEDGER_COLUMNS",
    "OUTBOX_COLUMNS",
    "PASSTHROUGH_OPTIONS",
    "STORE_OPTIONS",
    "PoolOptions",
    "PostgresConnection",
    "PostgresFloodBudget",
    "PostgresInbox",
    "PostgresLedger",
    "PostgresOutbox",
    "PostgresStore",
    "create_ddl",
    "create_schema",
    "drop_ddl",
    "flood_table",
    "flood_table_name",
    "inbox_table",
    "inbox_table_name",
    "ledger_table",
    "ledger_table_name",
    "migrate",
    "outbox_parked_table",
    "outbox_parked_table_name",
    "outbox_table",
    "outbox_table_name",
    "records_table",
    "table_name",
    "validate_table_prefix",
]
