"""``@idempotent(key=...)``: the action guard as a decorator on any async handler.

The key is rendered against the Telegram update bound by the framework adapter (aiogram
middleware, PTB processor, …), so one template works in every framework::

    @router.callback_query(F.data.startswith("approve:"))
    @idempotent(key="approve:{callback_query.message.message_id}:{callback_query.from.id}")
    async def approve(query: CallbackQuery) -> str:
        ...

Settings live on the decorator itself, never read from a middleware's ``handler``
argument (in aiogram 3 that is the next layer, not your function).
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

from telegram_idem._context import current_update
from telegram_idem._effects import ErrorTypes, effect_policy
from telegram_idem._guard import ErrorPolicy, InProgressPolicy, Once
from telegram_idem._keys import KeySource, fingerprint, render_key
from telegram_idem.errors import ConfigurationError

__all__ = ["FingerprintSource", "idempotent", "wrapper_of"]

P = ParamSpec("P")
T = TypeVar("T")

FingerprintSource = Sequence[str] | Callable[[Mapping[str, Any]], object]
"""Dotted update fields whose values make the fingerprint, or a callable on the update."""


_WRAPPERS: weakref.WeakKeyDictionary[Callable[..., Any], Callable[..., Any]] = (
    weakref.WeakKeyDictionary()
)


def wrapper_of(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """The ``@idempotent`` wrapper made around ``fn``, or ``None`` if ``fn`` was never
    wrapped. A framework adapter uses it to find handlers registered unwrapped (the
    decorator placed above the router's decorator)."""
    try:
        return _WRAPPERS.get(fn)
    except TypeError:  # not weak-referenceable: never wrapped
        return None


def _field(update: Mapping[str, Any], path: str) -> object:
    value: object = update
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def idempotent(
    *,
    key: KeySource,
    fingerprint_fields: FingerprintSource | None = None,
    in_progress: InProgressPolicy = "raise",
    on_error: ErrorPolicy = "release",
    lease: float | None = None,
    retention: float | None = None,
    wait_timeout: float | None = None,
    window: float | None = None,
    once: Once = "at_least",
    not_applied: ErrorTypes = (),
    permanent: ErrorTypes = (),
    ambiguous: ErrorTypes = (),
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
    """Make an async handler run once per idempotency key; repeats replay its result.

    Args:
        key: a template over the update (dotted paths such as
            ``"{callback_query.from.id}"`` and the shorthands ``{bot_id}``, ``{chat_id}``,
            ``{user_id}``, ``{message_id}``, ``{thread_id}``, ``{callback_data}``), or a
            callable ``(update: dict) -> str`` that must return a non-empty ``str``.
        fingerprint_fields: update fields (dotted paths) or a callable whose value is
            hashed; the same key with a different fingerprint raises ``ConflictError``.
        in_progress: ``"raise"`` | ``"wait"`` | ``"drop"`` (see :meth:`Idem.run`).
        on_error: ``"release"`` (default: a retry runs again) | ``"store"``.
        lease: seconds the claim's lease lasts (default the guard's ``lease``).
        retention: seconds the result is kept for replay (default the guard's
            ``action_retention``).
        wait_timeout: seconds ``in_progress="wait"`` waits for another holder (default
            the lease).
        window: seconds a finished run is replayed (a double-tap window for navigation
            buttons: a repeat within ``window`` seconds after the run finished is a
            replay, a later one runs again); independent of ``lease``. Not together
            with ``retention``. See :meth:`telegram_idem.Idem.run`.
        once: ``"at_least"`` (default: a handler whose holder crashed runs again) or
            ``"at_most"`` (it becomes unknown instead: every retry raises
            ``UnknownOutcomeError`` until ``idem.resolve`` settles it; needs a store
            with an effect ledger). Inside the handler,
            :func:`telegram_idem.effect_context` gives its stable ``idempotency_key``
            and fencing token.
        not_applied: exception classes meaning the handler's work was not applied (see
            :meth:`telegram_idem.Idem.run`).
        permanent: exception classes meaning it failed for good (see
            :meth:`telegram_idem.Idem.run`).
        ambiguous: exception classes meaning it may or may not have happened (see
            :meth:`telegram_idem.Idem.run`).

    Raises:
        TypeError: at decoration: the handler is not an ``async def``.
        ConfigurationError: at decoration: ``window`` given with ``retention``, or not
            > 0; an unknown ``once`` or ``on_error``; an error list holding anything but
            exception classes, or one class in two lists. At call time: no update bound
            (adapter not installed), or ``at_most`` on a store without an effect ledger.
        KeyTemplateError: at call time: the template names a field the update lacks, or
            the key callable returned anything but a non-empty ``str`` (nothing is
            stored).
        ConflictError: at call time: see :meth:`telegram_idem.Idem.run` (as are the
            next ones).
        InProgressError: at call time.
        StoredFailureError: at call time.
        UnknownOutcomeError: at call time.
        LostClaimError: at call time.
        StoreError: at call time.
    """
    if window is not None and (retention is not None or not window > 0):
        raise ConfigurationError(
            f"@idempotent: window must be > 0 seconds and not given with retention "
            f"(window={window!r}, retention={retention!r})"
        )
    policy = effect_policy(
        once=once,
        not_applied=not_applied,
        permanent=permanent,
        ambiguous=ambiguous,
        on_error=on_error,
    )

    def decorate(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        if not inspect.iscoroutinefunction(inspect.unwrap(fn)):
            raise TypeError(f"@idempotent needs an async handler, got {fn!r}")
        name = getattr(fn, "__qualname__", repr(fn))

        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            ctx = current_update()
            action = render_key(key, ctx.update, bot_id=ctx.bot_id)
            fp: str | None = None
            if fingerprint_fields is not None:
                if callable(fingerprint_fields):
                    fp = fingerprint(fingerprint_fields(ctx.update))
                else:
                    fp = fingerprint([_field(ctx.update, f) for f in fingerprint_fields])
            return await ctx.idem.run(
                ctx.idem.keys.action(ctx.bot_id, action),
                lambda: fn(*args, **kwargs),
                fingerprint=fp,
                in_progress=in_progress,
                on_error=on_error,
                lease=lease,
                retention=retention,
                wait_timeout=wait_timeout,
                handler=name,
                window=window,
                once=policy.once,
                not_applied=policy.not_applied,
                permanent=policy.permanent,
                ambiguous=policy.ambiguous,
            )

        try:
            _WRAPPERS[fn] = wrapper
        except TypeError:  # not weak-referenceable (rare callables): nothing to detect
            pass
        return wrapper

    return decorate
