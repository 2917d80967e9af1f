"""Which redis-py exceptions mean what (docs/store-redis.md#errors).

redis-py raises some errors Redis tells apart only by their text (a plain
``ResponseError`` or ``ConnectionError``): :func:`translate` reads those first, then
classifies by class with :data:`REDIS_ERRORS`. A failed cluster discovery is a
``RedisClusterException`` whose text says whether it is an outage or a mistake
(:func:`discovery_failure`).
"""

from __future__ import annotations

import asyncio

import redis.exceptions as rexc

from telegram_idem.backends._driver import DriverErrors, describe_error
from telegram_idem.errors import ConfigurationError, IdemError, StoreError

__all__ = [
    "REDIS_ERRORS",
    "discovery_failure",
    "is_config",
    "is_discovery",
    "is_refusal",
    "translate",
]

REDIS_ERRORS = DriverErrors(
    transient=(
        rexc.ConnectionError,  # includes BusyLoadingError, AuthenticationError, MaxConnections
        rexc.TimeoutError,
        rexc.ClusterDownError,  # includes MasterDownError
        rexc.TryAgainError,
        rexc.ReadOnlyError,  # a replica answered: failover in progress
        rexc.OutOfMemoryError,  # maxmemory reached (with noeviction): no write possible
        rexc.SlotNotCoveredError,
        OSError,
        asyncio.TimeoutError,
    ),
    config=(
        rexc.AuthenticationError,  # WRONGPASS, NOAUTH, AUTH without a password set
        rexc.AuthorizationError,
        rexc.AuthenticationWrongNumberOfArgsError,
        rexc.NoPermissionError,  # NOPERM: the ACL user lacks a command or key
    ),
    base=(rexc.RedisError, rexc.RedisClusterException),
)
"""redis-py's exceptions by class: ``transient`` = cannot answer now, ``config`` =
credentials or ACL, ``base`` = all of redis-py's."""

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
_DISCOVERY_OUTAGES = ("cannot be connected", "not covered", "could not agree")


def is_config(exc: BaseException) -> bool:
    """``exc`` is a mistake no retry can fix (by class, or by its text)."""
    if isinstance(exc, REDIS_ERRORS.config):
        return True
    return isinstance(exc, rexc.ResponseError | rexc.ConnectionError) and str(exc).startswith(
        _CONFIG_TEXTS
    )


def is_refusal(exc: BaseException) -> bool:
    """``exc`` is Redis refusing for now (``BUSY``, ``NOREPLICAS``, ``MISCONF``)."""
    return isinstance(exc, rexc.ResponseError) and str(exc).split(" ", 1)[0] in _REFUSALS


def is_discovery(exc: rexc.RedisClusterException) -> bool:
    """``exc`` reports a failed cluster discovery (see :func:`discovery_failure`)."""
    text = str(exc)
    return "Cluster mode is not enabled" in text or any(m in text for m in _DISCOVERY_OUTAGES)


def discovery_failure(exc: rexc.RedisClusterException) -> Exception:
    """What a failed cluster discovery means: a node that is no cluster node is a
    configuration error; no reachable node, uncovered slots or disagreeing nodes are an
    outage. Anything else is returned as is (a bug to see)."""
    text = str(exc)
    if "Cluster mode is not enabled" in text:
        return ConfigurationError(f"redis+cluster:// points at a node without cluster mode: {exc}")
    if any(m in text for m in _DISCOVERY_OUTAGES):
        return StoreError(f"Redis Cluster unavailable: {exc}", original=exc)
    return exc


def translate(where: str, exc: Exception) -> IdemError | None:
    """The library error for ``exc``, or ``None`` when it is not redis-py's (propagated).

    Args:
        where: ``"<store repr>.<op>"`` (never a password).
        exc: what the call raised.
    """
    if is_config(exc):
        return ConfigurationError(
            f"{where}: {describe_error(exc)} (check the password, ACL user, database "
            "number and key_prefix in the store URL, and the server's version)"
        )
    if is_refusal(exc):
        return StoreError(f"{where}: Redis refused the call: {exc}", original=exc)
    return REDIS_ERRORS.translate(where, exc)
