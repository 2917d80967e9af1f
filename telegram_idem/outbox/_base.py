"""The outbox contract: durable, per-chat ordered Bot API calls that are sent once.

An entry is one outgoing Bot API call (method + JSON params; files by reference), stored
under its **effect key**. The rules every store keeps (the conformance suite
:class:`~telegram_idem.testing.conformance.OutboxConformance` checks them):

- **enqueue is idempotent by key**: a second enqueue of a key that is stored (in any
  status, until its retention ends after it settled) writes nothing and returns the stored
  entry, so an action retried after a crash sends nothing new and gets the first call's
  outcome;
- **latest wins**: enqueueing a call with a ``collapse_key`` turns every *pending* (not
  in-flight) entry of the same bot and collapse key into ``SUPERSEDED`` (its ``result``
  is ``{"superseded_by": <new key>}``), in the same atomic step;
- **order**: per ``(bot_id, ordering_key)`` only the oldest *live* entry (pending or in
  flight) can be taken, so a chat's calls go out in enqueue order, one at a time, while
  chats run in parallel. Delivered, superseded, dead, unknown and parked entries are not
  live: none of them blocks its chat;
- **priority**: among the takeable heads of one bot, the lowest ``priority`` goes first,
  then the oldest (``seq``);
- **fencing**: a taken entry carries a fresh ``token`` (greater than any token the entry
  had before); ``deliver`` / ``retry`` / ``settle`` / ``park`` / ``extend`` succeed only
  with it, so a relay that stalled past its lease cannot record over the relay that took
  the entry over; an in-flight entry whose lease ended is takeable again;
- **parking**: ``park`` marks the entry's chat as parked (a 403 "bot was blocked"):
  the entry and every pending entry of that chat become ``PARKED``, and later enqueues to
  it are stored ``PARKED``, until ``unpark``;
- **to the back**: ``redrive``, ``unpark`` (the chat's parked entries, in their order) and
  a ``retry`` that moves an entry to another chat give new ``seq`` values, so a call of the
  chat already in flight stays the only one;
- **retention**: a delivered or superseded entry is kept ``retention`` seconds after it
  settled (replays of its key answer from it); then it is gone: ``get`` answers ``None``
  and an enqueue of its key stores a new call (a store may delete the row then or later,
  but never shows it again). Pending, in-flight, unknown, dead and parked entries are
  never deleted by time.

Times are seconds since the epoch on the store's clock.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from telegram_idem.errors import ConfigurationError

__all__ = [
    "LIVE",
    "REDRIVABLE",
    "SETTLED",
    "AmbiguousPolicy",
    "CallStatus",
    "NewCall",
    "Outbox",
    "OutboxEntry",
]


class CallStatus(StrEnum):
    """Where an outbox entry stands."""

    PENDING = "pending"
    """Waiting to be sent (or to be sent again, after a retryable failure)."""
    IN_FLIGHT = "in_flight"
    """Taken by a relay, which is calling the Bot API now."""
    DELIVERED = "delivered"
    """Telegram accepted it; ``result`` holds its answer's ``result`` (JSON)."""
    SUPERSEDED = "superseded"
    """A later call with the same ``collapse_key`` replaced it before it was sent."""
    UNKNOWN = "unknown"
    """An ambiguous outcome under policy ``hold``: it may or may not have taken effect.
    Never re-sent by itself; listed for reconciliation (``resolve`` or ``redrive``)."""
    DEAD = "dead"
    """Telegram refused it for good (``last_error`` carries its description)."""
    PARKED = "parked"
    """Its chat is parked (the bot was blocked there); ``unpark`` puts it back."""


LIVE = frozenset({CallStatus.PENDING, CallStatus.IN_FLIGHT})
"""Statuses that hold a chat's turn."""

SETTLED = frozenset({CallStatus.DELIVERED, CallStatus.SUPERSEDED})
"""Statuses whose entries expire ``retention`` seconds after they settled."""

REDRIVABLE = frozenset({CallStatus.DEAD, CallStatus.UNKNOWN, CallStatus.PARKED})
"""Statuses an operator's ``redrive`` puts back to ``PENDING``."""


class AmbiguousPolicy(StrEnum):
    """What a relay does when it cannot tell whether Telegram applied a call (the
    connection broke or timed out after the request was written, or a 5xx answer)."""

    RESEND = "resend"
    """Send it again (at-least-once): right for calls that are safe to repeat."""
    HOLD = "hold"
    """Make the entry ``UNKNOWN`` and never re-send it by itself (at-most-once)."""


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_object(params: bytes) -> dict[str, Any] | None:
    """Stored params decoded, if they are a JSON object (what every call's params are:
    Bot API "Making requests") in standard JSON (no ``NaN`` or ``Infinity``, which
    Python's ``json`` would read), else ``None``."""
    try:
        decoded = json.loads(params, parse_constant=_refuse_constant)
    except (ValueError, TypeError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return decoded if isinstance(decoded, dict) else None


@dataclass(frozen=True, slots=True)
class NewCall:
    """A call to enqueue.

    Attributes:
        key: the effect key (full and bounded: ``telegram_idem._keys.bounded_key``).
        bot_id: the bot that sends it.
        method: the Bot API method name, as given (``"sendMessage"``; unknown names are
            kept: the Bot API grows).
        params: the parameters as a JSON object, ASCII bytes; files by reference.
        ordering_key: the unit of ordering (``"chat:<chat_id>"``), or ``None`` for a call
            of its own (the key is then its unit).
        collapse_key: calls with the same collapse key replace each other while pending
            (latest wins), or ``None``.
        policy: what an ambiguous outcome does.
        priority: lower goes first among chats (0 replies, 10 bulk).
        retention: seconds the entry is kept after it is delivered or superseded.

    Raises:
        ValueError: ``params`` is not a JSON object (``encode_params`` of a mapping makes
            one): a call a relay could never send is refused here, before any store
            writes it, whichever store it is for.
        TypeError: ``params`` is not bytes.
    """

    key: str
    bot_id: int
    method: str
    params: bytes
    ordering_key: str | None
    collapse_key: str | None
    policy: AmbiguousPolicy
    priority: int = 0
    retention: float = 7 * 24 * 3600.0

    def __post_init__(self) -> None:
        if not isinstance(self.params, bytes | bytearray):
            raise TypeError(
                f"{self.method} {self.key}: params must be bytes (encode_params(...)), "
                f"not {type(self.params).__name__}"
            )
        if json_object(self.params) is None:
            raise ValueError(
                f"{self.method} {self.key}: params must be a JSON object as bytes, in "
                "standard JSON (no NaN or Infinity: encode_params(...) of a mapping); "
                "nothing is stored"
            )

    @property
    def unit(self) -> str:
        """The ordering key, or the key itself when the call has none."""
        return self.ordering_key or self.key


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """An entry as a relay or an operator sees it.

    Attributes:
        key: the effect key.
        bot_id: the bot that sends it.
        seq: enqueue order (store-wide, increasing; a redrive gives a new one).
        method: the Bot API method, as enqueued.
        params: the call's parameters as JSON bytes, as enqueued (or as a ``retry``
            replaced them, for a chat that migrated).
        collapse_key: the collapsing key, as enqueued (a later call under it supersedes
            this one while it waits), or ``None``.
        policy: what an ambiguous failure makes of it (:class:`AmbiguousPolicy`).
        priority: its flood-control priority, as enqueued (lower is sent first).
        retention: seconds the entry is kept after it is settled.
        ordering_key: the unit of ordering (the key itself when the call has none).
        status: see :class:`CallStatus`.
        attempts: how many times it has been taken.
        token: the current taker's fencing token (0 before the first take).
        created_at: when it was enqueued, seconds since the epoch (the store's clock, as
            every time here).
        available_at: when it may be taken, seconds since the epoch (a retry or a
            ``retry_after`` waits).
        lease_expires_at: when an in-flight lease ends, seconds since the epoch (0 when
            not in flight).
        settled_at: when it was delivered, superseded, buried, held or parked, seconds
            since the epoch (0 while live).
        result: Telegram's ``result`` as JSON bytes (``DELIVERED``), or
            ``{"superseded_by": key}`` (``SUPERSEDED``), else ``None``.
        last_error: the last failure, as text.
    """

    key: str
    bot_id: int
    seq: int
    method: str
    params: bytes
    ordering_key: str
    collapse_key: str | None
    policy: AmbiguousPolicy
    priority: int
    retention: float
    status: CallStatus
    attempts: int
    token: int
    created_at: float
    available_at: float
    lease_expires_at: float
    settled_at: float = 0.0
    result: bytes | None = None
    last_error: str | None = None


class Outbox(abc.ABC):
    """Durable, per-chat ordered Bot API calls (see the module docstring for the rules).

    Every method raises :class:`~telegram_idem.errors.StoreError` when the store cannot
    answer; none reports an outage as a decision.
    """

    @abc.abstractmethod
    async def enqueue(self, call: NewCall) -> tuple[OutboxEntry, bool]:
        """Store ``call`` under its key, unless the key is stored already.

        Args:
            call: the call to store (:class:`NewCall`, made by :class:`Outbound`).

        Returns:
            ``(entry, True)`` when stored now (``PENDING``, or ``PARKED`` when its chat is
            parked), else ``(the stored entry, False)`` and nothing is written.
        """

    async def enqueue_in(self, conn: object, call: NewCall) -> tuple[OutboxEntry, bool]:
        """:meth:`enqueue` inside the caller's own open database transaction on
        ``conn``: the entry commits or rolls back with the caller's writes.

        Stores whose tables can live in the bot's database (SQLite, PostgreSQL) accept
        their drivers' connections (sqlite3 / aiosqlite; asyncpg, SQLAlchemy
        ``AsyncConnection`` / ``AsyncSession``).

        Args:
            conn: the caller's open connection or session, inside its transaction.
            call: the call to store, as :meth:`enqueue`.

        Raises:
            ConfigurationError: this store cannot join a transaction, ``conn`` is not a
                connection it knows, or it is not on the store's own database.
        """
        raise ConfigurationError(
            f"{type(self).__name__} cannot join a database transaction: use an SQLite or "
            "PostgreSQL store whose tables live in the bot's database"
        )

    @abc.abstractmethod
    async def take(
        self, *, bot_id: int, lease: float, ordering_key: str | None = None
    ) -> OutboxEntry | None:
        """Lease the next takeable entry of ``bot_id`` (lowest priority, then oldest, among
        the heads of its chats), or ``None``.

        Args:
            bot_id: whose calls.
            lease: seconds the taker holds it before another relay may take it.
            ordering_key: only this chat's head (a sender delivering its own call now).
        """

    @abc.abstractmethod
    async def deliver(self, entry: OutboxEntry, *, result: bytes) -> bool:
        """Telegram accepted it: ``DELIVERED`` with ``result`` (JSON bytes). ``False`` if
        ``entry.token`` no longer holds it (nothing written).

        Args:
            entry: the entry as taken (its ``token`` proves the lease).
            result: Telegram's ``result``, as JSON bytes.
        """

    @abc.abstractmethod
    async def retry(
        self,
        entry: OutboxEntry,
        *,
        delay: float,
        error: str,
        params: bytes | None = None,
        ordering_key: str | None = None,
    ) -> bool:
        """Back to ``PENDING``, takeable after ``delay`` seconds; ``params`` and
        ``ordering_key`` replace the entry's when given (a group that migrated to a
        supergroup). ``False`` if not held.

        Args:
            entry: the entry as taken.
            delay: seconds until it may be taken again.
            error: why it failed, as text (kept as ``last_error``).
            params: new parameters as JSON bytes, or ``None`` to keep them.
            ordering_key: a new ordering unit (the supergroup's chat), or ``None`` to keep
                it.
        """

    @abc.abstractmethod
    async def settle(
        self,
        entry: OutboxEntry,
        *,
        status: Literal[CallStatus.DEAD, CallStatus.UNKNOWN],
        error: str,
    ) -> bool:
        """Make the entry a dead letter or an unknown outcome. ``False`` if not held.

        Args:
            entry: the entry as taken.
            status: ``CallStatus.DEAD`` or ``CallStatus.UNKNOWN``.
            error: why, as text (kept as ``last_error``).

        Raises:
            ValueError: ``status`` is neither ``DEAD`` nor ``UNKNOWN`` (some stores raise
                ``ConfigurationError`` for it instead).
            ConfigurationError: as ``ValueError``, in the stores that raise it.
        """

    @abc.abstractmethod
    async def park(self, entry: OutboxEntry, *, error: str) -> bool:
        """Park the entry's chat (see the module docstring). ``False`` if not held.

        Args:
            entry: the entry as taken.
            error: why the chat is parked, as text (e.g. "bot was blocked by the user").
        """

    @abc.abstractmethod
    async def extend(self, entry: OutboxEntry, *, lease: float) -> bool:
        """Heartbeat: the lease ends ``lease`` seconds from now. ``False`` if not held.

        Args:
            entry: the entry as taken.
            lease: seconds from now the lease ends.
        """

    @abc.abstractmethod
    async def get(self, key: str) -> OutboxEntry | None:
        """The entry stored under ``key``, or ``None``.

        Args:
            key: the effect key the call was stored under.
        """

    @abc.abstractmethod
    async def entries(
        self, *, status: CallStatus, bot_id: int | None = None, limit: int = 100
    ) -> list[OutboxEntry]:
        """Entries in ``status`` (of ``bot_id``, or of every bot), oldest (``seq``) first.

        Args:
            status: the status listed.
            bot_id: only this bot's entries; ``None``: every bot's.
            limit: at most this many.
        """

    @abc.abstractmethod
    async def redrive(self, key: str) -> bool:
        """Put a ``DEAD``, ``UNKNOWN`` or ``PARKED`` entry back to ``PENDING`` at the back
        of its chat (a new ``seq``, attempts reset; a parked chat stays parked for later
        enqueues). ``False`` if there is no such entry in one of those statuses.

        Args:
            key: the entry's effect key.
        """

    @abc.abstractmethod
    async def resolve(self, key: str, *, result: bytes) -> bool:
        """Settle an ``UNKNOWN`` entry as ``DELIVERED`` with ``result`` (an operator found
        the message). ``False`` if it is not unknown.

        Args:
            key: the entry's effect key.
            result: the ``Message`` (or other ``result``) Telegram returned, as JSON bytes.
        """

    @abc.abstractmethod
    async def unpark(self, *, bot_id: int, ordering_key: str) -> int:
        """Clear the chat's parked mark and put its ``PARKED`` entries back to
        ``PENDING`` (in their order). Returns how many.

        Args:
            bot_id: the bot whose chat it is.
            ordering_key: the parked chat's ordering unit (as :meth:`parked_units` lists
                it).
        """

    @abc.abstractmethod
    async def parked_units(self, *, bot_id: int | None = None) -> list[tuple[int, str]]:
        """The parked chats, as ``(bot_id, ordering_key)``.

        Args:
            bot_id: only this bot's chats; ``None``: every bot's.
        """

    @abc.abstractmethod
    async def counts(self, *, bot_id: int | None = None) -> dict[CallStatus, int]:
        """How many entries are in each status (statuses with none may be left out).

        Args:
            bot_id: only this bot's entries; ``None``: every bot's.
        """

    async def take_many(self, *, bot_id: int, lease: float, limit: int) -> Sequence[OutboxEntry]:
        """Up to ``limit`` entries of distinct chats, as successive :meth:`take` calls
        would give. Stores override this to take them in one round trip.

        Args:
            bot_id: whose calls.
            lease: seconds each taker holds its entry, as :meth:`take`.
            limit: at most this many entries.
        """
        taken: list[OutboxEntry] = []
        for _ in range(limit):
            entry = await self.take(bot_id=bot_id, lease=lease)
            if entry is None:
                break
            taken.append(entry)
        return taken
