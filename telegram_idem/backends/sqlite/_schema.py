"""The SQLite file's tables, and the records table as a transaction body uses it."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from telegram_idem._records import Record, Status

__all__ = [
    "FLOOD_SCHEMA",
    "INBOX_SCHEMA",
    "LEDGER_SCHEMA",
    "OUTBOX_SCHEMA",
    "RECORDS_SCHEMA",
    "RecordRows",
    "upgrade_inbox",
]

RECORDS_SCHEMA = """
CREATE TABLE IF NOT EXISTS idem_records (
    key TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    fencing_token INTEGER NOT NULL,
    lease_expires_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    fingerprint TEXT,
    result BLOB,
    attempts INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idem_records_expires ON idem_records (expires_at);
"""
"""The update guard and action records (docs/stores.md shows the same text)."""

INBOX_SCHEMA = """
CREATE TABLE IF NOT EXISTS idem_inbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    ordering_key TEXT NOT NULL,
    payload BLOB NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    token INTEGER NOT NULL,
    available_at REAL NOT NULL,
    lease_expires_at REAL NOT NULL,
    last_error TEXT,
    admitted_at REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS idem_inbox_heads ON idem_inbox (ordering_key, seq)
    WHERE status != 'dead';
CREATE INDEX IF NOT EXISTS idem_inbox_status ON idem_inbox (status, seq);
"""
"""The durable inbox's entries (``admitted_at``: seconds since the epoch on the store's
clock, ``0`` for an entry admitted before the column existed; :func:`upgrade_inbox` adds
it to a file made by an older version). ``idem_inbox_status`` serves the operator's
listings by status, oldest first."""


def upgrade_inbox(conn: sqlite3.Connection) -> bool:
    """Add ``admitted_at`` to an ``idem_inbox`` table made before it existed.

    Runs on every open, after :data:`INBOX_SCHEMA`: a read of the table's columns, and
    ``ALTER TABLE idem_inbox ADD COLUMN admitted_at REAL NOT NULL DEFAULT 0`` only when
    the column is missing (another connection adding it first is fine).

    Returns:
        ``True`` if this call added the column.

    Raises:
        sqlite3.OperationalError: from SQLite ("database is locked": another connection
            holds the write lock the ``ALTER`` needs).
    """
    columns = {row[1] for row in conn.execute("PRAGMA table_info(idem_inbox)")}
    if "admitted_at" in columns:
        return False
    try:
        conn.execute("ALTER TABLE idem_inbox ADD COLUMN admitted_at REAL NOT NULL DEFAULT 0")
    except sqlite3.OperationalError as exc:
        if "duplicate column" in str(exc).lower():
            return False  # another connection upgraded the file in between
        raise
    return True


OUTBOX_SCHEMA = """
CREATE TABLE IF NOT EXISTS idem_outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE,
    bot_id INTEGER NOT NULL,
    method TEXT NOT NULL,
    params BLOB NOT NULL,
    ordering_key TEXT NOT NULL,
    collapse_key TEXT,
    policy TEXT NOT NULL,
    priority INTEGER NOT NULL,
    retention REAL NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    token INTEGER NOT NULL,
    created_at REAL NOT NULL,
    available_at REAL NOT NULL,
    lease_expires_at REAL NOT NULL,
    settled_at REAL NOT NULL,
    expires_at REAL,
    result BLOB,
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS idem_outbox_live ON idem_outbox (bot_id, ordering_key, seq)
    WHERE status IN ('pending', 'in_flight');
CREATE INDEX IF NOT EXISTS idem_outbox_collapse ON idem_outbox (bot_id, collapse_key)
    WHERE status = 'pending' AND collapse_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS idem_outbox_status ON idem_outbox (status, seq);
CREATE INDEX IF NOT EXISTS idem_outbox_expires ON idem_outbox (expires_at)
    WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS idem_outbox_parked (
    bot_id INTEGER NOT NULL,
    ordering_key TEXT NOT NULL,
    parked_at REAL NOT NULL,
    PRIMARY KEY (bot_id, ordering_key)
) WITHOUT ROWID;
"""
"""The durable outbox's entries (``expires_at``: when a delivered or superseded entry's
retention ends, ``NULL`` for every other status) and its parked chats."""

FLOOD_SCHEMA = """
CREATE TABLE IF NOT EXISTS idem_flood (
    key TEXT PRIMARY KEY,
    tat REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idem_flood_tat ON idem_flood (tat);
"""
"""The flood budgets: each bucket's theoretical arrival time (seconds on the clock)."""

LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS idem_ledger (
    key TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    token INTEGER NOT NULL,
    started_at REAL NOT NULL,
    holder TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    detail TEXT NOT NULL,
    result BLOB,
    not_applied INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idem_ledger_started ON idem_ledger (state, started_at, key);
"""
"""The effect ledger: at-most-once effects started, unknown or settled (never expire)."""

_COLUMNS = "key, status, fencing_token, lease_expires_at, expires_at, fingerprint, result, attempts"
_SELECT = f"SELECT {_COLUMNS} FROM idem_records WHERE key = ?"
_UPSERT = f"INSERT OR REPLACE INTO idem_records ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
_PURGE = (
    "DELETE FROM idem_records WHERE key IN "
    "(SELECT key FROM idem_records WHERE expires_at <= ? LIMIT ?)"
)


@dataclass(frozen=True, slots=True)
class RecordRows:
    """The ``idem_records`` table through one connection, on the connection's thread.

    Implements :class:`~telegram_idem.backends._local.RecordAccess` (``read``, ``write``).

    Attributes:
        conn: the SQLite connection (inside the caller's transaction, if any).
    """

    conn: sqlite3.Connection

    def read(self, key: str) -> Record | None:
        """The stored record of ``key``, expired or not."""
        row: tuple[Any, ...] | None = self.conn.execute(_SELECT, (key,)).fetchone()
        if row is None:
            return None
        key, status, token, lease_at, exp_at, fp, result, attempts = row
        return Record(key, Status(status), token, lease_at, exp_at, fp, result, attempts)

    def write(self, record: Record) -> None:
        """Insert or replace ``record``."""
        self.conn.execute(
            _UPSERT,
            (
                record.key,
                record.status.value,
                record.fencing_token,
                record.lease_expires_at,
                record.expires_at,
                record.fingerprint,
                record.result,
                record.attempts,
            ),
        )

    def purge(self, now: float, limit: int) -> int:
        """Delete up to ``limit`` records whose retention ended at or before ``now``
        (seconds since the epoch); returns how many."""
        return self.conn.execute(_PURGE, (now, limit)).rowcount
