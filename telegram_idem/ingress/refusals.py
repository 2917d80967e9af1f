"""What a refused inbox admission means: a duplicate, or an update still in progress
elsewhere (:mod:`telegram_idem.admission`'s one rule, for the inbox shapes).

``Inbox.admit`` answers only "admitted or not". Refused is a duplicate when the update
guard record is completed (the inbox admitted it before, or another shape processed it),
but *not yet* when another shape sharing the store — ``FastAckWebhook`` /
``IdempotentRequestHandler``, the PTB processor, the Lambda handler, which claim the
update in progress and process in-process — holds it under a live lease: its holder may
be dead, and acknowledging the delivery would lose the update. So a refusal costs one
more read of the record, on that path only, and the record decides with
:func:`~telegram_idem.inbox.logic.refused_verdict`. (When the holder's lease has ended,
admission itself takes the claim over, on every store.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from telegram_idem.admission import Verdict
from telegram_idem.guard import Idem
from telegram_idem.inbox.base import NewEntry
from telegram_idem.inbox.logic import refused_verdict

__all__ = ["DECISIONS", "admission_verdicts"]

DECISIONS = {Verdict.RUN: "admitted", Verdict.DUPLICATE: "duplicate", Verdict.NOT_YET: "not_yet"}
"""The ``decision`` an inbox admission logs (:mod:`telegram_idem.logs`) for each verdict."""


async def admission_verdicts(
    idem: Idem, entries: Sequence[NewEntry], admitted: Sequence[bool]
) -> list[Verdict]:
    """The verdict of each admission: ``RUN`` for an admitted entry, else the refused
    record's verdict (``DUPLICATE`` or ``NOT_YET``), in order.

    Args:
        idem: the guard whose store admitted the entries.
        entries: the entries offered to ``Inbox.admit`` / ``admit_many``.
        admitted: its answers, in the same order.

    Raises:
        StoreError: a refused entry's record could not be read.
    """
    refused = [e.update_key for e, ok in zip(entries, admitted, strict=True) if not ok]
    records = iter(await asyncio.gather(*(idem.store.get(key) for key in refused)))
    return [Verdict.RUN if ok else refused_verdict(next(records)) for ok in admitted]
