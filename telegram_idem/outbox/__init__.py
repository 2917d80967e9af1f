"""The durable outbox: Bot API calls sent once, in order per chat, with honest unknowns.

- :class:`~telegram_idem.outbox._base.Outbox` — the store contract, implemented next to
  each store that supports it.
- :mod:`telegram_idem.outbox._calls` — what an answer means (outcome classes), default
  ambiguous policies, latest-wins collapse keys, params encoding.
- :class:`~telegram_idem.outbox._transport.HttpBotAPI` — the Bot API over HTTP (extra
  ``outbox``); :class:`CallNotSent` / :class:`AmbiguousCall` — no answer came.
- :class:`~telegram_idem.outbox._relay.Relay` — sends the entries and records outcomes.
- :class:`~telegram_idem.outbox._sender.Outbound` — what bot code calls:
  ``await outbound.call("sendMessage", {...})``.
"""

import importlib as _importlib
import typing as _typing

from telegram_idem.outbox._base import (
    LIVE,
    REDRIVABLE,
    SETTLED,
    AmbiguousPolicy,
    CallStatus,
    NewCall,
    Outbox,
    OutboxEntry,
)
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
from telegram_idem.outbox._failures import AmbiguousCall, CallNotSent
from telegram_idem.outbox._relay import Relay

if _typing.TYPE_CHECKING:
    from telegram_idem.outbox._sender import Outbound
    from telegram_idem.outbox._transport import BotAPI, HttpBotAPI

_LAZY = {
    "BotAPI": "telegram_idem.outbox._transport",
    "HttpBotAPI": "telegram_idem.outbox._transport",
    "Outbound": "telegram_idem.outbox._sender",
}
"""Names from modules that reach aiohttp (extra ``outbox``): imported on first access, so
the stores, which import this package for the contract, need no HTTP client."""

__all__ = [
    "COLLAPSING_METHODS",
    "LIVE",
    "REDRIVABLE",
    "SAFE_TO_REPEAT",
    "SETTLED",
    "AmbiguousCall",
    "AmbiguousPolicy",
    "Answer",
    "BotAPI",
    "CallNotSent",
    "CallStatus",
    "FileRef",
    "HttpBotAPI",
    "NewCall",
    "Outbound",
    "Outbox",
    "OutboxEntry",
    "OutcomeClass",
    "Relay",
    "Verdict",
    "call_digest",
    "classify",
    "collapse_key",
    "default_policy",
    "encode_params",
    "ordering_key_of",
]


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
