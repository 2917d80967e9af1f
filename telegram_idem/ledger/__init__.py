"""The effect ledger: what at-most-once effects have *started*, so a crash leaves an
honest *unknown* instead of a silent second run.

- :class:`~telegram_idem.ledger._base.Ledger` — the store contract, implemented next to
  each store that supports it (``Store.ledger()``, the ``HasLedger`` ability).
- :class:`LedgerEntry`, :class:`LedgerState` — one row and where it stands.
- :func:`check_settle`, :func:`check_limit`, :func:`storable_text` — argument and text
  rules every implementation applies (for a store of your own).

Bot code never calls the ledger directly: ``Idem.run(..., once="at_most")``,
``Idem.step(..., once="at_most")``, ``Idem.unresolved()`` and ``Idem.resolve()`` do.
"""

from telegram_idem.ledger._base import (
    Ledger,
    LedgerEntry,
    LedgerState,
    check_limit,
    check_settle,
    storable_text,
)

__all__ = ["Ledger", "LedgerEntry", "LedgerState", "check_limit", "check_settle", "storable_text"]
