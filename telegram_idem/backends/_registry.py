"""Which store class serves which URL scheme: the one table ``store_from_url`` reads.

Three sources, asked in this order:

1. :data:`BUILTIN_STORES`, the stores shipped with the library, named by module so that
   a store's driver is imported only when its scheme is used (the core installs with none
   of them). This tuple is where a built-in store's schemes are declared: the class gets
   its ``schemes`` from here when it is created.
2. Every :class:`~telegram_idem.backends._base.Store` subclass that declares schemes, by
   the class keyword (``class MyStore(Store, schemes=("mystore",))``) or the class
   attribute (``schemes = ("mystore",)``): it registers itself when the class is created,
   so it is found as soon as its module is imported.
3. The entry points of the group :data:`ENTRY_POINT_GROUP` (``telegram_idem.stores``),
   named by scheme, valued ``module:Class``: a distribution that ships a store declares,
   in its ``pyproject.toml``::

       [project.entry-points."telegram_idem.stores"]
       mystore = "mystore_pkg.store:MyStore"

   They are read (and the module imported) only when a scheme that neither of the above
   serves is asked, so installing such a distribution costs nothing until it is used.
   An entry point named like a built-in or registered scheme is never consulted.

This module is a leaf: it imports no store (nor the ``Store`` base), so
:mod:`telegram_idem.backends._base` registers into it at class creation without a cycle.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import EntryPoint, entry_points

from telegram_idem.errors import ConfigurationError

__all__ = [
    "BUILTIN_SCHEMES",
    "BUILTIN_STORES",
    "ENTRY_POINT_GROUP",
    "BuiltinStore",
    "known_schemes",
    "register",
    "store_class",
]

ENTRY_POINT_GROUP = "telegram_idem.stores"
"""The entry-point group third-party stores are declared in (name = scheme, value =
``module:Class``)."""


@dataclass(frozen=True, slots=True)
class BuiltinStore:
    """A store shipped with the library.

    Attributes:
        module: the module that defines (or re-exports) the class, imported on first use.
        name: the class name in ``module``.
        schemes: the lower-case URL schemes it serves.
        extra: the pip extra that installs its driver (``pip install
            'telegram-idem[<extra>]'``), or ``None`` when it needs none.
    """

    module: str
    name: str
    schemes: tuple[str, ...]
    extra: str | None = None

    def defines(self, cls: type) -> bool:
        """True if ``cls`` is this store: same class name, defined in :attr:`module` or
        a module of that package."""
        module = cls.__module__
        in_module = module == self.module or module.startswith(self.module + ".")
        return in_module and cls.__qualname__ == self.name


BUILTIN_STORES: tuple[BuiltinStore, ...] = (
    BuiltinStore("telegram_idem.backends.memory", "MemoryStore", ("memory",)),
    BuiltinStore("telegram_idem.backends.sqlite", "SQLiteStore", ("sqlite",)),
    BuiltinStore(
        "telegram_idem.backends.postgres", "PostgresStore", ("postgresql", "postgres"), "postgres"
    ),
    BuiltinStore(
        "telegram_idem.backends.redis", "RedisStore", ("redis", "rediss", "redis+cluster"), "redis"
    ),
    BuiltinStore("telegram_idem.backends.dynamodb", "DynamoDBStore", ("dynamodb",), "dynamodb"),
)
"""The built-in stores: the one place their schemes are declared."""

_BUILTIN: dict[str, BuiltinStore] = {s: b for b in BUILTIN_STORES for s in b.schemes}

BUILTIN_SCHEMES: dict[str, tuple[str, str, str]] = {
    s: (b.module, b.name, b.extra or "") for s, b in _BUILTIN.items()
}
"""Built-in scheme → (module, class, pip extra or ``""``), derived from
:data:`BUILTIN_STORES` (the older shape of the same table)."""

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
"""RFC 3986 scheme syntax, lower case (``urlsplit`` lower-cases what it parses)."""

_CLASSES: dict[str, type] = {}
"""Scheme → the class serving it, for every class created so far (built-in or not) and
every class an entry point loaded."""


def register(cls: type, declared: Sequence[str] | None) -> tuple[str, ...] | None:
    """Make ``cls`` the store of its schemes; called when a ``Store`` subclass is created.

    A built-in store (see :class:`BuiltinStore.defines`) serves the schemes of
    :data:`BUILTIN_STORES`; any other class serves ``declared``. A class defined again
    under the same module and name (a reloaded module) replaces its earlier self.

    Args:
        cls: the new class.
        declared: the schemes the class declares (keyword or attribute), or ``None``.

    Returns:
        The schemes ``cls`` serves, to set as its ``schemes``; ``None`` for a class that
        declares none and is no built-in (it keeps what it inherits, and serves nothing).

    Raises:
        ConfigurationError: ``declared`` is a string or holds a scheme that is not
            lower-case RFC 3986 syntax, a scheme another class serves, or a built-in
            store declaring other schemes than :data:`BUILTIN_STORES` gives it.
    """
    where = f"{cls.__module__}.{cls.__qualname__}"
    if isinstance(declared, str):
        raise ConfigurationError(f"{where}: schemes must be a tuple of strings, got {declared!r}")
    builtin = next((b for b in BUILTIN_STORES if b.defines(cls)), None)
    if builtin is not None:
        if declared is not None and tuple(declared) != builtin.schemes:
            raise ConfigurationError(
                f"{where} declares schemes {tuple(declared)!r}, but "
                f"telegram_idem.backends._registry.BUILTIN_STORES gives it {builtin.schemes!r}"
            )
        schemes = builtin.schemes
    elif declared is None:
        return None
    else:
        schemes = tuple(declared)
    for scheme in schemes:
        if not isinstance(scheme, str) or not _SCHEME.fullmatch(scheme):
            raise ConfigurationError(f"{where}.schemes: {scheme!r} is not a lower-case URL scheme")
        holder = _holder(scheme, cls)
        if holder is not None:
            raise ConfigurationError(f"{where}.schemes: {scheme}:// is already served by {holder}")
    for scheme in schemes:
        _CLASSES[scheme] = cls
    return schemes


def _holder(scheme: str, cls: type) -> str | None:
    """The class (``module.Name``) serving ``scheme`` if it is not ``cls`` (nor an
    earlier ``cls`` of a reloaded module), else ``None``."""
    if scheme in _CLASSES:
        other = _CLASSES[scheme]
        same = (other.__module__, other.__qualname__) == (cls.__module__, cls.__qualname__)
        return None if same else f"{other.__module__}.{other.__qualname__}"
    builtin = _BUILTIN.get(scheme)
    if builtin is None or builtin.defines(cls):
        return None
    return f"{builtin.module}.{builtin.name}"


def _entry_points(scheme: str | None = None) -> list[EntryPoint]:
    found = entry_points(group=ENTRY_POINT_GROUP)
    return [ep for ep in found if scheme is None or ep.name == scheme]


def known_schemes() -> list[str]:
    """Every scheme ``store_from_url`` accepts now, sorted: the built-in ones, those of
    the classes created so far, and the names of the installed entry points."""
    declared = {ep.name for ep in _entry_points() if _SCHEME.fullmatch(ep.name)}
    return sorted(_BUILTIN.keys() | _CLASSES.keys() | declared)


def store_class(scheme: str, url_shown: str, *, base: type) -> type:
    """The class serving ``scheme``, imported or loaded on first use.

    Args:
        scheme: a lower-case URL scheme.
        url_shown: the URL as error messages may show it (password redacted).
        base: the class every store derives from (``Store``); anything else is refused.

    Returns:
        A subclass of ``base``.

    Raises:
        ConfigurationError: no class serves ``scheme``; a built-in store's driver is not
            installed (the message names the pip extra); an entry point that does not
            load, that names no ``base`` subclass, or that two distributions declare.
    """
    if scheme in _CLASSES:
        return _checked(_CLASSES[scheme], base, f"{scheme}://")
    builtin = _BUILTIN.get(scheme)
    if builtin is not None:
        return _checked(_import_builtin(scheme, builtin), base, f"{scheme}://")
    return _from_entry_point(scheme, url_shown, base)


def _import_builtin(scheme: str, builtin: BuiltinStore) -> object:
    try:
        module = import_module(builtin.module)
    except ImportError as exc:
        if builtin.extra is None:
            raise ConfigurationError(f"{scheme}:// could not be imported ({exc})") from exc
        raise ConfigurationError(
            f"{scheme}:// needs pip install 'telegram-idem[{builtin.extra}]' ({exc})"
        ) from exc
    return getattr(module, builtin.name)


def _from_entry_point(scheme: str, url_shown: str, base: type) -> type:
    found = {ep.value: ep for ep in _entry_points(scheme)}
    if not found:
        known = ", ".join(f"{s}://" for s in known_schemes())
        raise ConfigurationError(f"unknown store URL scheme in {url_shown}; known: {known}")
    if len(found) > 1:
        named = ", ".join(sorted(found))
        raise ConfigurationError(
            f"{scheme}:// is declared by several {ENTRY_POINT_GROUP} entry points: {named}"
        )
    (ep,) = found.values()
    where = f"{scheme}:// (entry point {ep.name} = {ep.value} in group {ENTRY_POINT_GROUP})"
    try:
        loaded = ep.load()
    except Exception as exc:
        raise ConfigurationError(f"{where} failed to load: {type(exc).__name__}: {exc}") from exc
    cls = _checked(loaded, base, where)
    holder = _CLASSES.setdefault(scheme, cls)
    if holder is not cls:
        raise ConfigurationError(
            f"{where}: {scheme}:// is already served by {holder.__module__}.{holder.__qualname__}"
        )
    return cls


def _checked(found: object, base: type, where: str) -> type:
    if not (isinstance(found, type) and issubclass(found, base)):
        raise ConfigurationError(f"{where} names {found!r}, which is not a {base.__name__} class")
    return found
