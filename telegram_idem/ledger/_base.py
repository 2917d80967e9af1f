"""The effect ledger's store contract: :class:`Ledger`, :class:`LedgerEntry`,
:class:`LedgerState` and the argument rules every implementation applies.

The protocol they serve (which write comes when, in what order, and how keys and text
are stored) is the public package's docstring, :mod:`telegram_idem.ledger`
(``help(telegram_idem.ledger)``); it is not repeated here.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from telegram_idem._text import storable_text
from telegram_idem.errors import ConfigurationError

__all__ = ["Ledger", "LedgerEntry", "LedgerState", "check_limit", "check_settle", "storable_text"]


class LedgerState(StrEnum):
    """Where an at-most-once effect stands."""

    STARTED = "started"
    """Its holder wrote the row and ran (or was about to run) the effect; no outcome is
    recorded yet. Unknown once the holder is gone (its lease ended)."""
    UNKNOWN = "unknown"
    """A later holder found the row, or the effect failed ambiguously: it may or may not
    have taken effect. Never run again until settled."""
    SETTLED = "settled"
    """Someone settled it (:meth:`Ledger.settle`); the next holder applies the
    resolution (replays ``result``, or runs again when ``not_applied``)."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One ledger row.

    Attributes:
        key: the step's or action's full idempotency key.
        state: :class:`LedgerState`.
        token: the fencing token of the holder that wrote the row last (the runner for
            ``STARTED``, the finder for ``UNKNOWN``, the resolver for ``SETTLED``);
            :meth:`Ledger.finish` and :meth:`Ledger.mark_unknown` are fenced by it.
        started_at: seconds since the epoch (store clock) when the effect started.
        holder: who started it (``"host:pid"`` or a worker name given to the guard).
        attempts: how many holders have met the row (1 when started, +1 at every
            :meth:`Ledger.mark_unknown`).
        updated_at: seconds since the epoch (store clock) of the last change.
        detail: what is known (the ambiguous error's type and message, or how the row
            was found); ``""`` when nothing is.
        result: the settled result (the guard's codec encoding), or ``None``.
        not_applied: settled as "did not happen" (the next holder runs the effect).
    """

    key: str
    state: LedgerState
    token: int
    started_at: float
    holder: str
    attempts: int = 1
    updated_at: float = 0.0
    detail: str = ""
    result: bytes | None = None
    not_applied: bool = False


class Ledger(abc.ABC):
    """The store's effect ledger. Every method raises
    :class:`~telegram_idem.errors.StoreError` when the store cannot answer."""

    @abc.abstractmethod
    async def start(self, key: str, *, token: int, holder: str) -> LedgerEntry | None:
        """Write a ``STARTED`` row for ``key`` if it has none, atomically.

        Args:
            key: the effect's idempotency key.
            token: the holder's fencing token (of its record claim of ``key``).
            holder: who runs it.

        Returns:
            ``None`` if the row was written (run the effect); otherwise the existing row,
            unchanged (do not run it: see the module's table).

        Raises:
            StoreError: the store could not answer (or, PostgreSQL, the write kept racing
                concurrent ones).
        """

    @abc.abstractmethod
    async def mark_unknown(self, key: str, *, token: int, detail: str) -> LedgerEntry | None:
        """Make a ``STARTED`` or ``UNKNOWN`` row ``UNKNOWN``: ``token`` and ``detail``
        replaced, ``attempts`` + 1, ``updated_at`` now. A ``SETTLED`` row is left as it is
        (a resolution stands).

        Args:
            key: the effect's idempotency key.
            token: the caller's fencing token (the finder's, or the runner's own for an
                ambiguous failure); it must be ≥ the row's (a late holder with an older
                token changes nothing).
            detail: what is known, for the operator.

        Returns:
            The row after the call (``SETTLED`` or an older-token refusal: unchanged), or
            ``None`` if ``key`` has no row.
        """

    @abc.abstractmethod
    async def settle(
        self, key: str, *, token: int, result: bytes | None, not_applied: bool
    ) -> bool:
        """Settle a ``STARTED`` or ``UNKNOWN`` row: state ``SETTLED``, ``token`` the
        resolver's, with ``result`` or ``not_applied``.

        Args:
            key: the effect's idempotency key.
            token: the resolver's fencing token (from its record claim of ``key``).
            result: the encoded result to replay, or ``None`` with ``not_applied``.
            not_applied: the effect did not happen (the next holder runs it).

        Returns:
            ``True`` if this call settled it; ``False`` if there is no row or it is
            ``SETTLED`` already (the first resolution stands).

        Raises:
            ValueError: neither or both of ``result`` and ``not_applied`` given.
        """

    @abc.abstractmethod
    async def finish(self, key: str, *, token: int) -> bool:
        """Delete the row of ``key`` if its ``token`` is ``token`` (fenced: a late holder
        never removes a newer holder's or a resolver's row).

        Args:
            key: the effect's key.
            token: the fencing token of the holder that wrote the row.

        Returns:
            ``True`` if a row was deleted.
        """

    @abc.abstractmethod
    async def get(self, key: str) -> LedgerEntry | None:
        """The row of ``key``, or ``None``.

        Args:
            key: the effect's key.
        """

    @abc.abstractmethod
    async def entries(
        self,
        *,
        states: Sequence[LedgerState] = (LedgerState.STARTED, LedgerState.UNKNOWN),
        prefix: str = "",
        limit: int = 100,
    ) -> list[LedgerEntry]:
        """Rows in ``states`` whose key starts with ``prefix``, oldest ``started_at``
        first (ties: by key), at most ``limit``.

        Args:
            states: the states listed (default the unresolved ones: started and unknown).
            prefix: only keys starting with it (``""``: every key).
            limit: at most this many rows (≥ 1).

        Raises:
            ValueError: ``limit`` < 1.
        """


def check_settle(result: bytes | None, not_applied: bool) -> None:
    """The argument rule of :meth:`Ledger.settle`, for implementations.

    Args:
        result: the ``result=`` given to ``settle``, or ``None``.
        not_applied: the ``not_applied=`` given to ``settle``.

    Raises:
        ValueError: neither or both of ``result`` and ``not_applied`` given.
    """
    if (result is None) != not_applied:
        raise ValueError("settle needs exactly one of result= or not_applied=True")


def check_limit(limit: int, name: str = "limit") -> int:
    """The argument rule of every listing's ``limit`` (:meth:`Ledger.entries`, the
    inbox's operator reads, the stores' browsing): an integer ≥ 1.

    Args:
        limit: the ``limit=`` given to the listing.
        name: how the message names the argument.

    Returns:
        ``limit``.

    Raises:
        ConfigurationError: ``limit`` is not an integer ≥ 1 (a ``ValueError``).
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"{name} must be an integer ≥ 1, got {limit!r}")
    return limit
