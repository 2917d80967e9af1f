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
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS idem_inbox_heads ON idem_inbox (ordering_key, seq)
    WHERE status != 'dead';
"""
"""The durable inbox's entries."""

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
