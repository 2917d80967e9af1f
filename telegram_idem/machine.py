"""The record state machine of docs/design/record.md#the-record-and-its-state-machine, as pure functions (no I/O, time passed in).

The memory and SQLite stores run these functions inside their one transaction (the loop
of :class:`telegram_idem.backends._local.LocalStore`); server
stores (Redis Lua, Postgres SQL, DynamoDB conditions) implement the same table natively
and are checked against these functions by the conformance suite.

| situation when claiming                         | outcome                         |
|-------------------------------------------------|---------------------------------|
| no record, or retention expired                 | acquired (new fencing token)    |
| any live record, different fingerprint          | conflict                        |
| completed                                       | replay                          |
| failed                                          | failed (replay the failure)     |
| in progress, lease alive                        | in progress                     |
| in progress, lease expired (or released)        | acquired by takeover, token + 1 |

A fingerprint of ``None`` on either side matches anything. A released record keeps its
fencing token (so a zombie holder can never match a later holder) with its lease ended
and its fingerprint cleared.
"""

from __future__ import annotations

from dataclasses import replace

from telegram_idem._records import Claim, Outcome, Record, Status

__all__ = ["decide_claim", "do_complete", "do_extend", "do_fail", "do_release", "is_live"]


def is_live(record: Record | None, now: float) -> bool:
    """True if ``record`` exists and its retention has not expired at ``now``.

    Args:
        record: the key's current record, or ``None``.
        now: the store's clock, seconds since the epoch.
    """
    return record is not None and record.expires_at > now


def _fingerprints_differ(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a != b


def decide_claim(
    existing: Record | None,
    *,
    key: str,
    fingerprint: str | None,
    now: float,
    lease: float,
    retention: float,
) -> tuple[Claim, Record | None]:
    """Decide a claim of ``key`` against ``existing``.

    Args:
        existing: the stored record, or ``None``.
        key: the idempotency key.
        fingerprint: the caller's payload fingerprint, or ``None`` for no check.
        now: current time, seconds since the epoch.
        lease: seconds the caller's lease lasts if it acquires.
        retention: seconds the record is kept if it acquires.

    Returns:
        ``(claim, record_to_write)``; ``record_to_write`` is ``None`` when nothing changes.
    """
    if not is_live(existing, now):
        token = existing.fencing_token + 1 if existing is not None else 1
        new = Record(key, Status.IN_PROGRESS, token, now + lease, now + retention, fingerprint)
        return Claim(Outcome.ACQUIRED, new), new
    assert existing is not None
    if _fingerprints_differ(existing.fingerprint, fingerprint):
        return Claim(Outcome.CONFLICT, existing), None
    if existing.status is Status.COMPLETED:
        return Claim(Outcome.REPLAY, existing), None
    if existing.status is Status.FAILED:
        return Claim(Outcome.FAILED, existing), None
    if existing.lease_expires_at > now:
        return Claim(Outcome.IN_PROGRESS, existing), None
    taken = Record(
        key,
        Status.IN_PROGRESS,
        existing.fencing_token + 1,
        now + lease,
        max(existing.expires_at, now + retention),
        fingerprint if fingerprint is not None else existing.fingerprint,
        None,
        existing.attempts + 1,
    )
    return Claim(Outcome.ACQUIRED, taken), taken


def _held(record: Record | None, token: int, now: float) -> bool:
    return (
        is_live(record, now)
        and record is not None
        and record.status is Status.IN_PROGRESS
        and record.fencing_token == token
    )


def do_complete(
    record: Record | None, *, token: int, result: bytes, now: float, retention: float
) -> Record | None:
    """The completed record, or ``None`` if ``token`` no longer holds the key.

    A holder whose lease ran out but whose key nobody took over may still complete.

    Args:
        record: the key's current record, or ``None``.
        token: the holder's fencing token.
        result: the encoded result.
        now: the store's clock, seconds since the epoch.
        retention: seconds the completed record is kept, from ``now``.
    """
    if not _held(record, token, now):
        return None
    assert record is not None
    return Record(
        record.key,
        Status.COMPLETED,
        record.fencing_token,
        record.lease_expires_at,
        now + retention,
        record.fingerprint,
        result,
        record.attempts,
    )


def do_fail(
    record: Record | None, *, token: int, error: bytes, now: float, retention: float
) -> Record | None:
    """The failed record (a stored failure), or ``None`` if ``token`` no longer holds.

    Args:
        record: the key's current record, or ``None``.
        token: the holder's fencing token.
        error: the encoded failure.
        now: the store's clock, seconds since the epoch.
        retention: seconds the failed record is kept, from ``now``.
    """
    if not _held(record, token, now):
        return None
    assert record is not None
    return replace(record, status=Status.FAILED, result=error, expires_at=now + retention)


def do_release(record: Record | None, *, token: int, now: float) -> Record | None:
    """The released record (lease ended, fingerprint cleared, token kept), or ``None``.

    Args:
        record: the key's current record, or ``None``.
        token: the holder's fencing token.
        now: the store's clock, seconds since the epoch.
    """
    if not _held(record, token, now):
        return None
    assert record is not None
    return replace(record, lease_expires_at=now, fingerprint=None)


def do_extend(record: Record | None, *, token: int, now: float, lease: float) -> Record | None:
    """The record with its lease moved to ``now + lease``, or ``None`` if not held.

    A holder past its lease may still extend if nobody took over.

    Args:
        record: the key's current record, or ``None``.
        token: the holder's fencing token.
        now: the store's clock, seconds since the epoch.
        lease: seconds from ``now`` the lease ends.
    """
    if not _held(record, token, now):
        return None
    assert record is not None
    return replace(
        record, lease_expires_at=now + lease, expires_at=max(record.expires_at, now + lease)
    )
