"""Which botocore/aiohttp exceptions mean what (docs/store-dynamodb.md#errors).

DynamoDB tells its service errors apart by code, not by class (they are all
``ClientError``): :func:`translate` reads the code. Every message names the table and
never shows credentials.
"""

from __future__ import annotations

from typing import Final

import aiohttp
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    CredentialRetrievalError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from telegram_idem.backends._driver import describe_error
from telegram_idem.errors import ConfigurationError, IdemError, StoreError

__all__ = [
    "CONFIGURATION_CODES",
    "DRIVER_BASE",
    "DRIVER_ERRORS",
    "THROTTLING_CODES",
    "error_code",
    "translate",
]

DRIVER_ERRORS: Final[tuple[type[BaseException], ...]] = (
    EndpointConnectionError,
    ConnectTimeoutError,
    ReadTimeoutError,
    ConnectionClosedError,
    BotoConnectionError,
    HTTPClientError,
    NoCredentialsError,
    CredentialRetrievalError,
    ClientError,
    aiohttp.ClientError,
    OSError,
    TimeoutError,
)
"""The exceptions a DynamoDB call may raise that :func:`translate` classifies."""

DRIVER_BASE: Final[tuple[type[BaseException], ...]] = (
    BotoCoreError,
    ClientError,
    aiohttp.ClientError,
)
"""Every exception class of botocore and aiohttp."""

THROTTLING_CODES: Final = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ServiceUnavailable",
    }
)
"""Service error codes that mean "try later": raised as :class:`StoreError` (after
botocore's own retries), like every other service error except those in
:data:`CONFIGURATION_CODES` and a missing table."""

CONFIGURATION_CODES: Final = frozenset(
    {
        "UnrecognizedClientException",  # unknown access key id
        "InvalidSignatureException",  # wrong secret key
        "IncompleteSignatureException",
        "MissingAuthenticationTokenException",
        "InvalidClientTokenId",
        "ExpiredTokenException",  # session credentials expired: refresh them
        "AccessDeniedException",  # the IAM policy lacks dynamodb:<action> on the table
        "ValidationException",  # a request DynamoDB can never accept (e.g. a key > 2 KB)
    }
)
"""Service error codes no retry can fix: raised as :class:`ConfigurationError`."""


def error_code(exc: BaseException) -> str:
    """The service's error code of a ``ClientError`` (``""`` for any other exception)."""
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _message(exc: BaseException) -> str:
    """The service's own message of a ``ClientError`` (or the exception's text)."""
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Message", "") or exc)


def translate(exc: BaseException, where: str, table: str) -> IdemError:
    """The library error for a driver error: ``ConfigurationError`` for a missing table,
    bad or missing credentials, missing permissions or an invalid request (naming the
    table), ``StoreError`` (original attached) for everything else.

    Args:
        exc: a driver exception (:data:`DRIVER_ERRORS` or :data:`DRIVER_BASE`).
        where: ``"<store repr>.<op>"``.
        table: the table name.
    """
    code = error_code(exc)
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return ConfigurationError(
            f"{where}: no AWS credentials for DynamoDB table {table!r} ({describe_error(exc)}): "
            "configure them (environment, profile, role) or pass an aiobotocore session"
        )
    if code in CONFIGURATION_CODES:
        return ConfigurationError(
            f"{where}: DynamoDB refused the request on table {table!r}: {code}: "
            f"{_message(exc)} (check the AWS credentials, region and IAM permissions)"
        )
    if code == "ResourceNotFoundException":
        return ConfigurationError(
            f"{where}: DynamoDB table {table!r} does not exist (or is not ACTIVE yet). "
            "Create it once with `telegram-idem migrate <store URL>` (or `await "
            "store.migrate()`), or add `create_table=1` to the store URL."
        )
    kind = " (throttled: try later)" if code in THROTTLING_CODES else ""
    detail = f"{code}{kind}: {_message(exc)}" if code else describe_error(exc)
    return StoreError(f"{where} failed: {detail}", original=exc)
