"""One SQLite transaction per decision: every primitive of the store and of its inbox is
one ``BEGIN IMMEDIATE … COMMIT`` on the shared connection (read, decide, write inside),
and ``get`` takes no write lock. Observed with SQLite's own statement trace."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from telegram_idem import ManualClock
from telegram_idem._records import Status
from telegram_idem.backends.sqlite import SQLiteStore
from telegram_idem.inbox._base import NewEntry


class Trace:
    """The statements the store's connection runs, in order."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    def __call__(self, sql: str) -> None:
        self.statements.append(" ".join(sql.split()))

    def take(self) -> list[str]:
        taken, self.statements = self.statements, []
        return taken


@pytest.fixture
async def traced(tmp_path: Path) -> AsyncIterator[tuple[SQLiteStore, Trace]]:
    store = SQLiteStore(tmp_path / "t.db", clock=ManualClock())
    trace = Trace()
    await store.connection.run(lambda conn: conn.set_trace_callback(trace))
    trace.take()
    yield store, trace
    await store.close()


def transactions(statements: list[str]) -> list[list[str]]:
    """The statements between each ``BEGIN IMMEDIATE`` and its ``COMMIT``; fails on a
    statement outside a transaction."""
    found: list[list[str]] = []
    current: list[str] | None = None
    for sql in statements:
        if sql == "BEGIN IMMEDIATE":
            assert current is None, statements
            current = []
        elif sql == "COMMIT":
            assert current is not None, statements
            found.append(current)
            current = None
        else:
            assert current is not None, f"outside a transaction: {sql}"
            current.append(sql)
    assert current is None, statements
    return found


async def test_each_record_primitive_is_one_transaction(
    traced: tuple[SQLiteStore, Trace],
) -> None:
    store, trace = traced
    claim = await store.claim("k", lease=30, retention=60)
    (body,) = transactions(trace.take())
    assert body[0].startswith("SELECT") and body[1].startswith("INSERT OR REPLACE")

    assert (await store.claim("k", lease=30, retention=60)).outcome.value == "in_progress"
    (body,) = transactions(trace.take())
    assert len(body) == 1 and body[0].startswith("SELECT")  # nothing to write

    assert await store.extend("k", claim.token, lease=30)
    assert await store.complete("k", claim.token, b"1", retention=60)
    assert not await store.release("k", claim.token)  # completed: refused, still one
    assert len(transactions(trace.take())) == 3

    await store.claim_many([f"b{i}" for i in range(5)], lease=30, retention=60)
    (body,) = transactions(trace.take())
    assert len(body) == 10  # a read and a write per key, one transaction


async def test_get_reads_without_the_write_lock(traced: tuple[SQLiteStore, Trace]) -> None:
    store, trace = traced
    await store.claim("k", lease=30, retention=60)
    trace.take()
    assert await store.get("k") is not None
    statements = trace.take()
    assert len(statements) == 1 and statements[0].startswith("SELECT")


async def test_admission_writes_the_record_and_the_entry_in_one_transaction(
    traced: tuple[SQLiteStore, Trace],
) -> None:
    store, trace = traced
    inbox = store.inbox()
    entry = NewEntry("idem:7:u:1", "chat:1", b"{}")
    assert await inbox.admit(entry, retention=60)
    (body,) = transactions(trace.take())
    assert [s.split()[0:3] for s in body] == [
        ["SELECT", "key,", "status,"],
        ["INSERT", "OR", "REPLACE"],
        ["INSERT", "OR", "REPLACE"],
    ]
    assert "idem_records" in body[1] and "idem_inbox" in body[2]
    assert not await inbox.admit(entry, retention=60)  # the duplicate: read, no write
    (body,) = transactions(trace.take())
    assert len(body) == 1
    record = await store.get("idem:7:u:1")
    assert record is not None and record.status is Status.COMPLETED  # seen at admission


def test_the_trace_sees_sqlite_statements() -> None:
    conn = sqlite3.connect(":memory:")
    trace = Trace()
    conn.set_trace_callback(trace)
    conn.execute("SELECT 1")
    assert trace.take() == ["SELECT 1"]
