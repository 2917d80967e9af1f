"""telegram-idem: make Telegram bots safe against duplicate processing.

Three boundaries (docs/design/record.md#three-boundaries): the update guard (``(bot_id, update_id)`` seen once),
the action guard (:func:`idempotent` over a business key), and side-effect steps
(:meth:`Idem.step`), plus per-chat locks and signed callback tokens.
"""

from telegram_idem.admission import Admission, StorePolicy
from telegram_idem.admitted import Admitted
from telegram_idem.backends import Store, store_from_url
from telegram_idem.callbacks import CallbackTokens
from telegram_idem.clock import ManualClock
from telegram_idem.codec import JsonCodec, ResultCodec
from telegram_idem.context import bind_update, current_update
from telegram_idem.decorator import idempotent
from telegram_idem.errors import (
    CallbackTokenError,
    ClaimError,
    ConfigurationError,
    ConflictError,
    ExpiredCallbackTokenError,
    ForgedCallbackTokenError,
    IdemError,
    InProgressError,
    KeyTemplateError,
    LockHeldError,
    LostClaimError,
    MalformedUpdateError,
    PermanentUpdateError,
    ResultEncodingError,
    StoredFailureError,
    StoreError,
    UnknownCallbackTokenError,
    UpdateInProgressError,
)
from telegram_idem.events import DecisionEvent, subscribe
from telegram_idem.guard import Idem
from telegram_idem.keys import KeyBuilder, fingerprint, render_template
from telegram_idem.records import Claim, Outcome, Record, Status

__version__ = "0.1.0"

__all__ = [
    "Admission",
    "Admitted",
    "CallbackTokenError",
    "CallbackTokens",
    "Claim",
    "ClaimError",
    "ConfigurationError",
    "ConflictError",
    "DecisionEvent",
    "ExpiredCallbackTokenError",
    "ForgedCallbackTokenError",
    "Idem",
    "IdemError",
    "InProgressError",
    "JsonCodec",
    "KeyBuilder",
    "KeyTemplateError",
    "LockHeldError",
    "LostClaimError",
    "MalformedUpdateError",
    "ManualClock",
    "Outcome",
    "PermanentUpdateError",
    "Record",
    "ResultCodec",
    "ResultEncodingError",
    "Status",
    "Store",
    "StoreError",
    "StorePolicy",
    "StoredFailureError",
    "UnknownCallbackTokenError",
    "UpdateInProgressError",
    "bind_update",
    "current_update",
    "fingerprint",
    "idempotent",
    "render_template",
    "store_from_url",
    "subscribe",
]
