"""One outbox enqueue as a short sequence of statements, and the outbox rows as entries.

The same statements serve :meth:`SQLiteOutbox.enqueue` (inside the store's own
``BEGIN IMMEDIATE``) and :meth:`SQLiteOutbox.enqueue_in` (inside the bot's transaction on
its own ``sqlite3`` or ``aiosqlite`` connection). :func:`enqueue_steps` is a generator
that yields each statement and receives its rows, so one sequence is driven by a blocking
driver (:func:`run_steps`) or an awaiting one, never written twice.

The first statement is a write, so even in a transaction the bot opened ``DEFERRED``,
SQLite takes the write lock before anything is read: the decision (stored already? chat
parked? which pending calls collapse?) cannot race another process's enqueue.

A new key is one statement: the insert (parked chat read inside it) returns the entry. A
key whose entry's retention is over is replaced by the same statement (an upsert: a new
``seq`` at the back of its chat, the ``token`` kept, so a stale holder of the old entry
can never record over the new one). A key that is still stored returns nothing there, and
a second statement reads it; a call with a ``collapse_key`` adds the statement that
supersedes the older pending calls.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Generator, Mapping
from typing import Any

from telegram_idem.outbox import AmbiguousPolicy, CallStatus, NewCall, OutboxEntry

__all__ = [
    "COLUMNS",
    "Statement",
    "Steps",
    "enqueue_steps",
    "entry_of",
    "plain_rows",
    "run_steps",
    "superseded_by",
]

Statement = tuple[str, Mapping[str, object]]
"""An SQL text and its named parameters."""

Steps = Generator[Statement, list[tuple[Any, ...]], tuple[OutboxEntry, bool]]
"""Yields statements, receives each one's rows, returns what ``enqueue`` returns."""

COLUMNS = (
    "key, bot_id, seq, method, params, ordering_key, collapse_key, policy, priority, "
    "retention, status, attempts, token, created_at, available_at, lease_expires_at, "
    "settled_at, result, last_error"
)
"""The columns :func:`entry_of` reads, in its order."""

# Inserts the call, or replaces an entry of its key whose retention is over (delivered
# or superseded past ``expires_at``): a fresh seq, the token kept. A live key: no row.
# It starts with INSERT (no WITH): sqlite3's legacy transaction control opens the bot's
# transaction before a statement only by its first word.
_INSERT = f"""
INSERT INTO idem_outbox (key, bot_id, method, params, ordering_key, collapse_key, policy,
    priority, retention, status, attempts, token, created_at, available_at,
    lease_expires_at, settled_at)
SELECT :key, :bot_id, :method, :params, :unit, :collapse_key, :policy, :priority,
    :retention, CASE WHEN parked THEN 'parked' ELSE 'pending' END, 0, 0, :now, :now, 0,
    CASE WHEN parked THEN :now ELSE 0 END
FROM (SELECT EXISTS (SELECT 1 FROM idem_outbox_parked
                     WHERE bot_id = :bot_id AND ordering_key = :unit) AS parked) WHERE true
ON CONFLICT (key) DO UPDATE SET
    seq = (SELECT MAX(seq) + 1 FROM idem_outbox), bot_id = excluded.bot_id,
    method = excluded.method, params = excluded.params,
    ordering_key = excluded.ordering_key, collapse_key = excluded.collapse_key,
    policy = excluded.policy, priority = excluded.priority, retention = excluded.retention,
    status = excluded.status, attempts = 0, created_at = excluded.created_at,
    available_at = excluded.available_at, lease_expires_at = 0,
    settled_at = excluded.settled_at, expires_at = NULL, result = NULL, last_error = NULL
WHERE expires_at <= :now
RETURNING {COLUMNS}
"""

_SELECT_KEY = f"SELECT {COLUMNS} FROM idem_outbox WHERE key = :key"

_COLLAPSE = """
UPDATE idem_outbox SET status = 'superseded', result = :result, settled_at = :now,
    expires_at = :now + retention
WHERE bot_id = :bot_id AND collapse_key = :collapse_key AND status = 'pending'
    AND key != :key
"""


def entry_of(row: tuple[Any, ...]) -> OutboxEntry:
    """The entry of one row read as :data:`COLUMNS`."""
    (key, bot_id, seq, method, params, unit, collapse, policy, priority, retention, status,
     attempts, token, created, available, lease, settled, result, error) = row  # fmt: skip
    return OutboxEntry(
        key=key,
        bot_id=bot_id,
        seq=seq,
        method=method,
        params=bytes(params),
        ordering_key=unit,
        collapse_key=collapse,
        policy=AmbiguousPolicy(policy),
        priority=priority,
        retention=float(retention),
        status=CallStatus(status),
        attempts=attempts,
        token=token,
        created_at=float(created),
        available_at=float(available),
        lease_expires_at=float(lease),
        settled_at=float(settled),
        result=None if result is None else bytes(result),
        last_error=error,
    )


def superseded_by(key: str) -> bytes:
    """The ``result`` of an entry a later call replaced: ``{"superseded_by": key}``."""
    return json.dumps({"superseded_by": key}, separators=(",", ":")).encode("ascii")


def enqueue_steps(call: NewCall, now: float) -> Steps:
    """The statements of one enqueue of ``call`` at ``now`` (seconds on the store's clock);
    see the module docstring. Returns ``(entry, stored_now)``."""
    rows = yield (
        _INSERT,
        {
            "key": call.key,
            "bot_id": call.bot_id,
            "method": call.method,
            "params": call.params,
            "unit": call.unit,
            "collapse_key": call.collapse_key,
            "policy": call.policy.value,
            "priority": call.priority,
            "retention": call.retention,
            "now": now,
        },
    )
    if not rows:
        (stored,) = yield _SELECT_KEY, {"key": call.key}
        return entry_of(stored), False
    if call.collapse_key is not None:
        yield (
            _COLLAPSE,
            {
                "bot_id": call.bot_id,
                "collapse_key": call.collapse_key,
                "key": call.key,
                "result": superseded_by(call.key),
                "now": now,
            },
        )
    return entry_of(rows[0]), True


def plain_rows(conn: sqlite3.Connection, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` as plain tuples, whatever ``conn.row_factory`` makes."""
    cur = conn.cursor()
    cur.row_factory = None
    try:
        rows: list[tuple[Any, ...]] = cur.execute(sql, params).fetchall()
        return rows
    finally:
        cur.close()


def run_steps(conn: sqlite3.Connection, steps: Steps) -> tuple[OutboxEntry, bool]:
    """Drive ``steps`` on ``conn``, blocking, in whatever transaction ``conn`` is in."""
    try:
        sql, params = next(steps)
        while True:
            sql, params = steps.send(plain_rows(conn, sql, params))
    except StopIteration as done:
        result: tuple[OutboxEntry, bool] = done.value
        return result
