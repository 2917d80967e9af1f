"""telegram-idem: make Telegram bots safe against duplicate processing.

Three boundaries (docs/design/record.md#three-boundaries): the update guard (``(bot_id, update_id)`` seen once),
the action guard (:func:`idempotent` over a business key), and side-effect steps
(:meth:`Idem.step`), plus per-chat locks and signed callback tokens.
"""

from telegram_idem._admission import Admission, StorePolicy
from telegram_idem._admitted import AdmissionHost, Admitted
from telegram_idem._callbacks import CallbackTokens
from telegram_idem._clock import ManualClock
from telegram_idem._codec import JsonCodec, ResultCodec
from telegram_idem._context import (
    EffectContext,
    Guard,
    UpdateContext,
    bind_update,
    current_update,
    effect_context,
)
from telegram_idem._decorator import idempotent
from telegram_idem._guard import Idem
from telegram_idem._joined import JoinedTransaction
from telegram_idem._keys import KeyBuilder, fingerprint, render_template
from telegram_idem._ordering import Ordering
from telegram_idem._records import Claim, Outcome, Record, Status
from telegram_idem._unresolved import Unresolved
from telegram_idem._updates import bot_id_from_token
from telegram_idem.backends import Store, store_from_url
from telegram_idem.errors import (
    AmbiguousEffectError,
    CallbackTokenError,
    ChatParkedError,
    ClaimError,
    ConfigurationError,
    ConflictError,
    DeliveryTimeoutError,
    EffectError,
    ExpiredCallbackTokenError,
    ForgedCallbackTokenError,
    IdemError,
    InProgressError,
    KeyTemplateError,
    LockHeldError,
    LostClaimError,
    MalformedUpdateError,
    NotAppliedError,
    PermanentEffectError,
    PermanentUpdateError,
    ResolveError,
    ResultEncodingError,
    SendError,
    SendFailedError,
    StoredFailureError,
    StoreError,
    UnknownCallbackTokenError,
    UnknownOutcomeError,
    UpdateInProgressError,
)
from telegram_idem.events import DecisionEvent, subscribe

__version__ = "0.1.0"

__all__ = [
    "Admission",
    "AdmissionHost",
    "Admitted",
    "AmbiguousEffectError",
    "CallbackTokenError",
    "CallbackTokens",
    "ChatParkedError",
    "Claim",
    "ClaimError",
    "ConfigurationError",
    "ConflictError",
    "DecisionEvent",
    "DeliveryTimeoutError",
    "EffectContext",
    "EffectError",
    "ExpiredCallbackTokenError",
    "ForgedCallbackTokenError",
    "Guard",
    "Idem",
    "IdemError",
    "InProgressError",
    "JoinedTransaction",
    "JsonCodec",
    "KeyBuilder",
    "KeyTemplateError",
    "LockHeldError",
    "LostClaimError",
    "MalformedUpdateError",
    "ManualClock",
    "NotAppliedError",
    "Ordering",
    "Outcome",
    "PermanentEffectError",
    "PermanentUpdateError",
    "Record",
    "ResolveError",
    "ResultCodec",
    "ResultEncodingError",
    "SendError",
    "SendFailedError",
    "Status",
    "Store",
    "StoreError",
    "StorePolicy",
    "StoredFailureError",
    "UnknownCallbackTokenError",
    "UnknownOutcomeError",
    "Unresolved",
    "UpdateContext",
    "UpdateInProgressError",
    "bind_update",
    "bot_id_from_token",
    "current_update",
    "effect_context",
    "fingerprint",
    "idempotent",
    "render_template",
    "store_from_url",
    "subscribe",
]
