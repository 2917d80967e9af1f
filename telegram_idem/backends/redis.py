"""Redis store (``redis://``, ``rediss://``, ``redis+cluster://``): one Lua script per decision.

Each record is one hash at ``<key_prefix>:{<record key>}``. The braces make the whole
record key the cluster hash tag, so every single-key script touches one slot (on a
cluster, update guard records live in the inbox's slot instead: see
:meth:`RedisStore.redis_key` and :mod:`telegram_idem.backends.redis_inbox`). Every
primitive is ONE ``EVALSHA`` of a script in :mod:`telegram_idem.backends.redis_scripts`
(on ``NOSCRIPT``, e.g. after ``SCRIPT FLUSH`` or a failover, the same call is repeated
once as ``EVAL``, which also caches the script again). Redis forgets a record when its
retention ends (``PEXPIRE``); the lease end lives inside the hash.

Time: without a clock the scripts read the server's clock (``TIME``), so every worker
judges leases by one clock; with a clock (tests) *now* is passed to the script, and the
``PEXPIRE`` is still ``expires_at - now``.

Round trips: claim, complete, fail, release, extend and get are 1 each. ``claim_many``
is 1 on a single node (one script over all keys); on a cluster the keys are grouped by
hash slot, one script per slot, sent as one pipeline: 1 round trip per master node
holding any of the keys, all masters in parallel. Every inbox call (``store.inbox()``)
is 1 as well, ``admit_many`` included.

URLs (query options marked * are this store's own; the rest pass through to redis-py):

- ``redis://[[user]:password@]host[:port][/db]`` — a single node (or a proxy);
- ``rediss://…`` — the same over TLS (``ssl_cert_reqs``, ``ssl_ca_certs``,
  ``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname`` pass through);
- ``redis+cluster://[[user]:password@]host:port[,host:port…]`` — a Redis Cluster,
  found from any of the given nodes; ``?ssl=true`` for TLS.

Options: ``key_prefix``\\* (default ``idem``; no braces), ``socket_timeout``\\* and
``socket_connect_timeout``\\* (seconds, default 5), ``db`` (single node only),
``client_name``, ``health_check_interval`` (seconds), ``max_connections`` (per node;
default 100), ``socket_keepalive``, ``protocol`` (2, the default, or 3); TLS options only with
``rediss://`` or ``ssl=true``. Anything else is a
:class:`~telegram_idem.errors.ConfigurationError`.

Clients the store makes never resend a command after a connection error or timeout
(``retries=0``): a script whose reply was lost may have run, and running a claim twice
would turn the caller's own acquisition into "in progress". The error reaches the
caller as :class:`~telegram_idem.errors.StoreError` instead, and the next call
reconnects. Calls beyond ``max_connections`` wait for a free connection (redis-py's
pools would refuse them).

Errors (every message names the store's host, port and database, never the password,
and carries redis-py's own message):

- :class:`~telegram_idem.errors.ConfigurationError`, at the first call, for what no
  retry can fix: a wrong password or ACL user (``WRONGPASS``, ``NOAUTH``, an ``AUTH``
  the server does not expect), a missing ACL permission (``NOPERM``), a database index
  the server does not have (``redis://…/99``), a command the server does not know or
  has renamed, a record key holding another type (``WRONGTYPE``: another program
  writes under the store's ``key_prefix``);
- :class:`~telegram_idem.errors.StoreError` for connection errors (a host name that does
  not resolve included), timeouts, cluster-down/try-again/master-down, a replica's
  READONLY, OOM, and the refusals BUSY, NOREPLICAS and MISCONF;
- :class:`~telegram_idem.errors.StoreError` marked *unexpected* for any other Redis
  error (a script error is a bug): never a raw redis-py exception.

See ``docs/store-redis.md``.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import weakref
from collections.abc import Sequence
from typing import Any, ClassVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import redis.exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot

from telegram_idem.backends import redis_scripts
from telegram_idem.backends.base import Store, describe_error
from telegram_idem.clock import Clock
from telegram_idem.errors import ConfigurationError, IdemError, StoreError
from telegram_idem.inbox.base import Inbox
from telegram_idem.records import Claim, Outcome, Record, Status

__all__ = ["UPDATE_KEY", "RedisStore"]

RedisClient = Redis | RedisCluster
"""The clients the store accepts: ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster``."""

_DEFAULT_TIMEOUT = 5.0
_DEFAULT_PROTOCOL = 2
"""RESP2 unless the URL asks for 3: with RESP3, redis-py 8 skips its check of pooled
connections at checkout (they may hold maintenance push messages), so after a Redis
restart every idle connection would fail one call; with RESP2 they are replaced."""
_REFUSALS = frozenset({"BUSY", "NOREPLICAS", "MISCONF"})
"""Error codes redis-py raises as a plain ResponseError that mean "cannot answer now":
another script is running too long; too few replicas in sync (``min-replicas-to-write``);
a failed RDB save blocks writes (``stop-writes-on-bgsave-error``)."""
_CONFIG_TEXTS = (
    "DB index is out of range",
    "ERR DB index is out of range",
    "ERR invalid DB index",
    "invalid DB index",
    "Invalid Database",
    "unknown command",
    "ERR unknown command",
    "NOAUTH",
    "WRONGPASS",
    "NOPERM",
    "WRONGTYPE",
)
"""Starts of error messages (a plain ResponseError or ConnectionError in redis-py) that no
retry can fix: a database index the server lacks (``SELECT`` at connect), a command the
server does not know or has renamed, missing or wrong credentials, a missing ACL right,
a key of the store's prefix holding another type (another program shares the prefix)."""
_SINGLE_PASSTHROUGH = frozenset(
    {
        "db",
        "client_name",
        "health_check_interval",
        "max_connections",
        "socket_keepalive",
        "protocol",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_check_hostname",
    }
)
_CLUSTER_PASSTHROUGH = (_SINGLE_PASSTHROUGH - {"db"}) | {"ssl"}
UPDATE_KEY = re.compile(r"(?s).*:-?[0-9]+:u:-?[0-9]+")
"""The shape of an update guard key (:meth:`telegram_idem.keys.KeyBuilder.update`). On a
cluster, records with such keys live in the inbox's slot (:meth:`RedisStore.redis_key`).
Matching a few other keys too would be harmless: a record key always maps to the same
Redis key, the shape only decides which node holds it."""
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class _Script:
    """One Lua source: ``EVALSHA`` first, ``EVAL`` once on ``NOSCRIPT``."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def run(self, client: RedisClient, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except rexc.NoScriptError:
            return await client.eval(self.source, len(keys), *keys, *args)


_CLAIM = _Script(redis_scripts.CLAIM)
_COMPLETE = _Script(redis_scripts.COMPLETE)
_FAIL = _Script(redis_scripts.FAIL)
_RELEASE = _Script(redis_scripts.RELEASE)
_EXTEND = _Script(redis_scripts.EXTEND)
_GET = _Script(redis_scripts.GET)
_NOW = _Script("return redis.call('TIME')")  # KEYS[1] only routes it (a cluster's node)


def _ms(seconds: float, what: str) -> int:
    """Seconds → whole milliseconds, rounded up (a positive lease never becomes 0 ms)."""
    if not math.isfinite(seconds):
        raise ConfigurationError(f"{what} must be a finite number of seconds, got {seconds}")
    return math.ceil(seconds * 1000)


def _pool_size(client: RedisClient) -> int:
    """Connections the client may open (per node on a cluster)."""
    if isinstance(client, RedisCluster):
        size = client.connection_kwargs.get("max_connections")
    else:
        size = getattr(client.connection_pool, "max_connections", None)
    return size if isinstance(size, int) and 0 < size < 2**31 else 100


def _absent(value: object) -> bool:
    """A missing hash field: Lua ``false`` arrives as nil (RESP2), or as ``False`` from a
    server that maps it to a RESP3 boolean."""
    return value is None or value is False


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisStore(Store):
    """Records in Redis hashes, decided by Lua scripts (see the module docstring).

    Args:
        client_or_url: a ``redis.asyncio.Redis`` or ``redis.asyncio.cluster.RedisCluster``
            (made with ``decode_responses=False``; the store never closes it), or a store
            URL (the store makes the client, and closes it in :meth:`close`).
        clock: seconds since the epoch; ``None`` (the default, for production) = the
            Redis server's clock, read inside each script.
        key_prefix: first part of every Redis key (``<key_prefix>:{<record key>}``);
            a ``key_prefix`` option in the URL takes its place.

    Raises:
        ConfigurationError: a malformed URL or option, a prefix with braces, or a
            client that decodes responses (results are bytes).
        TypeError: ``client_or_url`` is neither a URL nor an asyncio Redis client.
    """

    schemes = ("redis", "rediss", "redis+cluster")
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = (
        rexc.ConnectionError,  # includes BusyLoadingError, AuthenticationError, MaxConnections
        rexc.TimeoutError,
        rexc.ClusterDownError,  # includes MasterDownError
        rexc.TryAgainError,
        rexc.ReadOnlyError,  # a replica answered: failover in progress
        rexc.OutOfMemoryError,  # maxmemory reached (with noeviction): no write possible
        rexc.SlotNotCoveredError,
        OSError,
        asyncio.TimeoutError,
    )
    config_errors: ClassVar[tuple[type[BaseException], ...]] = (
        rexc.AuthenticationError,  # WRONGPASS, NOAUTH, AUTH without a password set
        rexc.AuthorizationError,
        rexc.AuthenticationWrongNumberOfArgsError,
        rexc.NoPermissionError,  # NOPERM: the ACL user lacks a command or key
    )
    driver_base: ClassVar[tuple[type[BaseException], ...]] = (
        rexc.RedisError,
        rexc.RedisClusterException,
    )

    def __init__(
        self,
        client_or_url: RedisClient | str,
        *,
        clock: Clock | None = None,
        key_prefix: str = "idem",
    ) -> None:
        if isinstance(client_or_url, str):
            client, url_prefix = _client_from_url(client_or_url)
            key_prefix = url_prefix if url_prefix is not None else key_prefix
            self._owns_client = True
        elif isinstance(client_or_url, Redis | RedisCluster):
            client = client_or_url
            self._owns_client = False
        else:
            raise TypeError(
                "RedisStore needs a store URL, redis.asyncio.Redis or "
                f"redis.asyncio.cluster.RedisCluster, got {type(client_or_url).__name__}"
            )
        _check_prefix(key_prefix)
        encoder = client.get_encoder()
        if encoder.decode_responses:
            raise ConfigurationError(
                "RedisStore needs a client made with decode_responses=False (results are bytes)"
            )
        self._client: RedisClient = client
        self._cluster = isinstance(client, RedisCluster)
        self._clock = clock
        self.key_prefix = key_prefix
        self._closed = False
        self._discovered = False
        self._inbox: Inbox | None = None
        # Every call holds one gate slot and at most one connection per node while it
        # runs, so concurrent calls beyond the pool size wait here instead of failing
        # with MaxConnectionsError (redis-py's pools refuse, they do not queue).
        self._gate = asyncio.Semaphore(_pool_size(client))

    def __repr__(self) -> str:
        return f"RedisStore({_location(self._client)!r}, key_prefix={self.key_prefix!r})"

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> RedisStore:
        """Make the store and its client from ``url`` (formats: module docstring).

        No connection is opened until the first call.

        Args:
            url: ``redis://…``, ``rediss://…`` or ``redis+cluster://…``.
            clock: seconds since the epoch; ``None`` = the server's clock.

        Raises:
            ConfigurationError: a malformed URL or option, or an option not listed.
        """
        return cls(url, clock=clock)

    @property
    def client(self) -> RedisClient:
        """The redis-py client the store talks through."""
        return self._client

    @property
    def is_cluster(self) -> bool:
        """True when the client is a ``RedisCluster``."""
        return self._cluster

    @property
    def inbox_prefix(self) -> str:
        """The start of every inbox key: ``<key_prefix>:{<key_prefix>:inbox}:`` (one hash
        tag, so the whole inbox is one slot; see :mod:`telegram_idem.backends.redis_inbox`)."""
        return f"{self.key_prefix}:{{{self.key_prefix}:inbox}}:"

    def redis_key(self, key: str) -> str:
        """The Redis key of record ``key``: ``<key_prefix>:{<key>}``.

        On a cluster, an update guard key (:data:`UPDATE_KEY`) is stored in the inbox's
        slot instead, at ``<inbox_prefix>r:<key>``, so the inbox's admission claims it and
        writes the entry in one script.
        """
        if self._cluster and UPDATE_KEY.fullmatch(key):
            return f"{self.inbox_prefix}r:{key}"
        return f"{self.key_prefix}:{{{key}}}"

    def inbox(self) -> Inbox:
        """The durable inbox in this Redis (created on first use; see
        :mod:`telegram_idem.backends.redis_inbox`)."""
        if self._inbox is None:
            from telegram_idem.backends.redis_inbox import RedisInbox  # imports this module

            self._inbox = RedisInbox(self)
        return self._inbox

    # ----------------------------------------------------------------- plumbing

    def _now_arg(self) -> str:
        return "" if self._clock is None else str(round(self._clock() * 1000))

    def _encode_key(self, key: str) -> bytes:
        return self.redis_key(key).encode()

    async def _ready(self) -> None:
        if self._closed:
            raise StoreError("RedisStore is closed")
        if isinstance(self._client, RedisCluster) and not self._discovered:
            # Discover the cluster before the command, one client at a time per event
            # loop. Left to the first commands themselves, concurrent first commands on
            # a fresh client race and fail with "Connection closed by server" when
            # retries are 0 (redis-py 8.1); and discovery parses the server's COMMAND
            # table (~0.2 s of CPU without hiredis), so many clients discovering at
            # once starve the loop into connect timeouts.
            try:
                async with _discovery_lock():
                    await self._client.initialize()
            except rexc.RedisClusterException as exc:
                failure = _discovery_failure(exc)
                if failure is exc:
                    raise
                raise failure from exc
            self._discovered = True

    def _failure(self, exc: Exception) -> Exception:
        """The exception to raise for ``exc``: itself (a driver error, which
        :meth:`_translate` turns into a library error, or a bug), or the library error
        for a failed cluster discovery."""
        if isinstance(exc, self.driver_errors):
            self._discovered = False  # a cluster client re-discovers after an outage
            return exc
        if isinstance(exc, rexc.RedisClusterException) and _is_discovery(exc):
            return _discovery_failure(exc)
        return exc

    def _is_outage(self, exc: Exception) -> bool:
        if _is_config(exc):
            return False
        return (
            isinstance(exc, self.driver_errors)
            or _is_refusal(exc)
            or (isinstance(exc, rexc.RedisClusterException) and _is_discovery(exc))
        )

    def _translate(self, op: str, exc: Exception) -> IdemError | None:
        """Redis tells some errors apart only by their text: see the module docstring."""
        where = f"{self!r}.{op}"
        if _is_config(exc):
            return ConfigurationError(
                f"{where}: {describe_error(exc)} (check the password, ACL user, database "
                "number and key_prefix in the store URL, and the server's version)"
            )
        if _is_refusal(exc):
            return StoreError(f"{where}: Redis refused the call: {exc}", original=exc)
        return super()._translate(op, exc)

    async def _run(self, script: _Script, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        await self._ready()
        try:
            async with self._gate:
                return await script.run(self._client, keys, args)
        except Exception as exc:
            failure = self._failure(exc)
            if failure is exc:
                raise
            raise failure from exc

    def _record(self, key: str, row: Sequence[Any]) -> Record:
        _outcome, status, token, lease_ms, exp_ms, fp, result, attempts = row
        return Record(
            key=key,
            status=Status(_text(status)),
            fencing_token=int(token),
            lease_expires_at=int(lease_ms) / 1000,
            expires_at=int(exp_ms) / 1000,
            fingerprint=None if _absent(fp) else _text(fp),
            result=None if _absent(result) else bytes(result),
            attempts=int(attempts),
        )

    def _claim_of(self, key: str, row: Sequence[Any]) -> Claim:
        return Claim(Outcome(_text(row[0])), self._record(key, row))

    @staticmethod
    def _claim_args(
        now: str, lease: float, retention: float, fingerprint: str | None
    ) -> list[str | bytes]:
        return [
            now,
            str(_ms(lease, "lease")),
            str(_ms(retention, "retention")),
            "0" if fingerprint is None else "1",
            fingerprint.encode() if fingerprint is not None else b"",
        ]

    # ----------------------------------------------------------------- primitives

    async def _claim(
        self, key: str, fingerprint: str | None, lease: float, retention: float
    ) -> Claim:
        args = self._claim_args(self._now_arg(), lease, retention, fingerprint)
        rows = await self._run(_CLAIM, [self._encode_key(key)], args)
        return self._claim_of(key, rows[0])

    async def _claim_many(self, keys: Sequence[str], lease: float, retention: float) -> list[Claim]:
        if not keys:
            return []
        args = self._claim_args(self._now_arg(), lease, retention, None)
        encoded = [self._encode_key(k) for k in keys]
        if not self._cluster:
            rows = await self._run(_CLAIM, encoded, args)
            return [self._claim_of(k, row) for k, row in zip(keys, rows, strict=True)]
        groups: dict[int, list[int]] = {}
        for i, rkey in enumerate(encoded):
            groups.setdefault(key_slot(rkey), []).append(i)
        batches = [[encoded[i] for i in idx] for idx in groups.values()]
        answers = await self._claim_batches(batches, args)
        claims: list[Claim | None] = [None] * len(keys)
        for idx, rows in zip(groups.values(), answers, strict=True):
            for i, row in zip(idx, rows, strict=True):
                claims[i] = self._claim_of(keys[i], row)
        return [c for c in claims if c is not None]

    async def _claim_batches(
        self, batches: list[list[bytes]], args: Sequence[Any]
    ) -> list[list[Any]]:
        """Cluster: one claim script per slot, all in one pipeline: 1 round trip per
        master node holding any of the keys, the nodes in parallel. Batches answered
        ``NOSCRIPT`` did not run; they are sent again as ``EVAL`` in a second pipeline."""
        await self._ready()
        try:
            results = await self._pipeline("EVALSHA", _CLAIM.sha, batches, args)
            missing = [i for i, r in enumerate(results) if isinstance(r, rexc.NoScriptError)]
            if missing:
                redo = [batches[i] for i in missing]
                again = await self._pipeline("EVAL", _CLAIM.source, redo, args)
                for i, r in zip(missing, again, strict=True):
                    results[i] = r
            errors = [r for r in results if isinstance(r, Exception)]
            if errors:
                # Report an outage before a bug. The batches that did run keep their
                # claims: those keys stay in progress until their lease ends.
                outages = [e for e in errors if self._is_outage(e)]
                raise (outages or errors)[0]
        except Exception as exc:
            failure = self._failure(exc)
            if isinstance(exc, self.driver_errors):
                await self._forget_topology()
            if failure is exc:
                raise
            raise failure from exc
        return results

    async def _pipeline(
        self, command: str, script: str, batches: list[list[bytes]], args: Sequence[Any]
    ) -> list[Any]:
        """One ``command`` (EVALSHA/EVAL) per batch in one cluster pipeline; answers or
        exceptions in batch order."""
        assert isinstance(self._client, RedisCluster)
        pipe = self._client.pipeline()
        for batch in batches:
            # pipe.evalsha() is blocked by redis-py on clusters (it cannot recover from
            # NOSCRIPT itself); the raw command routes by the keys' slot all the same.
            pipe.execute_command(command, script, len(batch), *batch, *args)
        async with self._gate:
            results: list[Any] = await pipe.execute(raise_on_error=False)
        return results

    async def _forget_topology(self) -> None:
        """After a failed pipeline: make the next call re-discover the cluster.

        A failed single command marks its client for re-discovery itself; a failed
        pipeline does not, so we close the client's node connections as redis-py's own
        pipeline retry does (the client reconnects and re-discovers on next use).
        """
        self._discovered = False
        await self._client.aclose()

    async def _complete(self, key: str, token: int, result: bytes, retention: float) -> bool:
        args = [self._now_arg(), str(token), result, str(_ms(retention, "retention"))]
        return bool(await self._run(_COMPLETE, [self._encode_key(key)], args))

    async def _fail(self, key: str, token: int, error: bytes, retention: float) -> bool:
        args = [self._now_arg(), str(token), error, str(_ms(retention, "retention"))]
        return bool(await self._run(_FAIL, [self._encode_key(key)], args))

    async def _release(self, key: str, token: int) -> bool:
        args = [self._now_arg(), str(token)]
        return bool(await self._run(_RELEASE, [self._encode_key(key)], args))

    async def _extend(self, key: str, token: int, lease: float) -> bool:
        args = [self._now_arg(), str(token), str(_ms(lease, "lease"))]
        return bool(await self._run(_EXTEND, [self._encode_key(key)], args))

    async def _get(self, key: str) -> Record | None:
        row = await self._run(_GET, [self._encode_key(key)], [self._now_arg()])
        return None if _absent(row) else self._record(key, row)

    async def _now(self) -> float:
        if self._clock is not None:
            return float(self._clock())
        seconds, micros = await self._run(_NOW, [f"{self.key_prefix}:{{now}}".encode()], [])
        return int(seconds) + int(micros) / 1_000_000

    async def close(self) -> None:
        """Close the client if the store made it (from a URL); idempotent.

        Later calls raise :class:`StoreError`. A client passed in stays open.
        """
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            await self._client.aclose()


_discovery_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


def _discovery_lock() -> asyncio.Lock:
    """One lock per event loop, shared by every cluster store in it."""
    return _discovery_locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())


_DISCOVERY_OUTAGES = ("cannot be connected", "not covered", "could not agree")


def _is_discovery(exc: rexc.RedisClusterException) -> bool:
    text = str(exc)
    return "Cluster mode is not enabled" in text or any(m in text for m in _DISCOVERY_OUTAGES)


def _is_config(exc: BaseException) -> bool:
    if isinstance(exc, RedisStore.config_errors):
        return True
    return isinstance(exc, rexc.ResponseError | rexc.ConnectionError) and str(exc).startswith(
        _CONFIG_TEXTS
    )


def _is_refusal(exc: BaseException) -> bool:
    return isinstance(exc, rexc.ResponseError) and str(exc).split(" ", 1)[0] in _REFUSALS


def _location(client: RedisClient) -> str:
    """``host:port/db`` of a single-node client (``unix:<path>/db`` for a socket), the
    startup nodes of a cluster client; never credentials."""
    if isinstance(client, RedisCluster):
        nodes = ",".join(f"{n.host}:{n.port}" for n in client.startup_nodes)
        return f"cluster {nodes}"
    kwargs = client.connection_pool.connection_kwargs
    db = kwargs.get("db", 0)
    if "path" in kwargs:
        return f"unix:{kwargs['path']}/{db}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"


def _discovery_failure(exc: rexc.RedisClusterException) -> Exception:
    """What a failed cluster discovery means: a node that is no cluster node is a
    configuration error; no reachable node, uncovered slots or disagreeing nodes are an
    outage. Anything else is returned as is (a bug to see)."""
    text = str(exc)
    if "Cluster mode is not enabled" in text:
        return ConfigurationError(f"redis+cluster:// points at a node without cluster mode: {exc}")
    if any(m in text for m in _DISCOVERY_OUTAGES):
        return StoreError(f"Redis Cluster unavailable: {exc}", original=exc)
    return exc


# --------------------------------------------------------------------- URLs


def _check_prefix(prefix: str) -> None:
    if not prefix or "{" in prefix or "}" in prefix:
        raise ConfigurationError(
            f"key_prefix must be non-empty and without braces (they would become the "
            f"cluster hash tag), got {prefix!r}"
        )


def _seconds(options: dict[str, str], name: str, url: str) -> float:
    raw = options.pop(name, None)
    if raw is None:
        return _DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be seconds in {_redact(url)}") from None
    if not (value > 0 and math.isfinite(value)):
        raise ConfigurationError(f"{name} must be > 0 seconds in {_redact(url)}")
    return value


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return repr(url)
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return repr(parts._replace(netloc=f"{user}:***@{netloc}").geturl())


def _client_from_url(url: str) -> tuple[RedisClient, str | None]:
    """The client for ``url`` and the URL's ``key_prefix`` (or ``None``)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in RedisStore.schemes:
        raise ConfigurationError(f"not a Redis store URL: {_redact(url)}")
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    prefix = options.pop("key_prefix", None)
    timeouts = {
        "socket_timeout": _seconds(options, "socket_timeout", url),
        "socket_connect_timeout": _seconds(options, "socket_connect_timeout", url),
    }
    if scheme == "redis+cluster":
        allowed = _CLUSTER_PASSTHROUGH
    elif scheme == "rediss":
        allowed = _SINGLE_PASSTHROUGH
    else:  # plain TCP: a TLS option would reach redis-py's Connection as a bad keyword
        allowed = frozenset(o for o in _SINGLE_PASSTHROUGH if not o.startswith("ssl"))
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigurationError(f"unknown option(s) {unknown} in store URL {_redact(url)}")
    if options.get("protocol", "2") not in ("2", "3"):
        raise ConfigurationError(f"protocol must be 2 or 3 in {_redact(url)}")
    no_retry = Retry(NoBackoff(), 0)
    try:
        if scheme == "redis+cluster":
            return _cluster_from_url(url, parts.netloc, parts.path, options, timeouts), prefix
        if not parts.hostname:
            raise ConfigurationError(f"a Redis URL needs a host: {_redact(url)}")
        path = parts.path.strip("/")
        if path and not path.isdigit():
            raise ConfigurationError(f"the database must be a number in {_redact(url)}")
        query = urlencode(options)
        plain = parts._replace(query=query, fragment="").geturl()
        client = Redis.from_url(
            plain,
            retry=no_retry,
            protocol=_DEFAULT_PROTOCOL,  # a protocol option in the query wins
            socket_timeout=timeouts["socket_timeout"],
            socket_connect_timeout=timeouts["socket_connect_timeout"],
        )
    except ValueError as exc:  # redis-py's own parsing (ports, numbers, booleans)
        if isinstance(exc, ConfigurationError):
            raise
        raise ConfigurationError(f"bad Redis URL {_redact(url)}: {exc}") from None
    return client, prefix


def _cluster_from_url(
    url: str, netloc: str, path: str, options: dict[str, str], timeouts: dict[str, float]
) -> RedisCluster:
    if path.strip("/") not in ("", "0"):
        raise ConfigurationError(f"a Redis Cluster has only database 0: {_redact(url)}")
    userinfo, _, hosts = netloc.rpartition("@")
    nodes: list[ClusterNode] = []
    for item in hosts.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigurationError(
                f"redis+cluster:// needs host:port[,host:port…], got {_redact(url)}"
            )
        nodes.append(ClusterNode(host.strip("[]"), int(port)))
    kwargs: dict[str, Any] = dict(timeouts, protocol=_DEFAULT_PROTOCOL)
    if userinfo:
        user, _, password = userinfo.partition(":")
        kwargs["username"] = unquote(user) or None
        kwargs["password"] = unquote(password) or None
    for name, raw in options.items():
        if name in ("ssl", "ssl_check_hostname", "socket_keepalive"):
            flag = raw.lower()
            if flag not in _TRUE | _FALSE:
                raise ConfigurationError(f"{name} must be true or false in {_redact(url)}")
            kwargs[name] = flag in _TRUE
        elif name in ("max_connections", "protocol"):
            if not raw.isdigit():
                raise ConfigurationError(f"{name} must be an integer in {_redact(url)}")
            kwargs[name] = int(raw)
        elif name == "health_check_interval":
            try:
                kwargs[name] = float(raw)
            except ValueError:
                raise ConfigurationError(f"{name} must be seconds in {_redact(url)}") from None
        else:
            kwargs[name] = raw
    return RedisCluster(startup_nodes=nodes, retry=Retry(NoBackoff(), 0), **kwargs)
