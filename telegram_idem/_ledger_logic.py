"""The effect ledger's rules as pure functions over one row (no I/O, time passed in),
for the in-process stores (memory, SQLite), which run them inside their one transaction.
Server stores implement the same rules natively; the conformance suite
(:class:`telegram_idem.testing.conformance.LedgerConformance`) checks both.

See :mod:`telegram_idem.ledger` (its docstring) for the protocol these rules serve.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from telegram_idem.ledger import (
    LedgerEntry,
    LedgerState,
    check_limit,
    check_settle,
    storable_text,
)

__all__ = ["do_finish", "do_mark_unknown", "do_settle", "do_start", "select"]


def do_start(
    row: LedgerEntry | None, *, key: str, token: int, holder: str, now: float
) -> tuple[LedgerEntry | None, LedgerEntry | None]:
    """``(answer, row_to_write)`` of :meth:`~telegram_idem.ledger.Ledger.start`: the new
    ``STARTED`` row to write and ``None`` to answer, or the existing row to answer and
    nothing to write."""
    if row is not None:
        return row, None
    return None, LedgerEntry(key, LedgerState.STARTED, token, now, storable_text(holder), 1, now)


def do_mark_unknown(
    row: LedgerEntry | None, *, token: int, detail: str, now: float
) -> tuple[LedgerEntry | None, bool]:
    """``(row_after, changed)`` of :meth:`~telegram_idem.ledger.Ledger.mark_unknown`."""
    if row is None or row.state is LedgerState.SETTLED or token < row.token:
        return row, False
    new = replace(
        row,
        state=LedgerState.UNKNOWN,
        token=token,
        detail=storable_text(detail),
        attempts=row.attempts + 1,
        updated_at=now,
    )
    return new, True


def do_settle(
    row: LedgerEntry | None,
    *,
    token: int,
    result: bytes | None,
    not_applied: bool,
    now: float,
) -> LedgerEntry | None:
    """The settled row to write, or ``None`` (no row, or settled already).

    Raises:
        ValueError: neither or both of ``result`` and ``not_applied``.
    """
    check_settle(result, not_applied)
    if row is None or row.state is LedgerState.SETTLED:
        return None
    return replace(
        row,
        state=LedgerState.SETTLED,
        token=token,
        result=result,
        not_applied=not_applied,
        updated_at=now,
    )


def do_finish(row: LedgerEntry | None, *, token: int) -> bool:
    """Whether :meth:`~telegram_idem.ledger.Ledger.finish` deletes ``row``."""
    return row is not None and row.token == token


def select(
    rows: Iterable[LedgerEntry], *, states: Sequence[LedgerState], prefix: str, limit: int
) -> list[LedgerEntry]:
    """The rows :meth:`~telegram_idem.ledger.Ledger.entries` answers, oldest first.

    Raises:
        ValueError: ``limit`` < 1.
    """
    check_limit(limit)
    wanted = set(states)
    chosen = [r for r in rows if r.state in wanted and r.key.startswith(prefix)]
    chosen.sort(key=lambda r: (r.started_at, r.key))
    return chosen[:limit]
