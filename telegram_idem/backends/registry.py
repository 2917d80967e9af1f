"""Which store class serves which URL scheme: the table ``store_from_url`` reads.

Two sources, one table:

- the built-in stores, named by module so that a store's driver is imported only when
  its scheme is used (the core installs with none of them);
- every :class:`~telegram_idem.backends.base.Store` subclass that sets ``schemes``: it
  registers itself when the class is created (``Store.__init_subclass__``), so a custom
  store is found by ``store_from_url`` as soon as its module is imported.

The table itself lives in :mod:`telegram_idem.backends.base`, where classes register; this
module reads it.
"""

from __future__ import annotations

from importlib import import_module

from telegram_idem.backends.base import BUILTIN_SCHEMES, CUSTOM_SCHEMES, Store
from telegram_idem.errors import ConfigurationError

__all__ = ["BUILTIN_SCHEMES", "known_schemes", "store_class"]


def known_schemes() -> list[str]:
    """Every scheme ``store_from_url`` accepts now, sorted."""
    return sorted(BUILTIN_SCHEMES.keys() | CUSTOM_SCHEMES.keys())


def store_class(scheme: str, url_shown: str) -> type[Store]:
    """The class serving ``scheme`` (importing a built-in store's module on first use).

    Args:
        scheme: a lower-case URL scheme.
        url_shown: the URL as error messages may show it (password redacted).

    Raises:
        ConfigurationError: no class serves ``scheme``, or a built-in store's driver is
            not installed (the message names the pip extra).
    """
    if scheme in CUSTOM_SCHEMES:
        return CUSTOM_SCHEMES[scheme]
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
