"""The memory store's effect ledger: rows in a dict of this event loop, on the store's
clock (every method is atomic: nothing inside awaits)."""

from __future__ import annotations

from collections.abc import Sequence

from telegram_idem._clock import Clock
from telegram_idem._keys import bounded_key
from telegram_idem._ledger_logic import do_finish, do_mark_unknown, do_settle, do_start, select
from telegram_idem.ledger import Ledger, LedgerEntry, LedgerState

__all__ = ["MemoryLedger"]


class MemoryLedger(Ledger):
    """:class:`~telegram_idem.ledger.Ledger` in a dict; rows are never evicted (an
    unknown outcome stays until settled), and die with the process.

    Args:
        clock: seconds since the epoch (``started_at``, ``updated_at``).
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._rows: dict[str, LedgerEntry] = {}

    def __repr__(self) -> str:
        return f"MemoryLedger(rows={len(self._rows)})"

    async def start(self, key: str, *, token: int, holder: str) -> LedgerEntry | None:
        key = bounded_key(key)
        answer, new = do_start(
            self._rows.get(key), key=key, token=token, holder=holder, now=self._clock()
        )
        if new is not None:
            self._rows[key] = new
        return answer

    async def mark_unknown(self, key: str, *, token: int, detail: str) -> LedgerEntry | None:
        key = bounded_key(key)
        row, changed = do_mark_unknown(
            self._rows.get(key), token=token, detail=detail, now=self._clock()
        )
        if changed and row is not None:
            self._rows[key] = row
        return row

    async def settle(
        self, key: str, *, token: int, result: bytes | None, not_applied: bool
    ) -> bool:
        key = bounded_key(key)
        new = do_settle(
            self._rows.get(key),
            token=token,
            result=result,
            not_applied=not_applied,
            now=self._clock(),
        )
        if new is None:
            return False
        self._rows[key] = new
        return True

    async def finish(self, key: str, *, token: int) -> bool:
        key = bounded_key(key)
        if not do_finish(self._rows.get(key), token=token):
            return False
        del self._rows[key]
        return True

    async def get(self, key: str) -> LedgerEntry | None:
        return self._rows.get(bounded_key(key))

    async def entries(
        self,
        *,
        states: Sequence[LedgerState] = (LedgerState.STARTED, LedgerState.UNKNOWN),
        prefix: str = "",
        limit: int = 100,
    ) -> list[LedgerEntry]:
        return select(self._rows.values(), states=states, prefix=prefix, limit=limit)
