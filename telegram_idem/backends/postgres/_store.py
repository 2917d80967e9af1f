"""The records part of the PostgreSQL store: :class:`PostgresStore`, over a
:class:`~telegram_idem.backends.postgres._connection.PostgresConnection`.

Each primitive is one statement of :mod:`telegram_idem.backends.postgres._sql`; the
claim's outcome is decided from its one answer (``machine.decide_claim`` for a row it did
not write). :meth:`PostgresStore.inbox`, :meth:`PostgresStore.outbox` and
:meth:`PostgresStore.flood_budget` build their parts over the same connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar
from urllib.parse import urlsplit

from telegram_idem import machine
from telegram_idem._clock import Clock
from telegram_idem._joined import JoinedRecords
from telegram_idem._records import Claim, Outcome, Record
from telegram_idem.backends._base import Store
from telegram_idem.backends._url import redact
from telegram_idem.backends.postgres._browse import PostgresBrowsing
from telegram_idem.backends.postgres._connection import PoolOptions, PostgresConnection
from telegram_idem.backends.postgres._errors import POSTGRES_ERRORS
from telegram_idem.backends.postgres._flood import PostgresFloodBudget
from telegram_idem.backends.postgres._inbox import PostgresInbox
from telegram_idem.backends.postgres._joined_records import PostgresJoinedRecords
from telegram_idem.backends.postgres._ledger import PostgresLedger
from telegram_idem.backends.postgres._outbox import PostgresOutbox
from telegram_idem.backends.postgres._schema import DEFAULT_TABLE_PREFIX, create_schema, table_name
from telegram_idem.backends.postgres._sql import build_records_sql, record_of
from telegram_idem.backends.postgres._url import SCHEMES, parse_store_url, store_options_in
from telegram_idem.errors import ConfigurationError, IdemError, StoreError
from telegram_idem.flood import FloodBudget
from telegram_idem.inbox import Inbox
from telegram_idem.outbox import Outbox

__all__ = ["PostgresStore"]

_MAX_CLAIM_ROUNDS = 20


class PostgresStore(PostgresBrowsing, Store):
    """Records in one PostgreSQL table, ``<table_prefix>_records``; the inbox
    (:meth:`inbox`) in ``<table_prefix>_inbox``. Lists, counts and deletes records by
    key prefix and checks its tables
    (:class:`~telegram_idem.backends.postgres._browse.PostgresBrowsing`).

    Args:
        dsn: an asyncpg DSN, ``postgresql://user:password@host:5432/db`` (store options
            go in keyword arguments here; :meth:`from_url` parses them from a URL).
        clock: seconds since the epoch; ``None`` = the server's clock, read once per
            statement (recommended: one clock for every worker).
        table_prefix: the tables are ``<table_prefix>_records`` and
            ``<table_prefix>_inbox`` (``a-z 0-9 _``, ≤ 40).
        min_size: connections the pool keeps open (≥ 0).
        max_size: most connections the pool opens (≥ 1, ≥ ``min_size``).
        auto_create: create the tables on first use if missing (otherwise run
            :meth:`migrate` / ``telegram-idem migrate URL`` once).
        command_timeout: seconds a statement may take before :class:`StoreError`.
        connect_timeout: seconds to open one connection (waiting for a pool connection
            may take ``connect_timeout + command_timeout``).
        statement_cache_size: asyncpg's prepared statement cache per connection; ``0``
            for PgBouncer transaction pooling without prepared statement support.
        purge_every: start a background purge after this many writes by this object
            (``0`` = never; call :meth:`purge` yourself).
        purge_batch: most rows one purge deletes.
        connect_kwargs: more keyword arguments for ``asyncpg.create_pool`` (``ssl=``,
            ``server_settings=``, ``connection_class=``…).

    Raises:
        ConfigurationError: an option out of range, a bad ``table_prefix``, or store
            options inside ``dsn``.

    Every primitive (``claim``, ``claim_many``, ``complete``, ``fail``, ``release``,
    ``extend``, ``get``, ``purge``, ``migrate``) raises, besides what :class:`Store`
    documents:

    - :class:`StoreError` (``original`` = the driver's exception) when the server cannot
      answer: refused/reset/lost connection, ``command_timeout``, server shutting down or
      starting, too many connections, read-only standby after failover, the store closed;
    - :class:`ConfigurationError` when the table is missing (run ``telegram-idem migrate
      URL`` or use ``auto_create=1``), or the credentials, database or privileges are wrong;
    - ``TypeError`` for an argument asyncpg cannot encode (a programming error).

    When a statement was sent and the connection died before the answer, the outcome is
    unknown: the claim may have been written. A retry then sees the record (usually
    ``in progress`` until the lease ends). Nothing is retried automatically.
    """

    __module__ = "telegram_idem.backends.postgres"  # its public home (and the scheme table's)
    schemes = SCHEMES
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = POSTGRES_ERRORS.transient
    config_errors: ClassVar[tuple[type[BaseException], ...]] = POSTGRES_ERRORS.config
    driver_base: ClassVar[tuple[type[BaseException], ...]] = POSTGRES_ERRORS.base

    def __init__(
        self,
        dsn: str,
        *,
        clock: Clock | None = None,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        min_size: int = 1,
        max_size: int = 10,
        auto_create: bool = False,
        command_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        statement_cache_size: int = 100,
        purge_every: int = 1000,
        purge_batch: int = 500,
        connect_kwargs: dict[str, Any] | None = None,
    ) -> None:
        parts = urlsplit(dsn)
        if parts.scheme.lower() not in SCHEMES:
            raise ConfigurationError(
                f"a PostgreSQL DSN starts with postgresql://, got {redact(dsn)}"
            )
        stray = store_options_in(dsn)
        if stray:
            raise ConfigurationError(
                f"store option(s) {stray} in the DSN: pass them as keyword "
                "arguments, or use PostgresStore.from_url"
            )
        options = PoolOptions(
            min_size=min_size,
            max_size=max_size,
            auto_create=auto_create,
            command_timeout=float(command_timeout),
            connect_timeout=float(connect_timeout),
            statement_cache_size=statement_cache_size,
            purge_every=purge_every,
            purge_batch=purge_batch,
            connect_kwargs=dict(connect_kwargs or {}),
        )
        self.table = table_name(table_prefix)
        label = (
            f"PostgresStore(host={parts.hostname or ''!r}, "
            f"db={parts.path.lstrip('/')!r}, table={self.table!r})"
        )
        self.connection = PostgresConnection(
            dsn, label=label, table_prefix=table_prefix, options=options, clock=clock
        )
        """The pool, clock and error translation this store and its inbox share."""
        self.inbox_table = self.connection.inbox_table
        self.table_prefix = table_prefix
        self._sql = build_records_sql(self.table, server_clock=clock is None)
        self._inbox: PostgresInbox | None = None
        self._outbox: PostgresOutbox | None = None
        self._flood: PostgresFloodBudget | None = None
        self._ledger: PostgresLedger | None = None
        self.connection.purge_with(self._background_purge)

    def __repr__(self) -> str:
        return self.connection.label

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> PostgresStore:
        """``postgresql://user:password@host:port/db?option=value&…`` (or ``postgres://``).

        Store options: ``table_prefix`` (default ``idem``), ``auto_create`` (0/1),
        ``min_size`` (1), ``max_size`` (10), ``statement_cache_size`` (100; 0 for
        PgBouncer transaction pooling), ``command_timeout`` (10 s), ``connect_timeout``
        (10 s), ``purge_every`` (1000 writes), ``purge_batch`` (500 rows). The libpq
        options in :data:`~telegram_idem.backends.postgres.PASSTHROUGH_OPTIONS` go to
        asyncpg.

        Args:
            url: the store URL.
            clock: ``None`` (default) = the server's clock; otherwise seconds since the
                epoch, sent with every statement.

        Raises:
            ConfigurationError: another scheme, an unknown option, or a value that does
                not parse or is out of range (the message never shows the password).
        """
        dsn, kwargs = parse_store_url(url)
        return cls(dsn, clock=clock, **kwargs)

    def _translate(self, op: str, exc: Exception) -> IdemError | None:
        """The connection's translation: a missing table and a value beyond
        PostgreSQL's limits get their own message; the rest by exception class."""
        return self.connection.translate(op, exc)

    # ------------------------------------------------------------------ primitives

    async def _claim(
        self, key: str, fingerprint: str | None, lease: float, retention: float
    ) -> Claim:
        claims = await self.connection.run(
            lambda conn: self._claim_rounds(conn, [key], {key: fingerprint}, lease, retention)
        )
        return claims[0]

    async def _claim_many(self, keys: Sequence[str], lease: float, retention: float) -> list[Claim]:
        if not keys:
            return []
        return await self.connection.run(
            lambda conn: self._claim_rounds(conn, list(keys), None, lease, retention)
        )

    async def _claim_rounds(
        self,
        conn: Any,
        keys: list[str],
        fingerprints: dict[str, str | None] | None,
        lease: float,
        retention: float,
    ) -> list[Claim]:
        """Run the claim statement until every key has an answer.

        One round almost always answers every key. A key gets no answer only in a race:
        another claim committed a row the statement's snapshot cannot see (the upsert
        found the conflict, the snapshot read found nothing, or found the older version
        that still looked acquirable). The next round's snapshot sees that row.
        """
        answers: dict[str, Claim] = {}
        pending = keys
        for _ in range(_MAX_CLAIM_ROUNDS):
            if fingerprints is not None:
                key = pending[0]
                rows = await conn.fetch(
                    self._sql["claim"],
                    key,
                    fingerprints[key],
                    lease,
                    retention,
                    *self.connection.now_args(),
                )
            else:
                rows = await conn.fetch(
                    self._sql["claim_many"], pending, lease, retention, *self.connection.now_args()
                )
            wrote = False
            for row in rows:
                record = record_of(row)
                if row["written"]:
                    answers[record.key] = Claim(Outcome.ACQUIRED, record)
                    wrote = True
                    continue
                fp = fingerprints[record.key] if fingerprints is not None else None
                claim, _ = machine.decide_claim(
                    record,
                    key=record.key,
                    fingerprint=fp,
                    now=row["now"],
                    lease=lease,
                    retention=retention,
                )
                if claim.outcome is not Outcome.ACQUIRED:
                    answers[record.key] = claim
            if wrote:
                self.connection.wrote()
            pending = [k for k in pending if k not in answers]
            if not pending:
                return [answers[k] for k in keys]
        raise StoreError(
            f"{self!r}: claims of {len(pending)} key(s) still racing after "
            f"{_MAX_CLAIM_ROUNDS} rounds"
        )

    async def _update(self, name: str, *args: Any) -> bool:
        sql = self._sql[name]
        now = self.connection.now_args()

        async def run(conn: Any) -> Any:
            return await conn.fetchval(sql, *args, *now)

        done = await self.connection.run(run) is not None
        if done:
            self.connection.wrote()
        return done

    async def _complete(self, key: str, token: int, result: bytes, retention: float) -> bool:
        return await self._update("complete", key, token, result, retention)

    async def _fail(self, key: str, token: int, error: bytes, retention: float) -> bool:
        return await self._update("fail", key, token, error, retention)

    async def _release(self, key: str, token: int) -> bool:
        return await self._update("release", key, token)

    async def _extend(self, key: str, token: int, lease: float) -> bool:
        return await self._update("extend", key, token, lease)

    async def _get(self, key: str) -> Record | None:
        sql = self._sql["get"]
        now = self.connection.now_args()

        async def run(conn: Any) -> Any:
            return await conn.fetchrow(sql, key, *now)

        row = await self.connection.run(run)
        return None if row is None else record_of(row)

    async def _now(self) -> float:
        return await self.connection.now()

    def inbox(self) -> Inbox:
        """The durable inbox in ``<table_prefix>_inbox``, on this store's connection.

        Admission writes the update guard record and the entry in one statement; see
        :mod:`telegram_idem.backends.postgres._inbox`. The table is made by the same
        :meth:`migrate` / ``auto_create`` as the records table.
        """
        if self._inbox is None:
            self._inbox = PostgresInbox(self.connection)
        return self._inbox

    def outbox(self) -> Outbox:
        """The durable outbox in ``<table_prefix>_outbox`` (parked chats in
        ``<table_prefix>_outbox_parked``), on this store's connection; the same object on
        every call. Its ``enqueue_in(conn, call)`` joins the bot's own transaction on
        this database (see :class:`~telegram_idem.backends.postgres.PostgresOutbox`).
        The tables are made by :meth:`migrate` / ``auto_create`` with the others.
        """
        if self._outbox is None:
            self._outbox = PostgresOutbox(self.connection)
        return self._outbox

    def joined(self, conn: object) -> JoinedRecords:
        """The records written on the bot's connection ``conn``, inside its transaction
        on this database (``async with idem.transaction(conn)``; see
        :class:`~telegram_idem.backends.postgres._joined_records.PostgresJoinedRecords`):
        the store's own statements, so the same decisions, by the same clock.

        Args:
            conn: an asyncpg ``Connection`` or pool connection inside a transaction, or
                an SQLAlchemy ``AsyncConnection`` / ``AsyncSession`` on PostgreSQL, on
                the database that holds this store's tables.

        Raises:
            ConfigurationError: ``conn`` is of another kind (its transaction and its
                database are checked when the block is entered).
        """
        return PostgresJoinedRecords(self, conn, sql=self._sql, claim_rounds=self._claim_rounds)

    def flood_budget(self) -> FloodBudget:
        """The flood-control budgets in ``<table_prefix>_flood``, shared by every process
        on this database (:class:`~telegram_idem.backends.postgres.PostgresFloodBudget`);
        the same object on every call."""
        if self._flood is None:
            self._flood = PostgresFloodBudget(self.connection)
        return self._flood

    def ledger(self) -> PostgresLedger:
        """The effect ledger in ``<table_prefix>_ledger``, shared by every process on this
        database (:class:`~telegram_idem.backends.postgres.PostgresLedger`); the same
        object on every call. The table is made by :meth:`migrate` / ``auto_create`` with
        the others."""
        if self._ledger is None:
            self._ledger = PostgresLedger(self.connection)
        return self._ledger

    # ------------------------------------------------------------------ maintenance

    async def _background_purge(self, batch: int) -> int:
        """The records' purge, then the outbox's settled entries past their retention
        once the outbox is in use."""
        deleted = await self._purge_once(batch)
        if self._outbox is not None:
            deleted += await self._outbox.purge_once(batch)
        return deleted

    async def _purge_once(self, batch: int) -> int:
        sql = self._sql["purge"]
        now = self.connection.now_args()

        async def run(conn: Any) -> Any:
            return await conn.execute(sql, batch, *now)

        status: str = await self.connection.run(run)
        return int(status.rsplit(" ", 1)[-1])

    async def purge(self, batch: int = 500) -> int:
        """Delete up to ``batch`` records whose retention is over; returns how many.

        Rows locked by a concurrent claim are skipped (``FOR UPDATE SKIP LOCKED``), so a
        purge never makes a claim wait for long. Call it in a loop until it returns less
        than ``batch`` to empty the backlog.

        Args:
            batch: the most records deleted (≥ 1).

        Raises:
            ConfigurationError: ``batch`` < 1, or the table is missing.
            StoreError: the database could not answer.
        """
        if batch < 1:
            raise ConfigurationError(f"batch must be ≥ 1, got {batch}")
        return await self._call("purge", lambda: self._purge_once(batch))

    async def migrate(self) -> None:
        """Create the records, inbox, outbox (and its parked chats), flood and ledger
        tables and their indexes if absent (idempotent, safe concurrently; a schema made
        by an older version gains the tables it lacks).

        Raises:
            ConfigurationError: bad credentials or database, or no CREATE privilege.
            StoreError: the database could not answer.
        """

        async def run(conn: Any) -> None:
            await create_schema(conn, table_prefix=self.table_prefix)

        await self.connection.call("migrate", run)

    async def close(self) -> None:
        """Stop the background purge and close the pool. Idempotent; later calls raise
        :class:`StoreError`."""
        await self.connection.close()
