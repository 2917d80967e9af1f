"""The connection the PostgreSQL store keeps between calls (``_lane``): no pool acquire
per call, handed back when idle, on failure, with a transaction left open, and on close."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
from fixtures_postgres import with_option

from telegram_idem import Outcome
from telegram_idem.backends.postgres import PostgresStore
from telegram_idem.backends.postgres._lane import LANE_IDLE

pytestmark = pytest.mark.postgres

LEASE = 30.0
RETENTION = 3600.0
RESULT = b'{"ok":true}'
SLOW_PID = "SELECT pg_backend_pid() FROM pg_sleep(0.2)"


@pytest.fixture
async def closing() -> AsyncIterator[Callable[[PostgresStore], PostgresStore]]:
    made: list[PostgresStore] = []

    def keep(store: PostgresStore) -> PostgresStore:
        made.append(store)
        return store

    yield keep
    for store in made:
        await store.close()


@pytest.fixture
def acquires(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every ``asyncpg.Pool.acquire`` call from now on (one entry each)."""
    seen: list[int] = []
    original = asyncpg.Pool.acquire

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(asyncpg.Pool, "acquire", counting)
    return seen


async def wait_until(condition: Callable[[], bool], *, limit: float = 30.0) -> None:
    """Poll ``condition`` until true (fails the test after ``limit`` seconds)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not condition():
        assert loop.time() < deadline, "condition never became true"
        await asyncio.sleep(LANE_IDLE / 5)


async def test_sequential_calls_take_no_connection_from_the_pool(
    postgres_url_factory: Callable[[], str],
    closing: Callable[[PostgresStore], PostgresStore],
    acquires: list[int],
) -> None:
    store = closing(PostgresStore.from_url(with_option(postgres_url_factory(), "max_size=4")))
    first = await store.claim("warm", lease=LEASE, retention=RETENTION)
    acquires.clear()
    for i in range(20):
        claim = await store.claim(f"k{i}", lease=LEASE, retention=RETENTION)
        assert claim.outcome is Outcome.ACQUIRED
        assert await store.complete(f"k{i}", claim.token, RESULT, retention=RETENTION)
        replay = await store.claim(f"k{i}", lease=LEASE, retention=RETENTION)
        assert (replay.outcome, replay.record.result) == (Outcome.REPLAY, RESULT)
    assert await store.complete("warm", first.token, RESULT, retention=RETENTION)
    assert acquires == []


async def test_concurrent_calls_use_the_pool_beside_the_kept_connection(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    store = closing(PostgresStore.from_url(with_option(postgres_url_factory(), "max_size=4")))
    pids = await asyncio.gather(
        *(store.connection.run(lambda conn: conn.fetchval(SLOW_PID)) for _ in range(4))
    )
    assert len(set(pids)) == 4  # four at once: the kept one and three from the pool
    claims = await asyncio.gather(
        *(store.claim(f"c{i}", lease=LEASE, retention=RETENTION) for i in range(12))
    )
    assert [c.outcome for c in claims] == [Outcome.ACQUIRED] * 12


async def test_the_kept_connection_goes_back_to_the_pool_when_idle(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    store = closing(
        PostgresStore.from_url(with_option(postgres_url_factory(), "min_size=2&max_size=2"))
    )
    await store.claim("k", lease=LEASE, retention=RETENTION)
    pool = await store.connection.pool()
    assert pool.get_idle_size() == pool.get_size() - 1  # kept by the store
    await wait_until(lambda: pool.get_idle_size() == pool.get_size())
    # both pool connections can be held by someone else now, and the store still works
    async with pool.acquire(timeout=5) as a, pool.acquire(timeout=5) as b:
        assert a is not b
    assert (await store.claim("k", lease=LEASE, retention=RETENTION)).outcome is (
        Outcome.IN_PROGRESS
    )


async def test_a_transaction_left_open_is_rolled_back_by_the_pool(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    store = closing(PostgresStore.from_url(with_option(postgres_url_factory(), "max_size=2")))
    await store.claim("warm", lease=LEASE, retention=RETENTION)

    async def leave_open(conn: Any) -> int:
        await conn.execute("BEGIN")
        pid: int = await conn.fetchval("SELECT pg_backend_pid()")
        return pid

    async def in_transaction(conn: Any) -> bool:
        return bool(conn.is_in_transaction())

    await store.connection.run(leave_open)
    for _ in range(3):
        assert not await store.connection.run(in_transaction)
        claim = await store.claim("k", lease=LEASE, retention=RETENTION)
        assert claim.outcome in (Outcome.ACQUIRED, Outcome.IN_PROGRESS)
    # the claim was committed, not left inside the abandoned transaction
    pool = await store.connection.pool()
    async with pool.acquire(timeout=5) as conn:
        status = await conn.fetchval(f"SELECT status FROM {store.table} WHERE key = 'k'")
    assert status == "in_progress"


async def test_a_call_cancelled_on_the_kept_connection_leaves_it_usable(
    postgres_url_factory: Callable[[], str], closing: Callable[[PostgresStore], PostgresStore]
) -> None:
    store = closing(
        PostgresStore.from_url(
            with_option(postgres_url_factory(), "min_size=1&max_size=2&command_timeout=5")
        )
    )
    await store.claim("warm", lease=LEASE, retention=RETENTION)
    started = asyncio.Event()

    async def slow(conn: Any) -> None:
        started.set()
        await conn.execute("SELECT pg_sleep(30)")

    task = asyncio.ensure_future(store.connection.run(slow))
    await started.wait()
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for i in range(4):  # on the pool's connections, then a new kept one: none still sleeping
        claim = await store.claim(f"after{i}", lease=LEASE, retention=RETENTION)
        assert claim.outcome is Outcome.ACQUIRED


async def test_close_hands_the_kept_connection_back_at_once(
    postgres_url_factory: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    store = PostgresStore.from_url(
        with_option(postgres_url_factory(), "max_size=2&command_timeout=30")
    )
    await store.claim("k", lease=LEASE, retention=RETENTION)
    with caplog.at_level(logging.DEBUG, logger="telegram_idem.store.postgres"):
        await store.close()
    # pool.close() waited for no connection: nothing had to be terminated
    assert not [r for r in caplog.records if "terminating it" in r.getMessage()]
