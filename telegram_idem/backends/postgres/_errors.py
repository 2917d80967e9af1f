"""Which asyncpg exceptions mean what (docs/store-postgres.md#errors).

:data:`POSTGRES_ERRORS` classifies by exception class (the shared
:class:`~telegram_idem.backends._driver.DriverErrors`); :func:`translate` adds the two
cases with a message of their own: a missing table or column (run ``telegram-idem
migrate``) and a value beyond what PostgreSQL can hold.
"""

from __future__ import annotations

import asyncio

import asyncpg
import asyncpg.exceptions

from telegram_idem.backends._driver import DriverErrors, describe_error
from telegram_idem.errors import ConfigurationError, IdemError

__all__ = ["POSTGRES_ERRORS", "translate"]

POSTGRES_ERRORS = DriverErrors(
    transient=(
        OSError,  # refused, reset, unreachable; TimeoutError is an OSError
        asyncio.TimeoutError,  # command_timeout, pool acquire timeout
        asyncpg.PostgresConnectionError,  # class 08: connection lost / failed
        asyncpg.InterfaceError,  # connection closed, pool closing (misuse subclasses
        #                          are translated before they get here)
        asyncpg.exceptions.OperatorInterventionError,  # shutdown, cannot connect now,
        #                                                 query canceled (statement_timeout)
        asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full
        asyncpg.exceptions.ReadOnlySQLTransactionError,  # failover to a standby
        asyncpg.exceptions.TransactionRollbackError,  # deadlock / serialization
        asyncpg.exceptions.InternalClientError,  # a connection left in a broken state
    ),
    config=(
        asyncpg.exceptions.InvalidAuthorizationSpecificationError,  # bad password, no role
        asyncpg.exceptions.InvalidCatalogNameError,  # no such database
        asyncpg.exceptions.InsufficientPrivilegeError,
        asyncpg.exceptions.ClientConfigurationError,
    ),
    base=(asyncpg.PostgresError, asyncpg.InterfaceError),
)
"""asyncpg's exceptions by meaning: ``transient`` = the server cannot answer now,
``config`` = credentials, database or privileges are wrong, ``base`` = all of asyncpg's."""

_VALUE_ERRORS = (
    asyncpg.exceptions.ProgramLimitExceededError,  # 54000: index row size exceeds maximum
    asyncpg.exceptions.DataError,  # class 22: e.g. NUL in a text value
)


def translate(where: str, exc: Exception, *, tables: tuple[str, ...]) -> IdemError | None:
    """The library error for ``exc``, or ``None`` when it is not asyncpg's (propagated).

    Args:
        where: ``"<store repr>.<op>"`` (never a password).
        exc: what the round trip raised.
        tables: the store's tables, the records table first: a missing one is named (the
            records table when the message names none of them).
    """
    if isinstance(exc, asyncpg.exceptions.UndefinedTableError):
        named = [t for t in sorted(tables, key=len, reverse=True) if t in str(exc)]
        missing = named[0] if named else tables[0]
        return ConfigurationError(
            f"{where}: table {missing!r} does not exist: run `telegram-idem migrate "
            f"<store URL>` once (or PostgresStore.migrate()), or add auto_create=1 to "
            f"the store URL ({exc})"
        )
    if isinstance(exc, asyncpg.exceptions.UndefinedColumnError):
        return ConfigurationError(
            f"{where}: the tables were made by an older version of telegram-idem (a column "
            f"is missing): run `telegram-idem migrate <store URL>` once (or "
            f"PostgresStore.migrate()) to upgrade them in place ({exc})"
        )
    if isinstance(exc, _VALUE_ERRORS):
        return ConfigurationError(
            f"{where}: PostgreSQL cannot store this value ({describe_error(exc)}); "
            "keys longer than about 2,700 bytes exceed its index row limit, and text "
            "columns refuse NUL"
        )
    return POSTGRES_ERRORS.translate(where, exc)
