"""The DynamoDB store URL: ``dynamodb://<table>?option=value&…`` (docs/store-dynamodb.md).

Read through :class:`~telegram_idem.backends._url.StoreURL`; every message shows the URL
as :func:`~telegram_idem.backends._url.redact` does (never a password-like part).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from aiobotocore.config import AioConfig

from telegram_idem.backends._url import StoreURL
from telegram_idem.backends.dynamodb._setup import check_table_name
from telegram_idem.errors import ConfigurationError

__all__ = ["SCHEMES", "parse_store_url"]

SCHEMES = ("dynamodb",)
"""The URL scheme of the DynamoDB store."""

_REGION = re.compile(r"[a-z0-9-]+")


def parse_store_url(url: str) -> tuple[str, dict[str, Any]]:
    """The table and the store's keyword arguments of a store URL.

    Options: ``region`` (default ``us-east-1``), ``endpoint_url`` (``http(s)://host[:port]``),
    ``create_table`` (a flag), ``connect_timeout`` and ``read_timeout`` (seconds > 0),
    ``max_attempts`` (an integer ≥ 1; botocore's "standard" retry mode).

    Returns:
        ``(table, kwargs)`` for :class:`~telegram_idem.backends.dynamodb.DynamoDBStore`
        (``region``, ``endpoint_url``, ``create_table``, ``client_config``).

    Raises:
        ConfigurationError: another scheme, a user or password, a path or fragment, a
            bad table name, an unknown option, or a value that does not parse.
    """
    parsed = StoreURL.parse(url, schemes=SCHEMES)
    parts = parsed.parts
    if parts.path not in ("", "/") or parts.fragment or "@" in parts.netloc:
        raise parsed.error("a DynamoDB store URL is dynamodb://<table>?…: no user, path")
    region = parsed.take_text("region", "us-east-1") or ""
    if not _REGION.fullmatch(region):
        raise parsed.error("region must look like us-east-1")
    endpoint = parsed.take_text("endpoint_url")
    if endpoint is not None:
        ep = urlsplit(endpoint)
        if ep.scheme not in ("http", "https") or not ep.netloc:
            raise parsed.error("endpoint_url must be http(s)://host[:port]")
    create = parsed.take_bool("create_table", False)
    config: dict[str, Any] = {}
    for name in ("connect_timeout", "read_timeout"):
        seconds = parsed.take_seconds(name, None)
        if seconds is not None:
            config[name] = seconds
    attempts = parsed.take_int("max_attempts", None, minimum=1)
    if attempts is not None:
        config["retries"] = {"mode": "standard", "total_max_attempts": attempts}
    parsed.finish()
    try:
        check_table_name(parts.netloc)
    except ConfigurationError as exc:
        raise parsed.error(str(exc)) from None
    kwargs: dict[str, Any] = {
        "region": region,
        "endpoint_url": endpoint,
        "client_config": AioConfig(**config) if config else None,
        "create_table": create,
    }
    return parts.netloc, kwargs
