"""What the adapters tell the guards about the update being processed.

The adapter (aiogram middleware, PTB processor, webhook worker) binds an
:class:`UpdateContext` for the duration of one update; ``@idempotent`` and steps read it,
so the same decorator works in every framework. An action (and a step) binds an
:class:`ActionContext` so its steps know their parent key, its run (the epoch their keys
carry) and how long its record is kept; its :class:`EffectContext` is what the effect
itself may read (:func:`effect_context`): a stable idempotency key for a provider and
the current fencing token.

This module sits below the guard: it knows the guard only as the :class:`Guard`
protocol (:class:`telegram_idem.Idem` is one), so it imports nothing above it.
"""

from __future__ import annotations

import base64
import hashlib
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from telegram_idem._admission import Admission
from telegram_idem._keys import KeyBuilder
from telegram_idem._records import Claim, Record
from telegram_idem.errors import ConfigurationError

__all__ = [
    "ActionContext",
    "EffectContext",
    "Guard",
    "UpdateContext",
    "bind_update",
    "bound_update",
    "current_action",
    "current_update",
    "effect_context",
    "idempotency_key_of",
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
        once: Literal["at_least", "at_most"] = "at_least",
        not_applied: Sequence[type[BaseException]] = (),
        permanent: Sequence[type[BaseException]] = (),
        ambiguous: Sequence[type[BaseException]] = (),
    ) -> T:
        """:meth:`telegram_idem.Idem.run`."""
        ...

    async def step(
        self,
        name: str,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        key: str | None = None,
        once: Literal["at_least", "at_most"] = "at_least",
        on_error: Literal["release", "store"] = "release",
        not_applied: Sequence[type[BaseException]] = (),
        permanent: Sequence[type[BaseException]] = (),
        ambiguous: Sequence[type[BaseException]] = (),
        context: bool = False,
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
        outer shape runs it: a webhook, the Lambda worker, the inbox worker).

        Args:
            bot_id: the bot the update came to.
            update_id: the update's ``update_id``.
        """
        return (
            self.admission is not None
            and self.bot_id == bot_id
            and self.update.get("update_id") == update_id
        )


IDEMPOTENCY_KEY_CHARS = 43
"""Length of :attr:`EffectContext.idempotency_key` (URL-safe base64 of a SHA-256)."""


def idempotency_key_of(key: str) -> str:
    """The stable idempotency key of the step or action ``key``: the URL-safe base64 of
    its SHA-256, unpadded: 43 characters of ``[A-Za-z0-9_-]``, the same for every
    attempt and every worker (it depends on ``key`` only). Never raises."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


@dataclass(frozen=True, slots=True)
class EffectContext:
    """What a running step or action tells its effect (:func:`effect_context`, or the
    first argument of a step run with ``context=True``).

    Attributes:
        key: the step's or action's full idempotency key.
        idempotency_key: a stable key for the effect's provider (a payment API's
            ``Idempotency-Key`` header, a ledger's unique column): 43 characters of
            ``[A-Za-z0-9_-]`` derived from ``key`` only, so every attempt and every
            worker sends the same one (:func:`idempotency_key_of`).
        fencing_token: the current holder's fencing token; it grows at every takeover,
            so an effect can make its own writes conditional on it (``... WHERE
            token < :fencing_token``) and a stalled holder's late write loses.
        attempt: how many times the key has been acquired in this run (1 the first
            time, +1 at every takeover or retry after a release).
        once: ``"at_least"`` or ``"at_most"``.
        name: the step's name, or the action's handler name (its key when it has
            none).
    """

    key: str
    idempotency_key: str
    fencing_token: int
    attempt: int
    once: Literal["at_least", "at_most"]
    name: str


@dataclass(slots=True)
class ActionContext:
    """The action (or step) being run.

    Attributes:
        key: the action's full key.
        token: the holder's fencing token.
        idem: the guard running it; its steps and locks use this guard's store, whichever
            :class:`~telegram_idem.Idem` they are called on.
        calls: how many outbox calls of each content digest it has made so far (the
            ``n`` of their effect keys: stable under ``asyncio.gather``, because identical
            calls are interchangeable and distinct ones never share a counter).
        epoch: the identity of this run of the key: the record's ``fencing_token -
            attempts`` when it was claimed, the same across takeovers and retries of one
            run, another after the record expired and the key was acquired afresh. Its
            steps' keys carry it (:meth:`~telegram_idem.KeyBuilder.step`), so a step
            recorded by an earlier run is never replayed into this one.
        expires_at: seconds since the epoch (store clock) when the record was to expire
            as claimed (``inf`` when unknown); its steps' records are kept no longer.
        claimed_at: seconds since the epoch (store clock) of the claim.
        kept: seconds its record is kept once it completes (a ``window=`` action's
            window; ``inf`` when unknown); its steps' completed records are kept no
            longer, so a later window's run never replays them, on any store.
        claimed_mono: ``time.monotonic()`` at the claim (to estimate the store's time
            later without a round trip).
        attempt: the record's ``attempts`` at the claim (1 the first time).
        once: the run's ``once`` policy.
        name: the step's name or the action's handler name (``""``: its key).
    """

    key: str
    token: int
    idem: Guard
    calls: dict[str, int] = field(default_factory=dict)
    epoch: int = 0
    expires_at: float = math.inf
    claimed_at: float = 0.0
    claimed_mono: float = 0.0
    attempt: int = 1
    once: Literal["at_least", "at_most"] = "at_least"
    name: str = ""
    kept: float = math.inf
    _effect: EffectContext | None = field(default=None, repr=False, compare=False)

    @property
    def effect(self) -> EffectContext:
        """What the running effect may read (:func:`effect_context`), made on first use
        (the idempotency key is a hash: runs that never ask pay nothing)."""
        if self._effect is None:
            self._effect = EffectContext(
                key=self.key,
                idempotency_key=idempotency_key_of(self.key),
                fencing_token=self.token,
                attempt=self.attempt,
                once=self.once,
                name=self.name or self.key,
            )
        return self._effect

    def next_call(self, digest: str) -> int:
        """The index of the next call with content ``digest`` in this action (from 0)."""
        n = self.calls.get(digest, 0)
        self.calls[digest] = n + 1
        return n

    def retention_left(self, store_now: float | None = None) -> float:
        """Seconds left of this record's retention as claimed: at ``store_now`` (store
        clock) when given, else estimated from the claim and the monotonic clock
        (``inf`` when unknown; may be ≤ 0)."""
        if store_now is None:
            store_now = self.claimed_at + (time.monotonic() - self.claimed_mono)
        return self.expires_at - store_now


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


def effect_context() -> EffectContext:
    """The innermost running step's or action's :class:`EffectContext`.

    Raises:
        ConfigurationError: no step or action is running in this task.
    """
    action = _action.get()
    if action is None:
        raise ConfigurationError(
            "effect_context() is only available inside a running step or @idempotent action"
        )
    return action.effect


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


class bind_action:
    """Bind the running action or step for the ``with`` block (used by the guards; the
    arguments are :class:`ActionContext`'s; ``claimed_mono`` is read now)."""

    __slots__ = ("_ctx", "_reset")

    def __init__(
        self,
        key: str,
        token: int,
        idem: Guard,
        *,
        epoch: int = 0,
        expires_at: float = math.inf,
        claimed_at: float = 0.0,
        attempt: int = 1,
        once: Literal["at_least", "at_most"] = "at_least",
        name: str = "",
        kept: float = math.inf,
    ) -> None:
        self._ctx = ActionContext(
            key,
            token,
            idem,
            {},
            epoch,
            expires_at,
            claimed_at,
            time.monotonic(),
            attempt,
            once,
            name,
            kept,
        )

    @classmethod
    def of_record(
        cls,
        record: Record,
        idem: Guard,
        *,
        lease: float,
        once: Literal["at_least", "at_most"] = "at_least",
        name: str = "",
        kept: float = math.inf,
    ) -> bind_action:
        """The binding of the run that just acquired ``record`` (its claim's record)
        with a lease of ``lease`` seconds: its key and token, the run's epoch
        (``fencing_token - attempts``), the record's expiry and the store's time at the
        claim (``lease_expires_at - lease``), and ``kept`` (seconds its completed record
        will be kept), so its steps' keys carry the run and their records are kept no
        longer than this one. Every guard that runs a claimed key
        (the store's, or a joined transaction's) binds it this way."""
        return cls(
            record.key,
            record.fencing_token,
            idem,
            epoch=record.fencing_token - record.attempts,
            expires_at=record.expires_at,
            claimed_at=record.lease_expires_at - lease,
            attempt=record.attempts,
            once=once,
            name=name,
            kept=kept,
        )

    def __enter__(self) -> ActionContext:
        self._reset = _action.set(self._ctx)
        return self._ctx

    def __exit__(self, *exc: object) -> None:
        _action.reset(self._reset)
