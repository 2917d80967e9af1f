"""The effect ledger: what at-most-once effects have *started*, so a crash leaves an
honest *unknown* instead of a silent second run.

- :class:`Ledger` — the store contract, implemented next to each store that supports it
  (``Store.ledger()``, the ``HasLedger`` ability).
- :class:`LedgerEntry`, :class:`LedgerState` — one row and where it stands.
- :func:`check_settle`, :func:`check_limit`, :func:`storable_text` — argument and text
  rules every implementation applies (for a store of your own).

Bot code never calls the ledger directly: ``Idem.run(..., once="at_most")``,
``Idem.step(..., once="at_most")``, ``Idem.unresolved()`` and ``Idem.resolve()`` do.

Protocol
--------

An at-most-once effect (``once="at_most"`` on a step or an action) writes a ledger row
*before* it runs and removes it after its outcome is recorded. A row that outlives its
holder is the evidence that an effect may have happened: the next holder of the key
finds it and raises :class:`~telegram_idem.errors.UnknownOutcomeError` instead of
running the effect again, and the row stays listed until someone settles it.

The protocol, one key ``K`` (the step's or the action's idempotency key) held under the
record claim of ``K`` with fencing token ``t``:

| moment | record of ``K`` | ledger row of ``K`` |
|---|---|---|
| before the effect | claimed (``t``) | :meth:`Ledger.start` → ``STARTED`` (``t``) |
| success | completed | :meth:`Ledger.finish` (``t``) after the completion |
| not applied (the effect says so) | released | :meth:`Ledger.finish` (``t``) *before* the release |
| permanent failure | failed (stored) | :meth:`Ledger.finish` (``t``) after the failure |
| ambiguous failure | released | :meth:`Ledger.mark_unknown` (``t``) |
| crash anywhere after ``start`` | lease ends | ``STARTED`` stays |
| next holder (``t' > t``) | claimed | ``start`` returns the row → :meth:`Ledger.mark_unknown` (``t'``), release, raise |
| :meth:`Idem.resolve <telegram_idem.Idem.resolve>` | claimed by the resolver (``r``) | :meth:`Ledger.settle` (``r``) → ``SETTLED``; then completed (``result``) or released (``not_applied``) and :meth:`Ledger.finish` (``r``) |

The orders are chosen so that a crash between two writes errs towards *unknown*, never
towards a second run: the row is removed only after the record says what happened, except
for "not applied", where removing it first is safe (nothing happened).

Rows never expire by themselves: an unknown outcome stays until it is settled. Every
method takes the full key and stores it bounded as record keys are (a key longer than
every store can hold becomes a readable head plus its SHA-256; ``LedgerEntry.key`` is
that bounded key); ``holder`` and ``detail`` are kept exactly when they are strict UTF-8
without NUL, otherwise as :func:`storable_text` spells them (the one rule every store
applies to diagnostic text: lone surrogates as ``\\udXXX`` escapes, NUL as ``\\x00``);
``result`` bytes are kept exactly. Times are seconds since the epoch on the store's
clock.
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
