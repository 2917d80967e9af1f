"""Store conformance: every row of the record state machine (docs/design/record.md#the-record-and-its-state-machine) on every store.

One test body per rule, run against each store of the ``store`` fixture (tests/conftest.py).
Time moves with the shared ``ManualClock``; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from telegram_idem import (
    Claim,
    ConfigurationError,
    ManualClock,
    Outcome,
    Status,
    Store,
    StoreError,
)
from telegram_idem.backends.sqlite import SQLiteStore

LEASE = 30.0
RETENTION = 3600.0
KEY = "idem:7000000001:a:approve:4130:5550001001"


async def claim(
    store: Store,
    key: str = KEY,
    fp: str | None = None,
    *,
    lease: float = LEASE,
    retention: float = RETENTION,
) -> Claim:
    return await store.claim(key, fingerprint=fp, lease=lease, retention=retention)


# ----------------------------------------------------------------- no record / retention


async def test_first_claim_acquires_a_new_record(store: Store, clock: ManualClock) -> None:
    c = await claim(store, fp="fp-a")
    assert c.outcome is Outcome.ACQUIRED
    r = c.record
    assert (r.key, r.status, r.fingerprint, r.result, r.attempts) == (
        KEY,
        Status.IN_PROGRESS,
        "fp-a",
        None,
        1,
    )
    assert c.token == r.fencing_token
    assert r.lease_expires_at == pytest.approx(clock.now + LEASE)
    assert r.expires_at == pytest.approx(clock.now + RETENTION)
    stored = await store.get(KEY)
    assert stored is not None
    assert stored.status is Status.IN_PROGRESS
    assert stored.fencing_token == c.token


async def test_claim_after_retention_expiry_acquires_with_a_new_token(
    store: Store, clock: ManualClock
) -> None:
    first = await claim(store, fp="fp-a")
    assert await store.complete(KEY, first.token, b'"done"', retention=RETENTION)
    clock.advance(RETENTION + 1)
    again = await claim(store, fp="fp-b")  # a different payload: no conflict once forgotten
    assert again.outcome is Outcome.ACQUIRED
    assert again.record.status is Status.IN_PROGRESS
    assert again.record.result is None
    assert again.record.fingerprint == "fp-b"
    assert again.token != first.token


async def test_zombie_from_expired_retention_cannot_complete(
    store: Store, clock: ManualClock
) -> None:
    zombie = await claim(store)
    clock.advance(RETENTION + 1)
    fresh = await claim(store)
    assert fresh.outcome is Outcome.ACQUIRED
    assert not await store.complete(KEY, zombie.token, b'"zombie"', retention=RETENTION)
    assert await store.complete(KEY, fresh.token, b'"fresh"', retention=RETENTION)
    record = await store.get(KEY)
    assert record is not None and record.result == b'"fresh"'


# ----------------------------------------------------------------- replay


@pytest.mark.parametrize(
    "result", [b"null", b"0", b'""', b"false", b"{}", b"[]", b'"\xed\x95\x9c"', b"\x00"]
)
async def test_completed_replays_stored_bytes_exactly(store: Store, result: bytes) -> None:
    first = await claim(store, fp="fp-a")
    assert await store.complete(KEY, first.token, result, retention=RETENTION)
    again = await claim(store, fp="fp-a")
    assert again.outcome is Outcome.REPLAY
    assert again.record.status is Status.COMPLETED
    assert again.record.result == result
    assert type(again.record.result) is bytes
    assert again.record.fencing_token == first.token
    assert again.record.fingerprint == "fp-a"  # kept at completion


async def test_replay_without_fingerprint_matches_any(store: Store) -> None:
    first = await claim(store, fp="fp-a")
    await store.complete(KEY, first.token, b"1", retention=RETENTION)
    again = await claim(store, fp=None)
    assert again.outcome is Outcome.REPLAY
    assert again.record.result == b"1"


async def test_completion_sets_retention_from_completion_time(
    store: Store, clock: ManualClock
) -> None:
    first = await claim(store)
    clock.advance(10)
    assert await store.complete(KEY, first.token, b"1", retention=100.0)
    record = await store.get(KEY)
    assert record is not None
    assert record.expires_at == pytest.approx(clock.now + 100.0)
    clock.advance(99)
    assert (await claim(store)).outcome is Outcome.REPLAY
    clock.advance(2)
    assert (await claim(store)).outcome is Outcome.ACQUIRED


# ----------------------------------------------------------------- conflict


async def test_completed_with_other_fingerprint_conflicts(store: Store) -> None:
    first = await claim(store, fp="fp-a")
    await store.complete(KEY, first.token, b'"ok"', retention=RETENTION)
    other = await claim(store, fp="fp-b")
    assert other.outcome is Outcome.CONFLICT
    assert other.record.fingerprint == "fp-a"
    assert other.record.result == b'"ok"'
    # the record is untouched: the right payload still replays
    assert (await claim(store, fp="fp-a")).outcome is Outcome.REPLAY


async def test_in_progress_with_other_fingerprint_conflicts(store: Store) -> None:
    first = await claim(store, fp="fp-a")
    other = await claim(store, fp="fp-b")
    assert other.outcome is Outcome.CONFLICT
    assert other.token == first.token
    assert await store.complete(KEY, first.token, b"1", retention=RETENTION)


async def test_stored_failure_with_other_fingerprint_conflicts(store: Store) -> None:
    first = await claim(store, fp="fp-a")
    assert await store.fail(KEY, first.token, b'{"type":"E"}', retention=RETENTION)
    assert (await claim(store, fp="fp-b")).outcome is Outcome.CONFLICT


# ----------------------------------------------------------------- in progress / takeover


async def test_in_progress_while_lease_alive(store: Store, clock: ManualClock) -> None:
    first = await claim(store, fp="fp-a")
    clock.advance(LEASE - 0.5)
    second = await claim(store, fp="fp-a")
    assert second.outcome is Outcome.IN_PROGRESS
    assert second.token == first.token
    assert second.record.lease_expires_at == pytest.approx(first.record.lease_expires_at)
    record = await store.get(KEY)
    assert record is not None and record.attempts == 1


async def test_takeover_after_lease_expiry(store: Store, clock: ManualClock) -> None:
    first = await claim(store, fp="fp-a")
    clock.advance(LEASE + 1)
    second = await claim(store, fp="fp-a")
    assert second.outcome is Outcome.ACQUIRED
    assert second.token == first.token + 1
    assert second.record.attempts == 2
    assert second.record.status is Status.IN_PROGRESS
    assert second.record.fingerprint == "fp-a"
    assert second.record.lease_expires_at == pytest.approx(clock.now + LEASE)
    clock.advance(LEASE + 1)
    third = await claim(store, fp="fp-a")
    assert (third.outcome, third.token, third.record.attempts) == (
        Outcome.ACQUIRED,
        first.token + 2,
        3,
    )


async def test_zombie_completion_rejected_after_takeover(store: Store, clock: ManualClock) -> None:
    zombie = await claim(store)
    clock.advance(LEASE + 1)
    holder = await claim(store)
    assert holder.token == zombie.token + 1
    assert not await store.complete(KEY, zombie.token, b'"zombie"', retention=RETENTION)
    assert not await store.fail(KEY, zombie.token, b'{"type":"Z"}', retention=RETENTION)
    assert not await store.release(KEY, zombie.token)
    assert not await store.extend(KEY, zombie.token, lease=LEASE)
    record = await store.get(KEY)
    assert record is not None
    assert (record.status, record.fencing_token, record.result) == (
        Status.IN_PROGRESS,
        holder.token,
        None,
    )
    assert record.lease_expires_at == pytest.approx(holder.record.lease_expires_at)
    assert await store.complete(KEY, holder.token, b'"holder"', retention=RETENTION)
    # the zombie still cannot overwrite the completed record
    assert not await store.complete(KEY, zombie.token, b'"zombie"', retention=RETENTION)
    record = await store.get(KEY)
    assert record is not None
    assert (record.status, record.fencing_token, record.result) == (
        Status.COMPLETED,
        holder.token,
        b'"holder"',
    )


async def test_holder_past_its_lease_may_complete_if_nobody_took_over(
    store: Store, clock: ManualClock
) -> None:
    first = await claim(store)
    clock.advance(LEASE + 1)
    assert await store.complete(KEY, first.token, b'"late"', retention=RETENTION)
    assert (await claim(store)).outcome is Outcome.REPLAY


async def test_complete_twice_or_unknown_key_is_rejected(store: Store) -> None:
    first = await claim(store)
    assert await store.complete(KEY, first.token, b"1", retention=RETENTION)
    assert not await store.complete(KEY, first.token, b"2", retention=RETENTION)
    assert not await store.release(KEY, first.token)
    assert not await store.complete("idem:1:a:never-claimed", 1, b"1", retention=RETENTION)
    assert not await store.release("idem:1:a:never-claimed", 1)
    assert not await store.extend("idem:1:a:never-claimed", 1, lease=LEASE)
    record = await store.get(KEY)
    assert record is not None and record.result == b"1"


# ----------------------------------------------------------------- release / extend


async def test_release_lets_the_next_claim_acquire(store: Store, clock: ManualClock) -> None:
    first = await claim(store, fp="fp-a")
    assert await store.release(KEY, first.token)
    second = await claim(store, fp="fp-b")  # released: the retry may carry another payload
    assert second.outcome is Outcome.ACQUIRED
    assert second.token == first.token + 1
    assert second.record.attempts == 2
    assert second.record.fingerprint == "fp-b"
    assert not await store.complete(KEY, first.token, b'"old"', retention=RETENTION)
    assert await store.complete(KEY, second.token, b'"new"', retention=RETENTION)
    record = await store.get(KEY)
    assert record is not None and record.result == b'"new"'


async def test_extend_moves_the_lease(store: Store, clock: ManualClock) -> None:
    first = await claim(store, lease=10.0)
    clock.advance(8)
    assert await store.extend(KEY, first.token, lease=10.0)
    record = await store.get(KEY)
    assert record is not None
    assert record.lease_expires_at == pytest.approx(clock.now + 10.0)
    clock.advance(8)  # 16 s after the claim: past the first lease, inside the extended one
    blocked = await claim(store, lease=10.0)
    assert blocked.outcome is Outcome.IN_PROGRESS
    assert blocked.token == first.token
    clock.advance(3)  # past the extended lease
    taken = await claim(store, lease=10.0)
    assert taken.outcome is Outcome.ACQUIRED
    assert taken.token == first.token + 1


async def test_extend_beyond_retention_keeps_the_record(store: Store, clock: ManualClock) -> None:
    first = await claim(store, lease=10.0, retention=20.0)
    for _ in range(5):
        clock.advance(9)
        assert await store.extend(KEY, first.token, lease=10.0)
    # 45 s after the claim, far past the 20 s retention: still held
    assert (await claim(store, lease=10.0, retention=20.0)).outcome is Outcome.IN_PROGRESS
    assert await store.complete(KEY, first.token, b"1", retention=20.0)


# ----------------------------------------------------------------- failed


async def test_stored_failure_replays_as_failed(store: Store, clock: ManualClock) -> None:
    first = await claim(store, fp="fp-a")
    error = b'{"type":"ValueError","message":"boom"}'
    assert await store.fail(KEY, first.token, error, retention=RETENTION)
    for _ in range(2):
        again = await claim(store, fp="fp-a")
        assert again.outcome is Outcome.FAILED
        assert again.record.status is Status.FAILED
        assert again.record.result == error
    assert not await store.complete(KEY, first.token, b"1", retention=RETENTION)
    clock.advance(RETENTION + 1)
    assert (await claim(store, fp="fp-a")).outcome is Outcome.ACQUIRED


# ----------------------------------------------------------------- claim_many / get


async def test_claim_many_answers_in_order(store: Store) -> None:
    done = await claim(store, "idem:1:u:2")
    await store.complete("idem:1:u:2", done.token, b"null", retention=RETENTION)
    busy = await claim(store, "idem:1:u:4")
    keys = ["idem:1:u:3", "idem:1:u:2", "idem:1:u:1", "idem:1:u:4"]
    claims = await store.claim_many(keys, lease=LEASE, retention=RETENTION)
    assert [c.record.key for c in claims] == keys
    assert [c.outcome for c in claims] == [
        Outcome.ACQUIRED,
        Outcome.REPLAY,
        Outcome.ACQUIRED,
        Outcome.IN_PROGRESS,
    ]
    assert claims[1].record.result == b"null"
    assert claims[3].token == busy.token
    again = await store.claim_many(keys, lease=LEASE, retention=RETENTION)
    assert [c.outcome for c in again] == [
        Outcome.IN_PROGRESS,
        Outcome.REPLAY,
        Outcome.IN_PROGRESS,
        Outcome.IN_PROGRESS,
    ]


async def test_claim_many_edge_cases(store: Store) -> None:
    assert await store.claim_many([], lease=LEASE, retention=RETENTION) == []
    with pytest.raises(ConfigurationError):
        await store.claim_many(["a", "b", "a"], lease=LEASE, retention=RETENTION)
    assert await store.get("a") is None  # nothing was claimed


async def test_get_returns_none_after_retention(store: Store, clock: ManualClock) -> None:
    assert await store.get(KEY) is None
    first = await claim(store, retention=100.0)
    await store.complete(KEY, first.token, b"1", retention=100.0)
    clock.advance(99)
    assert await store.get(KEY) is not None
    clock.advance(2)
    assert await store.get(KEY) is None


@pytest.mark.parametrize(
    ("lease", "retention"), [(0.0, 10.0), (-1.0, 10.0), (10.0, 5.0), (float("nan"), 10.0)]
)
async def test_bad_lease_or_retention_is_a_configuration_error(
    store: Store, lease: float, retention: float
) -> None:
    with pytest.raises(ConfigurationError):
        await store.claim(KEY, lease=lease, retention=retention)
    with pytest.raises(ConfigurationError):
        await store.claim_many([KEY], lease=lease, retention=retention)
    assert await store.get(KEY) is None


# ----------------------------------------------------------------- concurrency


async def test_concurrent_claims_of_one_key_acquire_once(store: Store) -> None:
    claims = await asyncio.gather(*(claim(store) for _ in range(20)))
    outcomes = [c.outcome for c in claims]
    assert outcomes.count(Outcome.ACQUIRED) == 1
    assert outcomes.count(Outcome.IN_PROGRESS) == 19
    assert len({c.token for c in claims}) == 1


# ----------------------------------------------------------------- SQLite specifics


async def test_two_sqlite_stores_on_one_file_see_each_other(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = tmp_path / "shared.db"
    a, b = SQLiteStore(path, clock=clock), SQLiteStore(path, clock=clock)
    try:
        first = await claim(a, fp="fp-a")
        assert first.outcome is Outcome.ACQUIRED
        assert (await claim(b, fp="fp-a")).outcome is Outcome.IN_PROGRESS
        assert (await claim(b, fp="fp-b")).outcome is Outcome.CONFLICT
        assert await a.complete(KEY, first.token, b"false", retention=RETENTION)
        replay = await claim(b, fp="fp-a")
        assert replay.outcome is Outcome.REPLAY
        assert replay.record.result == b"false"
        got = await b.get(KEY)
        assert got is not None and got.status is Status.COMPLETED
    finally:
        await a.close()
        await b.close()
    reopened = SQLiteStore(path, clock=clock)
    try:
        replay = await claim(reopened, fp="fp-a")
        assert replay.outcome is Outcome.REPLAY  # the record is on disk
    finally:
        await reopened.close()


async def test_concurrent_claims_from_four_sqlite_stores_acquire_once(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = tmp_path / "contended.db"
    stores = [SQLiteStore(path, clock=clock) for _ in range(4)]
    try:
        claims = await asyncio.gather(*(claim(stores[i % 4]) for i in range(20)))
    finally:
        for s in stores:
            await s.close()
    assert [c.outcome for c in claims].count(Outcome.ACQUIRED) == 1


def test_concurrent_claims_from_threads_acquire_once(tmp_path: Path, clock: ManualClock) -> None:
    """Four threads, each with its own event loop and SQLiteStore on one file (as four
    worker processes would), five claims each: one acquires."""
    path = tmp_path / "threads.db"
    outcomes: list[Outcome] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)
    lock = threading.Lock()

    async def worker() -> list[Outcome]:
        s = SQLiteStore(path, clock=clock, busy_timeout=30.0)
        try:
            barrier.wait()
            got = await asyncio.gather(*(claim(s) for _ in range(5)))
            return [c.outcome for c in got]
        finally:
            await s.close()

    def run() -> None:
        try:
            got = asyncio.run(worker())
            with lock:
                outcomes.extend(got)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(outcomes) == 20
    assert outcomes.count(Outcome.ACQUIRED) == 1
    assert outcomes.count(Outcome.IN_PROGRESS) == 19


async def test_sqlite_outage_is_a_store_error_with_the_original(
    tmp_path: Path, clock: ManualClock
) -> None:
    broken = SQLiteStore(tmp_path, clock=clock)  # a directory is not a database file
    try:
        with pytest.raises(StoreError) as info:
            await claim(broken)
        assert isinstance(info.value.original, sqlite3.OperationalError)
        assert info.value.__cause__ is info.value.original
        with pytest.raises(StoreError):
            await broken.get(KEY)
        with pytest.raises(StoreError):
            await broken.complete(KEY, 1, b"1", retention=RETENTION)
    finally:
        await broken.close()


async def test_closed_sqlite_store_raises_store_error(tmp_path: Path, clock: ManualClock) -> None:
    s = SQLiteStore(tmp_path / "closed.db", clock=clock)
    first = await claim(s)
    await s.close()
    await s.close()  # idempotent
    for call in (
        lambda: claim(s),
        lambda: s.claim_many([KEY], lease=LEASE, retention=RETENTION),
        lambda: s.complete(KEY, first.token, b"1", retention=RETENTION),
        lambda: s.release(KEY, first.token),
        lambda: s.extend(KEY, first.token, lease=LEASE),
        lambda: s.get(KEY),
        s.purge,
    ):
        with pytest.raises(StoreError):
            await call()


async def test_sqlite_purge_deletes_expired_records(tmp_path: Path, clock: ManualClock) -> None:
    s = SQLiteStore(tmp_path / "purge.db", clock=clock)
    try:
        for i in range(3):
            await claim(s, f"k{i}", lease=5.0, retention=10.0 + i * 100)
        clock.advance(50)
        assert await s.purge() == 1
        assert await s.purge() == 0
        assert await s.get("k1") is not None
    finally:
        await s.close()
