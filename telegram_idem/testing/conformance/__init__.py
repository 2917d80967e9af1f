"""The store conformance suite: the contract every store keeps, as test classes to subclass.

A store's author (a built-in store of this package, or your own) gets the suite by
subclassing one class in a test module and giving it a URL factory::

    import pytest
    from telegram_idem.testing.conformance import StoreConformance

    class TestMyStore(StoreConformance):
        @pytest.fixture
        def store_url_factory(self, tmp_path):
            paths = iter(range(1_000_000))
            return lambda: f"mystore:///{tmp_path}/{next(paths)}.db"

``store_url_factory`` returns a callable giving a new URL, whose store holds no record,
on each call (clean up what it made in the fixture). Stores are made from the URLs by
:meth:`~ConformanceBase.open_store` (``store_from_url``, so a ``Store`` subclass that
sets ``schemes`` is found; override it for a store made otherwise), on the plugin's
``idem_clock``, so the tests move time and never sleep.

| class | covers |
|---|---|
| :class:`StoreConformance` | the record state machine (claim, complete, fail, release, extend, get; outcomes, fencing tokens, leases and takeover, retention), ``claim_many``, key bounding, result bytes, races from one connection, separate connections and OS processes, and agreement with a reference model on random operation sequences (hypothesis) |
| :class:`InboxConformance` | all of the above, plus the durable inbox of ``store.inbox()``: admission with the update guard, per-chat order, leases, retries, dead letters, redrive, fencing, exact payload bytes |
| :class:`OutboxConformance` | the outbox of ``store.outbox()`` alone: idempotent enqueue in every status, latest-wins collapse, per-chat order with one call in flight, priority, fencing, retries, dead and unknown outcomes, parked chats, redrive, resolve, listing, retention, races, exact bytes, odd keys |
| :class:`LedgerConformance` | the effect ledger of ``store.ledger()`` alone: one started row per key, unknown and settled under fencing tokens, fenced removal, listing oldest first by state and prefix, rows that never expire, exact bytes and odd keys, racing starts, one ledger per URL |
| :class:`BrowseConformance` | listing, counting and deleting records by key prefix (``records``, ``count_records``, ``delete_records``: live records in key order, a prefix never read as a pattern, odd and huge prefixes, exact batches) and ``health()`` finding a fresh store's tables |
| :class:`FloodBudgetConformance` | the flood budget of ``store.flood_budget()`` alone: burst then interval, all-or-nothing reservations, gates and pauses, races, budgets shared by one URL's store objects |

The outbound classes hold only their own contract: a store that has records, an outbox
and a flood budget subclasses ``StoreConformance`` (or ``InboxConformance``),
``OutboxConformance`` and ``FloodBudgetConformance`` in one class or in three.

Class attributes: ``shares_state = False`` for a store whose objects keep records of
their own (like ``memory://``): the separate-connection tests then share one object,
and the tests marked ``idem_shared_state`` (OS processes) are deselected by the plugin;
``model_examples`` (default 40) sets how many random sequences the model comparison
runs; ``settled_expiry`` (:class:`OutboxConformance`, default ``"clock"``) says whether
the store ends a delivered entry's retention by its clock (the tests move it) or by real
time (``"wall"``, a server-side TTL: the tests sleep 1.5 s). The classes need the ``telegram_idem`` pytest plugin (active once the package is
installed), pytest-asyncio and hypothesis (``pip install 'telegram-idem[testing]'``).

:data:`ODD_TEXTS` and :data:`ODD_PAYLOADS` are the texts and bytes the suite requires a
store to keep exactly, for a store's own further tests.
"""

from __future__ import annotations

from telegram_idem.testing.conformance._base import ConformanceBase, StoreMaker, UrlFactory
from telegram_idem.testing.conformance._browse import BrowseContract
from telegram_idem.testing.conformance._concurrency import ConcurrencyContract
from telegram_idem.testing.conformance._flood import FloodBudgetContract
from telegram_idem.testing.conformance._inbox import InboxContract
from telegram_idem.testing.conformance._ledger import LedgerContract
from telegram_idem.testing.conformance._model import ClaimTable, ModelContract
from telegram_idem.testing.conformance._outbox_ops import OutboxOpsContract
from telegram_idem.testing.conformance._payloads import ODD_PAYLOADS, ODD_TEXTS
from telegram_idem.testing.conformance._records import RecordContract

__all__ = [
    "ODD_PAYLOADS",
    "ODD_TEXTS",
    "BrowseConformance",
    "ClaimTable",
    "ConformanceBase",
    "FloodBudgetConformance",
    "InboxConformance",
    "LedgerConformance",
    "OutboxConformance",
    "StoreConformance",
    "StoreMaker",
    "UrlFactory",
]


class StoreConformance(RecordContract, ConcurrencyContract, ModelContract):
    """The record contract of a store: subclass it as ``Test<YourStore>`` and define the
    ``store_url_factory`` fixture (see the module docstring)."""


class InboxConformance(StoreConformance, InboxContract):
    """:class:`StoreConformance` plus the inbox contract, for a store whose ``inbox()``
    gives a durable inbox."""


class OutboxConformance(OutboxOpsContract):
    """The outbox contract of a store whose ``outbox()`` gives a durable outbox: subclass
    it as ``Test<YourStore>Outbox`` and define ``store_url_factory`` (see the module
    docstring; ``settled_expiry = "wall"`` for a store whose retention runs on real
    time)."""


class FloodBudgetConformance(FloodBudgetContract):
    """The flood-budget contract of a store whose ``flood_budget()`` gives a budget
    shared by every process using the store: subclass it and define
    ``store_url_factory`` (see the module docstring)."""


class LedgerConformance(LedgerContract):
    """The effect-ledger contract of a store whose ``ledger()`` gives a ledger shared by
    every process using the store: subclass it and define ``store_url_factory`` (see the
    module docstring)."""


class BrowseConformance(BrowseContract):
    """The browsing and health contract of a store with the
    :class:`~telegram_idem.backends.Browsable` and :class:`~telegram_idem.backends.Checkable`
    abilities: subclass it and define ``store_url_factory`` (see the module docstring;
    ``counts_expired = False`` for a store that forgets records past retention itself)."""
