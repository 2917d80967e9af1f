"""Wiring mistakes of the aiogram adapter that would otherwise guard nothing, silently.

- The middleware registered on an observer other than ``dp.update`` (e.g.
  ``dp.callback_query.outer_middleware(...)``) sees a ``CallbackQuery``, not an
  ``Update``, so it cannot claim anything: :func:`check_event` raises.
- ``@idempotent`` placed *above* the router's decorator::

      @idempotent(key="pay:{message.message_id}")   # wraps what the router returns...
      @router.message(Command("pay"))                # ...after it registered the bare fn
      async def pay(message): ...

  registers the bare handler, so it runs unguarded: :func:`check_handlers` finds every
  registered callback that ``@idempotent`` wrapped while its wrapper is not registered.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

from aiogram import Dispatcher
from aiogram.types import Update

from telegram_idem.decorator import wrapper_of
from telegram_idem.errors import ConfigurationError

__all__ = ["check_event", "check_handlers"]

_checked: weakref.WeakKeyDictionary[Dispatcher, str | None] = weakref.WeakKeyDictionary()


def check_event(event: object) -> None:
    """Raise unless ``event`` is an aiogram ``Update`` (the middleware is on ``dp.update``).

    Raises:
        ConfigurationError: the middleware is registered on another observer.
    """
    if not isinstance(event, Update):
        raise ConfigurationError(
            f"IdempotencyMiddleware received a {type(event).__name__}, not an Update: it "
            "is registered on an observer other than dp.update and guards nothing there. "
            "Register it with dp.update.outer_middleware(IdempotencyMiddleware(idem))."
        )


def check_handlers(dispatcher: Dispatcher | None) -> None:
    """Raise if a handler of ``dispatcher`` (or its sub-routers) is registered without
    the ``@idempotent`` wrapper made around it. Walks the handlers once per dispatcher
    (at its first update) and remembers the answer.

    Raises:
        ConfigurationError: ``@idempotent`` was placed above a router decorator.
    """
    if dispatcher is None:
        return
    try:
        problem = _checked[dispatcher]
    except KeyError:
        problem = _checked[dispatcher] = _find_misplaced(dispatcher)
    if problem is not None:
        raise ConfigurationError(problem)


def _find_misplaced(dispatcher: Dispatcher) -> str | None:
    registered: list[tuple[str, Any]] = []
    for router in dispatcher.chain_tail:
        for event_name, observer in router.observers.items():
            registered.extend((event_name, handler.callback) for handler in observer.handlers)
    callbacks = {id(cb) for _, cb in registered}
    bare = [
        (name, cb)
        for name, cb in registered
        if (wrapper := wrapper_of(cb)) is not None and id(wrapper) not in callbacks
    ]
    if not bare:
        return None
    where = ", ".join(f"{_describe(cb)} on router.{name}" for name, cb in bare)
    return (
        f"handler(s) registered without their @idempotent wrapper, so they run unguarded: "
        f"{where}. Put @idempotent(...) below the router decorator "
        "(@router.message(...) first, then @idempotent(...), then async def)."
    )


def _describe(fn: Any) -> str:
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        line = inspect.getsourcelines(fn)[1]
        return f"{name} ({inspect.getsourcefile(fn)}:{line})"
    except (OSError, TypeError):
        return str(name)
