"""Decision events: one :class:`DecisionEvent` per guard decision, given to every hook.

Every decision of the guards — the update guard's claim or an inbox admission, an
action, a step, a lock — is emitted here, from one place (:func:`emit_decision`), and
handed to each subscribed hook in the order they subscribed::

    seen: list[DecisionEvent] = []
    with subscribe(seen.append):
        await idem.run(key, work)
    [e.decision for e in seen]          # ['acquired']

The structured log record on the logger ``telegram_idem.decisions`` is the default
subscriber: always there, it writes the event's fields into the record's ``extra``
(``boundary``, ``key``, ``decision``, ``update_id``, ``chat_id``, ``user_id``,
``handler``, ``fencing_token``, ``elapsed_ms``, ``seconds``), at INFO; conflicts,
unknown outcomes, store errors and 429s at WARNING.

Hooks are called synchronously, in the task that made the decision, before the guard
acts on it: keep them quick (count, append, put on a queue), never blocking. A hook that
raises never breaks a decision: its first failure is logged (ERROR, with the traceback,
on ``telegram_idem.events``), later ones of the same subscription are not, and the other
hooks still run. When no hook is subscribed and the decision logger is off for the level,
emitting costs one check: no event is built.

A store outage decides nothing, but it is counted as one: a claim (an update's, an
inbox admission's, an action's or a step's) that the store could not answer emits
decision ``"store_error"`` (at WARNING; ``elapsed_ms`` is how long the store took to
fail) before its :class:`~telegram_idem.errors.StoreError` goes on to the admission
(:mod:`telegram_idem._admitted`) or the caller.

Flood control (boundary ``"flood"``, :mod:`telegram_idem.flood`) emits a 429 that paused
the bot (``"retry_after"``, ``seconds`` the pause Telegram asked for) and a call that
waited for its budgets (``"wait"``, ``seconds`` waited); ``handler`` is the Bot API
method, ``key`` the flood-control key (``…:flood:<bot_id>:pause`` for a 429, the budget
the call waited on for a wait).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self

from telegram_idem import _updates as _u

__all__ = [
    "Boundary",
    "DecisionEvent",
    "Hook",
    "Subscription",
    "decision_logger",
    "emit",
    "emit_decision",
    "listening",
    "subscribe",
]

Boundary = Literal["update", "action", "step", "lock", "outbox", "flood"]
"""Where a decision was made: the update guard (a claim, or an inbox admission), the
action guard, a side-effect step, a lock, the outbox relay (what an outgoing call's
answer decided), or flood control (a 429's pause, a call's wait for its budgets)."""

decision_logger = logging.getLogger("telegram_idem.decisions")
"""The logger of the default subscriber (one record per decision)."""

_log = logging.getLogger("telegram_idem.events")

_WARN = frozenset({"conflict", "unknown", "store_error", "retry_after"})
"""Decisions logged at WARNING: a conflict, an effect whose outcome is unknown, a claim
the store could not answer, and a 429 (Telegram's flood control paused the bot)."""


@dataclass(frozen=True, slots=True)
class DecisionEvent:
    """One guard decision.

    Attributes:
        boundary: ``"update"``, ``"action"``, ``"step"``, ``"lock"``, ``"outbox"`` or
            ``"flood"``.
        decision: what was decided. Claims: ``"acquired"``, ``"replay"``,
            ``"in_progress"``, ``"conflict"``, ``"failed"`` (a stored failure replayed),
            ``"store_error"`` (the store could not answer the claim, or the inbox
            admission: a :class:`~telegram_idem.errors.StoreError` follows).
            At-most-once actions and steps also: ``"unknown"`` (a holder met an
            unsettled effect, or it failed ambiguously) and ``"resolved"`` (settled by
            ``Idem.resolve``, or its resolution applied). Locks: ``"acquired"``, ``"held"``; the poll leader lease (``handler``
            ``"poll-leader"``) also ``"standby"``, ``"lost"``, ``"released"``. Inbox admissions (boundary ``update``):
            ``"admitted"``, ``"duplicate"``, ``"not_yet"``. Outbox calls (``handler`` is
            the Bot API method): ``"delivered"``, ``"already_done"``, ``"flood_wait"``
            (a 429), ``"migrated"``, ``"resend"``, ``"not_sent"``, ``"unknown"``,
            ``"dead"``, ``"parked"``. Flood control (``handler`` is the Bot API method):
            ``"retry_after"`` (a 429 paused the bot), ``"wait"`` (a call waited for its
            budgets).
        key: the full idempotency key (for flood control, the flood-control key).
        update_id: the update decided about, or being processed (``None`` when no update
            is bound).
        chat_id: that update's chat id, if it has one.
        user_id: that update's sender's id, if it has one.
        handler: the ``@idempotent`` handler's ``__qualname__``, or the step's name.
        fencing_token: the fencing token of the record that decided (``None`` for an
            inbox admission).
        elapsed_ms: milliseconds the store took to decide (``0.0`` when not measured).
        bot_id: the receiving bot's id, when known.
        seconds: flood control only: the pause a 429 asked for (``"retry_after"``), or
            the seconds a call waited for its budgets (``"wait"``); else ``None``.
    """

    boundary: Boundary
    decision: str
    key: str
    update_id: int | None = None
    chat_id: int | None = None
    user_id: int | None = None
    handler: str | None = None
    fencing_token: int | None = None
    elapsed_ms: float = 0.0
    bot_id: int | None = None
    seconds: float | None = None

    @property
    def level(self) -> int:
        """The log level of its record: WARNING for a conflict, an unknown outcome, a
        store error or a 429 (someone must look), else INFO."""
        return logging.WARNING if self.decision in _WARN else logging.INFO


Hook = Callable[[DecisionEvent], object]
"""A subscriber: called with each event; its return value is ignored."""

_lock = threading.Lock()
_hooks: tuple[Hook, ...] = ()
_failed: set[int] = set()  # id() of subscribed hooks that raised (logged once)


class Subscription:
    """What :func:`subscribe` returns: call it (or leave its ``with`` block) to
    unsubscribe. Unsubscribing twice does nothing.

    Args:
        hook: the subscribed hook.
    """

    __slots__ = ("_hook",)

    def __init__(self, hook: Hook) -> None:
        self._hook: Hook | None = hook

    def __call__(self) -> None:
        """Stop giving events to the hook."""
        global _hooks
        hook, self._hook = self._hook, None
        if hook is None:
            return
        with _lock:
            hooks = list(_hooks)
            for i, h in enumerate(hooks):
                if h is hook:
                    del hooks[i]
                    break
            _hooks = tuple(hooks)
            if not any(h is hook for h in hooks):
                _failed.discard(id(hook))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self()


def subscribe(hook: Hook) -> Subscription:
    """Give every decision event from now on to ``hook`` (after the hooks subscribed
    before it), until the returned :class:`Subscription` is called or its ``with``
    block ends. The same hook subscribed twice is called twice.

    Args:
        hook: ``(event: DecisionEvent) -> object``; called synchronously in the task
            that decided; its return value is ignored; what it raises is logged once
            and otherwise ignored.

    Returns:
        The subscription: ``unsubscribe()`` or ``with subscribe(hook): ...``.
    """
    global _hooks
    with _lock:
        _hooks = (*_hooks, hook)
    return Subscription(hook)


def listening(level: int = logging.INFO) -> bool:
    """Whether an event of ``level`` would reach anyone: a hook is subscribed, or the
    decision logger is on for ``level``. The one check on the hot path.

    Args:
        level: the event's log level (``logging.INFO``, …).
    """
    return bool(_hooks) or decision_logger.isEnabledFor(level)


def emit(event: DecisionEvent) -> None:
    """Give ``event`` to the default subscriber (the decision log record), then to each
    hook in subscription order. Never raises for a hook's failure.

    Args:
        event: the decision event.
    """
    if decision_logger.isEnabledFor(event.level):
        _log_record(event)
    for hook in _hooks:
        try:
            hook(event)
        except Exception:
            _hook_failed(hook)


def emit_decision(
    *,
    boundary: Boundary,
    key: str,
    decision: str,
    update: Mapping[str, Any] | None,
    handler: str | None = None,
    fencing_token: int | None = None,
    elapsed_ms: float = 0.0,
    bot_id: int | None = None,
    seconds: float | None = None,
) -> None:
    """Build the :class:`DecisionEvent` of a decision and :func:`emit` it, unless nobody
    listens (:func:`listening`): then nothing is built.

    Args:
        boundary: where it was decided.
        key: the full key decided about.
        decision: what was decided (see :class:`DecisionEvent`).
        update: the update decided about or bound (its ids are read from it), or ``None``.
        handler: the handler or step name.
        fencing_token: the deciding record's token.
        elapsed_ms: milliseconds the decision took.
        bot_id: the receiving bot's id, when known.
        seconds: flood control's pause or wait, in seconds (see :class:`DecisionEvent`).
    """
    level = logging.WARNING if decision in _WARN else logging.INFO
    if not listening(level):
        return
    emit(
        DecisionEvent(
            boundary=boundary,
            decision=decision,
            key=key,
            update_id=update.get("update_id") if update is not None else None,
            chat_id=_u.chat_id(update) if update is not None else None,
            user_id=_u.user_id(update) if update is not None else None,
            handler=handler,
            fencing_token=fencing_token,
            elapsed_ms=round(elapsed_ms, 3),
            bot_id=bot_id,
            seconds=seconds,
        )
    )


def _log_record(event: DecisionEvent) -> None:
    """The default subscriber: one record on ``telegram_idem.decisions``."""
    extra = {
        "boundary": event.boundary,
        "key": event.key,
        "decision": event.decision,
        "update_id": event.update_id,
        "chat_id": event.chat_id,
        "user_id": event.user_id,
        "handler": event.handler,
        "fencing_token": event.fencing_token,
        "elapsed_ms": event.elapsed_ms,
        "seconds": event.seconds,
    }
    decision_logger.log(
        event.level, "%s %s %s", event.boundary, event.decision, event.key, extra=extra
    )


def _hook_failed(hook: Hook) -> None:
    with _lock:
        first = id(hook) not in _failed
        _failed.add(id(hook))
    if first:
        _log.error(
            "decision hook %r raised; the decision stands and the hook stays subscribed "
            "(later failures of it are not logged)",
            hook,
            exc_info=True,
        )
