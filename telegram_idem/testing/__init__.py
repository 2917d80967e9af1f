"""Test helpers for bot authors: prove in your own test suite that handlers survive
duplicates.

- **Updates**: :class:`UpdateFactory` builds every common update type (parseable by
  aiogram and python-telegram-bot); :func:`load_fixture` reads the shipped real payloads.
- **Replay**: :class:`Replayer` delivers one update many times (sequentially,
  concurrently, interleaved, Telegram-style with re-sends, double taps) to an aiogram
  dispatcher, a PTB application, a webhook URL or an async callable, and its
  :class:`ReplayResult` tells how many times each handler and step ran.
- **Assertions**: :func:`assert_ran_once`, :func:`assert_step_ran_once`,
  :func:`assert_every_callback_answered`, :func:`assert_no_update_lost`.
- **A loopback Telegram**: :class:`FakeBotAPI` (the Bot API; a :class:`Fault` of a
  :class:`FaultKind` injects what Telegram answers when things go wrong, and
  :class:`FakeBotAPIControl` injects it into a fake in another process) and
  :class:`TelegramDelivery` (webhook delivery); these need aiohttp and are imported on
  first use, so ``import telegram_idem.testing`` works without it.
- **The pytest plugin** (:mod:`telegram_idem.testing.plugin`, active once the package is
  installed): fixtures ``idem``, ``idem_store``, ``idem_clock``, ``update_factory``,
  ``fake_bot_api``, ``telegram_delivery``, ``replay``. See docs/testing.md.
- **The store conformance suite** (:mod:`telegram_idem.testing.conformance`, imported on
  its own): test classes a store's author subclasses with one URL factory.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from telegram_idem.testing._assertions import (
    assert_every_callback_answered,
    assert_no_update_lost,
    assert_ran,
    assert_ran_once,
    assert_step_ran,
    assert_step_ran_once,
)
from telegram_idem.testing._decisions import BackgroundFailure, Decision, DecisionRecorder
from telegram_idem.testing._factories import (
    DEFAULT_BOT,
    DEFAULT_BOT_ID,
    DEFAULT_TOKEN,
    DEFAULT_USER,
    OMIT,
    UpdateFactory,
    chat_member_status,
)
from telegram_idem.testing._payloads import (
    FIXTURES,
    fixture_names,
    load_fixture,
    load_update,
    make_double_tap,
)
from telegram_idem.testing._replay import Delivery, Replayer, ReplayResult
from telegram_idem.testing._targets import (
    DROPPED,
    AiogramTarget,
    CallableTarget,
    PTBTarget,
    ReplayTarget,
    WebhookAnswerError,
    WebhookTarget,
    aiogram_bot,
)

if _typing.TYPE_CHECKING:
    from telegram_idem.testing._delivery import (
        SECRET_HEADER,
        Attempt,
        DeliveryReport,
        TelegramDelivery,
    )
    from telegram_idem.testing._loopback import LoopbackServer, serve_app
    from telegram_idem.testing.bot_api import (
        Call,
        FakeBotAPI,
        FakeBotAPIControl,
        Fault,
        FaultKind,
        SentMessage,
    )

_LAZY = {
    "LoopbackServer": "telegram_idem.testing._loopback",
    "serve_app": "telegram_idem.testing._loopback",
    "Attempt": "telegram_idem.testing._delivery",
    "Call": "telegram_idem.testing.bot_api",
    "DeliveryReport": "telegram_idem.testing._delivery",
    "FakeBotAPI": "telegram_idem.testing.bot_api",
    "FakeBotAPIControl": "telegram_idem.testing.bot_api",
    "Fault": "telegram_idem.testing.bot_api",
    "FaultKind": "telegram_idem.testing.bot_api",
    "SECRET_HEADER": "telegram_idem.testing._delivery",
    "SentMessage": "telegram_idem.testing.bot_api",
    "TelegramDelivery": "telegram_idem.testing._delivery",
}
"""Names from modules that need aiohttp: imported on first access."""

__all__ = [
    "DEFAULT_BOT",
    "DEFAULT_BOT_ID",
    "DEFAULT_TOKEN",
    "DEFAULT_USER",
    "DROPPED",
    "FIXTURES",
    "OMIT",
    "SECRET_HEADER",
    "AiogramTarget",
    "Attempt",
    "BackgroundFailure",
    "Call",
    "CallableTarget",
    "Decision",
    "DecisionRecorder",
    "Delivery",
    "DeliveryReport",
    "FakeBotAPI",
    "FakeBotAPIControl",
    "Fault",
    "FaultKind",
    "LoopbackServer",
    "PTBTarget",
    "ReplayResult",
    "ReplayTarget",
    "Replayer",
    "SentMessage",
    "TelegramDelivery",
    "UpdateFactory",
    "WebhookAnswerError",
    "WebhookTarget",
    "aiogram_bot",
    "assert_every_callback_answered",
    "assert_no_update_lost",
    "assert_ran",
    "assert_ran_once",
    "assert_step_ran",
    "assert_step_ran_once",
    "chat_member_status",
    "fixture_names",
    "load_fixture",
    "load_update",
    "make_double_tap",
    "serve_app",
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
