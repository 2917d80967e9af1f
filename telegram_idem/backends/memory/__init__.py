"""In-process store (``memory://``) for tests and single-process bots.

Bounded: records past their retention are evicted, and when ``max_items`` is reached the
records closest to expiry go first. Evicting a live record can let a duplicate through,
so each is counted (:attr:`MemoryStore.evicted_live`) and a WARNING says so: at most one
line per ``eviction_log_interval`` seconds, with the count since the previous line (not
one line per record). URL: ``memory://?max_items=100000``.

The package's parts: the records (``_state.MemoryRecords``: the dict, its expiry heap
and eviction), shared by the store (``_records``: the decision loop of
:class:`~telegram_idem.backends._local.LocalStore` over them) and its inbox (``_inbox``);
beside them the outbox of Bot API calls (``_outbox``) and the flood budget (``_flood``),
both on the store's clock.
"""

from telegram_idem.backends.memory._flood import MemoryFloodBudget
from telegram_idem.backends.memory._inbox import MemoryInbox
from telegram_idem.backends.memory._ledger import MemoryLedger
from telegram_idem.backends.memory._outbox import MemoryOutbox
from telegram_idem.backends.memory._records import MemoryStore
from telegram_idem.backends.memory._state import MemoryRecords

__all__ = [
    "MemoryFloodBudget",
    "MemoryInbox",
    "MemoryLedger",
    "MemoryOutbox",
    "MemoryRecords",
    "MemoryStore",
]
