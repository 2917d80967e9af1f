"""Where a JetStream inbox keeps things: subjects, consumers, the state bucket, message
ids and headers, and the stable hash that maps an ordering unit onto a partition."""

from __future__ import annotations

import base64
import re
import zlib
from dataclasses import dataclass

from telegram_idem.errors import ConfigurationError

__all__ = [
    "H_ADMITTED",
    "H_ID",
    "H_REDRIVE",
    "H_UNIT",
    "JetStreamLayout",
    "message_id",
    "partition_of",
]

H_ID = "Idem-Id"
"""Header: the entry id (the update guard key)."""
H_UNIT = "Idem-Unit"
"""Header: the ordering unit (``chat:<id>``, ``user:<id>``, or the entry id)."""
H_ADMITTED = "Idem-Admitted"
"""Header: seconds since the epoch (store clock) when the update was admitted."""
H_REDRIVE = "Idem-Redrive"
"""Header: present on a dead letter published again by ``redrive``."""

_UPDATE_KEY = re.compile(r":(?P<bot>-?\d+):u:(?P<update>-?\d+)$")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def message_id(update_key: str) -> str:
    """``Nats-Msg-Id`` of an admission: ``<bot_id>:<update_id>`` read from the update
    guard key (``<prefix>:<bot_id>:u:<update_id>``); the key itself when it has another
    shape (a hashed long key).

    Args:
        update_key: the update guard key.
    """
    found = _UPDATE_KEY.search(update_key)
    return f"{found['bot']}:{found['update']}" if found else update_key


def bot_token(update_key: str) -> str:
    """The subject token naming the bot (``0`` when the key does not say).

    Args:
        update_key: the update guard key.
    """
    found = _UPDATE_KEY.search(update_key)
    return found["bot"].replace("-", "m") if found else "0"


def partition_of(unit: str, partitions: int) -> int:
    """The partition of ordering unit ``unit``: CRC-32 of its UTF-8 bytes mod
    ``partitions`` (stable across processes and Python versions, unlike ``hash``).

    Args:
        unit: the ordering unit.
        partitions: how many partitions (≥ 1).
    """
    return zlib.crc32(unit.encode()) % partitions


def _token(text: str) -> str:
    """``text`` as a KV key token (URL-safe base64, no padding)."""
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@dataclass(frozen=True, slots=True)
class JetStreamLayout:
    """The names of one inbox's JetStream objects.

    Attributes:
        stream: the entry stream's name; entries are published on
            ``<stream>.<bot_id>.<partition>``.
        partitions: how many partitions (one durable consumer each).

    Raises:
        ConfigurationError: a stream name that is not 1-64 letters, digits, ``_`` or
            ``-``; ``partitions`` < 1.
    """

    stream: str
    partitions: int

    def __post_init__(self) -> None:
        if not _NAME.match(self.stream):
            raise ConfigurationError(
                f"JetStream stream name {self.stream!r}: 1-64 letters, digits, '_' or '-'"
            )
        if self.partitions < 1:
            raise ConfigurationError(f"partitions must be ≥ 1, got {self.partitions}")

    def subject(self, update_key: str, unit: str) -> str:
        """The subject of an entry: ``<stream>.<bot_id>.<partition>``.

        Args:
            update_key: the entry id (its bot id names the bot token).
            unit: its ordering unit (hashed onto the partition).
        """
        return f"{self.stream}.{bot_token(update_key)}.{partition_of(unit, self.partitions)}"

    def filter(self, partition: int) -> str:
        """The subject filter of ``partition``'s consumer (every bot).

        Args:
            partition: 0 ≤ partition < ``partitions``.
        """
        return f"{self.stream}.*.{partition}"

    def consumer(self, partition: int) -> str:
        """The durable consumer of ``partition``.

        Args:
            partition: 0 ≤ partition < ``partitions``.
        """
        return f"{self.stream}_p{partition}"

    @property
    def bucket(self) -> str:
        """The key-value bucket of entry states (its stream is ``KV_<bucket>``)."""
        return f"{self.stream}_state"

    @property
    def bucket_stream(self) -> str:
        """The stream under :attr:`bucket`."""
        return f"KV_{self.bucket}"

    @staticmethod
    def entry_key(entry_id: str) -> str:
        """The bucket key of entry ``entry_id``: ``e.<base64url(id)>``.

        Args:
            entry_id: the entry id (update guard key).
        """
        return f"e.{_token(entry_id)}"
