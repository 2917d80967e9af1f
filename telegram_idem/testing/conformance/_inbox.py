"""The inbox contract, for stores that have one (docs/design/record.md#ingress-and-workers).

Admission is one transaction with the update guard; one entry in flight per ordering key
(chat), in admission order; leases, retries, dead letters and redrive; fencing of a
worker whose lease was taken over; payloads kept as the exact bytes admitted.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from telegram_idem._clock import ManualClock
from telegram_idem._records import Outcome, Status
from telegram_idem.backends import Store
from telegram_idem.inbox import EntryStatus, Inbox, NewEntry
from telegram_idem.testing.conformance._base import ConformanceBase, StoreMaker
from telegram_idem.testing.conformance._payloads import ODD_PAYLOADS

__all__ = ["InboxContract", "entry"]

RETENTION = 3600.0
LEASE = 30.0


def entry(update_id: int, chat: str | None = "chat:1") -> NewEntry:
    """An inbox entry for update ``update_id`` (key ``idem:7:u:<id>``) of ``chat``."""
    payload = json.dumps({"update_id": update_id, "message": {"text": str(update_id)}}).encode()
    return NewEntry(f"idem:7:u:{update_id}", chat, payload)


async def _refused_as(store: Store, key: str, clock: ManualClock) -> Status | None:
    """Why an admission of ``key`` was refused, read from its update-guard record:
    ``COMPLETED`` (a duplicate), ``IN_PROGRESS`` under a live lease (not yet); ``None``
    when neither holds (no record, or a holder whose lease has ended)."""
    record = await store.get(key)
    if record is None:
        return None
    if record.status is Status.IN_PROGRESS and record.lease_expires_at <= clock.now:
        return None
    return record.status


class InboxContract(ConformanceBase):
    """The durable inbox of ``store.inbox()`` (see the module docstring)."""

    @pytest.fixture
    def inbox(self, store: Store) -> Inbox:
        """The inbox sharing ``store``'s connection."""
        return store.inbox()

    @pytest.mark.asyncio
    async def test_admit_enqueues_once_and_claims_the_update_guard(
        self, inbox: Inbox, store: Store
    ) -> None:
        assert await inbox.admit(entry(1), retention=RETENTION) is True
        assert await inbox.admit(entry(1), retention=RETENTION) is False
        assert await inbox.depth() == 1
        record = await store.get("idem:7:u:1")
        assert record is not None and record.status is Status.COMPLETED
        again = await store.claim("idem:7:u:1", lease=LEASE, retention=RETENTION)
        assert again.outcome is Outcome.REPLAY

    @pytest.mark.asyncio
    async def test_admit_many_answers_in_order(self, inbox: Inbox) -> None:
        await inbox.admit(entry(2), retention=RETENTION)
        got = await inbox.admit_many([entry(1), entry(2), entry(3)], retention=RETENTION)
        assert got == [True, False, True]
        assert await inbox.depth() == 3

    @pytest.mark.asyncio
    async def test_take_gives_a_token_and_one_attempt(self, inbox: Inbox) -> None:
        await inbox.admit(entry(1), retention=RETENTION)
        taken = await inbox.take(lease=LEASE)
        assert taken is not None
        assert (taken.id, taken.status, taken.attempts) == ("idem:7:u:1", EntryStatus.IN_FLIGHT, 1)
        assert json.loads(taken.payload)["update_id"] == 1
        assert await inbox.take(lease=LEASE) is None
        assert await inbox.ack(taken)
        assert await inbox.depth() == 0
        assert not await inbox.ack(taken)

    @pytest.mark.asyncio
    async def test_one_in_flight_per_chat_in_admission_order(self, inbox: Inbox) -> None:
        for uid, chat in [(1, "chat:a"), (2, "chat:a"), (3, "chat:b"), (4, "chat:a")]:
            await inbox.admit(entry(uid, chat), retention=RETENTION)
        first = await inbox.take(lease=LEASE)
        second = await inbox.take(lease=LEASE)
        assert (first and first.id, second and second.id) == ("idem:7:u:1", "idem:7:u:3")
        assert await inbox.take(lease=LEASE) is None  # chat a is busy, chat b is done
        assert first is not None and await inbox.ack(first)
        nxt = await inbox.take(lease=LEASE)
        assert nxt is not None and nxt.id == "idem:7:u:2"
        assert await inbox.ack(nxt)
        last = await inbox.take(lease=LEASE)
        assert last is not None and last.id == "idem:7:u:4"

    @pytest.mark.asyncio
    async def test_entries_without_an_ordering_key_are_independent(self, inbox: Inbox) -> None:
        await inbox.admit(entry(1, None), retention=RETENTION)
        await inbox.admit(entry(2, None), retention=RETENTION)
        a, b = await inbox.take(lease=LEASE), await inbox.take(lease=LEASE)
        assert a is not None and b is not None and a.id != b.id

    @pytest.mark.asyncio
    async def test_retry_waits_and_keeps_the_chat_in_order(
        self, inbox: Inbox, clock: ManualClock
    ) -> None:
        await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
        await inbox.admit(entry(2, "chat:a"), retention=RETENTION)
        first = await inbox.take(lease=LEASE)
        assert first is not None
        assert await inbox.retry(first, delay=10, error="boom")
        assert await inbox.take(lease=LEASE) is None  # entry 1 waits; entry 2 must not overtake
        clock.advance(10)
        again = await inbox.take(lease=LEASE)
        assert again is not None and again.id == first.id
        assert again.attempts == 2 and again.token > first.token
        assert again.last_error == "boom"

    @pytest.mark.asyncio
    async def test_a_refunded_retry_does_not_count_the_take(
        self, inbox: Inbox, clock: ManualClock
    ) -> None:
        await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
        await inbox.admit(entry(2, "chat:a"), retention=RETENTION)
        first = await inbox.take(lease=LEASE)
        assert first is not None and first.attempts == 1
        assert await inbox.retry(first, delay=5, error="429", refund=True)
        assert await inbox.take(lease=LEASE) is None  # it waits, and keeps its chat's order
        clock.advance(5)
        for _ in range(3):  # a run of refunded takes never adds up
            again = await inbox.take(lease=LEASE)
            assert again is not None and again.id == first.id
            assert again.attempts == 1 and again.last_error == "429"
            assert await inbox.retry(again, delay=0, error="429", refund=True)
        counted = await inbox.take(lease=LEASE)
        assert counted is not None and counted.attempts == 1
        assert await inbox.retry(counted, delay=0, error="boom")  # refund=False counts
        last = await inbox.take(lease=LEASE)
        assert last is not None and last.attempts == 2 and last.token > counted.token
        assert not await inbox.retry(counted, delay=0, error="x", refund=True)  # not held
        assert await inbox.ack(last)

    @pytest.mark.asyncio
    async def test_an_entry_whose_worker_died_is_taken_again_after_its_lease(
        self, inbox: Inbox, clock: ManualClock
    ) -> None:
        await inbox.admit(entry(1), retention=RETENTION)
        dead_worker = await inbox.take(lease=LEASE)
        assert dead_worker is not None
        clock.advance(LEASE - 1)
        assert await inbox.take(lease=LEASE) is None
        assert await inbox.extend(dead_worker, lease=LEASE)  # a heartbeat keeps it
        clock.advance(LEASE - 1)
        assert await inbox.take(lease=LEASE) is None
        clock.advance(2)
        heir = await inbox.take(lease=LEASE)
        assert heir is not None and heir.id == dead_worker.id and heir.attempts == 2
        assert not await inbox.ack(dead_worker)  # the zombie cannot finish the heir's entry
        assert not await inbox.retry(dead_worker, delay=0, error="x")
        assert await inbox.ack(heir)

    @pytest.mark.asyncio
    async def test_dead_letters_stop_blocking_and_can_be_redriven(self, inbox: Inbox) -> None:
        await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
        await inbox.admit(entry(2, "chat:a"), retention=RETENTION)
        poison = await inbox.take(lease=LEASE)
        assert poison is not None
        assert await inbox.bury(poison, error="ValueError: bad")
        [dead] = await inbox.dead_letters()
        assert (dead.id, dead.status, dead.last_error) == (
            poison.id,
            EntryStatus.DEAD,
            "ValueError: bad",
        )
        assert await inbox.depth() == 1
        nxt = await inbox.take(lease=LEASE)
        assert nxt is not None and nxt.id == "idem:7:u:2"
        assert await inbox.ack(nxt)
        assert await inbox.redrive(poison.id)
        assert not await inbox.redrive(poison.id)
        back = await inbox.take(lease=LEASE)
        assert back is not None and back.id == poison.id and back.attempts == 1
        assert await inbox.dead_letters() == []

    @pytest.mark.asyncio
    async def test_concurrent_takers_never_share_an_entry(self, inbox: Inbox) -> None:
        for uid in range(20):
            await inbox.admit(entry(uid, f"chat:{uid}"), retention=RETENTION)
        taken = await asyncio.gather(*(inbox.take(lease=LEASE) for _ in range(30)))
        ids = [t.id for t in taken if t is not None]
        assert len(ids) == 20 and len(set(ids)) == 20

    @pytest.mark.idem_shared_state
    @pytest.mark.asyncio
    async def test_takers_on_separate_connections_never_share_an_entry(
        self, store_factory: StoreMaker
    ) -> None:
        stores = [await store_factory() for _ in range(4)]
        inboxes = [s.inbox() for s in stores]
        for uid in range(12):
            await inboxes[uid % 4].admit(entry(uid, f"chat:{uid % 6}"), retention=RETENTION)
        taken = await asyncio.gather(*(inboxes[i % 4].take(lease=LEASE) for i in range(24)))
        ids = [t.id for t in taken if t is not None]
        assert len(ids) == len(set(ids)) == 6  # one head per chat

    @pytest.mark.asyncio
    async def test_concurrent_admissions_enqueue_each_update_once(self, inbox: Inbox) -> None:
        results = await asyncio.gather(
            *(
                inbox.admit(entry(uid % 5, f"chat:{uid % 5}"), retention=RETENTION)
                for uid in range(40)
            )
        )
        assert sum(results) == 5
        assert await inbox.depth() == 5

    @pytest.mark.asyncio
    async def test_a_redriven_letter_waits_behind_its_chats_entry_in_flight(
        self, inbox: Inbox
    ) -> None:
        await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
        await inbox.admit(entry(2, "chat:a"), retention=RETENTION)
        poison = await inbox.take(lease=LEASE)
        assert poison is not None and await inbox.bury(poison, error="bad")
        second = await inbox.take(lease=LEASE)
        assert second is not None and second.id == "idem:7:u:2"
        assert await inbox.redrive(poison.id)
        assert await inbox.take(lease=LEASE) is None  # never two of one chat in flight
        assert await inbox.ack(second)
        again = await inbox.take(lease=LEASE)
        assert again is not None and again.id == poison.id

    # ------------------------------------------- shapes sharing a store (issue 8, mixed)
    # A webhook shape that processes in-process (FastAckWebhook, PTB, Lambda) claims the
    # update guard *in progress*; an inbox admission of the same update must then tell a
    # completed update (a duplicate) from one still held (not yet), and take a dead holder's
    # claim over once its lease has ended.

    @pytest.mark.asyncio
    async def test_admission_refuses_a_completed_update_as_a_duplicate(
        self, inbox: Inbox, store: Store, clock: ManualClock
    ) -> None:
        other = await store.claim("idem:7:u:1", lease=LEASE, retention=RETENTION)
        assert await store.complete("idem:7:u:1", other.token, b"null", retention=RETENTION)
        assert await inbox.admit(entry(1), retention=RETENTION) is False
        assert await _refused_as(store, "idem:7:u:1", clock) is Status.COMPLETED
        assert await inbox.depth() == 0

    @pytest.mark.asyncio
    async def test_admission_refuses_a_claim_held_under_a_live_lease_as_not_yet(
        self, inbox: Inbox, store: Store, clock: ManualClock
    ) -> None:
        other = await store.claim("idem:7:u:1", lease=LEASE, retention=RETENTION)
        assert other.outcome is Outcome.ACQUIRED
        clock.advance(LEASE - 1)
        assert await inbox.admit(entry(1), retention=RETENTION) is False
        assert await inbox.admit_many([entry(1), entry(2)], retention=RETENTION) == [False, True]
        assert await _refused_as(store, "idem:7:u:1", clock) is Status.IN_PROGRESS
        assert await inbox.depth() == 1  # only update 2

    @pytest.mark.asyncio
    async def test_admission_takes_over_a_claim_whose_holder_died(
        self, inbox: Inbox, store: Store, clock: ManualClock
    ) -> None:
        dead = await store.claim("idem:7:u:1", lease=LEASE, retention=RETENTION)
        other = await store.claim("idem:7:u:2", lease=LEASE, retention=RETENTION)
        clock.advance(LEASE + 1)
        assert await inbox.admit(entry(1), retention=RETENTION) is True
        assert await inbox.admit_many([entry(2)], retention=RETENTION) == [True]
        record = await store.get("idem:7:u:1")
        assert record is not None and record.status is Status.COMPLETED
        assert record.fencing_token > dead.token
        # the dead holder, should it wake, can neither finish nor release the update
        assert not await store.complete("idem:7:u:1", dead.token, b"null", retention=RETENTION)
        assert not await store.release("idem:7:u:2", other.token)
        taken = await inbox.take(lease=LEASE)
        assert taken is not None and taken.id == "idem:7:u:1"
        assert await inbox.admit(entry(1), retention=RETENTION) is False  # now a duplicate
        assert await _refused_as(store, "idem:7:u:1", clock) is Status.COMPLETED

    # ------------------------------------------- payload bytes

    @pytest.mark.asyncio
    async def test_inbox_takes_back_the_bytes_it_admitted(self, inbox: Inbox) -> None:
        for i, payload in enumerate(ODD_PAYLOADS):
            assert await inbox.admit(
                NewEntry(f"idem:7:u:{i}", "chat:1", payload), retention=RETENTION
            )
            taken = await inbox.take(lease=LEASE)
            assert taken is not None and taken.payload == payload, i
            assert await inbox.ack(taken)

    @pytest.mark.asyncio
    async def test_admit_many_keeps_every_payload(self, inbox: Inbox) -> None:
        entries = [NewEntry(f"idem:7:u:{i}", f"chat:{i}", p) for i, p in enumerate(ODD_PAYLOADS)]
        assert await inbox.admit_many(entries, retention=RETENTION) == [True] * len(entries)
        got = {}
        for _ in entries:
            taken = await inbox.take(lease=LEASE)
            assert taken is not None
            got[taken.id] = taken.payload
        assert got == {e.update_key: e.payload for e in entries}
