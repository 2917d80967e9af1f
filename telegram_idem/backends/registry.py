"""Which store class serves which URL scheme: the table ``store_from_url`` reads.

Two sources, one table:

- the built-in stores, named by module so that a store's driver is imported only when
  its scheme is used (the core installs with none of them);
- every :class:`~telegram_idem.backends.base.Store` subclass that sets ``schemes``: it
  registers itself when the class is created (``Store.__init_subclass__``), so a custom
  store is found by ``store_from_url`` as soon as its module is imported.
"""

from __future__ import annotations

import re
from importlib import import_module
from typing import TYPE_CHECKING

from telegram_idem.errors import ConfigurationError

if TYPE_CHECKING:
    from telegram_idem.backends.base import Store

__all__ = ["BUILTIN_SCHEMES", "known_schemes", "register", "store_class"]

BUILTIN_SCHEMES: dict[str, tuple[str, str, str]] = {
    "memory": ("telegram_idem.backends.memory", "MemoryStore", ""),
    "sqlite": ("telegram_idem.backends.sqlite", "SQLiteStore", ""),
    "postgresql": ("telegram_idem.backends.postgres", "PostgresStore", "postgres"),
    "postgres": ("telegram_idem.backends.postgres", "PostgresStore", "postgres"),
    "redis": ("telegram_idem.backends.redis", "RedisStore", "redis"),
    "rediss": ("telegram_idem.backends.redis", "RedisStore", "redis"),
    "redis+cluster": ("telegram_idem.backends.redis", "RedisStore", "redis"),
    "dynamodb": ("telegram_idem.backends.dynamodb", "DynamoDBStore", "dynamodb"),
}
"""Built-in URL scheme → (module, class, pip extra that installs its driver)."""

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
"""RFC 3986 scheme syntax, lower case (``urlsplit`` lower-cases what it parses)."""

_registered: dict[str, type[Store]] = {}


def register(cls: type[Store]) -> None:
    """Make ``cls`` the store of each scheme in ``cls.schemes``.

    Called by ``Store.__init_subclass__``; a class defined again under the same module
    and name (a reloaded module) replaces its earlier self.

    Raises:
        ConfigurationError: a scheme that is not lower-case RFC 3986 syntax, or one that
            a built-in store or another class already serves.
    """
    for scheme in cls.schemes:
        if not isinstance(scheme, str) or not _SCHEME.fullmatch(scheme):
            raise ConfigurationError(
                f"{cls.__qualname__}.schemes: {scheme!r} is not a lower-case URL scheme"
            )
        owner = _owner(scheme)
        if owner is not None and owner != (cls.__module__, cls.__qualname__):
            raise ConfigurationError(
                f"{cls.__qualname__}.schemes: {scheme}:// is already served by "
                f"{owner[0]}.{owner[1]}"
            )
    for scheme in cls.schemes:
        _registered[scheme] = cls


def _owner(scheme: str) -> tuple[str, str] | None:
    if scheme in _registered:
        cls = _registered[scheme]
        return cls.__module__, cls.__qualname__
    if scheme in BUILTIN_SCHEMES:
        module, name, _extra = BUILTIN_SCHEMES[scheme]
        return module, name
    return None


def known_schemes() -> list[str]:
    """Every scheme ``store_from_url`` accepts now, sorted."""
    return sorted(BUILTIN_SCHEMES.keys() | _registered.keys())


def store_class(scheme: str, url_shown: str) -> type[Store]:
    """The class serving ``scheme`` (importing a built-in store's module on first use).

    Args:
        scheme: a lower-case URL scheme.
        url_shown: the URL as error messages may show it (password redacted).

    Raises:
        ConfigurationError: no class serves ``scheme``, or a built-in store's driver is
            not installed (the message names the pip extra).
    """
    if scheme in _registered:
        return _registered[scheme]
    if scheme not in BUILTIN_SCHEMES:
        known = ", ".join(f"{s}://" for s in known_schemes())
        raise ConfigurationError(f"unknown store URL scheme in {url_shown}; known: {known}")
    module_name, class_name, extra = BUILTIN_SCHEMES[scheme]
    try:
        module = import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"{scheme}:// needs pip install 'telegram-idem[{extra}]' ({exc})"
        ) from exc
    cls: type[Store] = getattr(module, class_name)
    return cls
