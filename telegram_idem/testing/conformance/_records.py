"""The record contract: every row of the record state machine, claim_many, get, key
bounding and result bytes (docs/design/record.md#the-record-and-its-state-machine).

Time moves with the test's ``ManualClock``; nothing sleeps.
"""

from __future__ import annotations

import hashlib

import pytest

from telegram_idem._clock import ManualClock
from telegram_idem._records import Claim, Outcome, Status
from telegram_idem.backends import Store
from telegram_idem.errors import ConfigurationError
from telegram_idem.testing.conformance._base import ConformanceBase
from telegram_idem.testing.conformance._payloads import ODD_PAYLOADS

__all__ = ["KEY", "LEASE", "RETENTION", "RecordContract", "claim"]

LEASE = 30.0
"""Seconds a claim's lease lasts in these tests."""
RETENTION = 3600.0
"""Seconds a record is kept in these tests."""
KEY = "idem:7000000001:a:approve:4130:5550001001"
"""The key most tests claim."""

ODD_KEYS = ["\ud800", "a\udfffb", "nul\x00byte", "\x00"]
"""Keys a driver refuses as they are: lone surrogates (valid JSON escapes, not UTF-8) and
NUL (PostgreSQL ``text`` cannot hold it). The store's key bounding makes them storable."""


async def claim(
    store: Store,
    key: str = KEY,
    fp: str | None = None,
    *,
    lease: float = LEASE,
    retention: float = RETENTION,
) -> Claim:
    """``store.claim(key, fingerprint=fp, lease=lease, retention=retention)``."""
    return await store.claim(key, fingerprint=fp, lease=lease, retention=retention)


def long_key(tail: str = "") -> str:
    """An action key of about 13 KB that compression cannot shrink, with multi-byte
    characters (PostgreSQL compresses a repetitive key under its index limit)."""
    topic = "웹훅" + "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(200))
    return f"idem:7:a:report:{topic}{tail}"


class RecordContract(ConformanceBase):
    """Claim, complete, fail, release, extend and get, as docs/design/record.md defines
    them: outcomes, fencing tokens, leases and takeover, retention, claim_many, key
    bounding, and result bytes kept exactly."""

    # ----------------------------------------------------------------- no record / retention

    @pytest.mark.asyncio
    async def test_first_claim_acquires_a_new_record(
        self, store: Store, clock: ManualClock
    ) -> None:
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

    @pytest.mark.asyncio
    async def test_claim_after_retention_expiry_acquires_with_a_new_token(
        self, store: Store, clock: ManualClock
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

    @pytest.mark.asyncio
    async def test_zombie_from_expired_retention_cannot_complete(
        self, store: Store, clock: ManualClock
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
    @pytest.mark.asyncio
    async def test_completed_replays_stored_bytes_exactly(
        self, store: Store, result: bytes
    ) -> None:
        first = await claim(store, fp="fp-a")
        assert await store.complete(KEY, first.token, result, retention=RETENTION)
        again = await claim(store, fp="fp-a")
        assert again.outcome is Outcome.REPLAY
        assert again.record.status is Status.COMPLETED
        assert again.record.result == result
        assert type(again.record.result) is bytes
        assert again.record.fencing_token == first.token
        assert again.record.fingerprint == "fp-a"  # kept at completion

    @pytest.mark.asyncio
    async def test_replay_without_fingerprint_matches_any(self, store: Store) -> None:
        first = await claim(store, fp="fp-a")
        await store.complete(KEY, first.token, b"1", retention=RETENTION)
        again = await claim(store, fp=None)
        assert again.outcome is Outcome.REPLAY
        assert again.record.result == b"1"

    @pytest.mark.asyncio
    async def test_completion_sets_retention_from_completion_time(
        self, store: Store, clock: ManualClock
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

    @pytest.mark.asyncio
    async def test_completed_with_other_fingerprint_conflicts(self, store: Store) -> None:
        first = await claim(store, fp="fp-a")
        await store.complete(KEY, first.token, b'"ok"', retention=RETENTION)
        other = await claim(store, fp="fp-b")
        assert other.outcome is Outcome.CONFLICT
        assert other.record.fingerprint == "fp-a"
        assert other.record.result == b'"ok"'
        # the record is untouched: the right payload still replays
        assert (await claim(store, fp="fp-a")).outcome is Outcome.REPLAY

    @pytest.mark.asyncio
    async def test_in_progress_with_other_fingerprint_conflicts(self, store: Store) -> None:
        first = await claim(store, fp="fp-a")
        other = await claim(store, fp="fp-b")
        assert other.outcome is Outcome.CONFLICT
        assert other.token == first.token
        assert await store.complete(KEY, first.token, b"1", retention=RETENTION)

    @pytest.mark.asyncio
    async def test_stored_failure_with_other_fingerprint_conflicts(self, store: Store) -> None:
        first = await claim(store, fp="fp-a")
        assert await store.fail(KEY, first.token, b'{"type":"E"}', retention=RETENTION)
        assert (await claim(store, fp="fp-b")).outcome is Outcome.CONFLICT

    # ----------------------------------------------------------------- in progress / takeover

    @pytest.mark.asyncio
    async def test_in_progress_while_lease_alive(self, store: Store, clock: ManualClock) -> None:
        first = await claim(store, fp="fp-a")
        clock.advance(LEASE - 0.5)
        second = await claim(store, fp="fp-a")
        assert second.outcome is Outcome.IN_PROGRESS
        assert second.token == first.token
        assert second.record.lease_expires_at == pytest.approx(first.record.lease_expires_at)
        record = await store.get(KEY)
        assert record is not None and record.attempts == 1

    @pytest.mark.asyncio
    async def test_takeover_after_lease_expiry(self, store: Store, clock: ManualClock) -> None:
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

    @pytest.mark.asyncio
    async def test_zombie_completion_rejected_after_takeover(
        self, store: Store, clock: ManualClock
    ) -> None:
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

    @pytest.mark.asyncio
    async def test_holder_past_its_lease_may_complete_if_nobody_took_over(
        self, store: Store, clock: ManualClock
    ) -> None:
        first = await claim(store)
        clock.advance(LEASE + 1)
        assert await store.complete(KEY, first.token, b'"late"', retention=RETENTION)
        assert (await claim(store)).outcome is Outcome.REPLAY

    @pytest.mark.asyncio
    async def test_complete_twice_or_unknown_key_is_rejected(self, store: Store) -> None:
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

    @pytest.mark.asyncio
    async def test_release_lets_the_next_claim_acquire(
        self, store: Store, clock: ManualClock
    ) -> None:
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

    @pytest.mark.asyncio
    async def test_extend_moves_the_lease(self, store: Store, clock: ManualClock) -> None:
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

    @pytest.mark.asyncio
    async def test_extend_beyond_retention_keeps_the_record(
        self, store: Store, clock: ManualClock
    ) -> None:
        first = await claim(store, lease=10.0, retention=20.0)
        for _ in range(5):
            clock.advance(9)
            assert await store.extend(KEY, first.token, lease=10.0)
        # 45 s after the claim, far past the 20 s retention: still held
        assert (await claim(store, lease=10.0, retention=20.0)).outcome is Outcome.IN_PROGRESS
        assert await store.complete(KEY, first.token, b"1", retention=20.0)

    # ----------------------------------------------------------------- failed

    @pytest.mark.asyncio
    async def test_stored_failure_replays_as_failed(self, store: Store, clock: ManualClock) -> None:
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

    @pytest.mark.asyncio
    async def test_claim_many_answers_in_order(self, store: Store) -> None:
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

    @pytest.mark.asyncio
    async def test_claim_many_edge_cases(self, store: Store) -> None:
        assert await store.claim_many([], lease=LEASE, retention=RETENTION) == []
        with pytest.raises(ConfigurationError):
            await store.claim_many(["a", "b", "a"], lease=LEASE, retention=RETENTION)
        assert await store.get("a") is None  # nothing was claimed

    @pytest.mark.asyncio
    async def test_get_returns_none_after_retention(self, store: Store, clock: ManualClock) -> None:
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
    @pytest.mark.asyncio
    async def test_bad_lease_or_retention_is_a_configuration_error(
        self, store: Store, lease: float, retention: float
    ) -> None:
        with pytest.raises(ConfigurationError):
            await store.claim(KEY, lease=lease, retention=retention)
        with pytest.raises(ConfigurationError):
            await store.claim_many([KEY], lease=lease, retention=retention)
        assert await store.get(KEY) is None

    # ----------------------------------------------------------------- result bytes

    @pytest.mark.asyncio
    async def test_record_result_bytes_round_trip(self, store: Store) -> None:
        for i, result in enumerate(ODD_PAYLOADS):
            key = f"idem:7:a:odd{i}"
            first = await claim(store, key)
            assert await store.complete(key, first.token, result, retention=RETENTION)
            record = await store.get(key)
            assert record is not None and record.result == result, i
            replay = await claim(store, key)
            assert replay.record.result == result, i

    # ----------------------------------------------------------------- key bounding

    @pytest.mark.asyncio
    async def test_a_13kb_key_is_claimed_completed_and_replayed(self, store: Store) -> None:
        key = long_key()
        first = await claim(store, key, fp="fp-a")
        assert first.outcome is Outcome.ACQUIRED
        assert await store.complete(key, first.token, b'"done"', retention=RETENTION)
        again = await claim(store, key, fp="fp-a")
        assert (again.outcome, again.record.result) == (Outcome.REPLAY, b'"done"')
        assert await store.get(key) is not None
        other = await claim(store, long_key("y"))  # the bounded key covers the whole key
        assert other.outcome is Outcome.ACQUIRED

    @pytest.mark.parametrize("odd", ODD_KEYS)
    @pytest.mark.asyncio
    async def test_a_key_with_a_lone_surrogate_or_nul_works_like_any(
        self, store: Store, odd: str
    ) -> None:
        key = f"idem:7:a:tap:{odd}"
        first = await claim(store, key)
        assert first.outcome is Outcome.ACQUIRED
        assert await store.extend(key, first.token, lease=LEASE)
        assert await store.complete(key, first.token, b"1", retention=RETENTION)
        assert (await claim(store, key)).outcome is Outcome.REPLAY
        record = await store.get(key)
        assert record is not None and record.result == b"1"
        others = [await claim(store, f"idem:7:a:tap:{o}") for o in ODD_KEYS if o != odd]
        assert [c.outcome for c in others] == [Outcome.ACQUIRED] * (len(ODD_KEYS) - 1)
