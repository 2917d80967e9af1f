"""What the adapters tell the guards about the update being processed.

The adapter (aiogram middleware, PTB processor, webhook worker) binds an
:class:`UpdateContext` for the duration of one update; ``@idempotent`` and steps read it,
so the same decorator works in every framework. An action binds an :class:`ActionContext`
so its steps know their parent key.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from telegram_idem.errors import ConfigurationError

if TYPE_CHECKING:
    from telegram_idem.guard import Idem

__all__ = ["ActionContext", "UpdateContext", "bind_update", "current_action", "current_update"]


@dataclass(frozen=True, slots=True)
class UpdateContext:
    """The update being processed.

    Attributes:
        update: the Bot API update as a dict (JSON field names, ``from`` included).
        bot_id: the receiving bot's id.
        idem: the guard that processes it.
    """

    update: Mapping[str, Any]
    bot_id: int
    idem: Idem


@dataclass(frozen=True, slots=True)
class ActionContext:
    """The action being run.

    Attributes:
        key: the action's full key.
        token: the holder's fencing token.
        idem: the guard running it; its steps and locks use this guard's store, whichever
            :class:`Idem` they are called on.
    """

    key: str
    token: int
    idem: Idem


_update: ContextVar[UpdateContext | None] = ContextVar("telegram_idem_update", default=None)
_action: ContextVar[ActionContext | None] = ContextVar("telegram_idem_action", default=None)


def current_update() -> UpdateContext:
    """The bound update.

    Raises:
        ConfigurationError: nothing is bound: install the adapter (aiogram
            ``IdempotencyMiddleware``) or wrap the call in :func:`bind_update`.
    """
    ctx = _update.get()
    if ctx is None:
        raise ConfigurationError(
            "no update is bound: register telegram_idem's middleware/processor for your "
            "framework, or call inside `with bind_update(update, bot_id=..., idem=...)`"
        )
    return ctx


def current_action() -> ActionContext | None:
    """The action being run in this task, or ``None``."""
    return _action.get()


class bind_update:
    """Bind ``update`` for the guards for the duration of the ``with`` block."""

    __slots__ = ("_ctx", "_reset")

    def __init__(self, update: Mapping[str, Any], *, bot_id: int, idem: Idem) -> None:
        self._ctx = UpdateContext(update, bot_id, idem)

    def __enter__(self) -> UpdateContext:
        self._reset = _update.set(self._ctx)
        return self._ctx

    def __exit__(self, *exc: object) -> None:
        _update.reset(self._reset)


@contextmanager
def bind_action(key: str, token: int, idem: Idem) -> Iterator[ActionContext]:
    """Bind the running action (used by the action guard)."""
    ctx = ActionContext(key, token, idem)
    reset = _action.set(ctx)
    try:
        yield ctx
    finally:
        _action.reset(reset)
