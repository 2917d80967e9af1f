"""Stores, made from URLs (``memory://``, ``sqlite:///path``) or passed as objects.

Server stores (Postgres, Redis, DynamoDB) register their schemes here as they land; each
is imported lazily, so the core installs with none of their drivers.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from telegram_idem.backends.base import Store
from telegram_idem.clock import Clock, system_clock
from telegram_idem.errors import ConfigurationError

__all__ = ["Store", "store_from_url"]

_SCHEMES: dict[str, tuple[str, str]] = {
    "memory": ("telegram_idem.backends.memory", "MemoryStore"),
    "sqlite": ("telegram_idem.backends.sqlite", "SQLiteStore"),
}


def store_from_url(url: str, *, clock: Clock = system_clock) -> Store:
    """Make a store from a URL.

    Args:
        url: ``memory://[?max_items=N]`` or ``sqlite:///path.db[?busy_timeout=S]``
            (three slashes then a relative path; four for an absolute one).
        clock: the clock for in-process stores (seconds since the epoch).

    Raises:
        ConfigurationError: unknown scheme, or a malformed URL or option.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        known = ", ".join(f"{s}://" for s in sorted(_SCHEMES))
        raise ConfigurationError(f"unknown store URL scheme in {url!r}; known: {known}")
    module, name = _SCHEMES[scheme]
    cls: Any = getattr(import_module(module), name)
    options = dict(parse_qsl(parts.query))
    try:
        if scheme == "memory":
            return cls(clock=clock, max_items=int(options.get("max_items", 100_000)))  # type: ignore[no-any-return]
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if parts.netloc or not path:
            raise ConfigurationError(f"sqlite URL needs a path: sqlite:///file.db, got {url!r}")
        return cls(path, clock=clock, busy_timeout=float(options.get("busy_timeout", 5.0)))  # type: ignore[no-any-return]
    except ConfigurationError:
        raise
    except ValueError as exc:
        raise ConfigurationError(f"bad option in store URL {url!r}: {exc}") from exc
