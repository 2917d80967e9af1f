"""Where the Redis store keeps things: the key of each record and of the inbox.

A record is one hash at ``<key_prefix>:{<record key>}``: the braces make the whole
record key the cluster hash tag, so every single-key script touches one slot.

The inbox is split into :attr:`KeyLayout.inbox_shards` shards by its ordering key
(:meth:`KeyLayout.inbox_shard`). With one shard (the default on a single node) it lives
under ONE hash tag, ``<key_prefix>:{<key_prefix>:inbox}:`` (one slot, one node), and on
a cluster the update guard records live in that slot too (:data:`UPDATE_KEY`), so
admission claims the guard and writes the entry in one script. With ``N > 1`` shards
(e.g. :data:`CLUSTER_INBOX_SHARDS` on a new cluster deployment) shard ``i`` lives under
``<key_prefix>:{<key_prefix>:inbox:<i>}:`` and every update guard stays at its own
``<key_prefix>:{<key>}`` (spread over the cluster); the store-wide admission counter
stays at ``<key_prefix>:{<key_prefix>:inbox}:seq``, where a one-shard inbox keeps it.

The outbox of each bot lives under its own hash tag, ``{<key_prefix>:outbox:<bot_id>}``
(one slot per bot: every outbox script is about one bot), beside a store-wide directory
``<key_prefix>:{<key_prefix>:outbox}:`` (the set of bots with an outbox, and on a single
node the store-wide ``seq`` counter). A flood budget ``<head>:f:<scope>`` (the shape of
:meth:`telegram_idem._keys.KeyBuilder.flood`, ``head`` = ``<prefix>:<bot_id>``) is kept at
``<key_prefix>:f:{<head>}:<scope>``: every budget of a bot in one slot, so a reservation
over several of them is one script.

The effect ledger lives under ONE hash tag, ``<key_prefix>:{<key_prefix>:ledger}:``
(:attr:`KeyLayout.ledger_base`): a hash per row at ``<base>r:<key>`` and the index
``<base>i`` (a sorted set of keys by ``started_at``), so every ledger script touches one
slot, listing included.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from telegram_idem.errors import ConfigurationError

__all__ = [
    "CLUSTER_INBOX_SHARDS",
    "FLOOD_KEY",
    "MAX_INBOX_SHARDS",
    "UPDATE_KEY",
    "KeyLayout",
    "check_prefix",
    "check_shards",
]

CLUSTER_INBOX_SHARDS = 16
"""The inbox's shards recommended for a NEW deployment on a Redis Cluster
(``inbox_shards=16``; the store's default stays 1 everywhere, because changing the count
of a running inbox needs the drain that ``docs/store-redis.md`` describes): enough to spread over a few dozen masters, few enough that a ``take``, which asks every
shard for its oldest takeable entry, stays cheap."""

MAX_INBOX_SHARDS = 1024
"""The most inbox shards a store accepts (a ``take`` asks each of them)."""

UPDATE_KEY = re.compile(r"(?s).*:-?[0-9]+:u:-?[0-9]+")
"""The shape of an update guard key (:meth:`telegram_idem._keys.KeyBuilder.update`). On a
cluster with a one-shard inbox, records with such keys live in the inbox's slot
(:meth:`KeyLayout.record`).
Matching a few other keys too would be harmless: a record key always maps to the same
Redis key, the shape only decides which node holds it."""


FLOOD_KEY = re.compile(r"(?s)(.*?:-?[0-9]+):f:(.*)")
"""The shape of a flood budget key (:meth:`telegram_idem._keys.KeyBuilder.flood`): group 1
is ``<prefix>:<bot_id>`` (the budget's hash tag), group 2 the scope."""


def check_prefix(prefix: str) -> None:
    """Accept a ``key_prefix``: non-empty, without braces.

    Raises:
        ConfigurationError: empty, or with ``{`` or ``}`` (they would become the cluster
            hash tag and put every record in one slot).
    """
    if not prefix or "{" in prefix or "}" in prefix:
        raise ConfigurationError(
            f"key_prefix must be non-empty and without braces (they would become the "
            f"cluster hash tag), got {prefix!r}"
        )


def check_shards(shards: int) -> None:
    """Accept an ``inbox_shards``: an integer from 1 to :data:`MAX_INBOX_SHARDS`.

    Raises:
        ConfigurationError: not an integer, or out of that range.
    """
    if isinstance(shards, bool) or not isinstance(shards, int):
        raise ConfigurationError(f"inbox_shards must be an integer, got {shards!r}")
    if not 1 <= shards <= MAX_INBOX_SHARDS:
        raise ConfigurationError(f"inbox_shards must be from 1 to {MAX_INBOX_SHARDS}, got {shards}")


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """The Redis keys of one store.

    Attributes:
        prefix: the ``key_prefix`` (checked by :func:`check_prefix`).
        cluster: the store talks to a Redis Cluster.
        inbox_shards: how many shards the inbox is split into (checked by
            :func:`check_shards`); with one on a cluster, update guards move to the
            inbox's slot (:attr:`guards_in_inbox`).

    Raises:
        ConfigurationError: a bad ``prefix`` or ``inbox_shards``.
    """

    prefix: str
    cluster: bool
    inbox_shards: int = 1

    def __post_init__(self) -> None:
        check_prefix(self.prefix)
        check_shards(self.inbox_shards)

    @property
    def inbox_prefix(self) -> str:
        """The start of the one-shard inbox's keys: ``<key_prefix>:{<key_prefix>:inbox}:``
        (also where a sharded inbox keeps its store-wide ``seq`` counter)."""
        return f"{self.prefix}:{{{self.prefix}:inbox}}:"

    @property
    def sharded(self) -> bool:
        """The inbox has more than one shard (admission is then several scripts)."""
        return self.inbox_shards > 1

    @property
    def guards_in_inbox(self) -> bool:
        """Update guard records live in the inbox's slot (a cluster, one shard)."""
        return self.cluster and not self.sharded

    def inbox_shard_prefix(self, shard: int) -> str:
        """The start of shard ``shard``'s inbox keys: :attr:`inbox_prefix` with one
        shard, else ``<key_prefix>:{<key_prefix>:inbox:<shard>}:``.

        Args:
            shard: the shard, from 0 to ``inbox_shards - 1``.
        """
        if not self.sharded:
            return self.inbox_prefix
        return f"{self.prefix}:{{{self.prefix}:inbox:{shard}}}:"

    def inbox_shard(self, ordering_key: str) -> int:
        """The shard of an ordering key: CRC-32 of its UTF-8 bytes modulo
        ``inbox_shards`` (stable across processes and versions).

        Args:
            ordering_key: the entry's ordering unit (chat, user, or its own id).
        """
        return zlib.crc32(ordering_key.encode()) % self.inbox_shards

    @property
    def ledger_base(self) -> str:
        """The start of every ledger key: ``<key_prefix>:{<key_prefix>:ledger}:`` (one hash
        tag: the rows and their index share a slot)."""
        return f"{self.prefix}:{{{self.prefix}:ledger}}:"

    @property
    def now_key(self) -> bytes:
        """The key that routes the clock script (``TIME``) to a node."""
        return f"{self.prefix}:{{now}}".encode()

    def record(self, key: str) -> str:
        """The Redis key of record ``key``: ``<key_prefix>:{<key>}``; on a cluster with a
        one-shard inbox an update guard key (:data:`UPDATE_KEY`) is
        ``<inbox_prefix>r:<key>`` instead.

        Args:
            key: the record's full key.
        """
        if self.guards_in_inbox and UPDATE_KEY.fullmatch(key):
            return f"{self.inbox_prefix}r:{key}"
        return f"{self.prefix}:{{{key}}}"

    @property
    def outbox_directory(self) -> str:
        """The store-wide outbox keys' start: ``<key_prefix>:{<key_prefix>:outbox}:``."""
        return f"{self.prefix}:{{{self.prefix}:outbox}}:"

    def outbox_base(self, bot_id: int) -> str:
        """The start of every outbox key of ``bot_id``:
        ``<key_prefix>:{<key_prefix>:outbox:<bot_id>}:`` (one hash tag per bot).

        Args:
            bot_id: the bot.
        """
        return f"{self.prefix}:{{{self.prefix}:outbox:{bot_id}}}:"

    def outbox_seq(self, bot_id: int) -> str:
        """The counter that gives ``bot_id``'s entries their ``seq``: store-wide on a
        single node (``<directory>seq``), the bot's own on a cluster (``<base>seq``: a
        script touches one slot).

        Args:
            bot_id: the bot.
        """
        if self.cluster:
            return f"{self.outbox_base(bot_id)}seq"
        return f"{self.outbox_directory}seq"

    def flood(self, key: str) -> str:
        """The Redis key of flood budget ``key``: ``<key_prefix>:f:{<head>}:<scope>`` for a
        key of the :data:`FLOOD_KEY` shape (a bot's budgets share a slot), else
        ``<key_prefix>:f:{<key>}``.

        Args:
            key: the budget's key (a bucket's ``key``).
        """
        match = FLOOD_KEY.fullmatch(key)
        if match is None:
            return f"{self.prefix}:f:{{{key}}}"
        return f"{self.prefix}:f:{{{match.group(1)}}}:{match.group(2)}"
