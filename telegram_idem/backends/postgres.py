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

The durable inbox (:meth:`PostgresStore.inbox`) lives in ``<table_prefix>_inbox`` beside
the records; see :mod:`telegram_idem.backends.postgres_inbox`.

Time: with ``clock=None`` (the default, and what ``from_url`` gives unless a clock is
passed) every statement reads the *server's* clock once
(``extract(epoch FROM clock_timestamp())``), so workers on different hosts judge leases
by one clock. With a clock, its reading is sent as a parameter.

The tables must exist: create them with ``telegram-idem migrate URL``,
:meth:`PostgresStore.migrate`, or ``auto_create=1``. See docs/store-postgres.md.

URL::

    postgresql://user:password@host:5432/db?table_prefix=idem&auto_create=0
        &min_size=1&max_size=10&statement_cache_size=100&command_timeout=10
        &connect_timeout=10&purge_every=1000&purge_batch=500

Store options (all optional) are removed before the DSN is given to asyncpg. These
libpq/asyncpg connection options pass through: ``host port dbname database user
password passfile sslmode sslcert sslkey sslrootcert sslcrl sslpassword sslnegotiation
ssl_min_protocol_version ssl_max_protocol_version target_session_attrs krbsrvname gsslib
service application_name search_path``. Anything else raises ``ConfigurationError``.
Behind PgBouncer in transaction pooling mode (before 1.21, or without
``max_prepared_statements``) add ``statement_cache_size=0``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg  # type: ignore[import-untyped]
import asyncpg.exceptions  # type: ignore[import-untyped]

from telegram_idem import machine
from telegram_idem.backends.base import Store, describe_error
from telegram_idem.backends.postgres_schema import (
    COLUMNS,
    DEFAULT_TABLE_PREFIX,
    create_schema,
    inbox_table_name,
    table_name,
)
from telegram_idem.backends.url import reject_unknown
from telegram_idem.clock import Clock
from telegram_idem.errors import ConfigurationError, IdemError, StoreError
from telegram_idem.inbox.base import Inbox
from telegram_idem.records import Claim, Outcome, Record, Status

__all__ = ["PASSTHROUGH_OPTIONS", "STORE_OPTIONS", "PostgresStore"]

log = logging.getLogger("telegram_idem.store.postgres")

T = TypeVar("T")

STORE_OPTIONS = frozenset(
    {
        "table_prefix",
        "auto_create",
        "min_size",
        "max_size",
        "statement_cache_size",
        "command_timeout",
        "connect_timeout",
        "purge_every",
        "purge_batch",
    }
)
"""URL query options read by the store itself (removed before asyncpg sees the DSN)."""

PASSTHROUGH_OPTIONS = frozenset(
    {
        "host",
        "port",
        "dbname",
        "database",
        "user",
        "password",
        "passfile",
        "sslmode",
        "sslcert",
        "sslkey",
        "sslrootcert",
        "sslcrl",
        "sslpassword",
        "sslnegotiation",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "target_session_attrs",
        "krbsrvname",
        "gsslib",
        "service",
        # asyncpg sends unknown DSN options as server settings; these two are useful ones.
        "application_name",
        "search_path",
    }
)
"""URL query options handed to asyncpg unchanged."""

_SERVER_NOW = "extract(epoch FROM clock_timestamp())"
_MAX_CLAIM_ROUNDS = 20
_COLS = ", ".join(COLUMNS)
_RCOLS = ", ".join(f"r.{c}" for c in COLUMNS)

# The claim. ``c`` fixes "now" once for the whole statement. ``up`` inserts a new record,
# or, on a key conflict, overwrites the existing one only when it may be acquired:
# retention over (a fresh record, token + 1), or in progress with its lease over and no
# fingerprint mismatch (a takeover: token + 1, attempts + 1, retention kept if longer).
# When ``up`` wrote nothing, ``old`` (the row as of the statement's snapshot) comes back
# instead, and Python decides replay / conflict / in progress / failed from it with
# ``machine.decide_claim``. The ON CONFLICT branch locks the row, so two concurrent
# claims of one key serialise there and at most one writes. A key whose snapshot row is
# live and not acquirable (a duplicate: replay, in progress, conflict, failed) is not
# inserted at all, so a duplicate is a read: no row lock, no WAL, no commit flush.
_CLAIM_UPSERT = """
  INSERT INTO {table} AS r ({cols})
  SELECT k.key, 'in_progress', 1, c.now + {lease}, c.now + {retention}, {fp}, NULL, 1
  FROM {source}
  WHERE NOT EXISTS (
    SELECT 1 FROM old o
    WHERE o.key = k.key AND o.expires_at > c.now
      AND NOT (o.status = 'in_progress' AND o.lease_expires_at <= c.now
               AND (o.fingerprint IS NULL OR {fp} IS NULL OR o.fingerprint = {fp})))
  ON CONFLICT (key) DO UPDATE SET
    status = 'in_progress',
    fencing_token = r.fencing_token + 1,
    lease_expires_at = excluded.lease_expires_at,
    expires_at = CASE WHEN r.expires_at <= (SELECT now FROM c) THEN excluded.expires_at
                      ELSE greatest(r.expires_at, excluded.expires_at) END,
    fingerprint = CASE WHEN r.expires_at <= (SELECT now FROM c) THEN excluded.fingerprint
                       ELSE coalesce(excluded.fingerprint, r.fingerprint) END,
    result = NULL,
    attempts = CASE WHEN r.expires_at <= (SELECT now FROM c) THEN 1
                    ELSE r.attempts + 1 END
  WHERE r.expires_at <= (SELECT now FROM c)
     OR (r.status = 'in_progress'
         AND r.lease_expires_at <= (SELECT now FROM c)
         AND (r.fingerprint IS NULL OR excluded.fingerprint IS NULL
              OR r.fingerprint = excluded.fingerprint))
  RETURNING {rcols}"""

_CLAIM = (
    (
        """WITH c AS MATERIALIZED (SELECT {now}::float8 AS now),
old AS (SELECT {cols} FROM {table} WHERE key = $1::text),
up AS ("""
        + _CLAIM_UPSERT.replace("{source}", "(SELECT $1::text AS key) AS k, c").replace(
            "{fp}", "$2::text"
        )
        + """
)
SELECT true AS written, up.*, (SELECT now FROM c) AS now FROM up
UNION ALL
SELECT false, old.*, (SELECT now FROM c) FROM old WHERE NOT EXISTS (SELECT 1 FROM up)"""
    )
    .replace("{lease}", "$3::float8")
    .replace("{retention}", "$4::float8")
)

_CLAIM_MANY = (
    (
        """WITH c AS MATERIALIZED (SELECT {now}::float8 AS now),
old AS (SELECT {cols} FROM {table} WHERE key = ANY($1::text[])),
up AS ("""
        + _CLAIM_UPSERT.replace(
            "{source}", "(SELECT key FROM unnest($1::text[]) AS u(key) ORDER BY key) AS k, c"
        ).replace("{fp}", "NULL::text")
        + """
)
SELECT true AS written, up.*, (SELECT now FROM c) AS now FROM up
UNION ALL
SELECT false, old.*, (SELECT now FROM c) FROM old
WHERE old.key NOT IN (SELECT key FROM up)"""
    )
    .replace("{lease}", "$2::float8")
    .replace("{retention}", "$3::float8")
)

_UPDATE = """WITH c AS MATERIALIZED (SELECT {now}::float8 AS now)
UPDATE {table} AS r SET {set}
FROM c
WHERE r.key = $1 AND r.fencing_token = $2 AND r.status = 'in_progress' AND r.expires_at > c.now
RETURNING 1"""

_COMPLETE = _UPDATE.replace(
    "{set}", "status = 'completed', result = $3, expires_at = c.now + $4::float8"
)
_FAIL = _UPDATE.replace("{set}", "status = 'failed', result = $3, expires_at = c.now + $4::float8")
_RELEASE = _UPDATE.replace("{set}", "lease_expires_at = c.now, fingerprint = NULL")
_EXTEND = _UPDATE.replace(
    "{set}",
    "lease_expires_at = c.now + $3::float8, "
    "expires_at = greatest(r.expires_at, c.now + $3::float8)",
)
_NOW = "WITH c AS MATERIALIZED (SELECT {now}::float8 AS now)\n"
_GET = _NOW + "SELECT {cols} FROM {table} WHERE key = $1 AND expires_at > (SELECT now FROM c)"
# "now" comes from ``c`` (an InitPlan, one value) so the expires_at index can serve the scan.
# FOR UPDATE re-checks the expiry on the newest row version and keeps the rows locked
# until the DELETE ends, so the outer DELETE needs no second expiry test. ``= ANY(ARRAY(…))``
# (rather than ``IN (…)``) makes the planner look the chosen keys up in the primary key
# instead of hash-joining them against the whole table.
_PURGE = (
    _NOW
    + """DELETE FROM {table} WHERE key = ANY(ARRAY(
  SELECT key FROM {table} WHERE expires_at <= (SELECT now FROM c)
  LIMIT $1 FOR UPDATE SKIP LOCKED
))"""
)

# (template, index of the "now" parameter when a clock is given)
_STATEMENTS: dict[str, tuple[str, int]] = {
    "claim": (_CLAIM, 5),
    "claim_many": (_CLAIM_MANY, 4),
    "complete": (_COMPLETE, 5),
    "fail": (_FAIL, 5),
    "release": (_RELEASE, 3),
    "extend": (_EXTEND, 4),
    "get": (_GET, 2),
    "purge": (_PURGE, 2),
}


def _build_sql(table: str, server_clock: bool) -> dict[str, str]:
    out = {}
    for name, (template, now_index) in _STATEMENTS.items():
        now = _SERVER_NOW if server_clock else f"${now_index}"
        out[name] = (
            template.replace("{now}", now)
            .replace("{table}", table)
            .replace("{cols}", _COLS)
            .replace("{rcols}", _RCOLS)
        )
    return out


def _record(row: Any) -> Record:
    return Record(
        key=row["key"],
        status=Status(row["status"]),
        fencing_token=row["fencing_token"],
        lease_expires_at=row["lease_expires_at"],
        expires_at=row["expires_at"],
        fingerprint=row["fingerprint"],
        result=row["result"],
        attempts=row["attempts"],
    )


async def _keep_session(connection: Any) -> None:
    """Pool reset hook: the store never changes session state, so a release costs no query.

    (asyncpg still rolls back an open transaction before calling this.)
    """


def _redact(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostinfo}"))


def _parse_bool(url: str, name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ConfigurationError(f"{name} must be 0 or 1 in {url!r}, got {value!r}")


def _parse_number(url: str, name: str, value: str, kind: type[int] | type[float]) -> Any:
    try:
        return kind(value)
    except ValueError:
        what = "an integer" if kind is int else "a number of seconds"
        raise ConfigurationError(f"{name} must be {what} in {url!r}, got {value!r}") from None


_VALUE_ERRORS = (
    asyncpg.exceptions.ProgramLimitExceededError,  # 54000: index row size exceeds maximum
    asyncpg.exceptions.DataError,  # class 22: e.g. NUL in a text value
)


class PostgresStore(Store):
    """Records in one PostgreSQL table, ``<table_prefix>_records``; the inbox
    (:meth:`inbox`) in ``<table_prefix>_inbox``.

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

    schemes = ("postgresql", "postgres")
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = (
        OSError,  # refused, reset, unreachable; TimeoutError is an OSError
        asyncio.TimeoutError,  # command_timeout, pool acquire timeout
        asyncpg.PostgresConnectionError,  # class 08: connection lost / failed
        asyncpg.InterfaceError,  # connection closed, pool closing (misuse subclasses
        #                          are translated before they get here)
        asyncpg.exceptions.OperatorInterventionError,  # shutdown, cannot connect now,
        #                                                 query canceled (statement_timeout)
        asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full
        asyncpg.exceptions.ReadOnlySQLTransactionError,  # failover to a standby
        asyncpg.exceptions.TransactionRollbackError,  # deadlock / serialization
        asyncpg.exceptions.InternalClientError,  # a connection left in a broken state
    )

    config_errors: ClassVar[tuple[type[BaseException], ...]] = (
        asyncpg.exceptions.InvalidAuthorizationSpecificationError,  # bad password, no role
        asyncpg.exceptions.InvalidCatalogNameError,  # no such database
        asyncpg.exceptions.InsufficientPrivilegeError,
        asyncpg.exceptions.ClientConfigurationError,
    )
    driver_base: ClassVar[tuple[type[BaseException], ...]] = (
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
    )

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
        if urlsplit(dsn).scheme.lower() not in self.schemes:
            raise ConfigurationError(
                f"a PostgreSQL DSN starts with postgresql://, got {_redact(dsn)!r}"
            )
        stray = STORE_OPTIONS & dict(parse_qsl(urlsplit(dsn).query)).keys()
        if stray:
            raise ConfigurationError(
                f"store option(s) {sorted(stray)} in the DSN: pass them as keyword "
                "arguments, or use PostgresStore.from_url"
            )
        if not (isinstance(min_size, int) and isinstance(max_size, int)):
            raise ConfigurationError("min_size and max_size must be integers")
        if min_size < 0 or max_size < 1 or min_size > max_size:
            raise ConfigurationError(
                f"need 0 ≤ min_size ≤ max_size and max_size ≥ 1, got {min_size}, {max_size}"
            )
        if not command_timeout > 0 or not connect_timeout > 0:
            raise ConfigurationError("command_timeout and connect_timeout must be > 0 seconds")
        if statement_cache_size < 0 or purge_every < 0 or purge_batch < 1:
            raise ConfigurationError(
                "need statement_cache_size ≥ 0, purge_every ≥ 0 and purge_batch ≥ 1"
            )
        self.table = table_name(table_prefix)
        self.inbox_table = inbox_table_name(table_prefix)
        self.table_prefix = table_prefix
        self._dsn = dsn
        self._clock = clock
        self._min_size = min_size
        self._max_size = max_size
        self._auto_create = auto_create
        self._command_timeout = float(command_timeout)
        self._connect_timeout = float(connect_timeout)
        self._statement_cache_size = statement_cache_size
        self._purge_every = purge_every
        self._purge_batch = purge_batch
        self._connect_kwargs = dict(connect_kwargs or {})
        self._sql = _build_sql(self.table, server_clock=clock is None)
        self._pool: Any = None
        self._pool_lock = asyncio.Lock()
        self._closed = False
        self._writes = 0
        self._purge_task: asyncio.Task[None] | None = None
        self._inbox: Inbox | None = None

    def __repr__(self) -> str:
        parts = urlsplit(self._dsn)
        host = parts.hostname or ""
        return f"PostgresStore(host={host!r}, db={parts.path.lstrip('/')!r}, table={self.table!r})"

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> PostgresStore:
        """``postgresql://user:password@host:port/db?option=value&…`` (or ``postgres://``).

        Store options: ``table_prefix`` (default ``idem``), ``auto_create`` (0/1),
        ``min_size`` (1), ``max_size`` (10), ``statement_cache_size`` (100; 0 for
        PgBouncer transaction pooling), ``command_timeout`` (10 s), ``connect_timeout``
        (10 s), ``purge_every`` (1000 writes), ``purge_batch`` (500 rows). The libpq
        options in :data:`PASSTHROUGH_OPTIONS` go to asyncpg.

        Args:
            url: the store URL.
            clock: ``None`` (default) = the server's clock; otherwise seconds since the
                epoch, sent with every statement.

        Raises:
            ConfigurationError: another scheme, an unknown option, or a value that does
                not parse or is out of range.
        """
        parts = urlsplit(url)
        shown = _redact(url)  # error messages never carry the password
        if parts.scheme.lower() not in cls.schemes:
            raise ConfigurationError(f"a PostgreSQL store URL starts with postgresql://: {shown!r}")
        try:
            parts.port  # noqa: B018  (validates the port)
        except ValueError:
            raise ConfigurationError(f"bad port in {shown!r}") from None
        query = parse_qsl(parts.query, keep_blank_values=True)
        options: dict[str, str] = {}
        passthrough: list[tuple[str, str]] = []
        unknown: dict[str, str] = {}
        for name, value in query:
            if name in STORE_OPTIONS:
                options[name] = value
            elif name in PASSTHROUGH_OPTIONS:
                passthrough.append((name, value))
            else:
                unknown[name] = value
        reject_unknown(shown, unknown)
        kwargs: dict[str, Any] = {}
        if "table_prefix" in options:
            kwargs["table_prefix"] = options["table_prefix"]
        if "auto_create" in options:
            kwargs["auto_create"] = _parse_bool(shown, "auto_create", options["auto_create"])
        for name in ("min_size", "max_size", "statement_cache_size", "purge_every", "purge_batch"):
            if name in options:
                kwargs[name] = _parse_number(shown, name, options[name], int)
        for name in ("command_timeout", "connect_timeout"):
            if name in options:
                kwargs[name] = _parse_number(shown, name, options[name], float)
        dsn = urlunsplit(parts._replace(query=urlencode(passthrough)))
        return cls(dsn, clock=clock, **kwargs)

    # ------------------------------------------------------------------ connections

    async def _get_pool(self) -> Any:
        if self._closed:
            raise StoreError(f"{self!r} is closed")
        if self._pool is not None:
            return self._pool
        async with self._pool_lock:
            if self._closed:
                raise StoreError(f"{self!r} is closed")
            if self._pool is None:
                kwargs: dict[str, Any] = {
                    "min_size": self._min_size,
                    "max_size": self._max_size,
                    "command_timeout": self._command_timeout,
                    "timeout": self._connect_timeout,
                    "statement_cache_size": self._statement_cache_size,
                    "reset": _keep_session,
                }
                kwargs.update(self._connect_kwargs)
                pool = await asyncpg.create_pool(self._dsn, **kwargs)
                if self._auto_create:
                    try:
                        async with pool.acquire(timeout=self._acquire_timeout) as conn:
                            await create_schema(conn, table_prefix=self.table_prefix)
                    except BaseException:
                        pool.terminate()
                        raise
                self._pool = pool
            return self._pool

    @property
    def _acquire_timeout(self) -> float:
        return self._connect_timeout + self._command_timeout

    async def _run(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``fn(connection)`` on a pool connection, translating configuration errors."""
        try:
            pool = await self._get_pool()
            async with pool.acquire(timeout=self._acquire_timeout) as conn:
                try:
                    return await fn(conn)
                except self.driver_errors:
                    # The connection may be half-dead (server shut down, protocol state
                    # lost): never hand it to the next caller; the pool opens a new one.
                    # (A connection asyncpg already closed is back in the pool: skip it.)
                    with contextlib.suppress(Exception):
                        conn.terminate()
                    raise
        except asyncpg.InterfaceError as exc:
            if isinstance(exc, ValueError):  # asyncpg's client-side DataError: a bad argument
                raise TypeError(f"{self!r}: {exc}") from exc
            raise

    def _translate(self, op: str, exc: Exception) -> IdemError | None:
        """A missing table and a value beyond PostgreSQL's limits get their own message;
        the rest is classified by the base class (``config_errors``, ``driver_errors``)."""
        where = f"{self!r}.{op}"
        if isinstance(exc, asyncpg.exceptions.UndefinedTableError):
            missing = self.inbox_table if self.inbox_table in str(exc) else self.table
            return ConfigurationError(
                f"{where}: table {missing!r} does not exist: run `telegram-idem migrate "
                f"<store URL>` once (or PostgresStore.migrate()), or add auto_create=1 to "
                f"the store URL ({exc})"
            )
        if isinstance(exc, _VALUE_ERRORS):
            return ConfigurationError(
                f"{where}: PostgreSQL cannot store this value ({describe_error(exc)}); "
                "keys longer than about 2,700 bytes exceed its index row limit, and text "
                "columns refuse NUL"
            )
        return super()._translate(op, exc)

    def _now_args(self) -> tuple[float, ...]:
        return () if self._clock is None else (float(self._clock()),)

    def _wrote(self) -> None:
        self._writes += 1
        if self._purge_every and self._writes % self._purge_every == 0:
            self._start_background_purge()

    def _start_background_purge(self) -> None:
        pool = self._pool
        if pool is None or self._closed:
            return
        if self._purge_task is not None and not self._purge_task.done():
            return
        # Only on a spare connection: an idle one, or room to open one.
        if pool.get_idle_size() == 0 and pool.get_size() >= pool.get_max_size():
            return
        self._purge_task = asyncio.get_running_loop().create_task(
            self._background_purge(), name=f"telegram-idem purge {self.table}"
        )

    async def _background_purge(self) -> None:
        try:
            deleted = await self._purge_once(self._purge_batch)
            log.debug("purged %d expired records from %s", deleted, self.table)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a purge failure must never surface in a claim
            log.warning("background purge of %s failed: %r", self.table, exc)

    # ------------------------------------------------------------------ primitives

    async def _claim(
        self, key: str, fingerprint: str | None, lease: float, retention: float
    ) -> Claim:
        claims = await self._run(
            lambda conn: self._claim_rounds(conn, [key], {key: fingerprint}, lease, retention)
        )
        return claims[0]

    async def _claim_many(self, keys: Sequence[str], lease: float, retention: float) -> list[Claim]:
        if not keys:
            return []
        return await self._run(
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
                    *self._now_args(),
                )
            else:
                rows = await conn.fetch(
                    self._sql["claim_many"], pending, lease, retention, *self._now_args()
                )
            wrote = False
            for row in rows:
                record = _record(row)
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
                self._wrote()
            pending = [k for k in pending if k not in answers]
            if not pending:
                return [answers[k] for k in keys]
        raise StoreError(
            f"{self!r}: claims of {len(pending)} key(s) still racing after "
            f"{_MAX_CLAIM_ROUNDS} rounds"
        )

    async def _update(self, name: str, *args: Any) -> bool:
        sql = self._sql[name]
        now = self._now_args()

        async def run(conn: Any) -> Any:
            return await conn.fetchval(sql, *args, *now)

        done = await self._run(run) is not None
        if done:
            self._wrote()
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
        now = self._now_args()

        async def run(conn: Any) -> Any:
            return await conn.fetchrow(sql, key, *now)

        row = await self._run(run)
        return None if row is None else _record(row)

    async def _now(self) -> float:
        if self._clock is not None:
            return float(self._clock())

        async def run(conn: Any) -> Any:
            return await conn.fetchval(f"SELECT {_SERVER_NOW}::float8")

        return float(await self._run(run))

    def inbox(self) -> Inbox:
        """The durable inbox in ``<table_prefix>_inbox``, on this store's pool and clock.

        Admission writes the update guard record and the entry in one statement; see
        :mod:`telegram_idem.backends.postgres_inbox`. The table is made by the same
        :meth:`migrate` / ``auto_create`` as the records table.
        """
        if self._inbox is None:
            from telegram_idem.backends.postgres_inbox import PostgresInbox

            self._inbox = PostgresInbox(self)
        return self._inbox

    # ------------------------------------------------------------------ maintenance

    async def _purge_once(self, batch: int) -> int:
        sql = self._sql["purge"]
        now = self._now_args()

        async def run(conn: Any) -> Any:
            return await conn.execute(sql, batch, *now)

        status: str = await self._run(run)
        return int(status.rsplit(" ", 1)[-1])

    async def purge(self, batch: int = 500) -> int:
        """Delete up to ``batch`` records whose retention is over; returns how many.

        Rows locked by a concurrent claim are skipped (``FOR UPDATE SKIP LOCKED``), so a
        purge never makes a claim wait for long. Call it in a loop until it returns less
        than ``batch`` to empty the backlog.

        Raises:
            ConfigurationError: ``batch`` < 1, or the table is missing.
            StoreError: the database could not answer.
        """
        if batch < 1:
            raise ConfigurationError(f"batch must be ≥ 1, got {batch}")
        return await self._call("purge", lambda: self._purge_once(batch))

    async def migrate(self) -> None:
        """Create the records and inbox tables and their indexes if absent (idempotent,
        safe concurrently).

        Raises:
            ConfigurationError: bad credentials or database, or no CREATE privilege.
            StoreError: the database could not answer.
        """

        async def run(conn: Any) -> None:
            await create_schema(conn, table_prefix=self.table_prefix)

        await self._call("migrate", lambda: self._run(run))

    async def close(self) -> None:
        """Stop the background purge and close the pool. Idempotent; later calls raise
        :class:`StoreError`."""
        self._closed = True
        task, self._purge_task = self._purge_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        async with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), timeout=self._command_timeout)
            except Exception as exc:  # a connection still busy, or already gone
                log.debug("closing the pool of %r: %r; terminating it", self, exc)
                pool.terminate()
