"""An entry's state as the bucket keeps it (JSON), and the decisions on it: which entries
a take may lease, and what each transition writes.

The payload is not here: it stays in the entry stream at ``seq`` (``DONE`` is the
tombstone an ack or a drop leaves, so a late re-delivery of the message is not recorded
again; tombstones older than the inbox's ``tombstone_age`` are deleted)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace

from telegram_idem.inbox import EntryStatus, InboxEntry

__all__ = ["DONE", "State", "candidates"]

DONE = "done"
"""The status of a tombstone (acked or dropped)."""


@dataclass(frozen=True, slots=True)
class State:
    """One entry's state (the payload lives in the stream at ``seq``).

    Attributes:
        id: the entry id (update guard key).
        seq: the entry stream's sequence of its message (admission order).
        unit: the ordering unit.
        status: an :class:`EntryStatus` value, or :data:`DONE`.
        attempts: takes counted so far.
        token: the current taker's token (+1 per take).
        available_at: seconds since the epoch (store clock) it may be taken.
        lease_expires_at: seconds since the epoch when an in-flight lease ends.
        last_error: the last failure, as text.
        admitted_at: seconds since the epoch (store clock) of admission.
        done_at: seconds since the epoch when it became a tombstone (``0.0`` otherwise).
    """

    id: str
    seq: int
    unit: str
    status: str
    attempts: int = 0
    token: int = 0
    available_at: float = 0.0
    lease_expires_at: float = 0.0
    last_error: str | None = None
    admitted_at: float = 0.0
    done_at: float = 0.0

    def encode(self) -> bytes:
        """The bucket value (JSON)."""
        return json.dumps(
            {
                "id": self.id,
                "seq": self.seq,
                "unit": self.unit,
                "status": self.status,
                "attempts": self.attempts,
                "token": self.token,
                "available_at": self.available_at,
                "lease_expires_at": self.lease_expires_at,
                "last_error": self.last_error,
                "admitted_at": self.admitted_at,
                "done_at": self.done_at,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, value: bytes) -> State:
        """The state a bucket value holds.

        Args:
            value: what :meth:`encode` wrote.

        Raises:
            ValueError: not such a value.
        """
        data = json.loads(value)
        return cls(
            id=str(data["id"]),
            seq=int(data["seq"]),
            unit=str(data["unit"]),
            status=str(data["status"]),
            attempts=int(data["attempts"]),
            token=int(data["token"]),
            available_at=float(data["available_at"]),
            lease_expires_at=float(data["lease_expires_at"]),
            last_error=data["last_error"],
            admitted_at=float(data["admitted_at"]),
            done_at=float(data.get("done_at", 0.0)),
        )

    @property
    def live(self) -> bool:
        """Pending or in flight."""
        return self.status in (EntryStatus.PENDING, EntryStatus.IN_FLIGHT)

    def entry(self, payload: bytes = b"") -> InboxEntry:
        """As an :class:`InboxEntry` (``payload`` read from the stream by the caller).

        Args:
            payload: the message's bytes.
        """
        return InboxEntry(
            id=self.id,
            seq=self.seq,
            ordering_key=self.unit,
            payload=payload,
            status=EntryStatus(self.status),
            attempts=self.attempts,
            token=self.token,
            available_at=self.available_at,
            lease_expires_at=self.lease_expires_at,
            last_error=self.last_error,
            admitted_at=self.admitted_at,
        )

    def taken(self, now: float, lease: float) -> State:
        """Leased by a new taker: a new token, one more attempt."""
        return replace(
            self,
            status=EntryStatus.IN_FLIGHT.value,
            attempts=self.attempts + 1,
            token=self.token + 1,
            lease_expires_at=now + lease,
        )

    def held_by(self, token: int) -> bool:
        """In flight under ``token``.

        Args:
            token: the taker's token.
        """
        return self.status == EntryStatus.IN_FLIGHT and self.token == token

    def tombstone(self, now: float) -> State:
        """Acked or dropped at ``now``."""
        return replace(self, status=DONE, done_at=now)


def candidates(states: Iterable[State], now: float) -> list[State]:
    """The entries a take may lease, oldest (``seq``) first: per ordering unit, none
    while one of its entries is in flight under a live lease; else its oldest live entry
    if that is due (pending and ``available_at`` reached, or in flight with an ended
    lease: its worker died). Dead letters and tombstones never count.

    Args:
        states: every state the inbox knows.
        now: the store's clock.
    """
    busy: set[str] = set()
    heads: dict[str, State] = {}
    for s in states:
        if not s.live:
            continue
        if s.status == EntryStatus.IN_FLIGHT and s.lease_expires_at > now:
            busy.add(s.unit)
        head = heads.get(s.unit)
        if head is None or s.seq < head.seq:
            heads[s.unit] = s
    due = [
        h
        for unit, h in heads.items()
        if unit not in busy and (h.status == EntryStatus.IN_FLIGHT or h.available_at <= now)
    ]
    return sorted(due, key=lambda s: s.seq)
