"""Parsing the query options of store URLs, shared by every store."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit, urlunsplit

from telegram_idem.errors import ConfigurationError

__all__ = ["redact", "reject_unknown", "url_options"]


def url_options(url: str) -> dict[str, str]:
    """The query parameters of ``url`` (last value wins)."""
    return dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))


def reject_unknown(url: str, remaining: dict[str, str]) -> None:
    """Raise :class:`ConfigurationError` if options were left unread (a typo, usually)."""
    if remaining:
        raise ConfigurationError(
            f"unknown option(s) {sorted(remaining)} in store URL {redact(url)}"
        )


def redact(url: str) -> str:
    """``repr(url)`` with the password (if any) replaced by ``***``: what error messages
    show of a URL."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # an unparsable netloc: show nothing of what may be credentials
        return repr(url.split("://", 1)[0] + "://…")
    if password is None:
        return repr(url)
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return repr(urlunsplit(parts._replace(netloc=f"{user}:***@{hostinfo}")))
