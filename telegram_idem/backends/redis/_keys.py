"""Where the Redis store keeps things: the key of each record and of the inbox.

A record is one hash at ``<key_prefix>:{<record key>}``: the braces make the whole
record key the cluster hash tag, so every single-key script touches one slot. The inbox
lives under ONE hash tag, ``<key_prefix>:{<key_prefix>:inbox}:`` (one slot, one node),
and on a cluster the update guard records live in that slot too (:data:`UPDATE_KEY`), so
admission claims the guard and writes the entry in one script.

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
from dataclasses import dataclass

from telegram_idem.errors import ConfigurationError

__all__ = ["FLOOD_KEY", "UPDATE_KEY", "KeyLayout", "check_prefix"]

UPDATE_KEY = re.compile(r"(?s).*:-?[0-9]+:u:-?[0-9]+")
"""The shape of an update guard key (:meth:`telegram_idem._keys.KeyBuilder.update`). On a
cluster, records with such keys live in the inbox's slot (:meth:`KeyLayout.record`).
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


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """The Redis keys of one store.

    Attributes:
        prefix: the ``key_prefix`` (checked by :func:`check_prefix`).
        cluster: the store talks to a Redis Cluster (update guards move to the inbox's slot).

    Raises:
        ConfigurationError: a bad ``prefix``.
    """

    prefix: str
    cluster: bool

    def __post_init__(self) -> None:
        check_prefix(self.prefix)

    @property
    def inbox_prefix(self) -> str:
        """The start of every inbox key: ``<key_prefix>:{<key_prefix>:inbox}:``."""
        return f"{self.prefix}:{{{self.prefix}:inbox}}:"

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
        """The Redis key of record ``key``: ``<key_prefix>:{<key>}``; on a cluster an
        update guard key (:data:`UPDATE_KEY`) is ``<inbox_prefix>r:<key>`` instead.

        Args:
            key: the record's full key.
        """
        if self.cluster and UPDATE_KEY.fullmatch(key):
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
