"""Recording the guards' decisions while a test runs.

Every guard decision is one :class:`~telegram_idem.events.DecisionEvent`.
:class:`DecisionRecorder` subscribes to them for a ``with`` block
(:func:`telegram_idem.events.subscribe`), so decisions are recorded whatever logging
setup the test suite has, and keeps each as a :class:`Decision`. It also keeps the
failures a fast-ack webhook logs for updates that failed *after* it answered 200 (logger
``telegram_idem.webhook``), which no HTTP client can see::

    with DecisionRecorder() as recorder:
        await dispatcher.feed_raw_update(bot, update)
    [d.decision for d in recorder.decisions]      # ['acquired', 'acquired', ...]
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from telegram_idem.events import DecisionEvent, Subscription, subscribe

__all__ = ["BackgroundFailure", "Decision", "DecisionRecorder"]

_webhook_logger = logging.getLogger("telegram_idem.webhook")


@dataclass(frozen=True, slots=True)
class Decision:
    """One guard decision, as recorded.

    Attributes:
        boundary: ``"update"``, ``"action"``, ``"step"`` or ``"lock"``.
        decision: ``"acquired"``, ``"replay"``, ``"in_progress"``, ``"conflict"``,
            ``"failed"`` (a stored failure replayed) or, for locks, ``"held"``.
        key: the full idempotency key.
        handler: the action's handler (its ``__qualname__``) or the step's name.
        update_id: the update being processed, if one was bound.
        fencing_token: the token of the record that decided.
        task: ``id()`` of the asyncio task that asked (tells concurrent callers apart).
    """

    boundary: str
    decision: str
    key: str
    handler: str | None
    update_id: int | None
    fencing_token: int | None
    task: int | None = None


@dataclass(frozen=True, slots=True)
class BackgroundFailure:
    """An update that failed after the webhook had answered 200 (so Telegram never
    re-sends it): its ``update_id`` and the exception.

    Attributes:
        update_id: the update that failed, or ``None`` if unknown.
        error: the exception.
    """

    update_id: int | None
    error: BaseException


def _task_id() -> int | None:
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return None
    return id(task) if task is not None else None


class DecisionRecorder(logging.Handler):
    """Keeps the guard decisions made inside its ``with`` block (a decision hook), and
    the background failures the webhook logs (a logging handler on
    ``telegram_idem.webhook``).

    Args:
        update_ids: keep only decisions about these updates (plus those with no update
            bound); ``None`` keeps all. Narrowing avoids counting another test's updates
            when several run in one process.
    """

    def __init__(self, update_ids: Collection[int] | None = None) -> None:
        super().__init__(level=logging.DEBUG)
        self.update_ids = set(update_ids) if update_ids is not None else None
        self.decisions: list[Decision] = []
        self.background_failures: list[BackgroundFailure] = []
        self._subscription: Subscription | None = None

    def _wanted(self, update_id: int | None) -> bool:
        return self.update_ids is None or update_id is None or update_id in self.update_ids

    def record(self, event: DecisionEvent) -> None:
        """Keep ``event`` if it is about an update of interest (the decision hook).

        Args:
            event: a decision event.
        """
        if not self._wanted(event.update_id):
            return
        self.decisions.append(
            Decision(
                boundary=event.boundary,
                decision=event.decision,
                key=event.key,
                handler=event.handler,
                update_id=event.update_id,
                fencing_token=event.fencing_token,
                task=_task_id(),
            )
        )

    def emit(self, record: logging.LogRecord) -> None:
        """Keep ``record`` if it is a background failure of interest.

        Args:
            record: a log record (the ``logging.Handler`` side).
        """
        if record.name == _webhook_logger.name:
            self._background(record)

    def _background(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.ERROR or not record.exc_info:
            return
        error = record.exc_info[1]
        if error is None:
            return
        args = record.args if isinstance(record.args, tuple) else ()
        update_id = args[0] if args and isinstance(args[0], int) else None
        if self._wanted(update_id):
            self.background_failures.append(BackgroundFailure(update_id, error))

    def __enter__(self) -> Self:
        self._subscription = subscribe(self.record)
        _webhook_logger.addHandler(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _webhook_logger.removeHandler(self)
        if self._subscription is not None:
            self._subscription()
            self._subscription = None
