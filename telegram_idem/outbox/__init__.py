"""The durable outbox: Bot API calls sent once, in order per chat, with honest unknowns.

- :class:`~telegram_idem.outbox._base.Outbox` — the store contract, implemented next to
  each store that supports it.
- :mod:`telegram_idem.outbox._calls` — what an answer means (outcome classes), default
  ambiguous policies, latest-wins collapse keys, params encoding.
"""

from telegram_idem.outbox._base import AmbiguousPolicy, CallStatus, NewCall, Outbox, OutboxEntry
from telegram_idem.outbox._calls import (
    COLLAPSING_METHODS,
    SAFE_TO_REPEAT,
    Answer,
    FileRef,
    OutcomeClass,
    Verdict,
    call_digest,
    classify,
    collapse_key,
    default_policy,
    encode_params,
    ordering_key_of,
)

__all__ = [
    "COLLAPSING_METHODS",
    "SAFE_TO_REPEAT",
    "AmbiguousPolicy",
    "Answer",
    "CallStatus",
    "FileRef",
    "NewCall",
    "Outbox",
    "OutboxEntry",
    "OutcomeClass",
    "Verdict",
    "call_digest",
    "classify",
    "collapse_key",
    "default_policy",
    "encode_params",
    "ordering_key_of",
]
