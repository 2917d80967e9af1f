"""What the python-telegram-bot adapter modules share: the Bot API view of a PTB update,
the registry of guarded applications, and the record of one guarded run.

Public names are re-exported by :mod:`telegram_idem.adapters.ptb`; import them from there.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from collections.abc import Awaitable, Mapping
from contextvars import ContextVar
from typing import Any

from telegram import Update
from telegram.ext import Application, CallbackContext

from telegram_idem._guard import Idem
from telegram_idem.errors import ConfigurationError

__all__ = [
    "IDEM_KEY",
    "AnyApplication",
    "AnyContext",
    "application_of",
    "close_unrun",
    "idem_of",
    "register_guard",
    "update_to_dict",
]

log = logging.getLogger("telegram_idem.ptb")

IDEM_KEY = "idem"
"""``context.bot_data`` key that :func:`idem_of` also reads (an :class:`Idem` you put
there yourself). The adapter does not write ``bot_data``: PTB persistence would try to
pickle or JSON-encode the guard."""

AnyApplication = Application[Any, Any, Any, Any, Any, Any]
AnyContext = CallbackContext[Any, Any, Any, Any]

# Applications the processor or the inbox dispatch attached to, and their guard.
_GUARDS: weakref.WeakKeyDictionary[AnyApplication, Idem] = weakref.WeakKeyDictionary()

# Message fields that are ``True`` or absent in the Bot API but that PTB serialises as
# ``false`` when absent (Bot API, "Message": "Optional. Service message: ...").
_PTB_FALSE_DEFAULTS = frozenset(
    {"delete_chat_photo", "group_chat_created", "supergroup_chat_created", "channel_chat_created"}
)


def update_to_dict(update: Update) -> dict[str, Any]:
    """The update as Bot API JSON: ``from`` (not ``from_user``), dates as Unix seconds,
    unknown fields (``api_kwargs``) included, and PTB's ``false`` defaults for the
    ``*_chat_created`` / ``delete_chat_photo`` service flags left out, as Telegram sends it.

    For the shipped fixtures the result equals the received JSON.

    Args:
        update: the PTB ``Update``.
    """
    data: dict[str, Any] = _strip_false_defaults(update.to_dict())
    return data


def _strip_false_defaults(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _strip_false_defaults(v)
            for k, v in value.items()
            if not (k in _PTB_FALSE_DEFAULTS and v is False)
        }
    if isinstance(value, list):
        return [_strip_false_defaults(v) for v in value]
    return value


def register_guard(application: AnyApplication, idem: Idem) -> None:
    """Make ``idem`` the guard :func:`idem_of` finds for ``application``."""
    _GUARDS[application] = idem


def idem_of(context: AnyContext) -> Idem:
    """The :class:`Idem` guarding ``context.application``.

    Found where :class:`~telegram_idem.adapters.ptb.IdempotentUpdateProcessor` (after its
    first update, or its ``attach``) or :func:`~telegram_idem.adapters.ptb.inbox_dispatch`
    registered it, else ``context.bot_data["idem"]`` if you put one there.

    Args:
        context: a PTB callback's ``context``.

    Raises:
        ConfigurationError: neither.
    """
    found = _GUARDS.get(context.application)
    if found is not None:
        return found
    data = context.bot_data
    if isinstance(data, Mapping) and isinstance(data.get(IDEM_KEY), Idem):
        guard: Idem = data[IDEM_KEY]
        return guard
    raise ConfigurationError(
        "no Idem for this application: build it with "
        "ApplicationBuilder().concurrent_updates(IdempotentUpdateProcessor(idem, n)), or set "
        "context.bot_data['idem']"
    )


class Run:
    """One guarded update's processing, seen by the error handler through a context var."""

    __slots__ = ("error", "finished", "ran")

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.ran = False
        self.finished = False


RUN: ContextVar[Run | None] = ContextVar("telegram_idem_ptb_run", default=None)


def close_unrun(coroutine: Awaitable[Any]) -> None:
    """Close a coroutine that will never be awaited (no "never awaited" warning)."""
    close = getattr(coroutine, "close", None)
    if callable(close):
        close()


def application_of(coroutine: Awaitable[Any]) -> AnyApplication | None:
    """The application whose ``process_update(update)`` coroutine this is (PTB passes
    exactly that to ``BaseUpdateProcessor.process_update``), read from the unstarted
    coroutine's arguments."""
    if not inspect.iscoroutine(coroutine):
        return None
    owner = inspect.getcoroutinelocals(coroutine).get("self")
    return owner if isinstance(owner, Application) else None
