"""The Redis store's browsing and health check (the
:class:`~telegram_idem.backends.Browsable` and :class:`~telegram_idem.backends.Checkable`
abilities), over the store's :class:`~telegram_idem.backends.redis.RedisConnection`.

Records are found with ``SCAN … MATCH`` over the store's own key namespace, never
``KEYS``: the pattern is the Redis key of a record whose key starts with the prefix
(``<key_prefix>:{<prefix>*}``, and on a cluster also the update guards' place in the
inbox's slot, ``<inbox_prefix>r:<prefix>*``), every glob character of the key prefix and
of the prefix escaped (:func:`glob_escape`). On a cluster every master is scanned
(redis-py's ``scan_iter`` walks the primaries). A key is taken as a record only if the
layout maps its record key back to it (:meth:`KeyLayout.record`).

Costs: ``records`` and ``count_records`` scan the whole keyspace (``SCAN`` visits every
key to match any: about ``dbsize / 1000`` round trips per master), then read the
chosen records in one pipeline; ``delete_records`` scans until it has ``limit`` keys and
unlinks them (``UNLINK``: freed in the background).
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio.cluster import RedisCluster

from telegram_idem._records import Record
from telegram_idem.backends._browse import check_limit, stored_prefix
from telegram_idem.backends._health import StoreHealth
from telegram_idem.backends.redis._connection import RedisConnection
from telegram_idem.backends.redis._scripts import SCRIPTS, absent, record_of, text
from telegram_idem.backends.redis._url import RedisClient

__all__ = ["RedisBrowsing", "glob_escape"]

_GET = SCRIPTS["get"]
_SCAN_COUNT = 1000
_SPARE = 16
"""Keys read beyond ``limit`` by ``records``, for records past retention that Redis has
not forgotten yet (it forgets each at its retention end, ``PEXPIRE``)."""
_SAFE_POLICIES = ("noeviction",)
"""``maxmemory-policy`` values that never evict a record before its retention ends (every
record has a TTL, so the ``volatile-*`` policies evict them too)."""


def glob_escape(text: str) -> str:
    """``text`` as a Redis glob pattern that matches itself only (``\\``, ``*``, ``?``,
    ``[``, ``]`` escaped with a backslash)."""
    for char in ("\\", "*", "?", "[", "]"):
        text = text.replace(char, "\\" + char)
    return text


def _per_node(answer: Any) -> list[Any]:
    """A cluster command's answers (``{node: answer}``) or a single node's, as a list."""
    if isinstance(answer, dict) and answer and all(isinstance(v, dict) for v in answer.values()):
        return list(answer.values())
    return [answer]


class RedisBrowsing:
    """Mixed into :class:`~telegram_idem.backends.redis.RedisStore`."""

    connection: RedisConnection

    def _patterns(self, prefix: str) -> list[str]:
        keys = self.connection.keys
        start = glob_escape(stored_prefix(prefix))
        patterns = [f"{glob_escape(keys.prefix + ':{')}{start}*}}"]
        if keys.guards_in_inbox:
            patterns.append(f"{glob_escape(keys.inbox_prefix + 'r:')}{start}*")
        return patterns

    def _record_key(self, redis_key: bytes) -> str | None:
        """The record key whose Redis key is ``redis_key``, or ``None`` if none is."""
        keys = self.connection.keys
        raw = redis_key.decode("utf-8", "replace")
        heads = [keys.prefix + ":{"] + ([keys.inbox_prefix + "r:"] if keys.guards_in_inbox else [])
        for head in heads:
            if raw.startswith(head):
                key = raw[len(head) :]
                key = key[:-1] if head.endswith("{") and key.endswith("}") else key
                if keys.record(key).encode() == redis_key:
                    return key
        return None

    async def _scan(self, prefix: str) -> AsyncIterator[tuple[str, bytes]]:
        """(record key, Redis key) of every record stored under ``prefix``, unordered;
        each ``SCAN`` page is one round trip, its errors untranslated."""
        client = self.connection.client
        for pattern in self._patterns(prefix):
            async for redis_key in client.scan_iter(match=pattern, count=_SCAN_COUNT):
                key = self._record_key(bytes(redis_key))
                if key is not None:
                    yield key, bytes(redis_key)

    async def _gather(self, prefix: str, limit: int | None) -> list[tuple[str, bytes]]:
        """The first ``limit`` (all: ``None``) of :meth:`_scan` in key order, holding
        at most ``2 * limit`` keys in memory while the scan runs."""

        async def scan(_client: RedisClient) -> list[tuple[str, bytes]]:
            found: list[tuple[str, bytes]] = []
            async for pair in self._scan(prefix):
                found.append(pair)
                if limit is not None and len(found) >= 2 * limit:
                    found = heapq.nsmallest(limit, found)
            return found if limit is None else heapq.nsmallest(limit, found)

        return await self.connection.execute(scan)

    async def records(self, *, prefix: str, limit: int = 100) -> list[Record]:
        """The live records whose key starts with ``prefix``, the first ``limit`` in key
        (code point) order (:class:`~telegram_idem.backends.Browsable`): the whole
        keyspace is scanned, the first keys are read in one pipeline.

        Raises:
            ConfigurationError: ``limit`` < 1, or an ACL forbids ``SCAN``.
            StoreError: Redis could not answer.
        """
        check_limit(limit)

        async def run() -> list[Record]:
            chosen = sorted(await self._gather(prefix, limit + _SPARE))
            if not chosen:
                return []
            now = self.connection.now_arg()
            rows = await self.connection.run_pipelined(
                _GET, [[redis_key] for _, redis_key in chosen], [now]
            )
            out = [
                record_of(key, row)
                for (key, _), row in zip(chosen, rows, strict=True)
                if not absent(row)
            ]
            return out[:limit]

        return await self.connection.call("records", run)

    async def count_records(self, *, prefix: str, expired: bool = False) -> int:
        """How many records are stored under ``prefix`` (a whole-keyspace ``SCAN``,
        counted as it goes).
        With ``expired``: 0, since Redis forgets each record when its retention ends
        (``PEXPIRE``), so there is nothing for a purge to do.

        Raises:
            ConfigurationError: an ACL forbids ``SCAN``.
            StoreError: Redis could not answer.
        """
        if expired:
            return 0

        async def count(_client: RedisClient) -> int:
            n = 0
            async for _ in self._scan(prefix):
                n += 1
            return n

        return await self.connection.call("count_records", lambda: self.connection.execute(count))

    async def delete_records(self, *, prefix: str, limit: int = 1000) -> int:
        """Delete up to ``limit`` records stored under ``prefix``: ``SCAN`` until that
        many are found, then one ``UNLINK`` (on a cluster split by slot); returns how
        many Redis deleted.

        Raises:
            ConfigurationError: ``limit`` < 1, or an ACL forbids ``SCAN`` or ``UNLINK``.
            StoreError: Redis could not answer.
        """
        check_limit(limit)

        async def run(client: RedisClient) -> int:
            doomed: list[bytes] = []
            async for _key, redis_key in self._scan(prefix):
                doomed.append(redis_key)
                if len(doomed) >= limit:
                    break
            if not doomed:
                return 0
            return int(await client.unlink(*doomed))

        return await self.connection.call("delete_records", lambda: self.connection.execute(run))

    async def health(self) -> StoreHealth:
        """Each master's Redis version (≥ 5 needed: the scripts read ``TIME`` and
        replicate their effects) and its ``maxmemory-policy`` (anything but
        ``noeviction`` may evict a live record, and a duplicate then runs again; not
        checked where ``CONFIG GET`` is refused, as on many managed services).

        Raises:
            ConfigurationError: wrong password or ACL user.
            StoreError: Redis could not answer.
        """
        cluster = self.connection.cluster

        async def run(client: RedisClient) -> tuple[list[str], list[str] | None]:
            where: dict[str, Any] = {"target_nodes": RedisCluster.PRIMARIES} if cluster else {}
            infos = _per_node(await client.info("server", **where))
            versions = [str(info.get("redis_version", "?")) for info in infos]
            try:
                configs = _per_node(await client.config_get("maxmemory-policy", **where))
            except Exception as exc:
                if self.connection.is_outage(exc):
                    raise
                return versions, None  # CONFIG refused (renamed, ACL, managed service)
            policies = [text(c.get("maxmemory-policy", b"?")) for c in configs]
            return versions, policies

        versions, policies = await self.connection.call(
            "health", lambda: self.connection.execute(run)
        )
        problems: list[str] = []
        for version in sorted(set(versions)):
            major = version.split(".", 1)[0]
            if major.isdigit() and int(major) < 5:
                problems.append(f"Redis {version} is too old: the store needs Redis ≥ 5")
        for policy in sorted(set(policies or [])):
            if policy not in _SAFE_POLICIES:
                problems.append(
                    f"maxmemory-policy is {policy}: Redis may evict live records (a "
                    "duplicate then runs again); set noeviction"
                )
        shown = sorted(set(versions))
        server = "Redis " + ", ".join(shown)
        if cluster:
            server += f" (cluster, {len(versions)} masters)"
        checked = "maxmemory-policy" if policies is not None else "(CONFIG GET refused)"
        return StoreHealth(
            server=server,
            compared=f"server version and {checked}; Redis keeps no tables or schema "
            "version (the scripts load on first use)",
            problems=tuple(problems),
        )
