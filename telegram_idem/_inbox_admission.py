"""Admitting deliveries into the durable inbox: what :meth:`telegram_idem.Idem.admit_to_inbox`
does, mapped to the same :class:`~telegram_idem._admission.Admission` outcomes as
:meth:`telegram_idem.Idem.admit`, so ``WebhookIngress`` and ``PollingIngress`` translate
the outcomes every other shape translates.

Admission claims the update guard and writes the entry together (``Inbox.admit_many``,
one round trip for the batch), recording the update completed: from its first admission
the inbox owns it (``RUN``, :attr:`~telegram_idem._admitted.Admitted.queued`).
``Inbox.admit`` answers only "admitted or not"; a refusal is a duplicate when the record
is completed (the inbox admitted it before, or another shape processed it), but *not yet*
when another shape sharing the store (``FastAckWebhook`` / ``IdempotentRequestHandler``,
the PTB processor, the Lambda handler) holds it in progress under a live lease: its holder
may be dead, and acknowledging the delivery would lose the update. So a refusal costs one
more read of the record, on that path only
(:func:`~telegram_idem._admission.refused_admission`). When the holder's lease has ended,
admission itself takes the claim over, on every store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from telegram_idem._admission import (
    Admission,
    StorePolicy,
    StorePolicyLike,
    refused_admission,
)
from telegram_idem._admitted import AdmissionHost, Admitted, emit_update_store_error
from telegram_idem.errors import StoreError
from telegram_idem.events import emit_decision
from telegram_idem.inbox import Inbox, NewEntry

__all__ = ["INBOX_DECISIONS", "admit_to_inbox"]

log = logging.getLogger("telegram_idem")

INBOX_DECISIONS = {
    Admission.RUN: "admitted",
    Admission.DUPLICATE: "duplicate",
    Admission.NOT_YET: "not_yet",
}
"""The ``decision`` of an inbox admission's event (:mod:`telegram_idem.events`)."""


async def admit_to_inbox(
    host: AdmissionHost,
    entries: Sequence[NewEntry],
    updates: Sequence[Mapping[str, Any] | None],
    *,
    bot_id: int,
    inbox: Inbox,
    store_policy: StorePolicyLike = StorePolicy.FAIL_CLOSED,
) -> list[Admitted]:
    """:meth:`telegram_idem.Idem.admit_to_inbox` (see there)."""
    policy = StorePolicy.of(store_policy)
    if len(entries) != len(updates):
        raise ValueError("admit_to_inbox needs one update (or None) per entry")
    started = time.perf_counter()
    try:
        admitted = await inbox.admit_many(entries, retention=host.update_retention)
    except StoreError as exc:
        elapsed = (time.perf_counter() - started) * 1000
        for entry, update in zip(entries, updates, strict=True):
            emit_update_store_error(entry.update_key, update, elapsed, bot_id)
        return _inbox_outage(host, entries, updates, bot_id=bot_id, policy=policy, error=exc)
    refused = [e.update_key for e, ok in zip(entries, admitted, strict=True) if not ok]
    try:
        records = iter(await asyncio.gather(*(host.store.get(key) for key in refused)))
    except StoreError as exc:
        # Refused, and the record cannot be read: a duplicate or in progress elsewhere,
        # never new, so never run unguarded whatever the policy; a re-send decides.
        log.warning(
            "store outage: refused update(s) %s not told apart (duplicate or in progress "
            "elsewhere); not acknowledged, so Telegram re-sends: %s",
            ", ".join(
                str(_shown_id(e, u))
                for e, u, ok in zip(entries, updates, admitted, strict=True)
                if not ok
            ),
            exc,
        )
        records = None
        error: StoreError | None = exc
    else:
        error = None
    elapsed = (time.perf_counter() - started) * 1000
    result: list[Admitted] = []
    for entry, update, ok in zip(entries, updates, admitted, strict=True):
        if ok:
            outcome = Admission.RUN
        elif records is None:
            outcome = Admission.UNAVAILABLE
        else:
            outcome = refused_admission(next(records))
        if outcome is Admission.NOT_YET:
            log.warning(
                "update %s is in progress elsewhere (another shape sharing the store holds "
                "its claim): not admitted to the inbox, not acknowledged as a duplicate",
                _shown_id(entry, update),
            )
        if outcome in INBOX_DECISIONS:
            emit_decision(
                boundary="update",
                key=entry.update_key,
                decision=INBOX_DECISIONS[outcome],
                update=update,
                elapsed_ms=elapsed,
                bot_id=bot_id,
            )
        elif outcome is Admission.UNAVAILABLE:
            emit_update_store_error(entry.update_key, update, elapsed, bot_id)
        result.append(
            Admitted(
                host,
                update if update is not None else {},
                bot_id=bot_id,
                key=entry.update_key,
                outcome=outcome,
                error=error if outcome is Admission.UNAVAILABLE else None,
                queued=ok,
            )
        )
    return result


def _shown_id(entry: NewEntry, update: Mapping[str, Any] | None) -> object:
    return update.get("update_id") if update is not None else entry.update_key


def _inbox_outage(
    host: AdmissionHost,
    entries: Sequence[NewEntry],
    updates: Sequence[Mapping[str, Any] | None],
    *,
    bot_id: int,
    policy: StorePolicy,
    error: StoreError,
) -> list[Admitted]:
    shown = ", ".join(str(_shown_id(e, u)) for e, u in zip(entries, updates, strict=True))
    runnable = policy is StorePolicy.FAIL_OPEN
    if runnable:
        log.error("store outage: update(s) %s run unguarded (fail_open): %s", shown, error)
    else:
        log.warning(
            "store outage: update(s) %s not admitted (fail_closed), so Telegram delivers "
            "them again: %s",
            shown,
            error,
        )
    return [
        Admitted(
            host,
            update if update is not None else {},
            bot_id=bot_id,
            key=entry.update_key,
            outcome=Admission.UNGUARDED
            if runnable and update is not None
            else Admission.UNAVAILABLE,
            error=error,
        )
        for entry, update in zip(entries, updates, strict=True)
    ]
