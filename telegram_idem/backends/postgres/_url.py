"""The PostgreSQL store URL: which options are the store's, which go to asyncpg.

``postgresql://user:password@host:5432/db?table_prefix=idem&auto_create=0&…`` (or
``postgres://``) is read through :class:`~telegram_idem.backends._url.StoreURL`: the store's
own options (:data:`STORE_OPTIONS`) become keyword arguments of
:class:`~telegram_idem.backends.postgres.PostgresStore`, the libpq/asyncpg options
(:data:`PASSTHROUGH_OPTIONS`) stay in the DSN, anything else is a
:class:`~telegram_idem.errors.ConfigurationError` whose message never shows the password.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlsplit

from telegram_idem.backends._url import StoreURL

__all__ = ["PASSTHROUGH_OPTIONS", "SCHEMES", "STORE_OPTIONS", "parse_store_url", "store_options_in"]

SCHEMES = ("postgresql", "postgres")
"""The URL schemes of the PostgreSQL store."""

STORE_OPTIONS = frozenset(
    {
        "table_prefix",
        "auto_create",
        "min_size",
        "max_size",
        "statement_cache_size",
        "command_timeout",
        "connect_timeout",
        "purge_every",
        "purge_batch",
    }
)
"""URL query options read by the store itself (removed before asyncpg sees the DSN)."""

PASSTHROUGH_OPTIONS = frozenset(
    {
        "host",
        "port",
        "dbname",
        "database",
        "user",
        "password",
        "passfile",
        "sslmode",
        "sslcert",
        "sslkey",
        "sslrootcert",
        "sslcrl",
        "sslpassword",
        "sslnegotiation",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "target_session_attrs",
        "krbsrvname",
        "gsslib",
        "service",
        # asyncpg sends unknown DSN options as server settings; these two are useful ones.
        "application_name",
        "search_path",
    }
)
"""URL query options handed to asyncpg unchanged."""

_INTEGERS = ("min_size", "max_size", "statement_cache_size", "purge_every", "purge_batch")
_SECONDS = ("command_timeout", "connect_timeout")


def parse_store_url(url: str) -> tuple[str, dict[str, Any]]:
    """Split a store URL into the asyncpg DSN and the store's keyword arguments.

    Args:
        url: ``postgresql://user:password@host:port/db?option=value&…``.

    Returns:
        ``(dsn, kwargs)``: the URL with only :data:`PASSTHROUGH_OPTIONS` left in its
        query (it holds the password: never show it), and the options of
        :data:`STORE_OPTIONS` that the URL sets, typed (``table_prefix`` text,
        ``auto_create`` a flag, the counts integers, the timeouts seconds > 0).

    Raises:
        ConfigurationError: another scheme, a bad port, an unknown option, or a value
            that does not parse (ranges are checked by the store's constructor).
    """
    parsed = StoreURL.parse(url, schemes=SCHEMES)
    kwargs: dict[str, Any] = {}
    prefix = parsed.take_text("table_prefix")
    if prefix is not None:
        kwargs["table_prefix"] = prefix
    if "auto_create" in parsed.options:
        kwargs["auto_create"] = parsed.take_bool("auto_create", False)
    for name in _INTEGERS:
        number = parsed.take_int(name, None)
        if number is not None:
            kwargs[name] = number
    for name in _SECONDS:
        seconds = parsed.take_seconds(name, None)
        if seconds is not None:
            kwargs[name] = seconds
    passthrough = parsed.take_passthrough(PASSTHROUGH_OPTIONS)
    parsed.finish()
    return parsed.with_query(passthrough), kwargs


def store_options_in(dsn: str) -> list[str]:
    """The store options (:data:`STORE_OPTIONS`) in ``dsn``'s query, sorted: a DSN given
    to asyncpg must carry none of them."""
    names = {name for name, _ in parse_qsl(urlsplit(dsn).query, keep_blank_values=True)}
    return sorted(STORE_OPTIONS & names)
