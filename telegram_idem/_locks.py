"""Locks on top of the record store: a lock is a record in progress, its lease the TTL.

A lock may name an ``owner`` (the action key that holds it). The record's fingerprint
carries the owner, which decides what happens when the lock is found held:

| found                                           | then                                    |
|-------------------------------------------------|-----------------------------------------|
| free (never held, released, retention over)     | acquired                                |
| held, lease alive, another owner (or no owner)  | :class:`LockHeldError`                  |
| held by the same owner                          | taken over: the action that held it was |
|                                                 | itself taken over after its holder died |
| held, lease ended (the holder crashed)          | taken over                              |

A takeover releases the dead holder's claim with its own fencing token and claims again,
so two contenders racing for a dead lock still end with one holder.

Whether a lease ended, and ``retry_after``, are judged by the store's clock
(:meth:`Store.now`: the server's on PostgreSQL and Redis), never the caller's: a worker
whose clock runs ahead must not take a live lock, and one whose clock runs behind must
not be told to wait for the difference. (DynamoDB has no server clock; there the
writers' clocks decide, so keep hosts NTP-synced and ``ttl`` well above their skew.)
"""

from __future__ import annotations

import re

from telegram_idem._records import Claim, Outcome
from telegram_idem.backends import Store
from telegram_idem.errors import LockHeldError

__all__ = ["POLL_LEADER", "acquire_lock", "is_poll_cursor"]

POLL_LEADER = "poll-leader"
"""The lock name of a bot's long-polling leader lease
(:mod:`telegram_idem.ingress._leader`): key ``{prefix}:{bot_id}:l:poll-leader``. The
effect ledger row at that key keeps the leader's offset; it is not an effect."""

_POLL_CURSOR = re.compile(r"(?s).*:-?[0-9]+:l:" + POLL_LEADER)


def is_poll_cursor(key: str) -> bool:
    """Whether ``key`` is a poll leader's key (its ledger row is an offset, not an
    effect: :meth:`telegram_idem.Idem.unresolved` skips it). Never raises."""
    return _POLL_CURSOR.fullmatch(key) is not None and ":a:" not in key


async def acquire_lock(
    store: Store, key: str, *, ttl: float, retention: float, owner: str | None
) -> Claim:
    """Claim the lock ``key`` (see the module's table).

    Args:
        store: the store.
        key: the lock's full key.
        ttl: seconds the lock lasts if its holder never releases it.
        retention: seconds the record is kept (≥ ttl), so fencing tokens keep rising.
        owner: who holds it (an action key), or ``None``.

    Raises:
        LockHeldError: a live holder has it (``retry_after`` = seconds left).
        StoreError: the store could not answer.
    """
    claim = await store.claim(key, fingerprint=owner, lease=ttl, retention=retention)
    if claim.outcome is Outcome.ACQUIRED:
        return claim
    record = claim.record
    same_owner = owner is not None and record.fingerprint == owner
    # IN_PROGRESS means the store found the lease alive; CONFLICT (another owner) says
    # nothing about the lease, so ask the store's clock.
    now: float | None = None
    if not same_owner and claim.outcome is not Outcome.IN_PROGRESS:
        now = await store.now()
    if same_owner or (now is not None and record.lease_expires_at <= now):
        await store.release(key, record.fencing_token)
        claim = await store.claim(key, fingerprint=owner, lease=ttl, retention=retention)
        if claim.outcome is Outcome.ACQUIRED:
            return claim
        record = claim.record
        now = None
    if now is None:
        now = await store.now()
    raise LockHeldError(
        f"{key} is held",
        key=key,
        record=record,
        retry_after=max(record.lease_expires_at - now, 0.0),
    )
