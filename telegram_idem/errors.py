"""Every error telegram-idem raises, in one tree.

::

    IdemError
    ├── StoreError                   the store could not answer (outage, timeout, throttling);
    │                                 never reported as "duplicate" or "acquired"
    ├── ConfigurationError           a bad store URL, option or template
    │   └── KeyTemplateError         a key template names a field the update lacks
    ├── MalformedUpdateError         not a Bot API update (no integer ``update_id``)
    ├── PermanentUpdateError         an update that can never be processed: the inbox
    │                                 worker dead-letters it at once, without retries
    ├── ClaimError                   a decision about one key; carries ``key`` and ``record``
    │   ├── ConflictError            same key, different fingerprint
    │   ├── InProgressError          another holder's lease is alive (policy ``raise``,
    │   │   │                         or ``wait`` ran out of time)
    │   │   └── UpdateInProgressError  an update's claim is held elsewhere: do not
    │   │                             acknowledge it (Telegram must re-send it)
    │   ├── LockHeldError            a lock already has a holder
    │   ├── LostClaimError           a result stored with a stale fencing token
    │   └── StoredFailureError       replay of a failure stored by ``on_error="store"``
    ├── ResultEncodingError          a handler result the codec cannot store
    ├── UnknownOutcomeError          an effect that may or may not have happened (an
    │                                 at-most-once step or action that was interrupted, or
    │                                 an ambiguous send held for reconciliation); carries
    │                                 ``key`` and what is known (``entry``)
    ├── ResolveError                 ``Idem.resolve`` of a key that is not unresolved
    ├── EffectError                  a marker an effect raises to say what its failure means
    │   ├── NotAppliedError          it did not happen: release, a retry runs it
    │   ├── PermanentEffectError     it failed for good: store the failure, retries replay it
    │   └── AmbiguousEffectError     nobody knows: unknown under ``at_most``, release
    │                                 under ``at_least``
    ├── SendError                    an outbox call that did not deliver; carries ``key``
    │   ├── SendFailedError          Telegram refused it for good (``error_code``,
    │   │   │                         ``description``): a dead letter
    │   │   └── ChatParkedError      its chat is parked (the bot was blocked there)
    │   └── DeliveryTimeoutError     not delivered within the caller's wait; it stays in
    │                                 the outbox and is still sent
    └── CallbackTokenError           callback data that does not resolve
        ├── ForgedCallbackTokenError     bad shape or bad signature
        ├── ExpiredCallbackTokenError    signed, but past its TTL
        └── UnknownCallbackTokenError    signed and live, but no server-side payload
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from telegram_idem._records import Record

__all__ = [
    "AmbiguousEffectError",
    "CallbackTokenError",
    "ChatParkedError",
    "ClaimError",
    "ConfigurationError",
    "ConflictError",
    "DeliveryTimeoutError",
    "EffectError",
    "ExpiredCallbackTokenError",
    "ForgedCallbackTokenError",
    "IdemError",
    "InProgressError",
    "KeyTemplateError",
    "LockHeldError",
    "LostClaimError",
    "MalformedUpdateError",
    "NotAppliedError",
    "PermanentEffectError",
    "PermanentUpdateError",
    "ResolveError",
    "ResultEncodingError",
    "SendError",
    "SendFailedError",
    "StoreError",
    "StoredFailureError",
    "UnknownCallbackTokenError",
    "UnknownOutcomeError",
    "UpdateInProgressError",
]


class IdemError(Exception):
    """Base class of every telegram-idem error."""


class StoreError(IdemError):
    """The store could not give an answer: connection error, timeout, throttling.

    ``original`` is the driver's exception (also chained as ``__cause__``). An outage is
    never turned into a "duplicate" or an "acquired" decision: callers apply a policy.

    Args:
        message: the error's text (``str(error)``).
        original: the driver's exception, kept as ``original``; ``None`` when there is none.
    """

    def __init__(self, message: str, *, original: BaseException | None = None) -> None:
        super().__init__(message)
        self.original = original


class ConfigurationError(IdemError, ValueError):
    """A store URL, option or key template that cannot work."""


class KeyTemplateError(ConfigurationError):
    """A key template names a field absent from the update, or is not a valid template.

    ``template`` is the template, ``field`` the field that failed (or ``None``).

    Args:
        message: the error's text (``str(error)``).
        template: the template, kept as ``template``.
        field: the field that failed, kept as ``field`` (``None``: the template itself is
            bad).
    """

    def __init__(self, message: str, *, template: str, field: str | None = None) -> None:
        super().__init__(message)
        self.template = template
        self.field = field


class MalformedUpdateError(IdemError, ValueError):
    """The object is not a Bot API ``Update``: not a JSON object, or no integer ``update_id``.

    Source: Bot API, "Getting updates" → ``Update`` (``update_id`` is an Integer).
    """


class PermanentUpdateError(IdemError):
    """An update that no retry can process (the framework cannot parse it, it was rejected
    at admission). Raise it from an inbox dispatch to send the entry to the dead letters
    at once instead of retrying it while its chat waits."""


class ClaimError(IdemError):
    """A decision about one idempotency key. ``key`` and ``record`` say which and why.

    Args:
        message: the error's text (``str(error)``).
        key: the idempotency key decided on, kept as ``key``.
        record: the record the decision read, kept as ``record`` (``None``: none).
    """

    def __init__(self, message: str, *, key: str, record: Record | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.record = record


class ConflictError(ClaimError):
    """The key was first claimed with a different payload fingerprint."""


class InProgressError(ClaimError):
    """Another holder is running this key and its lease is alive."""


class UpdateInProgressError(InProgressError):
    """An update's guard claim is held elsewhere and its lease is alive.

    The delivery must not be acknowledged (see :mod:`telegram_idem._admission`): a webhook
    answers it with a non-2xx so Telegram re-sends it, and the re-delivery after the
    holder's lease ends runs it by takeover if the holder died.
    """


class LockHeldError(ClaimError):
    """The lock has a live holder. ``retry_after`` is seconds until its lease ends.

    Args:
        message: the error's text (``str(error)``).
        key: the lock's key.
        record: the holder's record.
        retry_after: seconds until the holder's lease ends, kept as ``retry_after``.
    """

    def __init__(
        self, message: str, *, key: str, record: Record | None = None, retry_after: float = 0.0
    ) -> None:
        super().__init__(message, key=key, record=record)
        self.retry_after = retry_after


class LostClaimError(ClaimError):
    """The holder's fencing token is no longer the record's: its lease was taken over.

    Raised when a holder that stalled past its lease tries to store its result; the new
    holder's record stands untouched. (A stale release or heartbeat is logged, not raised.)
    """


class StoredFailureError(ClaimError):
    """Replay of a failure stored under ``on_error="store"``.

    ``error_type`` and ``error_message`` describe the first run's exception.

    Args:
        message: the error's text (``str(error)``).
        key: the key whose failure is replayed.
        record: its record.
        error_type: the first run's exception class name, kept as ``error_type``.
        error_message: the first run's exception text, kept as ``error_message``.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str,
        record: Record | None = None,
        error_type: str = "",
        error_message: str = "",
    ) -> None:
        super().__init__(message, key=key, record=record)
        self.error_type = error_type
        self.error_message = error_message


class ResultEncodingError(IdemError, TypeError):
    """A handler or step result the result codec cannot serialise."""


class UnknownOutcomeError(IdemError):
    """An effect may or may not have taken effect, and nobody can tell by retrying: an
    at-most-once step or action (``once="at_most"``) whose holder was interrupted after
    it started, or that failed ambiguously; or an outbox call under policy ``hold`` whose
    answer was lost. It is never re-run by itself; an operator (or the bot) settles it
    (``Idem.resolve``; for a call also ``Outbox.resolve`` / ``Outbox.redrive``).

    Args:
        message: the error's text (``str(error)``).

    Attributes:
        key: the step's, action's or call's key.
        entry: what is known: a :class:`telegram_idem.ledger.LedgerEntry` for a step or
            action, an :class:`telegram_idem.outbox.OutboxEntry` for a call, or ``None``.
    """

    def __init__(self, message: str, *, key: str, entry: object | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.entry = entry


class ResolveError(IdemError):
    """``Idem.resolve`` of a key that has nothing to settle: no unknown step, action or
    call under it, or it was settled (or completed) already.

    Args:
        message: the error's text (``str(error)``).

    Attributes:
        key: the key given.
    """

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


class EffectError(IdemError):
    """Base of the markers an effect raises to say what its failure means (the effect
    error classes); raise a subclass, ``from`` the original error."""


class NotAppliedError(EffectError):
    """The effect did not happen (the provider refused before acting, a validation
    failed): the claim is released and a retry runs it again, under either ``once``."""


class PermanentEffectError(EffectError):
    """The effect failed for good: the failure is stored and every retry replays it
    (:class:`StoredFailureError`)."""


class AmbiguousEffectError(EffectError):
    """Nobody can tell whether the effect happened (a timeout after the request was
    sent): under ``once="at_most"`` the key becomes unknown (every retry raises
    :class:`UnknownOutcomeError` until it is resolved); under ``"at_least"`` the claim is
    released and a retry runs it again."""


class SendError(IdemError):
    """An outbox call that did not deliver. ``key`` is its effect key.

    Args:
        message: the error's text (``str(error)``).
        key: the call's effect key, kept as ``key``.
    """

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


class SendFailedError(SendError):
    """Telegram refused the call for good; the entry is a dead letter (redrivable).

    Args:
        message: the error's text (``str(error)``).
        key: the call's effect key.

    Attributes:
        error_code: Telegram's ``error_code`` (400, 403, ...), or ``None``.
        description: Telegram's ``description``.
    """

    def __init__(
        self, message: str, *, key: str, error_code: int | None = None, description: str = ""
    ) -> None:
        super().__init__(message, key=key)
        self.error_code = error_code
        self.description = description


class ChatParkedError(SendFailedError):
    """The call's chat is parked (403: the bot was blocked, kicked, or the user is
    deactivated); the entry waits, parked, until the chat is unparked."""


class DeliveryTimeoutError(SendError):
    """The call was not delivered within the caller's wait. It stays in the outbox and
    a relay still sends it; await it again, or look it up by ``key``."""


class CallbackTokenError(IdemError):
    """Callback data that does not resolve to a server-side payload. ``data`` is what came.

    Args:
        message: the error's text (``str(error)``).
        data: the callback data that came, kept as ``data``.
    """

    def __init__(self, message: str, *, data: str) -> None:
        super().__init__(message)
        self.data = data


class ForgedCallbackTokenError(CallbackTokenError):
    """The callback data is not a token this secret signed (bad shape or bad HMAC)."""


class ExpiredCallbackTokenError(CallbackTokenError):
    """The token is genuine but its TTL has passed."""


class UnknownCallbackTokenError(CallbackTokenError):
    """The token is genuine and live, but the store has no payload for it (revoked or lost)."""
