"""The record kept per idempotency key, and the answer to a claim (docs/design/record.md#the-record-and-its-state-machine)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Claim", "Outcome", "Record", "Status"]


class Status(StrEnum):
    """Where a key's work stands."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"


class Outcome(StrEnum):
    """What a claim decided."""

    ACQUIRED = "acquired"
    """The caller holds the key now (new record, expired retention, or lease takeover)."""
    REPLAY = "replay"
    """Completed with the same fingerprint: the stored result is in ``record.result``."""
    CONFLICT = "conflict"
    """The key was claimed with a different fingerprint."""
    IN_PROGRESS = "in_progress"
    """Another holder's lease is alive."""
    FAILED = "failed"
    """A failure was stored (``on_error="store"``): replay it."""


@dataclass(frozen=True, slots=True)
class Record:
    """One key's record.

    Attributes:
        key: the full idempotency key.
        status: in_progress, completed or failed.
        fencing_token: +1 at every new claim of the key, takeovers included.
        lease_expires_at: seconds since the epoch when the holder's lease ends.
        expires_at: seconds since the epoch when the record may be forgotten (retention).
        fingerprint: hash of the payload the key was first claimed with, or ``None``.
        result: serialised result (completed) or failure (failed); ``None`` while in progress.
        attempts: how many times the key has been acquired.
    """

    key: str
    status: Status
    fencing_token: int
    lease_expires_at: float
    expires_at: float
    fingerprint: str | None = None
    result: bytes | None = None
    attempts: int = 1


@dataclass(frozen=True, slots=True)
class Claim:
    """A store's answer to one claim: the outcome and the record it is about.

    For ``ACQUIRED`` the record is the caller's new record (its ``fencing_token`` is the
    caller's token); otherwise it is the existing record that caused the outcome.

    Attributes:
        outcome: what the claim decided (:class:`Outcome`).
        record: the record it is about (see above).
    """

    outcome: Outcome
    record: Record

    @property
    def token(self) -> int:
        """The fencing token of ``record``."""
        return self.record.fencing_token
