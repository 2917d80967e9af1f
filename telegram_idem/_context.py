"""What the adapters tell the guards about the update being processed.

The adapter (aiogram middleware, PTB processor, webhook worker) binds an
:class:`UpdateContext` for the duration of one update; ``@idempotent`` and steps read it,
so the same decorator works in every framework. An action binds an :class:`ActionContext`
so its steps know their parent key.

This module sits below the guard: it knows the guard only as the :class:`Guard`
protocol (:class:`telegram_idem.Idem` is one), so it imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from telegram_idem._admission import Admission
from telegram_idem._keys import KeyBuilder
from telegram_idem._records import Claim
from telegram_idem.errors import ConfigurationError

__all__ = [
    "ActionContext",
    "Guard",
    "UpdateContext",
    "bind_update",
    "bound_update",
    "current_action",
    "current_update",
]

T = TypeVar("T")


class Guard(Protocol):
    """The guard as bound code sees it: what ``@idempotent``, steps and locks call on
    :attr:`UpdateContext.idem`. :class:`telegram_idem.Idem` is the implementation; see
    its methods for the arguments, units and errors."""

    keys: KeyBuilder

    async def run(
        self,
        key: str,
        fn: Callable[[], Awaitable[T]],
        *,
        fingerprint: str | None = None,
        in_progress: Literal["raise", "wait", "drop"] = "raise",
        on_error: Literal["release", "store"] = "release",
        lease: float | None = None,
        retention: float | None = None,
        wait_timeout: float | None = None,
        handler: str | None = None,
        boundary: Literal["action", "step"] = "action",
        window: float | None = None,
    ) -> T:
        """:meth:`telegram_idem.Idem.run`."""
        ...

    async def step(
        self,
        name: str,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        key: str | None = None,
        **kwargs: Any,
    ) -> T:
        """:meth:`telegram_idem.Idem.step`."""
        ...

    def lock(
        self,
        name: str,
        *,
        bot_id: int | None = None,
        ttl: float = 120.0,
        wait: float = 0.0,
    ) -> AbstractAsyncContextManager[Claim]:
        """:meth:`telegram_idem.Idem.lock`."""
        ...

    def chat_lock(
        self, *, ttl: float = 120.0, name: str = "", wait: float = 0.0
    ) -> AbstractAsyncContextManager[Claim]:
        """:meth:`telegram_idem.Idem.chat_lock`."""
        ...


@dataclass(frozen=True, slots=True)
class UpdateContext:
    """The update being processed.

    Attributes:
        update: the Bot API update as a dict (JSON field names, ``from`` included).
        bot_id: the receiving bot's id.
        idem: the guard that processes it.
        admission: how the update runs: ``Admission.RUN`` (under its update guard claim,
            or owned by the durable inbox), ``Admission.UNGUARDED`` (a store outage,
            fail-open), or ``None`` (bound by hand with :func:`bind_update`, not
            admitted). A framework adapter meeting an update that is already bound
            *and admitted* runs it without admitting it again.
    """

    update: Mapping[str, Any]
    bot_id: int
    idem: Guard
    admission: Admission | None = None

    def admitted(self, bot_id: int, update_id: object) -> bool:
        """Whether this is the update ``update_id`` of ``bot_id``, already admitted (an
        outer shape runs it: a webhook, the Lambda worker, the inbox worker)."""
        return (
            self.admission is not None
            and self.bot_id == bot_id
            and self.update.get("update_id") == update_id
        )


@dataclass(frozen=True, slots=True)
class ActionContext:
    """The action being run.

    Attributes:
        key: the action's full key.
        token: the holder's fencing token.
        idem: the guard running it; its steps and locks use this guard's store, whichever
            :class:`~telegram_idem.Idem` they are called on.
        calls: how many outbox calls of each content digest it has made so far (the
            ``n`` of their effect keys: stable under ``asyncio.gather``, because identical
            calls are interchangeable and distinct ones never share a counter).
    """

    key: str
    token: int
    idem: Guard
    calls: dict[str, int] = field(default_factory=dict)

    def next_call(self, digest: str) -> int:
        """The index of the next call with content ``digest`` in this action (from 0)."""
        n = self.calls.get(digest, 0)
        self.calls[digest] = n + 1
        return n


_update: ContextVar[UpdateContext | None] = ContextVar("telegram_idem_update", default=None)
_action: ContextVar[ActionContext | None] = ContextVar("telegram_idem_action", default=None)


def bound_update() -> UpdateContext | None:
    """The bound update, or ``None`` when nothing is bound."""
    return _update.get()


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
    """Bind ``update`` for the guards for the duration of the ``with`` block.

    Args:
        update: the Bot API update dict.
        bot_id: the receiving bot's id.
        idem: the guard processing it.
        admission: how it was admitted (:attr:`UpdateContext.admission`); leave it
            ``None`` when binding by hand (tests, a framework without an adapter).
    """

    __slots__ = ("_ctx", "_reset")

    def __init__(
        self,
        update: Mapping[str, Any],
        *,
        bot_id: int,
        idem: Guard,
        admission: Admission | None = None,
    ) -> None:
        self._ctx = UpdateContext(update, bot_id, idem, admission)

    def __enter__(self) -> UpdateContext:
        self._reset = _update.set(self._ctx)
        return self._ctx

    def __exit__(self, *exc: object) -> None:
        _update.reset(self._reset)


@contextmanager
def bind_action(key: str, token: int, idem: Guard) -> Iterator[ActionContext]:
    """Bind the running action (used by the action guard)."""
    ctx = ActionContext(key, token, idem)
    reset = _action.set(ctx)
    try:
        yield ctx
    finally:
        _action.reset(reset)
