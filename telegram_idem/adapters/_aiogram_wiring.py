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
- aiogram's ``SimpleRequestHandler`` with its default ``handle_in_background=True``
  answers 200 before the guard decides: :func:`answering_first_routes` finds it among an
  aiohttp app's routes (``register()`` adds ``handler.handle`` as a POST route).

:func:`check_observers` and :func:`check_handlers` run at the dispatcher's start-up when
the middleware was installed with ``IdempotencyMiddleware.setup(dp)``, and at the first
update otherwise.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

from aiogram import Dispatcher
from aiogram.types import Update
from aiogram.webhook.aiohttp_server import BaseRequestHandler
from aiohttp import web

from telegram_idem._decorator import wrapper_of
from telegram_idem.errors import ConfigurationError

__all__ = ["answering_first_routes", "check_event", "check_handlers", "check_observers"]

# The answer per dispatcher, by id (a plain dict lookup on every update; the entry is
# dropped when the dispatcher is collected, before its id can be reused).
_UNCHECKED = object()
_checked: dict[int, object] = {}


def check_event(event: object) -> None:
    """Raise unless ``event`` is an aiogram ``Update`` (the middleware is on ``dp.update``).

    Raises:
        ConfigurationError: the middleware is registered on another observer.
    """
    if not isinstance(event, Update):
        raise ConfigurationError(
            f"IdempotencyMiddleware received a {type(event).__name__}, not an Update: it "
            "is registered on an observer other than dp.update and guards nothing there. "
            "Register it with IdempotencyMiddleware(idem).setup(dp), which also checks the "
            "wiring at start-up (or dp.update.outer_middleware(IdempotencyMiddleware(idem)))."
        )


def check_observers(dispatcher: Dispatcher, middleware: type) -> None:
    """Raise if an instance of ``middleware`` is registered on an observer of
    ``dispatcher`` (or of its sub-routers) other than ``dispatcher.update``, where it
    would receive no ``Update`` and guard nothing.

    Raises:
        ConfigurationError: such a registration exists.
    """
    wrong = [
        f"{'dp' if router is dispatcher else 'router'}.{name}.{kind}"
        for router in dispatcher.chain_tail
        for name, observer in router.observers.items()
        if observer is not dispatcher.update
        for kind, manager in (
            ("outer_middleware", observer.outer_middleware),
            ("middleware", observer.middleware),
        )
        if any(isinstance(m, middleware) for m in manager)
    ]
    if wrong:
        raise ConfigurationError(
            f"{middleware.__name__} is registered on {', '.join(wrong)}: it sees no Update "
            "there and guards nothing. Register it on dp.update only "
            f"({middleware.__name__}(idem).setup(dp))."
        )


def check_handlers(dispatcher: Dispatcher | None, *, fresh: bool = False) -> None:
    """Raise if a handler of ``dispatcher`` (or its sub-routers) is registered without
    the ``@idempotent`` wrapper made around it. Walks the handlers once per dispatcher
    and remembers the answer; ``fresh=True`` (at start-up) walks them again.

    Raises:
        ConfigurationError: ``@idempotent`` was placed above a router decorator.
    """
    if dispatcher is None:
        return
    problem = _checked.get(id(dispatcher), _UNCHECKED)
    if problem is _UNCHECKED:  # the first walk of this dispatcher: forget it when it goes
        weakref.finalize(dispatcher, _checked.pop, id(dispatcher), None)
    if fresh or problem is _UNCHECKED:
        problem = _checked[id(dispatcher)] = _find_misplaced(dispatcher)
    if problem is not None:
        raise ConfigurationError(str(problem))


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


def answering_first_routes(app: web.Application, dispatcher: Dispatcher) -> list[str]:
    """The paths of ``app`` (and of its sub-apps) served by aiogram's own request handler
    with ``handle_in_background=True`` for ``dispatcher``: they answer 200 before the
    update guard decides. A subclass that overrides ``handle`` (telegram-idem's
    ``IdempotentRequestHandler``) decides first and is not listed."""
    paths: list[str] = []
    for resource in app.router.resources():
        sub_app = getattr(resource, "_app", None)  # add_subapp / add_domain resources
        if isinstance(sub_app, web.Application):
            paths.extend(answering_first_routes(sub_app, dispatcher))
            continue
        for route in resource:
            owner = _aiogram_handle_owner(route.handler)
            if owner is not None and owner.handle_in_background and owner.dispatcher is dispatcher:
                paths.append(resource.canonical)
    return paths


def _aiogram_handle_owner(handler: Any) -> BaseRequestHandler | None:
    """The request handler whose un-overridden aiogram ``handle`` serves this route
    (registered as ``rh.handle`` by ``register()``, or as the object itself)."""
    owner: object
    func: object
    if isinstance(handler, BaseRequestHandler):
        owner, func = handler, type(handler).__call__
    else:
        owner, func = getattr(handler, "__self__", None), getattr(handler, "__func__", None)
    if isinstance(owner, BaseRequestHandler) and func is BaseRequestHandler.handle:
        return owner
    return None
