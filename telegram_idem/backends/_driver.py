"""Driver errors → library errors: the one translation every store and connection uses.

A store (:meth:`telegram_idem.backends._base.Store._call`) or a store's connection object
runs each round trip through :func:`call` with a *translate* function, usually
:meth:`DriverErrors.translate` of its driver's :class:`DriverErrors`:

- ``config`` (wrong password or ACL, no such database, missing privilege…) →
  :class:`~telegram_idem.errors.ConfigurationError`: retrying cannot help;
- ``transient`` (connection refused or lost, DNS failure, timeout, failover…) →
  :class:`~telegram_idem.errors.StoreError`: the store cannot answer now;
- any other exception of the driver (``base``) → :class:`StoreError` too, marked
  *unexpected*: never a raw driver exception, never a decision.

A library error raised inside the round trip passes unchanged, and an exception that is
not the driver's (a bug, a ``TypeError`` for a bad argument) propagates. Every message
starts with ``where`` (the store's ``repr`` and the operation: host, database, table,
never a password) and carries the driver's own message (:func:`describe_error`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from telegram_idem.errors import ConfigurationError, IdemError, StoreError

__all__ = ["DriverErrors", "Translate", "call", "describe_error"]

T = TypeVar("T")

Translate = Callable[[str, Exception], IdemError | None]
"""``translate(op, exc)``: the library error for ``exc`` raised by operation ``op``, or
``None`` when ``exc`` is not the driver's (then it propagates unchanged)."""

ExceptionTypes = tuple[type[BaseException], ...]


def describe_error(exc: BaseException) -> str:
    """``"<class>: <message>"`` of a driver exception, its cause's message appended when
    it adds one (``TimeoutError`` has no message of its own).

    Not ``repr``: redis-py 8's ``repr`` is only a category (``network:ConnectionError``).

    Args:
        exc: the driver's exception.
    """
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" ({type(cause).__name__}: {cause})"
    return text


@dataclass(frozen=True, slots=True)
class DriverErrors:
    """How one driver's exceptions map onto library errors.

    Attributes:
        transient: exception types meaning "cannot answer now" → :class:`StoreError`.
        config: exception types meaning a configuration mistake →
            :class:`ConfigurationError` (checked first: a driver may list a class in both).
        base: every exception type of the driver; one not listed above is an
            *unexpected* :class:`StoreError`.
    """

    transient: ExceptionTypes
    config: ExceptionTypes = ()
    base: ExceptionTypes = ()

    def translate(self, where: str, exc: Exception) -> IdemError | None:
        """The library error for ``exc``, or ``None`` if ``exc`` is not the driver's.

        Args:
            where: how the message names the failed call: ``"<store repr>.<op>"``
                (never a password).
            exc: the exception the round trip raised.
        """
        if isinstance(exc, self.config):
            return ConfigurationError(f"{where}: {describe_error(exc)}")
        if isinstance(exc, self.transient):
            return StoreError(f"{where} failed: {describe_error(exc)}", original=exc)
        if isinstance(exc, self.base):
            return StoreError(
                f"{where} failed with an unexpected driver error: {describe_error(exc)}",
                original=exc,
            )
        return None


async def call(op: str, fn: Callable[[], Awaitable[T]], translate: Translate) -> T:
    """Run ``fn`` (one round trip) and raise the library error ``translate`` gives for a
    driver exception, chained to it; a library error or a non-driver exception passes.

    Args:
        op: the operation's name (``"claim"``, ``"inbox.take"``…), handed to ``translate``.
        fn: the round trip.
        translate: ``translate(op, exc)`` → the library error, or ``None`` to propagate.

    Raises:
        ConfigurationError, StoreError: as ``translate`` decides.
    """
    try:
        return await fn()
    except IdemError:
        raise
    except Exception as exc:
        error = translate(op, exc)
        if error is None:
            raise
        raise error from exc
