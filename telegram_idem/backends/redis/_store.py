"""The records part of the Redis store: :class:`RedisStore`, over a
:class:`~telegram_idem.backends.redis._connection.RedisConnection`.

Each primitive is one script of :mod:`telegram_idem.backends.redis._scripts`; on a
cluster ``claim_many`` groups its keys by hash slot, one script per slot, all in one
pipeline. :meth:`RedisStore.inbox`, :meth:`RedisStore.outbox`,
:meth:`RedisStore.flood_budget` and :meth:`RedisStore.ledger` build their parts over the
same connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from telegram_idem._clock import Clock
from telegram_idem._records import Claim, Outcome, Record
from telegram_idem.backends._base import Store
from telegram_idem.backends.redis._browse import RedisBrowsing
from telegram_idem.backends.redis._connection import RedisConnection, location
from telegram_idem.backends.redis._errors import REDIS_ERRORS
from telegram_idem.backends.redis._flood import RedisFloodBudget
from telegram_idem.backends.redis._inbox import RedisInbox
from telegram_idem.backends.redis._ledger import RedisLedger
from telegram_idem.backends.redis._outbox import RedisOutbox
from telegram_idem.backends.redis._scripts import SCRIPTS, absent, ms, record_of
from telegram_idem.backends.redis._url import SCHEMES, RedisClient, client_from_url
from telegram_idem.errors import IdemError
from telegram_idem.flood import FloodBudget
from telegram_idem.inbox import Inbox
from telegram_idem.outbox import Outbox

__all__ = ["RedisStore"]

_CLAIM = SCRIPTS["claim"]
_COMPLETE = SCRIPTS["complete"]
_FAIL = SCRIPTS["fail"]
_RELEASE = SCRIPTS["release"]
_EXTEND = SCRIPTS["extend"]
_GET = SCRIPTS["get"]
_NOW = SCRIPTS["now"]


_OUTCOME: dict[bytes | str, Outcome] = {
    **{outcome.value.encode(): outcome for outcome in Outcome},
    **{outcome.value: outcome for outcome in Outcome},
}


def _claim_of(key: str, row: Sequence[Any]) -> Claim:
    return Claim(_OUTCOME[row[0]], record_of(key, row))


def _claim_args(
    now: str, lease: float, retention: float, fingerprint: str | None
) -> list[str | bytes]:
    return [
        now,
        str(ms(lease, "lease")),
        str(ms(retention, "retention")),
        "0" if fingerprint is None else "1",
        fingerprint.encode() if fingerprint is not None else b"",
    ]


class RedisStore(RedisBrowsing, Store):
    """Records in Redis hashes, decided by Lua scripts (see the module docstring).
    Lists, counts and deletes records by key prefix (``SCAN``, never ``KEYS``) and checks
    the server (:class:`~telegram_idem.backends.redis._browse.RedisBrowsing`).

    Args:
        client_or_url: a ``redis.asyncio.Redis`` or ``redis.asyncio.cluster.RedisCluster``
            (made with ``decode_responses=False``; the store never closes it), or a store
            URL (the store makes the client, and closes it in :meth:`close`).
        clock: seconds since the epoch; ``None`` (the default, for production) = the
            Redis server's clock, read inside each script.
        key_prefix: first part of every Redis key (``<key_prefix>:{<record key>}``);
            a ``key_prefix`` option in the URL takes its place.
        inbox_shards: how many shards the inbox is split into by ordering key (see
            :class:`~telegram_idem.backends.redis.RedisInbox`); ``None`` (the default):
            1 (one slot, the layout of earlier versions, so an upgrade finds its
            inbox and its update guards where they were); on a new cluster
            deployment give 16 (the inbox and the update guards spread over the
            masters). An
            ``inbox_shards`` option in the URL takes its place.

    Raises:
        ConfigurationError: a malformed URL or option, a prefix with braces, an
            ``inbox_shards`` outside 1–1024, or a client that decodes responses
            (results are bytes).
        TypeError: ``client_or_url`` is neither a URL nor an asyncio Redis client.
    """

    __module__ = "telegram_idem.backends.redis"  # its public home (and the scheme table's)
    schemes = SCHEMES
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = REDIS_ERRORS.transient
    config_errors: ClassVar[tuple[type[BaseException], ...]] = REDIS_ERRORS.config
    driver_base: ClassVar[tuple[type[BaseException], ...]] = REDIS_ERRORS.base

    def __init__(
        self,
        client_or_url: RedisClient | str,
        *,
        clock: Clock | None = None,
        key_prefix: str = "idem",
        inbox_shards: int | None = None,
    ) -> None:
        if isinstance(client_or_url, str):
            client, url_prefix, url_shards = client_from_url(client_or_url)
            key_prefix = url_prefix if url_prefix is not None else key_prefix
            inbox_shards = url_shards if url_shards is not None else inbox_shards
            owns_client = True
        elif isinstance(client_or_url, Redis | RedisCluster):
            client = client_or_url
            owns_client = False
        else:
            raise TypeError(
                "RedisStore needs a store URL, redis.asyncio.Redis or "
                f"redis.asyncio.cluster.RedisCluster, got {type(client_or_url).__name__}"
            )
        self.connection = RedisConnection(
            client,
            key_prefix=key_prefix,
            label=f"RedisStore({location(client)!r}, key_prefix={key_prefix!r})",
            clock=clock,
            owns_client=owns_client,
            inbox_shards=inbox_shards,
        )
        """The client, keys, clock, gate and error translation this store and its inbox
        share."""
        self.key_prefix = key_prefix
        self._keys = self.connection.keys
        self._inbox: RedisInbox | None = None
        self._outbox: RedisOutbox | None = None
        self._flood: RedisFloodBudget | None = None
        self._ledger: RedisLedger | None = None

    def __repr__(self) -> str:
        return self.connection.label

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> RedisStore:
        """Make the store and its client from ``url`` (formats: the package docstring).

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
        return self.connection.client

    @property
    def is_cluster(self) -> bool:
        """True when the client is a ``RedisCluster``."""
        return self.connection.cluster

    @property
    def inbox_prefix(self) -> str:
        """The start of a one-shard inbox's keys: ``<key_prefix>:{<key_prefix>:inbox}:``
        (one hash tag, so the whole inbox is one slot; a sharded inbox keeps its
        store-wide ``seq`` counter there; see :class:`RedisInbox`)."""
        return self._keys.inbox_prefix

    def redis_key(self, key: str) -> str:
        """The Redis key of record ``key``: ``<key_prefix>:{<key>}``.

        On a cluster with a one-shard inbox (``inbox_shards=1``), an update guard key
        (:data:`~telegram_idem.backends.redis.UPDATE_KEY`) is stored in the inbox's slot
        instead, at ``<inbox_prefix>r:<key>``, so the inbox's admission claims it and
        writes the entry in one script.

        Args:
            key: the record's full key.
        """
        return self._keys.record(key)

    def inbox(self) -> Inbox:
        """The durable inbox in this Redis, over this store's connection (created on
        first use; see :class:`RedisInbox`)."""
        if self._inbox is None:
            self._inbox = RedisInbox(self.connection)
        return self._inbox

    def outbox(self) -> Outbox:
        """The durable outbox of Bot API calls in this Redis, over this store's
        connection (created on first use; see :class:`RedisOutbox`)."""
        if self._outbox is None:
            self._outbox = RedisOutbox(self.connection)
        return self._outbox

    def flood_budget(self) -> FloodBudget:
        """The flood-control budgets in this Redis, shared by every process using it,
        over this store's connection (created on first use; see
        :class:`RedisFloodBudget`)."""
        if self._flood is None:
            self._flood = RedisFloodBudget(self.connection)
        return self._flood

    def ledger(self) -> RedisLedger:
        """The effect ledger in this Redis, over this store's connection (created on first
        use, the same object on every call; see :class:`RedisLedger`)."""
        if self._ledger is None:
            self._ledger = RedisLedger(self.connection)
        return self._ledger

    def _translate(self, op: str, exc: Exception) -> IdemError | None:
        """The connection's translation (Redis tells some errors apart only by text)."""
        return self.connection.translate(op, exc)

    def _encode_key(self, key: str) -> bytes:
        return self._keys.record(key).encode()

    # ----------------------------------------------------------------- primitives

    async def _claim(
        self, key: str, fingerprint: str | None, lease: float, retention: float
    ) -> Claim:
        args = _claim_args(self.connection.now_arg(), lease, retention, fingerprint)
        rows = await self.connection.run(_CLAIM, [self._encode_key(key)], args)
        return _claim_of(key, rows[0])

    async def _claim_many(self, keys: Sequence[str], lease: float, retention: float) -> list[Claim]:
        if not keys:
            return []
        args = _claim_args(self.connection.now_arg(), lease, retention, None)
        encoded = [self._encode_key(k) for k in keys]
        if not self.connection.cluster:
            rows = await self.connection.run(_CLAIM, encoded, args)
            return [_claim_of(k, row) for k, row in zip(keys, rows, strict=True)]
        groups: dict[int, list[int]] = {}
        for i, rkey in enumerate(encoded):
            groups.setdefault(key_slot(rkey), []).append(i)
        batches = [[encoded[i] for i in idx] for idx in groups.values()]
        answers = await self.connection.run_pipelined(_CLAIM, batches, args)
        claims: list[Claim | None] = [None] * len(keys)
        for idx, rows in zip(groups.values(), answers, strict=True):
            for i, row in zip(idx, rows, strict=True):
                claims[i] = _claim_of(keys[i], row)
        return [c for c in claims if c is not None]

    async def _complete(self, key: str, token: int, result: bytes, retention: float) -> bool:
        args = [self.connection.now_arg(), str(token), result, str(ms(retention, "retention"))]
        return bool(await self.connection.run(_COMPLETE, [self._encode_key(key)], args))

    async def _fail(self, key: str, token: int, error: bytes, retention: float) -> bool:
        args = [self.connection.now_arg(), str(token), error, str(ms(retention, "retention"))]
        return bool(await self.connection.run(_FAIL, [self._encode_key(key)], args))

    async def _release(self, key: str, token: int) -> bool:
        args = [self.connection.now_arg(), str(token)]
        return bool(await self.connection.run(_RELEASE, [self._encode_key(key)], args))

    async def _extend(self, key: str, token: int, lease: float) -> bool:
        args = [self.connection.now_arg(), str(token), str(ms(lease, "lease"))]
        return bool(await self.connection.run(_EXTEND, [self._encode_key(key)], args))

    async def _get(self, key: str) -> Record | None:
        row = await self.connection.run(_GET, [self._encode_key(key)], [self.connection.now_arg()])
        return None if absent(row) else record_of(key, row)

    async def _now(self) -> float:
        if self.connection.clock is not None:
            return float(self.connection.clock())
        seconds, micros = await self.connection.run(_NOW, [self._keys.now_key], [])
        return int(seconds) + int(micros) / 1_000_000

    async def close(self) -> None:
        """Close the client if the store made it (from a URL); idempotent.

        Later calls raise :class:`StoreError`. A client passed in stays open.
        """
        await self.connection.close()
