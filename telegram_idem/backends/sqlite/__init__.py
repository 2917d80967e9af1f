"""SQLite store (``sqlite:///path/to/file.db``): the embedded default.

One file in WAL mode, shared safely by several processes: every claim is one
``BEGIN IMMEDIATE`` transaction (read, decide by :mod:`telegram_idem.machine`, write), so
two processes can never both acquire a key. Calls run on one dedicated thread per store.
Records past retention are purged in batches of ``purge_batch`` rows every
``purge_every`` writes, so no purge holds the write lock for long.

URL: ``sqlite:///relative.db``, ``sqlite:////abs/path.db``, ``sqlite:///:memory:``;
query ``?busy_timeout=5`` (seconds to wait for another writer).

The package's parts: the file (:class:`SQLiteConnection`: the connection, its thread,
the transaction, the clock; ``_connection``), its tables (``_schema``), the store
(``_records``: the decision loop of :class:`~telegram_idem.backends._local.LocalStore`
over the records table), the inbox (``_inbox``), the outbox (``_outbox``; one enqueue's
statements in ``_enqueue``, joining the bot's own transaction in ``_join``) and the flood
budget (``_flood``), all sharing the connection.
"""

from telegram_idem.backends.sqlite._connection import ErrorGuard, SQLiteConnection
from telegram_idem.backends.sqlite._flood import SQLiteFloodBudget
from telegram_idem.backends.sqlite._inbox import SQLiteInbox
from telegram_idem.backends.sqlite._ledger import SQLiteLedger
from telegram_idem.backends.sqlite._outbox import SQLiteOutbox
from telegram_idem.backends.sqlite._records import SQLiteStore

__all__ = [
    "ErrorGuard",
    "SQLiteConnection",
    "SQLiteFloodBudget",
    "SQLiteInbox",
    "SQLiteLedger",
    "SQLiteOutbox",
    "SQLiteStore",
]
