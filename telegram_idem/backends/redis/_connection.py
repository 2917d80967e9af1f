"""The connection every part of the Redis store shares: client, keys, clock, gate, errors.

:class:`RedisConnection` is what the records store
(:class:`~telegram_idem.backends.redis.RedisStore`) and its inbox
(:class:`~telegram_idem.backends.redis.RedisInbox`) hold; neither touches the other.
A later part (an outbox, a rate limiter) is one more object over the same connection.
It owns:

- the redis-py client (closed by :meth:`RedisConnection.close` only if the store made
  it) and, on a cluster, its discovery before the first call, one client at a time per
  event loop;
- the key layout (:class:`~telegram_idem.backends.redis._keys.KeyLayout`);
- the clock: the server's (``TIME`` inside each script) or the injected one, passed to
  every script as ``ARGV[1]`` (:meth:`now_arg`);
- the gate: every call holds one slot and at most one connection per node while it runs,
  so calls beyond the pool size wait instead of failing with ``MaxConnectionsError``
  (redis-py's pools refuse, they do not queue);
- one script or command with its errors translated (:meth:`call` around :meth:`run`,
  :meth:`execute` or :meth:`run_pipelined`).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.exceptions as rexc
from redis.asyncio.cluster import RedisCluster

from telegram_idem._clock import Clock
from telegram_idem.backends import _driver as driver
from telegram_idem.backends.redis._errors import (
    REDIS_ERRORS,
    discovery_failure,
    is_config,
    is_discovery,
    is_refusal,
    translate,
)
from telegram_idem.backends.redis._keys import KeyLayout
from telegram_idem.backends.redis._lane import Lane
from telegram_idem.backends.redis._scripts import Script
from telegram_idem.backends.redis._url import RedisClient
from telegram_idem.errors import ConfigurationError, IdemError, StoreError

__all__ = ["RedisConnection", "location"]

T = TypeVar("T")

_discovery_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


def _discovery_lock() -> asyncio.Lock:
    """One lock per event loop, shared by every cluster connection in it."""
    return _discovery_locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())


def _pool_size(client: RedisClient) -> int:
    """Connections the client may open (per node on a cluster)."""
    if isinstance(client, RedisCluster):
        size = client.connection_kwargs.get("max_connections")
    else:
        size = getattr(client.connection_pool, "max_connections", None)
    return size if isinstance(size, int) and 0 < size < 2**31 else 100


def location(client: RedisClient) -> str:
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


class RedisConnection:
    """One redis-py client and what every part of the store does with it.

    Args:
        client: a ``redis.asyncio.Redis`` or ``RedisCluster`` made with
            ``decode_responses=False``.
        key_prefix: the first part of every Redis key (no braces).
        label: how messages name the store (its ``repr``: location and prefix).
        clock: seconds since the epoch; ``None`` = the server's clock.
        owns_client: :meth:`close` closes the client (the store made it from a URL).
        inbox_shards: the inbox's shards (:class:`~telegram_idem.backends.redis._keys.KeyLayout`);
            ``None``: 1 (one slot, the layout of earlier versions).

    Raises:
        ConfigurationError: a bad ``key_prefix`` or ``inbox_shards``, or a client that
            decodes responses.
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        key_prefix: str,
        label: str,
        clock: Clock | None = None,
        owns_client: bool = False,
        inbox_shards: int | None = None,
    ) -> None:
        cluster = isinstance(client, RedisCluster)
        if inbox_shards is None:
            inbox_shards = 1
        self.keys = KeyLayout(key_prefix, cluster, inbox_shards)
        """Where records and the inbox live."""
        if client.get_encoder().decode_responses:
            raise ConfigurationError(
                "RedisStore needs a client made with decode_responses=False (results are bytes)"
            )
        self.client: RedisClient = client
        self.cluster = self.keys.cluster
        self.label = label
        self.clock = clock
        self._owns_client = owns_client
        self._closed = False
        self._discovered = False
        self._gate = asyncio.Semaphore(_pool_size(client))
        self.lane = Lane.for_client(client) if owns_client else None
        """The fast lane the scripts take (:mod:`telegram_idem.backends.redis._lane`), or
        ``None``: a cluster, TLS, or a client passed in (redis-py's path, as configured)."""

    def __repr__(self) -> str:
        return f"RedisConnection({self.label})"

    def now_arg(self) -> str:
        """A script's ``ARGV[1]``: ``""`` (the script reads ``TIME``), or the injected
        clock in integer milliseconds."""
        return "" if self.clock is None else str(round(self.clock() * 1000))

    # ----------------------------------------------------------------- readiness

    async def ready(self) -> None:
        """Before a call: refuse when closed; on a cluster, discover it once.

        Discovery runs before the command, one client at a time per event loop. Left to
        the first commands themselves, concurrent first commands on a fresh client race
        and fail with "Connection closed by server" when retries are 0 (redis-py 8.1);
        and discovery parses the server's COMMAND table (~0.2 s of CPU without hiredis),
        so many clients discovering at once starve the loop into connect timeouts.

        Raises:
            StoreError: closed, or the cluster cannot be discovered now.
            ConfigurationError: the node is not in cluster mode.
        """
        if self._closed:
            raise StoreError(f"{self.label} is closed")
        if isinstance(self.client, RedisCluster) and not self._discovered:
            try:
                async with _discovery_lock():
                    await self.client.initialize()
            except rexc.RedisClusterException as exc:
                failure = discovery_failure(exc)
                if failure is exc:
                    raise
                raise failure from exc
            self._discovered = True

    def failure(self, exc: Exception) -> Exception:
        """The exception to raise for ``exc``: itself (a driver error, which
        :meth:`translate` turns into a library error, or a bug), or the library error
        for a failed cluster discovery. A driver error makes a cluster re-discover.

        Args:
            exc: what a round trip raised.
        """
        if isinstance(exc, REDIS_ERRORS.transient):
            self._discovered = False  # a cluster client re-discovers after an outage
            return exc
        if isinstance(exc, rexc.RedisClusterException) and is_discovery(exc):
            return discovery_failure(exc)
        return exc

    def is_outage(self, exc: Exception) -> bool:
        """``exc`` means "cannot answer now" (not a mistake, not a bug).

        Args:
            exc: what a round trip raised.
        """
        if is_config(exc):
            return False
        return (
            isinstance(exc, REDIS_ERRORS.transient)
            or is_refusal(exc)
            or (isinstance(exc, rexc.RedisClusterException) and is_discovery(exc))
        )

    def translate(self, op: str, exc: Exception) -> IdemError | None:
        """The library error for ``exc`` raised by ``op``, or ``None`` if not redis-py's
        (see :func:`telegram_idem.backends.redis._errors.translate`).

        Args:
            op: the operation's name, for the message (``claim``, ``inbox.take``…).
            exc: what it raised.
        """
        return translate(f"{self.label}.{op}", exc)

    def call(self, op: str, fn: Callable[[], Awaitable[T]]) -> Awaitable[T]:
        """``fn()`` as operation ``op``, its driver errors translated.

        Args:
            op: the operation's name, for error messages.
            fn: the round trip(s), untranslated.

        Raises:
            StoreError: Redis cannot answer now, or the connection is closed.
            ConfigurationError: what no retry can fix (credentials, ACL, database).
        """
        return driver.call(op, fn, self.translate)

    # ----------------------------------------------------------------- round trips

    async def run(self, script: Script, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        """One script (``EVALSHA``, ``EVAL`` on ``NOSCRIPT``): on the fast lane
        (:attr:`lane`) when there is one, else through the gate on redis-py's client.

        Args:
            script: the Lua script.
            keys: its ``KEYS`` (one slot on a cluster).
            args: its ``ARGV``.

        Raises:
            StoreError: the connection is closed.
            redis.exceptions.RedisError: untranslated (:meth:`call` translates), or the
                library error of a failed discovery.
        """
        lane = self.lane
        if lane is not None:
            if self._closed:
                raise StoreError(f"{self.label} is closed")
            try:
                return await lane.call("EVALSHA", script.sha, len(keys), *keys, *args)
            except rexc.NoScriptError:
                return await lane.call("EVAL", script.source, len(keys), *keys, *args)
        await self.ready()
        try:
            async with self._gate:
                return await script.run(self.client, keys, args)
        except Exception as exc:
            failure = self.failure(exc)
            if failure is exc:
                raise
            raise failure from exc

    async def execute(self, fn: Callable[[RedisClient], Awaitable[T]]) -> T:
        """``fn(client)``: plain commands (one round trip), through the gate, like :meth:`run`.

        Args:
            fn: the commands, given the redis-py client.

        Raises:
            redis.exceptions.RedisError: untranslated, as :meth:`run`, or the library error
                of a failed discovery.
        """
        await self.ready()
        try:
            async with self._gate:
                return await fn(self.client)
        except Exception as exc:
            failure = self.failure(exc)
            if failure is exc:
                raise
            raise failure from exc

    async def run_pipelined(
        self, script: Script, batches: list[list[bytes]], args: Sequence[Any]
    ) -> list[Any]:
        """``script`` once per batch of keys (on a cluster each batch one slot), all in
        one pipeline: on a cluster 1 round trip per master node holding any of the keys,
        the nodes in parallel; on a single node 1 round trip (a pipeline without
        ``MULTI``). Batches answered ``NOSCRIPT`` did not run; they are sent again as
        ``EVAL`` in a second pipeline. Answers in batch order.

        Args:
            script: the Lua script.
            batches: the ``KEYS`` of each run (each batch one slot on a cluster).
            args: the ``ARGV`` of every run.

        Raises:
            redis.exceptions.RedisError: the first outage among the batches' errors, else
                the first error (the batches that did run keep their effects); after an
                outage the cluster is discovered again on the next call.
        """
        return await self.run_each([(script, batch, args) for batch in batches])

    async def run_each(
        self, calls: Sequence[tuple[Script, Sequence[bytes], Sequence[Any]]]
    ) -> list[Any]:
        """Several scripts, each with its own ``KEYS`` (one slot on a cluster) and ``ARGV``,
        in one pipeline, as :meth:`run_pipelined` (1 round trip per master touched, the
        masters in parallel; ``NOSCRIPT`` answers sent again as ``EVAL``). Answers in
        call order.

        Args:
            calls: ``(script, keys, args)`` of each run.

        Raises:
            redis.exceptions.RedisError: as :meth:`run_pipelined` (the runs that did run
                keep their effects).
        """
        if not calls:
            return []
        await self.ready()
        try:
            results = await self._pipe([("EVALSHA", s.sha, k, a) for s, k, a in calls])
            missing = [i for i, r in enumerate(results) if isinstance(r, rexc.NoScriptError)]
            if missing:
                redo = [("EVAL", calls[i][0].source, calls[i][1], calls[i][2]) for i in missing]
                for i, r in zip(missing, await self._pipe(redo), strict=True):
                    results[i] = r
            errors = [r for r in results if isinstance(r, Exception)]
            if errors:
                outages = [e for e in errors if self.is_outage(e)]
                raise (outages or errors)[0]
        except Exception as exc:
            failure = self.failure(exc)
            if isinstance(exc, REDIS_ERRORS.transient) and self.cluster:
                await self.forget_topology()
            if failure is exc:
                raise
            raise failure from exc
        return results

    async def _pipe(
        self, commands: Sequence[tuple[str, str, Sequence[bytes], Sequence[Any]]]
    ) -> list[Any]:
        """``(command, script, keys, args)`` each in one pipeline (the fast lane's, a
        cluster's, or a single node's without ``MULTI``): ``command`` is ``EVALSHA`` with a
        SHA or ``EVAL`` with a source; answers or exceptions in command order."""
        if self.lane is not None:
            return await self.lane.pipeline(
                [
                    (command, script, len(keys), *keys, *args)
                    for command, script, keys, args in commands
                ]
            )
        if isinstance(self.client, RedisCluster):
            pipe: Any = self.client.pipeline()
        else:
            pipe = self.client.pipeline(transaction=False)
        for command, script, keys, args in commands:
            # pipe.evalsha() is blocked by redis-py on clusters (it cannot recover from
            # NOSCRIPT itself); the raw command routes by the keys' slot all the same.
            pipe.execute_command(command, script, len(keys), *keys, *args)
        async with self._gate:
            results: list[Any] = await pipe.execute(raise_on_error=False)
        return results

    async def forget_topology(self) -> None:
        """After a failed pipeline: make the next call re-discover the cluster.

        A failed single command marks its client for re-discovery itself; a failed
        pipeline does not, so we close the client's node connections as redis-py's own
        pipeline retry does (the client reconnects and re-discovers on next use).
        """
        self._discovered = False
        await self.client.aclose()

    async def close(self) -> None:
        """Close the client if the store made it (from a URL); idempotent.

        Later calls raise :class:`StoreError`. A client passed in stays open.
        """
        if self._closed:
            return
        self._closed = True
        if self.lane is not None:
            await self.lane.close()
        if self._owns_client:
            await self.client.aclose()
