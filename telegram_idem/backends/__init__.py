"""Stores, made from URLs or passed as objects.

| URL                                             | store                     | extra      |
|-------------------------------------------------|---------------------------|------------|
| ``memory://``                                   | :class:`MemoryStore`      | —          |
| ``sqlite:///path.db``                           | :class:`SQLiteStore`      | —          |
| ``postgresql://user@host/db``                   | ``PostgresStore``         | postgres   |
| ``redis://host:6379/0``, ``rediss://…``         | ``RedisStore``            | redis      |
| ``redis+cluster://host:7000``                   | ``RedisStore`` (cluster)  | redis      |
| ``dynamodb://table?region=…&endpoint_url=…``    | ``DynamoDBStore``         | dynamodb   |

Each store module is imported only when its scheme is used, so the core installs with
none of the drivers.
"""

from __future__ import annotations

from importlib import import_module
from urllib.parse import urlsplit

from telegram_idem.backends.base import Store
from telegram_idem.clock import Clock
from telegram_idem.errors import ConfigurationError

__all__ = ["SCHEMES", "Store", "store_from_url"]

SCHEMES: dict[str, tuple[str, str, str]] = {
    "memory": ("telegram_idem.backends.memory", "MemoryStore", ""),
    "sqlite": ("telegram_idem.backends.sqlite", "SQLiteStore", ""),
    "postgresql": ("telegram_idem.backends.postgres", "PostgresStore", "postgres"),
    "postgres": ("telegram_idem.backends.postgres", "PostgresStore", "postgres"),
    "redis": ("telegram_idem.backends.redis", "RedisStore", "redis"),
    "rediss": ("telegram_idem.backends.redis", "RedisStore", "redis"),
    "redis+cluster": ("telegram_idem.backends.redis", "RedisStore", "redis"),
    "dynamodb": ("telegram_idem.backends.dynamodb", "DynamoDBStore", "dynamodb"),
}
"""URL scheme → (module, class, pip extra that installs its driver)."""


def store_from_url(url: str, *, clock: Clock | None = None) -> Store:
    """Make a store from a URL (see the table in this module's docstring).

    Args:
        url: the store URL.
        clock: seconds since the epoch; ``None`` = the store's own time source.

    Raises:
        ConfigurationError: unknown scheme, malformed URL or option, or the store's
            driver is not installed (the message names the extra to install).
    """
    scheme = urlsplit(url).scheme.lower()
    if scheme not in SCHEMES:
        known = ", ".join(f"{s}://" for s in sorted(SCHEMES))
        raise ConfigurationError(f"unknown store URL scheme in {url!r}; known: {known}")
    module_name, class_name, extra = SCHEMES[scheme]
    try:
        module = import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"{url.split(':', 1)[0]}:// needs pip install 'telegram-idem[{extra}]' ({exc})"
        ) from exc
    cls: type[Store] = getattr(module, class_name)
    return cls.from_url(url, clock=clock)
