"""What an effect's failure means: the effect policy (``once`` and the error classes) and
the one classification every run applies.

A step or an action that raises is *not applied* (nothing happened: release, a retry
runs it), *permanent* (it failed for good: store the failure, retries replay it) or
*ambiguous* (nobody knows: unknown under ``once="at_most"``, release under
``"at_least"``). The first rule that matches decides, walking the exception's classes
from the most specific:

| order | rule | meaning |
|---|---|---|
| 1 | a marker: :class:`~telegram_idem.errors.NotAppliedError`, :class:`~telegram_idem.errors.PermanentEffectError`, :class:`~telegram_idem.errors.AmbiguousEffectError` | its own |
| 2 | the run's lists ``not_applied=``, ``permanent=``, ``ambiguous=`` (the nearest class in the MRO wins) | the list's |
| 3 | the library's own errors (below) | as tabled |
| 4 | Bot API errors of aiogram and python-telegram-bot, matched by qualified class name (the core imports neither framework) | as tabled |
| 5 | anything else | ``on_error="store"``: permanent; otherwise not applied under ``at_least`` (today's release), ambiguous under ``at_most`` |

| error | meaning |
|---|---|
| :class:`~telegram_idem.outbox.CallNotSent`, :class:`~telegram_idem.errors.DeliveryTimeoutError` (the call stays in the outbox under its stable effect key) | not applied |
| :class:`~telegram_idem.errors.SendFailedError`, :class:`~telegram_idem.errors.ChatParkedError` (the refusal is kept by the outbox entry, where an operator settles it: ``redrive``, ``unpark``; a retry of the action after that gets the call's new answer, so the action keeps no copy of the failure) | not applied |
| :class:`~telegram_idem.outbox.AmbiguousCall`, :class:`~telegram_idem.errors.UnknownOutcomeError` | ambiguous |
| aiogram ``TelegramRetryAfter``, ``TelegramMigrateToChat``; PTB ``RetryAfter``, ``ChatMigrated`` | not applied |
| aiogram ``TelegramBadRequest``, ``TelegramForbiddenError``, ``TelegramNotFound``, ``TelegramUnauthorizedError``, ``TelegramConflictError``, ``TelegramEntityTooLarge``; PTB ``BadRequest``, ``Forbidden``, ``InvalidToken``, ``Conflict`` | permanent |
| aiogram ``TelegramNetworkError``, ``TelegramServerError``; PTB ``TimedOut``, ``NetworkError`` | ambiguous |

Cancellation (``asyncio.CancelledError`` and other ``BaseException``) is not classified
here: the runner treats it as ambiguous under ``at_most`` and releases under
``at_least``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from telegram_idem.errors import (
    AmbiguousEffectError,
    ConfigurationError,
    DeliveryTimeoutError,
    NotAppliedError,
    PermanentEffectError,
    SendFailedError,
    UnknownOutcomeError,
)
from telegram_idem.outbox import AmbiguousCall, CallNotSent

__all__ = [
    "EffectPolicy",
    "ErrorTypes",
    "Meaning",
    "Once",
    "classify",
    "effect_policy",
]

Once = Literal["at_least", "at_most"]
"""``"at_least"``: a crash before the record runs the effect again (the default);
``"at_most"``: a crash after it started leaves it unknown, never run again by itself."""

ErrorTypes = Sequence[type[BaseException]]
"""Exception classes (a tuple, or any sequence) whose instances carry one meaning."""


class Meaning(StrEnum):
    """What an effect's failure means."""

    NOT_APPLIED = "not_applied"
    """Nothing happened: release the claim; a retry runs the effect."""
    PERMANENT = "permanent"
    """It failed for good: store the failure; retries replay it."""
    AMBIGUOUS = "ambiguous"
    """Nobody knows: unknown under ``at_most``; released under ``at_least``."""


_MARKERS: tuple[tuple[type[BaseException], Meaning], ...] = (
    (NotAppliedError, Meaning.NOT_APPLIED),
    (PermanentEffectError, Meaning.PERMANENT),
    (AmbiguousEffectError, Meaning.AMBIGUOUS),
)

_LIBRARY: tuple[tuple[type[BaseException], Meaning], ...] = (
    (CallNotSent, Meaning.NOT_APPLIED),
    (DeliveryTimeoutError, Meaning.NOT_APPLIED),
    # The outbox entry keeps the refusal (ChatParkedError is one): settled there, a retry
    # of the action re-enqueues the same effect key and gets the settled answer.
    (SendFailedError, Meaning.NOT_APPLIED),
    (AmbiguousCall, Meaning.AMBIGUOUS),
    (UnknownOutcomeError, Meaning.AMBIGUOUS),
)

_FRAMEWORK: dict[str, Meaning] = {
    # aiogram 3 (aiogram/exceptions.py)
    "aiogram.exceptions.TelegramRetryAfter": Meaning.NOT_APPLIED,
    "aiogram.exceptions.TelegramMigrateToChat": Meaning.NOT_APPLIED,
    "aiogram.exceptions.TelegramBadRequest": Meaning.PERMANENT,
    "aiogram.exceptions.TelegramForbiddenError": Meaning.PERMANENT,
    "aiogram.exceptions.TelegramNotFound": Meaning.PERMANENT,
    "aiogram.exceptions.TelegramUnauthorizedError": Meaning.PERMANENT,
    "aiogram.exceptions.TelegramConflictError": Meaning.PERMANENT,
    "aiogram.exceptions.TelegramEntityTooLarge": Meaning.PERMANENT,
    "aiogram.exceptions.TelegramNetworkError": Meaning.AMBIGUOUS,
    "aiogram.exceptions.TelegramServerError": Meaning.AMBIGUOUS,
    # python-telegram-bot 22 (telegram/error.py); BadRequest and TimedOut are
    # NetworkErrors, so the nearest class decides.
    "telegram.error.RetryAfter": Meaning.NOT_APPLIED,
    "telegram.error.ChatMigrated": Meaning.NOT_APPLIED,
    "telegram.error.BadRequest": Meaning.PERMANENT,
    "telegram.error.Forbidden": Meaning.PERMANENT,
    "telegram.error.InvalidToken": Meaning.PERMANENT,
    "telegram.error.Conflict": Meaning.PERMANENT,
    "telegram.error.TimedOut": Meaning.AMBIGUOUS,
    "telegram.error.NetworkError": Meaning.AMBIGUOUS,
}
"""Bot API errors of the frameworks, by ``module.qualname`` of a class in the MRO."""


@dataclass(frozen=True, slots=True)
class EffectPolicy:
    """How one run treats its effect: ``once`` and the error classes.

    Attributes:
        once: ``"at_least"`` or ``"at_most"``.
        not_applied, permanent, ambiguous: exception classes with that meaning.
        on_error: ``"release"`` or ``"store"``: what an exception no rule classifies
            means (see the module docstring, rule 5).
    """

    once: Once = "at_least"
    not_applied: tuple[type[BaseException], ...] = ()
    permanent: tuple[type[BaseException], ...] = ()
    ambiguous: tuple[type[BaseException], ...] = ()
    on_error: Literal["release", "store"] = "release"

    @property
    def at_most(self) -> bool:
        """Whether the effect is at most once (it needs the store's ledger)."""
        return self.once == "at_most"


AT_LEAST = EffectPolicy()
"""Today's behaviour: at least once, nothing listed, released on error."""


def _types(name: str, value: object) -> tuple[type[BaseException], ...]:
    if isinstance(value, type):
        value = (value,)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ConfigurationError(f"{name}= must be a tuple of exception classes, got {value!r}")
    out: list[type[BaseException]] = []
    for item in value:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise ConfigurationError(f"{name}= must hold exception classes, got {item!r}")
        out.append(item)
    return tuple(out)


def effect_policy(
    *,
    once: object = "at_least",
    not_applied: object = (),
    permanent: object = (),
    ambiguous: object = (),
    on_error: object = "release",
) -> EffectPolicy:
    """The :class:`EffectPolicy` of a run's arguments, checked.

    Args:
        once: ``"at_least"`` or ``"at_most"``.
        not_applied, permanent, ambiguous: exception classes (a tuple; one class is
            taken as a tuple of one).
        on_error: ``"release"`` or ``"store"``.

    Raises:
        ConfigurationError: another ``once`` or ``on_error``, a list holding anything
            but exception classes, or one class in two lists.
    """
    if once not in ("at_least", "at_most"):
        raise ConfigurationError(f"once must be 'at_least' or 'at_most', got {once!r}")
    if on_error not in ("release", "store"):
        raise ConfigurationError(f"on_error must be 'release' or 'store', got {on_error!r}")
    lists = {
        "not_applied": _types("not_applied", not_applied),
        "permanent": _types("permanent", permanent),
        "ambiguous": _types("ambiguous", ambiguous),
    }
    seen: dict[type[BaseException], str] = {}
    for name, types in lists.items():
        for cls in types:
            if seen.get(cls, name) != name:
                raise ConfigurationError(
                    f"{cls.__qualname__} is in both {seen[cls]}= and {name}=: give it one meaning"
                )
            seen[cls] = name
    if once == "at_least" and on_error == "release" and not seen:
        return AT_LEAST
    return EffectPolicy(
        once=once,
        not_applied=lists["not_applied"],
        permanent=lists["permanent"],
        ambiguous=lists["ambiguous"],
        on_error=on_error,
    )


def classify(exc: BaseException, policy: EffectPolicy) -> Meaning:
    """What ``exc``, raised by an effect run under ``policy``, means (the module's
    tables). Never raises."""
    for marker, meaning in _MARKERS:
        if isinstance(exc, marker):
            return meaning
    if policy.not_applied or policy.permanent or policy.ambiguous:
        listed = (
            (policy.not_applied, Meaning.NOT_APPLIED),
            (policy.permanent, Meaning.PERMANENT),
            (policy.ambiguous, Meaning.AMBIGUOUS),
        )
        for cls in type(exc).__mro__:
            for types, meaning in listed:
                if cls in types:
                    return meaning
    for known, meaning in _LIBRARY:
        if isinstance(exc, known):
            return meaning
    for cls in type(exc).__mro__:
        found = _FRAMEWORK.get(f"{cls.__module__}.{cls.__qualname__}")
        if found is not None:
            return found
    if policy.on_error == "store":
        return Meaning.PERMANENT
    return Meaning.AMBIGUOUS if policy.at_most else Meaning.NOT_APPLIED
