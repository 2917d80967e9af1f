"""Stores, made from URLs or passed as objects.

| URL                                             | store                     | extra      |
|-------------------------------------------------|---------------------------|------------|
| ``memory://``                                   | :class:`MemoryStore`      | —          |
| ``sqlite:///path.db``                           | :class:`SQLiteStore`      | —          |
| ``postgresql://user@host/db``                   | ``PostgresStore``         | postgres   |
| ``redis://host:6379/0``, ``rediss://…``         | ``RedisStore``            | redis      |
| ``redis+cluster://host:7000``                   | ``RedisStore`` (cluster)  | redis      |
| ``dynamodb://table?region=…&endpoint_url=…``    | ``DynamoDBStore``         | dynamodb   |

(The table the code reads is :data:`telegram_idem.backends._registry.BUILTIN_STORES`.)
Each store module is imported only when its scheme is used, so the core installs with
none of the drivers. A custom :class:`Store` subclass that declares schemes serves them
too, and so does a store a distribution declares as an entry point
(:mod:`telegram_idem.backends._registry`). What a store can do beyond the record
primitives (an inbox, ``migrate``, ``purge``, listing records by prefix, a health check) is in :mod:`telegram_idem.backends._abilities`.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from telegram_idem._clock import Clock
from telegram_idem._joined import JoinedRecords
from telegram_idem.backends._abilities import (
    Browsable,
    Checkable,
    HasFloodBudget,
    HasInbox,
    HasLedger,
    HasOutbox,
    JoinsTransactions,
    Migratable,
    Purgeable,
    as_browsable,
    as_checkable,
    as_migratable,
    as_purgeable,
    flood_budget_of,
    has_flood_budget,
    has_inbox,
    has_ledger,
    has_outbox,
    inbox_of,
    joined_of,
    joins_transactions,
    ledger_of,
    outbox_of,
)
from telegram_idem.backends._base import Store
from telegram_idem.backends._driver import DriverErrors, describe_error
from telegram_idem.backends._health import StoreHealth
from telegram_idem.backends._registry import (
    BUILTIN_SCHEMES,
    ENTRY_POINT_GROUP,
    known_schemes,
    store_class,
)
from telegram_idem.backends._url import StoreURL, redact

__all__ = [
    "ENTRY_POINT_GROUP",
    "SCHEMES",
    "Browsable",
    "Checkable",
    "DriverErrors",
    "HasFloodBudget",
    "HasInbox",
    "HasLedger",
    "HasOutbox",
    "JoinedRecords",
    "JoinsTransactions",
    "Migratable",
    "Purgeable",
    "Store",
    "StoreHealth",
    "StoreURL",
    "as_browsable",
    "as_checkable",
    "as_migratable",
    "as_purgeable",
    "describe_error",
    "flood_budget_of",
    "has_flood_budget",
    "has_inbox",
    "has_ledger",
    "has_outbox",
    "inbox_of",
    "joined_of",
    "joins_transactions",
    "known_schemes",
    "ledger_of",
    "outbox_of",
    "redact",
    "store_from_url",
]

SCHEMES = BUILTIN_SCHEMES
"""Built-in URL scheme → (module, class, pip extra or ``""``), derived from
:data:`telegram_idem.backends._registry.BUILTIN_STORES`."""


def store_from_url(url: str, *, clock: Clock | None = None) -> Store:
    """Make a store from a URL (see the table in this module's docstring).

    Besides the built-in schemes, a :class:`Store` subclass that declares schemes is found
    once its module is imported (``class MyStore(Store, schemes=("mystore",))`` serves
    ``mystore://…`` through its ``from_url``), and an installed distribution's entry point
    in the group ``telegram_idem.stores`` named ``mystore`` is loaded when ``mystore://…``
    is first asked.

    Args:
        url: the store URL.
        clock: seconds since the epoch; ``None`` = the store's own time source.

    Raises:
        ConfigurationError: unknown scheme, malformed URL or option, the store's
            driver is not installed (the message names the extra to install), or an
            entry point that does not load a ``Store`` class. No message shows the URL's
            password.
    """
    scheme = urlsplit(url).scheme.lower()
    cls = store_class(scheme, redact(url), base=Store)
    assert issubclass(cls, Store)  # store_class refuses any other class
    return cls.from_url(url, clock=clock)
