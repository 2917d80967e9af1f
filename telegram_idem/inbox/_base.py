"""The inbox contract (docs/design/record.md#ingress-and-workers).

An entry is one admitted update. **Admission** claims the update guard and writes the
entry together (one transaction / one script), so a duplicate is never enqueued twice and
an entry never exists without its claim. **Workers** take entries with a lease:

- per ordering key (``chat:<id>``, else ``user:<id>``, else the entry itself) only the
  oldest live entry can be taken, so each chat is processed in admission order and at most
  one of its entries is in flight, while different chats run in parallel;
- a taken entry carries a fresh ``token``; ``ack`` / ``retry`` / ``bury`` / ``extend``
  succeed only with it, so a worker that stalled past its lease cannot touch an entry
  another worker took over;
- an in-flight entry whose lease expired (its worker died) is taken again;
- ``retry`` puts it back with a delay (``refund=True``: that take does not count as an
  attempt); ``bury`` makes it a dead letter, which no longer
  blocks its chat; ``redrive`` puts a dead letter back.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["EntryStatus", "Inbox", "InboxEntry", "InboxStats", "NewEntry", "UnitBacklog"]


class EntryStatus(StrEnum):
    """Where an inbox entry stands."""

    PENDING = "pending"
    IN_FLIGHT = "in_flight"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class NewEntry:
    """An update to admit.

    Attributes:
        update_key: the update guard key (``KeyBuilder.update``); also the entry id.
        ordering_key: the unit of ordering (``ordering_key(update)``), or ``None``.
        payload: the update as JSON bytes.
    """

    update_key: str
    ordering_key: str | None
    payload: bytes


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """An entry as a worker or an operator sees it.

    Attributes:
        id: the update guard key of the update.
        seq: admission order (store-wide, increasing).
        ordering_key: the unit of ordering (the id itself when the update has none).
        payload: the update as JSON bytes.
        status: pending, in_flight or dead.
        attempts: how many times it has been taken.
        token: the current taker's token.
        available_at: seconds since the epoch when it may be taken (retries wait).
        lease_expires_at: seconds since the epoch when an in-flight lease ends.
        last_error: the last failure, as text.
        admitted_at: seconds since the epoch (store clock) when it was admitted; ``0.0``
            for an entry admitted before the store recorded it.
    """

    id: str
    seq: int
    ordering_key: str
    payload: bytes
    status: EntryStatus
    attempts: int
    token: int
    available_at: float
    lease_expires_at: float
    last_error: str | None = None
    admitted_at: float = 0.0


@dataclass(frozen=True, slots=True)
class InboxStats:
    """How many entries are in each status, and how long the oldest of each has waited.

    Attributes:
        counts: entries per status (every :class:`EntryStatus`, ``0`` where none).
        oldest_admitted_at: per status that has entries, the ``admitted_at`` (seconds
            since the epoch, store clock) of its oldest entry; a status with no entries
            is absent.
        now: the store's clock when the numbers were read (seconds since the epoch), so
            ``now - oldest_admitted_at[s]`` is the age of the oldest entry in ``s``.
    """

    counts: Mapping[EntryStatus, int]
    oldest_admitted_at: Mapping[EntryStatus, float] = field(default_factory=dict)
    now: float = 0.0

    def oldest_age(self, status: EntryStatus) -> float:
        """Seconds the oldest entry in ``status`` has waited since admission (``0.0`` if
        there is none).

        Args:
            status: the status looked at.
        """
        admitted = self.oldest_admitted_at.get(status)
        return 0.0 if admitted is None else max(self.now - admitted, 0.0)


@dataclass(frozen=True, slots=True)
class UnitBacklog:
    """The live entries of one ordering unit (a chat, a user, or one update).

    Attributes:
        ordering_key: the unit (``chat:<id>``, ``user:<id>``, or the entry id).
        pending: its pending entries.
        in_flight: its in-flight entries (0 or 1: one entry of a unit at a time).
        oldest_admitted_at: ``admitted_at`` of its oldest live entry (seconds since the
            epoch, store clock).
    """

    ordering_key: str
    pending: int
    in_flight: int
    oldest_admitted_at: float


class Inbox(abc.ABC):
    """Durable, per-chat ordered queue of admitted updates.

    Every method raises :class:`~telegram_idem.errors.StoreError` when the store cannot
    answer; none reports an outage as a decision.
    """

    @abc.abstractmethod
    async def admit(self, entry: NewEntry, *, retention: float) -> bool:
        """Claim the update guard and enqueue, atomically.

        Args:
            entry: the update.
            retention: seconds the update guard remembers the update id.

        Returns:
            ``True`` if enqueued now; ``False`` for a duplicate (nothing written).
        """

    async def admit_many(self, entries: Sequence[NewEntry], *, retention: float) -> list[bool]:
        """:meth:`admit` for a batch (a getUpdates answer), answers in order.

        Stores override this to admit the whole batch in one round trip.

        Args:
            entries: the updates, in ``getUpdates`` order.
            retention: seconds the update guard remembers each update id.

        Raises:
            ConfigurationError: an entry the store cannot admit (Redis Cluster: a key that
                is not an update guard key).
        """
        return [await self.admit(e, retention=retention) for e in entries]

    @abc.abstractmethod
    async def take(self, *, lease: float) -> InboxEntry | None:
        """Lease the oldest takeable entry (see the module docstring), or ``None``.

        Args:
            lease: seconds the taker holds it before another worker may take it.
        """

    @abc.abstractmethod
    async def ack(self, entry: InboxEntry) -> bool:
        """Done: remove the entry. ``False`` if ``entry.token`` no longer holds it.

        Args:
            entry: the entry as taken (its ``token`` must still hold it).
        """

    @abc.abstractmethod
    async def retry(
        self, entry: InboxEntry, *, delay: float, error: str, refund: bool = False
    ) -> bool:
        """Put the entry back, takeable after ``delay`` seconds. ``False`` if not held.

        Args:
            entry: the entry as it was taken (its ``token`` must still hold it).
            delay: seconds before it may be taken again.
            error: the failure, as text (kept as ``last_error``).
            refund: the take does not count: ``attempts`` goes back down by one (never
                below 0). For a failure that says nothing about the update, such as a
                Bot API 429 whose ``retry_after`` asked the bot to wait.
        """

    @abc.abstractmethod
    async def bury(self, entry: InboxEntry, *, error: str) -> bool:
        """Make the entry a dead letter. ``False`` if not held.

        Args:
            entry: the entry as taken (its ``token`` must still hold it).
            error: why, as text (kept as ``last_error``).
        """

    @abc.abstractmethod
    async def extend(self, entry: InboxEntry, *, lease: float) -> bool:
        """Heartbeat: the lease ends ``lease`` seconds from now. ``False`` if not held.

        Args:
            entry: the entry as taken (its ``token`` must still hold it).
            lease: seconds from now the lease ends.
        """

    @abc.abstractmethod
    async def dead_letters(self, *, limit: int = 100) -> list[InboxEntry]:
        """Dead letters, oldest first.

        Args:
            limit: most entries returned.
        """

    @abc.abstractmethod
    async def redrive(self, entry_id: str) -> bool:
        """Put the dead letter ``entry_id`` back (attempts reset). ``False`` if none.

        Args:
            entry_id: the dead letter's id (its update guard key).
        """

    @abc.abstractmethod
    async def depth(self) -> int:
        """Live entries (pending and in flight), for metrics and tests."""

    # ------------------------------------------------------------- for operators

    @abc.abstractmethod
    async def get(self, entry_id: str) -> InboxEntry | None:
        """The entry ``entry_id`` (an update guard key) in any status, or ``None``.

        Args:
            entry_id: the entry's id (its update guard key).
        """

    @abc.abstractmethod
    async def entries(
        self,
        *,
        status: EntryStatus | None = None,
        ordering_key: str | None = None,
        limit: int = 100,
    ) -> list[InboxEntry]:
        """Entries oldest (``seq``) first, of ``status`` and of ``ordering_key`` when
        given, at most ``limit``.

        Args:
            status: only entries in this status (``None``: any).
            ordering_key: only entries of this unit (``chat:<id>``, ``user:<id>``, or an
                entry's own id; ``None``: any).
            limit: most entries returned (≥ 1).

        Raises:
            ValueError: ``limit`` < 1.
        """

    @abc.abstractmethod
    async def drop(self, entry_id: str) -> bool:
        """Delete the dead letter ``entry_id`` for good. Its update guard record stays,
        so a redelivery of that update is still a duplicate. ``False`` if there is no
        dead letter by that id (a live entry is never dropped).

        Args:
            entry_id: the dead letter's id (its update guard key).
        """

    @abc.abstractmethod
    async def stats(self) -> InboxStats:
        """Counts per status and the admission time of each status's oldest entry, read
        together (one snapshot where the store can)."""

    @abc.abstractmethod
    async def backlog(self, *, limit: int = 100) -> list[UnitBacklog]:
        """The ordering units that have live entries, the most entries first (ties: the
        oldest first), at most ``limit``: "pending per chat".

        Args:
            limit: most units returned (≥ 1).

        Raises:
            ValueError: ``limit`` < 1.
        """
