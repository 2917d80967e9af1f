"""One structured log record per guard decision.

Logger ``telegram_idem.decisions``; each record carries, in ``extra``: ``key``,
``update_id``, ``chat_id``, ``user_id``, ``handler``, ``decision``, ``fencing_token``,
``elapsed_ms`` (milliseconds the decision took), and ``boundary`` (update, action, step,
lock). Decisions log at INFO, conflicts at WARNING. A store outage makes no decision: it
raises :class:`~telegram_idem.errors.StoreError` and the adapter's policy logs it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from telegram_idem import updates as _u

__all__ = ["decision_logger", "log_decision"]

decision_logger = logging.getLogger("telegram_idem.decisions")


def log_decision(
    *,
    boundary: str,
    key: str,
    decision: str,
    update: Mapping[str, Any] | None,
    handler: str | None = None,
    fencing_token: int | None = None,
    elapsed_ms: float = 0.0,
    level: int = logging.INFO,
) -> None:
    """Emit the decision record described in the module docstring."""
    if not decision_logger.isEnabledFor(level):
        return
    extra = {
        "boundary": boundary,
        "key": key,
        "decision": decision,
        "update_id": update.get("update_id") if update is not None else None,
        "chat_id": _u.chat_id(update) if update is not None else None,
        "user_id": _u.user_id(update) if update is not None else None,
        "handler": handler,
        "fencing_token": fencing_token,
        "elapsed_ms": round(elapsed_ms, 3),
    }
    decision_logger.log(level, "%s %s %s", boundary, decision, key, extra=extra)
