"""The decisions of a claim inside ``idem.transaction(conn)`` are the store's
(:mod:`telegram_idem.machine`'s table), judged by the store's clock, on both joined
stores: a dead holder's ended lease is taken over (token + 1), a record past its
retention is claimed afresh, a completed key replays and a stored failure replays; each
decision is emitted as a decision event, as outside a transaction."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from services import postgres_dsn
from transaction.joined_support import Tx, postgres_tx, sqlite_tx

from telegram_idem import Idem, ManualClock, Status, StoredFailureError
from telegram_idem.backends.postgres import PostgresStore
from telegram_idem.backends.sqlite import SQLiteStore
from telegram_idem.events import DecisionEvent, subscribe


@pytest.fixture(
    params=[
        pytest.param("sqlite", marks=pytest.mark.sqlite),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
async def joined(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Idem, ManualClock, Tx]]:
    clock = ManualClock()
    if request.param == "sqlite":
        path = str(tmp_path / "bot.db")
        idem = Idem(SQLiteStore(path, clock=clock), heartbeat=False)
        await idem.store.get("warm-up")
        async with sqlite_tx("sqlite3", path) as tx:
            yield idem, clock, tx
        await idem.close()
        return
    factory: Callable[[], str] = request.getfixturevalue("postgres_url_factory")
    url = factory()
    idem = Idem(PostgresStore.from_url(url, clock=clock), heartbeat=False)
    async with postgres_tx("asyncpg", postgres_dsn()) as tx:
        yield idem, clock, tx
    await idem.close()


async def run_in(tx: Tx, idem: Idem, key: str, value: int, runs: list[int]) -> int:
    async def work() -> int:
        runs.append(value)
        return value

    async with tx.begin():
        async with idem.transaction(tx.conn):
            return await idem.run(key, work, lease=10, retention=100)


async def test_a_dead_holder_s_ended_lease_is_taken_over_in_the_transaction(
    joined: tuple[Idem, ManualClock, Tx],
) -> None:
    idem, clock, tx = joined
    held = await idem.store.claim("k", lease=10, retention=100)  # a holder that died
    clock.advance(11)
    runs: list[int] = []
    assert await run_in(tx, idem, "k", 1, runs) == 1
    record = await idem.store.get("k")
    assert record is not None and record.status is Status.COMPLETED
    assert record.fencing_token == held.token + 1 and record.attempts == 2
    assert await run_in(tx, idem, "k", 2, runs) == 1  # then a replay
    assert runs == [1]


async def test_a_record_past_its_retention_is_claimed_afresh(
    joined: tuple[Idem, ManualClock, Tx],
) -> None:
    idem, clock, tx = joined
    runs: list[int] = []
    assert await run_in(tx, idem, "k", 1, runs) == 1
    clock.advance(50)
    assert await run_in(tx, idem, "k", 2, runs) == 1
    clock.advance(51)  # retention over (not purged yet): the key is new again
    assert await run_in(tx, idem, "k", 3, runs) == 3
    assert runs == [1, 3]
    record = await idem.store.get("k")
    assert record is not None and record.fencing_token == 2 and record.attempts == 1


async def test_a_stored_failure_replays_inside_the_transaction(
    joined: tuple[Idem, ManualClock, Tx],
) -> None:
    idem, _, tx = joined

    async def fails() -> None:
        raise ValueError("sold out")

    await idem.store.get("warm-up")
    with pytest.raises(ValueError):
        await idem.run("k", fails, on_error="store")  # stored outside any transaction
    with pytest.raises(StoredFailureError, match="sold out"):
        await run_in(tx, idem, "k", 1, [])


async def test_each_joined_decision_is_an_event(joined: tuple[Idem, ManualClock, Tx]) -> None:
    idem, _, tx = joined
    seen: list[DecisionEvent] = []
    with subscribe(seen.append):
        await run_in(tx, idem, "k", 1, [])
        await run_in(tx, idem, "k", 1, [])
    assert [(e.boundary, e.key, e.decision) for e in seen] == [
        ("action", "k", "acquired"),
        ("action", "k", "replay"),
    ]
    assert seen[0].fencing_token == 1
