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

This module holds the outcome of an admission (:class:`Admission`), the outage policy
(:class:`StorePolicy`) and the pure rules that map a store's answer to an outcome
(:func:`admission_for`, :func:`refused_admission`). The admission itself is
:meth:`telegram_idem.Idem.admit` (and :meth:`~telegram_idem.Idem.admit_to_inbox`), whose
docstring, like ``docs/answers.md``, has the decision table every ingress shape
translates:

| situation                                   | outcome       | webhook | polling | inbox |
|---------------------------------------------|---------------|---------|---------|-------|
| new, or a dead holder's lease ended         | ``RUN``       | 200 | processed | one entry; 200 / offset moves |
| completed before, or a stored failure       | ``DUPLICATE`` | 200, not run | confirmed, not run | no entry; 200 / confirmed |
| in progress, the holder's lease alive       | ``NOT_YET``   | 503 | waited for (``wait``), then ``RUN`` by takeover or ``DUPLICATE`` | no entry; 503 / offset kept |
| store outage, ``fail_closed`` (default)     | ``UNAVAILABLE`` | 503 | retried for ``outage_wait``, then not run (ERROR) | 503 / offset kept |
| store outage, ``fail_open``                 | ``UNGUARDED`` | 200, run without a claim (ERROR) | run without a claim | 200, dispatched in-process |

Unknown update types follow the same rule (guarded by ``update_id``, passed to the
framework untouched); an update without an integer ``update_id`` is refused with
:class:`~telegram_idem.errors.MalformedUpdateError`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from telegram_idem._records import Outcome, Record, Status
from telegram_idem.errors import ConfigurationError

__all__ = [
    "DEFAULT_OUTAGE_WAIT",
    "NOT_YET_STATUS",
    "Admission",
    "StorePolicy",
    "StorePolicyLike",
    "admission_for",
    "refused_admission",
]

DEFAULT_OUTAGE_WAIT = 300.0
"""Seconds an update that Telegram will not re-send (polled, or already answered 200)
keeps trying its claim through a store outage, fail-closed, before it is given up
(:meth:`telegram_idem.Idem.admit` ``outage_wait``)."""

NOT_YET_STATUS = 503
"""The HTTP status a webhook answers for ``NOT_YET`` and ``UNAVAILABLE``: any non-2xx
makes Telegram re-send (Bot API, ``setWebhook``); 503 says "try again later" to people
reading logs."""


class Admission(StrEnum):
    """The outcome of admitting one delivery of an update."""

    RUN = "run"
    """This delivery holds the update (its claim, or its inbox entry): process it (or
    leave it to the inbox worker), then acknowledge."""
    DUPLICATE = "duplicate"
    """Processed (or its failure stored) before: acknowledge without running."""
    NOT_YET = "not_yet"
    """Another holder's lease is alive: do not acknowledge, so Telegram re-sends it."""
    UNAVAILABLE = "unavailable"
    """The store cannot answer and the policy is fail-closed: do not acknowledge (answer
    non-2xx, do not confirm), so it is delivered again once the store answers."""
    UNGUARDED = "unguarded"
    """The store cannot answer and the policy is fail-open: run it without a claim
    (logged loudly) and acknowledge."""

    @property
    def acknowledged(self) -> bool:
        """Whether the delivery is acknowledged (a webhook answers 2xx, polling confirms
        it): ``RUN``, ``DUPLICATE`` and ``UNGUARDED``."""
        return self in (Admission.RUN, Admission.DUPLICATE, Admission.UNGUARDED)

    @property
    def runs(self) -> bool:
        """Whether this delivery runs the update: ``RUN`` and ``UNGUARDED``."""
        return self in (Admission.RUN, Admission.UNGUARDED)


class StorePolicy(StrEnum):
    """What an admission does when the store cannot answer
    (:class:`~telegram_idem.errors.StoreError`). Every shape takes it as
    ``on_store_error=``, as a member or as its string value."""

    FAIL_CLOSED = "fail_closed"
    """Do not run the update unguarded: ``UNAVAILABLE`` (after ``outage_wait``)."""
    FAIL_OPEN = "fail_open"
    """Run the update without its claim: ``UNGUARDED``, logged at ERROR."""

    @classmethod
    def of(cls, value: StorePolicyLike) -> StorePolicy:
        """The policy named ``value`` (a member, ``"fail_closed"`` or ``"fail_open"``).

        Args:
            value: a :class:`StorePolicy`, or its value as text.

        Raises:
            ConfigurationError: another value.
        """
        try:
            return cls(value)
        except ValueError:
            raise ConfigurationError(
                f"on_store_error must be 'fail_closed' or 'fail_open', got {value!r}"
            ) from None


StorePolicyLike = StorePolicy | Literal["fail_closed", "fail_open"]
"""What ``on_store_error=`` accepts: a :class:`StorePolicy`, or its string value."""


def admission_for(outcome: Outcome) -> Admission:
    """The admission of an update guard claim's outcome (see the module's table).

    Args:
        outcome: the claim's outcome.

    Returns:
        ``RUN`` for acquired, ``NOT_YET`` for in progress, ``DUPLICATE`` otherwise (the
        update guard claims without a fingerprint, so a conflict means "seen").
    """
    if outcome is Outcome.ACQUIRED:
        return Admission.RUN
    if outcome is Outcome.IN_PROGRESS:
        return Admission.NOT_YET
    return Admission.DUPLICATE


def refused_admission(record: Record | None) -> Admission:
    """The admission of an update the durable inbox refused (``Inbox.admit`` answered
    ``False``), from its update guard record read just after.

    The inbox refuses only a completed or failed record, or a claim in progress under a
    live lease, so an in-progress record read after a refusal is another holder's (a
    shape that processes in-process, sharing the store): ``NOT_YET``, never a
    duplicate. A completed one is the inbox's own earlier admission or a processed
    update: ``DUPLICATE``.

    Args:
        record: ``store.get(update_key)`` after the refused admission.

    Returns:
        ``DUPLICATE`` for completed or failed; ``NOT_YET`` for in progress, and for no
        record (it ended between the two reads: the next delivery admits it).
    """
    if record is None or record.status is Status.IN_PROGRESS:
        return Admission.NOT_YET
    return Admission.DUPLICATE
