"""The decision log: one structured record per guard decision.

Logger ``telegram_idem.decisions``; each record carries, in ``extra``: ``key``,
``update_id``, ``chat_id``, ``user_id``, ``handler``, ``decision``, ``fencing_token``,
``elapsed_ms`` (milliseconds the decision took), and ``boundary`` (update, action, step,
lock). Decisions log at INFO, conflicts at WARNING. A store outage makes no decision: it
raises :class:`~telegram_idem.errors.StoreError` and the admission's policy logs it.

The record is the default subscriber of the decision events (:mod:`telegram_idem.events`,
where decisions are emitted); this module keeps the names it always had.
"""

from __future__ import annotations

from telegram_idem.events import decision_logger, emit_decision

__all__ = ["decision_logger", "log_decision"]

log_decision = emit_decision
"""Emit one decision (:func:`telegram_idem.events.emit_decision`): its record, and its
event to every hook."""
