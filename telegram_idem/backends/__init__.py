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
none of the drivers. A custom :class:`Store` subclass that sets ``schemes`` serves them
too (:mod:`telegram_idem.backends.registry`).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from telegram_idem.backends.base import Store
from telegram_idem.backends.registry import BUILTIN_SCHEMES, known_schemes, store_class
from telegram_idem.backends.url import redact
from telegram_idem.clock import Clock

__all__ = ["SCHEMES", "Store", "known_schemes", "store_from_url"]

SCHEMES = BUILTIN_SCHEMES
"""Built-in URL scheme → (module, class, pip extra). Custom stores register themselves
by setting ``schemes`` (see :mod:`telegram_idem.backends.registry`)."""


def store_from_url(url: str, *, clock: Clock | None = None) -> Store:
    """Make a store from a URL (see the table in this module's docstring).

    A :class:`Store` subclass that sets ``schemes`` is found here once its module is
    imported: ``class MyStore(Store): schemes = ("mystore",)`` serves ``mystore://…``
    through its ``from_url``.

    Args:
        url: the store URL.
        clock: seconds since the epoch; ``None`` = the store's own time source.

    Raises:
        ConfigurationError: unknown scheme, malformed URL or option, or the store's
            driver is not installed (the message names the extra to install). No
            message shows the URL's password.
    """
    scheme = urlsplit(url).scheme.lower()
    return store_class(scheme, redact(url)).from_url(url, clock=clock)
