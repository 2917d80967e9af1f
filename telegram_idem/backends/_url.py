"""Store URLs: one parser with typed options, and the one place a password is redacted.

Every store's ``from_url`` reads its URL through :class:`StoreURL`::

    url = StoreURL.parse(text, schemes=("sqlite",))
    busy = url.take_seconds("busy_timeout", 5.0)
    url.finish()                     # an option left unread is an error (a typo, usually)

Each ``take_*`` removes its option and returns it typed, or the default when absent; a
value that does not parse raises :class:`~telegram_idem.errors.ConfigurationError` naming
the option and the URL as :func:`redact` shows it. No message made here carries a password.
Options are the URL's query parameters; the last value of a repeated one wins.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit, urlunsplit

from telegram_idem.errors import ConfigurationError

__all__ = ["StoreURL", "redact"]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def redact(url: str) -> str:
    """``repr(url)`` with the password (if any) replaced by ``***``: how error messages
    show a URL. An unparsable authority shows only the scheme (it may hold credentials).

    Args:
        url: the store URL.
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return repr(url.split("://", 1)[0] + "://…")
    if password is None:
        return repr(url)
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return repr(urlunsplit(parts._replace(netloc=f"{user}:***@{hostinfo}")))


@dataclass
class StoreURL:
    """A store URL being read: its parts, its options not yet taken, how errors show it.

    Attributes:
        raw: the URL as given (may hold a password: never put it in a message).
        parts: ``urllib.parse.urlsplit(raw)``.
        shown: the URL for messages (:func:`redact`).
        options: query options not taken yet (name → text).
    """

    raw: str
    parts: SplitResult
    shown: str
    options: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, url: str, *, schemes: Collection[str], multi_host: bool = False) -> StoreURL:
        """Split ``url`` and check its scheme (case-insensitive) and port.

        Args:
            url: the store URL.
            schemes: the lower-case schemes the calling store serves.
            multi_host: the authority may list several ``host:port`` (a cluster's seed
                nodes, ``h1:7000,h2:7000``): its port is not checked here, the store
                splits and checks the list itself.

        Raises:
            ConfigurationError: another scheme, or a port that is not a number.
        """
        shown = redact(url)
        try:
            parts = urlsplit(url)
            if not multi_host:
                parts.port  # noqa: B018  (validates the port)
        except ValueError:
            raise ConfigurationError(f"bad host or port in store URL {shown}") from None
        if parts.scheme.lower() not in schemes:
            wanted = " or ".join(f"{s}://" for s in sorted(schemes))
            raise ConfigurationError(f"a store URL starting with {wanted} expected, got {shown}")
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        return cls(raw=url, parts=parts, shown=shown, options=options)

    @property
    def scheme(self) -> str:
        """The scheme, lower case."""
        return self.parts.scheme.lower()

    def error(self, problem: str) -> ConfigurationError:
        """``ConfigurationError("<problem> in <redacted URL>")``, to raise.

        Args:
            problem: what is wrong, e.g. ``"lease must be > 0"``.
        """
        return ConfigurationError(f"{problem} in store URL {self.shown}")

    def take_text(self, name: str, default: str | None = None) -> str | None:
        """Option ``name`` as text, or ``default``.

        Args:
            name: the option's name in the URL query.
            default: returned when the URL has no such option.
        """
        return self.options.pop(name, default)

    def take_seconds(
        self, name: str, default: float | None, *, allow_zero: bool = False
    ) -> float | None:
        """Option ``name`` in seconds (a finite number > 0, or ≥ 0 with ``allow_zero``).

        Args:
            name: the option's name in the URL query.
            default: seconds, returned when the URL has no such option.
            allow_zero: accept 0.

        Raises:
            ConfigurationError: not a number, not finite, or out of range.
        """
        raw = self.options.pop(name, None)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise self.error(f"{name} must be seconds, got {raw!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            bound = "≥ 0" if allow_zero else "> 0"
            raise self.error(f"{name} must be {bound} seconds, got {raw!r}")
        return value

    def take_int(self, name: str, default: int | None, *, minimum: int | None = None) -> int | None:
        """Option ``name`` as an integer (at least ``minimum`` if given).

        Args:
            name: the option's name in the URL query.
            default: returned when the URL has no such option.
            minimum: the smallest value accepted; ``None``: any.

        Raises:
            ConfigurationError: not an integer, or below ``minimum``.
        """
        raw = self.options.pop(name, None)
        if raw is None:
            return default
        try:
            value = int(raw.strip())
        except ValueError:
            raise self.error(f"{name} must be an integer, got {raw!r}") from None
        if minimum is not None and value < minimum:
            raise self.error(f"{name} must be an integer ≥ {minimum}, got {raw!r}")
        return value

    def take_bool(self, name: str, default: bool) -> bool:
        """Option ``name`` as a flag: ``1/true/yes/on`` or ``0/false/no/off`` (any case).

        Args:
            name: the option's name in the URL query.
            default: returned when the URL has no such option.

        Raises:
            ConfigurationError: any other value.
        """
        raw = self.options.pop(name, None)
        if raw is None:
            return default
        flag = raw.strip().lower()
        if flag in _TRUE:
            return True
        if flag in _FALSE:
            return False
        raise self.error(f"{name} must be true or false, got {raw!r}")

    def take_passthrough(self, names: Iterable[str]) -> list[tuple[str, str]]:
        """Remove and return the options among ``names`` (for the driver), in URL order.

        Args:
            names: the driver's option names.
        """
        wanted = set(names)
        taken = [(k, v) for k, v in self.options.items() if k in wanted]
        for k, _ in taken:
            del self.options[k]
        return taken

    def finish(self) -> None:
        """Check every option was taken.

        Raises:
            ConfigurationError: options left unread (named, sorted).
        """
        if self.options:
            raise self.error(f"unknown option(s) {sorted(self.options)}")

    def with_query(self, query: Iterable[tuple[str, str]]) -> str:
        """The raw URL with its query replaced by ``query`` and no fragment (e.g. a DSN
        for the driver with only its own options). Holds the password: never show it.

        Args:
            query: the ``(name, value)`` pairs of the new query.
        """
        return urlunsplit(self.parts._replace(query=urlencode(list(query)), fragment=""))
