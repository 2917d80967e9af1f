"""Parsing the query options of store URLs, shared by every store."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

from telegram_idem.errors import ConfigurationError

__all__ = ["reject_unknown", "url_options"]


def url_options(url: str) -> dict[str, str]:
    """The query parameters of ``url`` (last value wins)."""
    return dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))


def reject_unknown(url: str, remaining: dict[str, str]) -> None:
    """Raise :class:`ConfigurationError` if options were left unread (a typo, usually)."""
    if remaining:
        raise ConfigurationError(f"unknown option(s) {sorted(remaining)} in store URL {url!r}")
