"""The one rule for answering a delivery of an update: only a *completed* update is
acknowledged as a duplicate.

Telegram re-sends an update until it is acknowledged: a webhook answer that is not a 2xx
(or none within about 60 s) makes it re-send the same ``update_id`` later; ``getUpdates``
confirms every update below the ``offset`` of the next call (Bot API, "Getting updates":
``setWebhook`` and ``getUpdates``). Acknowledging an update is therefore a promise that it
*has been* processed, or is durably queued. An update whose claim is only *in progress*
elsewhere carries no such promise: its holder may be dead (a killed run, an OOM, a
platform timeout), or the claim may have been applied by a store after its client had
timed out. Answering such a delivery "duplicate" loses the update for good.

Every ingress shape maps a claim's :class:`~telegram_idem.records.Outcome` to a
:class:`Verdict` with :func:`verdict_for`, and the verdict to its own answer:

| outcome of the update guard claim | verdict     | webhook answer | polling                   |
|-----------------------------------|-------------|----------------|---------------------------|
| acquired (new, or lease taken over)| ``RUN``     | 200 (processed / queued) | processed         |
| replay (completed before)         | ``DUPLICATE``| 200, not run   | confirmed, not run        |
| failed (a stored failure)         | ``DUPLICATE``| 200, not run   | confirmed, not run        |
| in progress, holder's lease alive | ``NOT_YET`` | 503 (re-sent later) | wait for the lease (bounded), then run by takeover or confirm the replay |
| store outage, ``fail_closed``     | —           | 503            | not confirmed (batch re-fetched) |

After the dead holder's lease ends, the next delivery acquires by takeover and runs the
update once. A durable inbox admits and records an update (completed) in one step, so
from its first admission the inbox owns the update; a refused admission is read back and
mapped here too, since another shape sharing the store may hold the update in progress
(:mod:`telegram_idem.ingress.refusals`).
"""

from __future__ import annotations

from enum import StrEnum

from telegram_idem.records import Outcome

__all__ = ["DEFAULT_OUTAGE_WAIT", "NOT_YET_STATUS", "Verdict", "verdict_for"]

DEFAULT_OUTAGE_WAIT = 300.0
"""Seconds an update that Telegram will not re-send (polled, or already answered 200)
keeps trying its claim through a store outage, fail-closed, before the outage is raised
(:meth:`telegram_idem.Idem.admit_update` ``outage_wait``)."""

NOT_YET_STATUS = 503
"""The HTTP status a webhook answers for ``NOT_YET``: any non-2xx makes Telegram re-send
(Bot API, ``setWebhook``); 503 says "try again later" to people reading logs."""


class Verdict(StrEnum):
    """What to do with one delivery of an update."""

    RUN = "run"
    """This delivery holds the update: process it, then acknowledge."""
    DUPLICATE = "duplicate"
    """Processed (or its failure stored) before: acknowledge without running."""
    NOT_YET = "not_yet"
    """Another holder's lease is alive: do not acknowledge, so Telegram re-sends it."""


def verdict_for(outcome: Outcome) -> Verdict:
    """The verdict for an update guard claim's outcome (see the module's table).

    Args:
        outcome: the claim's outcome.

    Returns:
        ``RUN`` for acquired, ``NOT_YET`` for in progress, ``DUPLICATE`` otherwise (the
        update guard claims without a fingerprint, so a conflict means "seen").
    """
    if outcome is Outcome.ACQUIRED:
        return Verdict.RUN
    if outcome is Outcome.IN_PROGRESS:
        return Verdict.NOT_YET
    return Verdict.DUPLICATE
