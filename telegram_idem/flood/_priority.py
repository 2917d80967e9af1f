"""The priority of the calls made in a block of code, for senders that pass none per call.

aiogram's ``bot.send_message(...)`` has no argument for it (python-telegram-bot has
``rate_limit_args``), so a bulk broadcast says so around its calls::

    with priority(BULK):
        for chat in subscribers:
            await bot.send_message(chat, text)

``Outbound.call``, ``FloodControl.wait_turn`` and the aiogram and PTB hooks read it when
they are given no priority of their own; an explicit one wins. It is a context variable,
so tasks started inside the block inherit it and other tasks never see it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from telegram_idem.flood._limits import BULK, REPLY

__all__ = ["current_priority", "priority"]

_PRIORITY: ContextVar[int] = ContextVar("telegram_idem_priority", default=REPLY)


@contextmanager
def priority(value: int) -> Iterator[None]:
    """Give the calls made inside the block the priority ``value``.

    Args:
        value: :data:`~telegram_idem.flood._limits.REPLY` (0, the default: replies to
            users) … :data:`~telegram_idem.flood._limits.BULK` (10: broadcasts, which use
            only part of the global and group bursts and go after replies).

    Raises:
        ValueError: ``value`` is not an ``int`` from 0 to 10.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not REPLY <= value <= BULK:
        raise ValueError(f"priority must be an int from {REPLY} to {BULK}, got {value!r}")
    token = _PRIORITY.set(value)
    try:
        yield
    finally:
        _PRIORITY.reset(token)


def current_priority(given: int | None = None) -> int:
    """``given`` if it is not ``None``, else the priority of the enclosing
    :func:`priority` block (:data:`~telegram_idem.flood._limits.REPLY` outside one).

    Args:
        given: a priority passed with the call itself, or ``None``.
    """
    return _PRIORITY.get() if given is None else given
