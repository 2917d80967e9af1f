"""``async with idem.transaction(conn)`` on the SQLite store: the action's claim and
completion, a step's record and an outbox entry commit or roll back with the bot's own
rows, on each connection kind the store joins (sqlite3, aiosqlite, SQLAlchemy
``AsyncConnection`` and ``AsyncSession``), on real files."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from transaction.joined_support import Rollback, Tx, sqlite_tx

from telegram_idem import ConfigurationError, Idem, Status, StoredFailureError
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.backends.sqlite import SQLiteStore
from telegram_idem.outbox import CallStatus, HttpBotAPI, Outbound
from telegram_idem.testing.bot_api import FakeBotAPI

pytestmark = pytest.mark.sqlite

KINDS = ["sqlite3", "aiosqlite", "sa-connection", "sa-session"]


@pytest.fixture
async def shop(tmp_path: Path) -> AsyncIterator[tuple[Idem, str]]:
    """A guard on a SQLite file set up by its store, with the bot's table ``orders``."""
    path = str(tmp_path / "bot.db")
    idem = Idem(SQLiteStore(path), heartbeat=False)
    await idem.store.get("warm-up")  # the store sets its file up
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    yield idem, path
    await idem.close()


@pytest.fixture(params=KINDS)
async def tx(request: pytest.FixtureRequest, shop: tuple[Idem, str]) -> AsyncIterator[Tx]:
    async with sqlite_tx(request.param, shop[1]) as made:
        yield made


def orders(path: str) -> list[int]:
    with sqlite3.connect(path) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM orders ORDER BY id")]


async def place(idem: Idem, tx: Tx, n: int, runs: list[int]) -> dict[str, int]:
    """The bot's action: one order row, recorded under ``order:<n>``."""

    async def work() -> dict[str, int]:
        runs.append(n)
        await tx.exec("INSERT INTO orders VALUES (:id)", {"id": n})
        return {"order": n}

    return await idem.run(f"order:{n}", work)


async def test_commit_keeps_the_business_row_and_the_completed_record(
    tx: Tx, shop: tuple[Idem, str]
) -> None:
    idem, path = shop
    runs: list[int] = []
    async with tx.begin():
        async with idem.transaction(tx.conn):
            assert await place(idem, tx, 1, runs) == {"order": 1}
        assert await idem.store.get("order:1") is None  # not committed yet
    record = await idem.store.get("order:1")
    assert record is not None and record.status is Status.COMPLETED
    assert orders(path) == [1]
    # a later duplicate, joined or not, replays without running
    async with tx.begin():
        async with idem.transaction(tx.conn):
            assert await place(idem, tx, 1, runs) == {"order": 1}
    assert await place(idem, tx, 1, runs) == {"order": 1}
    assert runs == [1]
    assert orders(path) == [1]


async def test_rollback_leaves_neither_row_nor_record_and_a_retry_runs(
    tx: Tx, shop: tuple[Idem, str]
) -> None:
    idem, path = shop
    runs: list[int] = []
    with pytest.raises(Rollback):
        async with tx.begin():
            async with idem.transaction(tx.conn):
                await place(idem, tx, 1, runs)
                raise Rollback
    assert orders(path) == []
    assert await idem.store.get("order:1") is None
    async with tx.begin():
        async with idem.transaction(tx.conn):
            await place(idem, tx, 1, runs)
    assert runs == [1, 1] and orders(path) == [1]


async def test_a_savepoint_rolled_back_removes_only_what_it_wrote(
    tx: Tx, shop: tuple[Idem, str]
) -> None:
    idem, path = shop
    runs: list[int] = []
    async with tx.begin():
        async with idem.transaction(tx.conn):
            await place(idem, tx, 1, runs)
            with pytest.raises(Rollback):
                async with tx.nested():
                    await place(idem, tx, 2, runs)
                    raise Rollback
    assert orders(path) == [1]
    assert await idem.store.get("order:1") is not None
    assert await idem.store.get("order:2") is None


async def test_an_outer_rollback_removes_a_released_savepoint_s_writes(
    tx: Tx, shop: tuple[Idem, str]
) -> None:
    idem, path = shop
    with pytest.raises(Rollback):
        async with tx.begin():
            async with idem.transaction(tx.conn):
                async with tx.nested():
                    await place(idem, tx, 1, [])
                raise Rollback
    assert orders(path) == []
    assert await idem.store.get("order:1") is None


async def test_a_failing_action_caught_and_committed_is_released_never_completed(
    tx: Tx, shop: tuple[Idem, str]
) -> None:
    idem, path = shop

    async def fails() -> None:
        await tx.exec("INSERT INTO orders VALUES (8)")
        raise ValueError("card declined")

    async with tx.begin():
        async with idem.transaction(tx.conn):
            with pytest.raises(ValueError, match="declined"):
                await idem.run("order:9", fails)
    record = await idem.store.get("order:9")
    assert record is not None and record.status is Status.IN_PROGRESS
    assert record.result is None
    runs: list[int] = []
    async with tx.begin():
        async with idem.transaction(tx.conn):
            assert await place(idem, tx, 9, runs) == {"order": 9}  # a retry runs
    record = await idem.store.get("order:9")
    assert record is not None and record.status is Status.COMPLETED
    assert record.fencing_token == 2
    assert runs == [9]
    assert orders(path) == [8, 9]  # the bot chose to commit its own row


async def test_a_stored_failure_commits_with_the_transaction_and_replays(
    tx: Tx, shop: tuple[Idem, str]
) -> None:
    idem, _ = shop

    async def fails() -> None:
        raise ValueError("out of stock")

    async with tx.begin():
        async with idem.transaction(tx.conn):
            with pytest.raises(ValueError):
                await idem.run("order:5", fails, on_error="store")
    async with tx.begin():
        async with idem.transaction(tx.conn):
            with pytest.raises(StoredFailureError, match="out of stock"):
                await idem.run("order:5", fails)


async def test_a_step_inside_a_joined_action_is_recorded_in_the_same_transaction(
    tx: Tx, shop: tuple[Idem, str]
) -> None:
    idem, path = shop
    effects: list[str] = []

    async def effect() -> str:
        effects.append("credit")
        await tx.exec("INSERT INTO orders VALUES (7)")
        return "credited"

    async def action() -> str:
        return await idem.step("credit", effect)

    with pytest.raises(Rollback):
        async with tx.begin():
            async with idem.transaction(tx.conn):
                assert await idem.run("order:7", action) == "credited"
                raise Rollback
    step_key = idem.keys.step("order:7", "credit")
    assert await idem.store.get(step_key) is None and orders(path) == []
    async with tx.begin():
        async with idem.transaction(tx.conn):
            assert await idem.run("order:7", action) == "credited"
    step = await idem.store.get(step_key)
    assert step is not None and step.status is Status.COMPLETED
    assert effects == ["credit", "credit"] and orders(path) == [7]


async def test_an_outbox_entry_enqueued_without_conn_commits_with_the_action(
    tx: Tx, shop: tuple[Idem, str]
) -> None:
    idem, path = shop
    outbox = idem.store.outbox()
    async with FakeBotAPI() as fake, HttpBotAPI("1:t", base_url=fake.url) as api:
        out = Outbound(outbox, api, bot_id=1, keys=idem.keys)

        async def receipt(n: int) -> str:
            await tx.exec("INSERT INTO orders VALUES (:id)", {"id": n})
            return await out.enqueue("sendMessage", {"chat_id": 5, "text": f"order {n}"})

        with pytest.raises(Rollback):
            async with tx.begin():
                async with idem.transaction(tx.conn):
                    await idem.run("order:1", lambda: receipt(1))
                    raise Rollback
        assert await outbox.counts() == {}
        async with tx.begin():
            async with idem.transaction(tx.conn):
                key = await idem.run("order:2", lambda: receipt(2))
                assert await outbox.get(key) is None  # not committed yet
                with pytest.raises(ConfigurationError, match="cannot wait"):
                    await out.call("sendMessage", {"chat_id": 5, "text": "now"}, key="x")
        entry = await outbox.get(key)
        assert entry is not None and entry.status is CallStatus.PENDING
        assert await outbox.counts() == {CallStatus.PENDING: 1}
        assert orders(path) == [2]
        assert fake.calls_of("sendMessage") == []


async def test_a_concurrent_duplicate_waits_for_the_commit_then_replays(
    shop: tuple[Idem, str],
) -> None:
    idem, path = shop
    runs: list[int] = []
    gate = asyncio.Event()
    async with sqlite_tx("aiosqlite", path) as first, sqlite_tx("aiosqlite", path) as second:

        async def slow() -> dict[str, int]:
            runs.append(1)
            await first.exec("INSERT INTO orders VALUES (1)")
            gate.set()
            await asyncio.sleep(0.3)
            return {"order": 1}

        async def run_first() -> Any:
            async with first.begin():
                async with idem.transaction(first.conn):
                    return await idem.run("order:1", slow)

        async def run_second() -> Any:
            await gate.wait()
            async with second.begin():
                async with idem.transaction(second.conn):
                    return await place(idem, second, 1, runs)

        a, b = await asyncio.gather(run_first(), run_second())
    assert a == b == {"order": 1}
    assert runs == [1] and orders(path) == [1]


# ------------------------------------------------------------------ what cannot join


async def test_a_connection_to_another_file_is_refused(
    shop: tuple[Idem, str], tmp_path: Path
) -> None:
    idem, path = shop
    other = sqlite3.connect(tmp_path / "other.db", isolation_level=None)
    try:
        other.execute("BEGIN")
        with pytest.raises(ConfigurationError, match=r"other\.db") as caught:
            async with idem.transaction(other):
                pass
        assert path in str(caught.value)
    finally:
        other.close()


async def test_an_aiosqlite_connection_to_another_file_is_refused(
    shop: tuple[Idem, str], tmp_path: Path
) -> None:
    idem, _ = shop
    async with aiosqlite.connect(tmp_path / "other.db") as other:
        with pytest.raises(ConfigurationError, match=r"other\.db"):
            async with idem.transaction(other):
                pass


async def test_an_autocommit_connection_outside_a_transaction_is_refused(
    shop: tuple[Idem, str],
) -> None:
    idem, path = shop
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        with pytest.raises(ConfigurationError, match="open transaction"):
            async with idem.transaction(conn):
                pass
    finally:
        conn.close()


async def test_an_unsupported_connection_kind_is_refused(shop: tuple[Idem, str]) -> None:
    idem, _ = shop
    with pytest.raises(
        ConfigurationError, match=r"cannot join a transaction on a builtins\.object"
    ):
        async with idem.transaction(object()):
            pass


async def test_a_store_whose_records_live_elsewhere_cannot_join(tmp_path: Path) -> None:
    idem = Idem(MemoryStore())
    conn = sqlite3.connect(tmp_path / "bot.db")
    try:
        with pytest.raises(ConfigurationError, match="join your database transaction"):
            async with idem.transaction(conn):
                pass
    finally:
        conn.close()


async def test_an_action_of_another_store_inside_the_block_does_not_join(
    shop: tuple[Idem, str],
) -> None:
    idem, path = shop
    other = Idem(MemoryStore())
    async with sqlite_tx("sqlite3", path) as tx:
        with pytest.raises(Rollback):
            async with tx.begin():
                async with idem.transaction(tx.conn):
                    assert await other.run("elsewhere", lambda: _value(3)) == 3
                    raise Rollback
    record = await other.store.get("elsewhere")
    assert record is not None and record.status is Status.COMPLETED


async def _value(v: int) -> int:
    return v


async def test_at_most_once_inside_a_joined_transaction_is_refused_before_anything_runs(
    tx: Tx, shop: tuple[Idem, str]
) -> None:
    """Its record would roll back with the transaction while an outside effect stays."""
    idem, _ = shop
    effects: list[str] = []

    async def charge() -> str:
        effects.append("charged")
        return "ok"

    with pytest.raises(ConfigurationError, match="at_most"):
        async with tx.begin():
            async with idem.transaction(tx.conn):
                await idem.run("charge:1", charge, once="at_most")
    assert effects == [] and await idem.store.get("charge:1") is None
    assert await idem.store.ledger().get("charge:1") is None


async def test_a_joined_runs_steps_expire_with_it_and_a_window_is_kept(
    tx: Tx, shop: tuple[Idem, str]
) -> None:
    """The joined run binds its action as the store's runs do: a step's record is kept
    no longer than the action's, and a ``window=`` action keeps its window, not the
    claim's retention."""
    idem, _ = shop

    async def action() -> str:
        return await idem.step("credit", lambda: asyncio.sleep(0, "credited"))

    async with tx.begin():
        async with idem.transaction(tx.conn):
            assert await idem.run("order:8", action, retention=120.0) == "credited"
            assert await idem.run("nav:1", lambda: asyncio.sleep(0, "page"), window=5.0)
    parent = await idem.store.get("order:8")
    step = await idem.store.get(idem.keys.step("order:8", "credit"))
    assert parent is not None and step is not None
    assert step.expires_at <= parent.expires_at + 0.5
    assert parent.expires_at - step.lease_expires_at < 130  # not the day-long default
    nav = await idem.store.get("nav:1")
    assert nav is not None and nav.status is Status.COMPLETED
    assert nav.expires_at - (nav.lease_expires_at - idem.lease) < 10  # the window


async def test_joining_never_queues_behind_the_stores_thread(tmp_path: Path) -> None:
    """The first join of a connection inside the bot's transaction does not wait on the
    store's thread once the store is in use: that thread may be queued behind a claim
    waiting for the very write lock the bot's transaction holds (the stall the Stars
    shop's two processes hit through ``enqueue_in``)."""
    path = tmp_path / "bot.db"
    store = SQLiteStore(str(path), busy_timeout=3)
    idem = Idem(store, heartbeat=False)
    try:
        await store.claim("warm", lease=30, retention=60)  # the store in use
        async with aiosqlite.connect(path, timeout=5) as conn:
            await conn.execute("BEGIN IMMEDIATE")  # the bot's transaction: the write lock
            waiting = asyncio.create_task(store.claim("other", lease=30, retention=60))
            await asyncio.sleep(0.2)  # that claim now waits for the lock on the thread
            started = asyncio.get_running_loop().time()
            async with idem.transaction(conn):
                done = await asyncio.wait_for(
                    idem.run("order:9", lambda: asyncio.sleep(0, "ok")), timeout=2
                )
            took = asyncio.get_running_loop().time() - started
            await conn.commit()
        await waiting
        assert done == "ok" and took < 1, f"the join waited {took:.2f} s"
        record = await store.get("order:9")
        assert record is not None and record.status is Status.COMPLETED
    finally:
        await idem.close()


async def test_gathered_actions_on_one_joined_connection_are_refused_clearly(
    tx: Tx, shop: tuple[Idem, str]
) -> None:
    """Two tasks' runs on one connection at once would interleave statements on it
    (asyncpg: a raw ``InterfaceError``): the second is refused with a clear error, and
    steps nested in one run still join."""
    idem, path = shop
    started = asyncio.Event()

    async def slow() -> str:
        started.set()
        await asyncio.sleep(0.05)
        await tx.exec("INSERT INTO orders VALUES (21)")
        return await idem.step("inner", lambda: asyncio.sleep(0, "nested"))

    async def second() -> str:
        await started.wait()
        return await idem.run("order:22", lambda: asyncio.sleep(0, "b"))

    async with tx.begin():
        async with idem.transaction(tx.conn):
            outcomes = await asyncio.gather(
                idem.run("order:21", slow), second(), return_exceptions=True
            )
    assert outcomes[0] == "nested"
    assert isinstance(outcomes[1], ConfigurationError)
    assert "one after another" in str(outcomes[1])
    assert orders(path) == [21] and await idem.store.get("order:22") is None


async def test_a_step_awaited_through_a_task_of_its_action_still_joins(
    tx: Tx, shop: tuple[Idem, str]
) -> None:
    """``asyncio.wait_for``, ``shield`` and a one-step ``gather`` run the step in a task
    of their own while the action waits: nested, not side by side, so it joins."""
    idem, _ = shop

    async def action() -> list[str]:
        a = await asyncio.wait_for(idem.step("a", lambda: asyncio.sleep(0, "a")), 5)
        b = await asyncio.shield(idem.step("b", lambda: asyncio.sleep(0, "b")))
        (c,) = await asyncio.gather(idem.step("c", lambda: asyncio.sleep(0, "c")))
        return [a, b, c]

    async with tx.begin():
        async with idem.transaction(tx.conn):
            assert await idem.run("order:31", action) == ["a", "b", "c"]
    for name in "abc":
        step = await idem.store.get(idem.keys.step("order:31", name))
        assert step is not None and step.status is Status.COMPLETED


async def test_two_steps_of_one_action_side_by_side_are_refused(
    tx: Tx, shop: tuple[Idem, str]
) -> None:
    idem, _ = shop

    async def slow() -> str:
        await asyncio.sleep(0.05)
        return "slow"

    async def action() -> list[str]:
        outcomes = await asyncio.gather(
            idem.step("a", slow), idem.step("b", slow), return_exceptions=True
        )
        return [o if isinstance(o, str) else type(o).__name__ for o in outcomes]

    async with tx.begin():
        async with idem.transaction(tx.conn):
            assert await idem.run("order:32", action) == ["slow", "ConfigurationError"]
