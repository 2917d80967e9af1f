"""The inbox contract, for stores that have one (docs/design/record.md#ingress-and-workers).

Admission is one transaction with the update guard; one entry in flight per ordering key
(chat), in admission order; leases, retries, dead letters and redrive; fencing of a
worker whose lease was taken over; payloads kept as the exact bytes admitted; the
operator's reads (``get``, ``entries``, ``stats``, ``backlog``) and ``drop``.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from telegram_idem._clock import ManualClock
from telegram_idem._records import Outcome, Status
from telegram_idem.backends import Store
from telegram_idem.inbox import EntryStatus, Inbox, InboxEntry, NewEntry
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


def _ids(entries: list[InboxEntry]) -> list[int]:
    """The update ids of ``entries`` (keys ``idem:7:u:<id>``), in order."""
    return [int(e.id.rsplit(":", 1)[1]) for e in entries]


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

    # ------------------------------------------- the operator's reads, and drop

    @pytest.mark.asyncio
    async def test_get_reads_an_entry_in_every_status(
        self, inbox: Inbox, clock: ManualClock
    ) -> None:
        admitted = clock.now
        await inbox.admit(entry(1), retention=RETENTION)
        clock.advance(2)
        pending = await inbox.get("idem:7:u:1")
        assert pending is not None
        assert (pending.status, pending.attempts, pending.admitted_at) == (
            EntryStatus.PENDING,
            0,
            admitted,
        )
        assert json.loads(pending.payload)["update_id"] == 1
        taken = await inbox.take(lease=LEASE)
        assert taken is not None
        in_flight = await inbox.get(taken.id)
        assert in_flight is not None and in_flight.status is EntryStatus.IN_FLIGHT
        assert (in_flight.token, in_flight.attempts) == (taken.token, 1)
        assert await inbox.bury(taken, error="ValueError: bad")
        dead = await inbox.get(taken.id)
        assert dead is not None and dead.status is EntryStatus.DEAD
        assert (dead.last_error, dead.admitted_at) == ("ValueError: bad", admitted)
        assert await inbox.get("idem:7:u:2") is None

    @pytest.mark.asyncio
    async def test_admit_many_records_when_each_entry_was_admitted(
        self, inbox: Inbox, clock: ManualClock
    ) -> None:
        await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
        first = clock.now
        clock.advance(7)
        assert await inbox.admit_many(
            [entry(2, "chat:a"), entry(3, "chat:b")], retention=RETENTION
        ) == [True, True]
        got = await inbox.entries()
        assert [(i, e.admitted_at) for i, e in zip(_ids(got), got, strict=True)] == [
            (1, first),
            (2, first + 7),
            (3, first + 7),
        ]

    @pytest.mark.asyncio
    async def test_entries_are_oldest_first_and_filtered(self, inbox: Inbox) -> None:
        for uid, chat in [(1, "chat:a"), (2, "chat:b"), (3, "chat:a"), (4, None), (5, "chat:a")]:
            await inbox.admit(entry(uid, chat), retention=RETENTION)
        assert _ids(await inbox.entries()) == [1, 2, 3, 4, 5]
        first = await inbox.take(lease=LEASE)
        assert first is not None and first.id == "idem:7:u:1"
        assert _ids(await inbox.entries(status=EntryStatus.IN_FLIGHT)) == [1]
        assert _ids(await inbox.entries(status=EntryStatus.PENDING)) == [2, 3, 4, 5]
        assert _ids(await inbox.entries(ordering_key="chat:a")) == [1, 3, 5]
        got = await inbox.entries(ordering_key="chat:a", status=EntryStatus.PENDING)
        assert _ids(got) == [3, 5]
        assert await inbox.bury(first, error="bad")
        assert _ids(await inbox.entries(status=EntryStatus.DEAD)) == [1]
        assert _ids(await inbox.entries(status=EntryStatus.IN_FLIGHT)) == []
        assert _ids(await inbox.entries(ordering_key="chat:a")) == [1, 3, 5]
        got = await inbox.entries(ordering_key="chat:a", status=EntryStatus.DEAD)
        assert _ids(got) == [1]
        assert await inbox.entries(ordering_key="chat:b", status=EntryStatus.DEAD) == []
        # an update without an ordering key is a unit of its own, named by its id
        assert _ids(await inbox.entries(ordering_key="idem:7:u:4")) == [4]
        assert await inbox.entries(ordering_key="chat:zz") == []
        assert _ids(await inbox.entries(limit=2)) == [1, 2]
        assert _ids(await inbox.entries(ordering_key="chat:a", limit=2)) == [1, 3]
        assert _ids(await inbox.entries(status=EntryStatus.PENDING, limit=1)) == [2]

    @pytest.mark.asyncio
    async def test_entries_follow_a_redriven_letter_to_the_tail_of_the_order(
        self, inbox: Inbox
    ) -> None:
        for uid in (1, 2, 3):
            await inbox.admit(entry(uid, f"chat:{uid}"), retention=RETENTION)
        first = await inbox.take(lease=LEASE)
        assert first is not None and await inbox.bury(first, error="bad")
        before = await inbox.get(first.id)
        assert await inbox.redrive(first.id)
        after = await inbox.get(first.id)
        assert before is not None and after is not None
        assert after.status is EntryStatus.PENDING and after.attempts == 0
        assert after.admitted_at == before.admitted_at  # a redrive is not an admission
        assert _ids(await inbox.entries()) == [2, 3, 1]

    @pytest.mark.asyncio
    async def test_listings_page_through_many_sparse_entries(self, inbox: Inbox) -> None:
        await inbox.admit_many(
            [entry(uid, f"chat:{uid % 3}") for uid in range(1, 61)], retention=RETENTION
        )
        taken = [await inbox.take(lease=LEASE) for _ in range(3)]  # the head of each chat
        for t in taken:
            assert t is not None and await inbox.bury(t, error="bad")
        assert _ids(await inbox.entries(status=EntryStatus.DEAD)) == [1, 2, 3]
        pending = await inbox.entries(status=EntryStatus.PENDING, limit=1000)
        assert _ids(pending) == list(range(4, 61))
        chat = await inbox.entries(ordering_key="chat:1", limit=1000)
        assert _ids(chat) == list(range(1, 61, 3))
        assert _ids(await inbox.entries(limit=5)) == [1, 2, 3, 4, 5]

    @pytest.mark.parametrize("limit", [0, -1])
    @pytest.mark.asyncio
    async def test_listings_refuse_a_limit_below_one(self, inbox: Inbox, limit: int) -> None:
        with pytest.raises(ValueError, match="limit"):
            await inbox.entries(limit=limit)
        with pytest.raises(ValueError, match="limit"):
            await inbox.entries(status=EntryStatus.DEAD, limit=limit)
        with pytest.raises(ValueError, match="limit"):
            await inbox.backlog(limit=limit)

    @pytest.mark.asyncio
    async def test_drop_deletes_only_dead_letters_and_keeps_the_update_guard(
        self, inbox: Inbox, store: Store
    ) -> None:
        await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
        await inbox.admit(entry(2, "chat:a"), retention=RETENTION)
        poison = await inbox.take(lease=LEASE)
        assert poison is not None
        assert not await inbox.drop(poison.id)  # in flight: never dropped
        assert await inbox.bury(poison, error="bad")
        assert not await inbox.drop("idem:7:u:2")  # pending: never dropped
        assert not await inbox.drop("idem:7:u:99")  # nothing by that id
        assert await inbox.drop(poison.id)
        assert await inbox.get(poison.id) is None
        assert await inbox.dead_letters() == []
        assert not await inbox.drop(poison.id)
        assert not await inbox.redrive(poison.id)
        assert _ids(await inbox.entries()) == [2]
        # the update guard record stays: a redelivery of the update is a duplicate
        record = await store.get(poison.id)
        assert record is not None and record.status is Status.COMPLETED
        assert await inbox.admit(entry(1, "chat:a"), retention=RETENTION) is False
        assert await inbox.get(poison.id) is None

    @pytest.mark.asyncio
    async def test_stats_count_each_status_and_age_its_oldest(
        self, inbox: Inbox, clock: ManualClock
    ) -> None:
        empty = await inbox.stats()
        assert dict(empty.counts) == dict.fromkeys(EntryStatus, 0)
        assert dict(empty.oldest_admitted_at) == {}
        assert empty.now == clock.now
        assert empty.oldest_age(EntryStatus.PENDING) == 0.0
        t0 = clock.now
        await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
        clock.advance(10)
        await inbox.admit(entry(2, "chat:b"), retention=RETENTION)
        clock.advance(5)
        await inbox.admit_many([entry(3, "chat:c"), entry(4, "chat:c")], retention=RETENTION)
        clock.advance(1)
        one = await inbox.take(lease=LEASE)
        two = await inbox.take(lease=LEASE)
        assert (
            one is not None
            and two is not None
            and (one.id, two.id)
            == (
                "idem:7:u:1",
                "idem:7:u:2",
            )
        )
        assert await inbox.bury(two, error="bad")
        clock.advance(4)
        stats = await inbox.stats()
        assert dict(stats.counts) == {
            EntryStatus.PENDING: 2,
            EntryStatus.IN_FLIGHT: 1,
            EntryStatus.DEAD: 1,
        }
        assert dict(stats.oldest_admitted_at) == {
            EntryStatus.IN_FLIGHT: t0,
            EntryStatus.DEAD: t0 + 10,
            EntryStatus.PENDING: t0 + 15,
        }
        assert stats.now == clock.now == t0 + 20
        assert stats.oldest_age(EntryStatus.PENDING) == 5.0
        assert stats.oldest_age(EntryStatus.IN_FLIGHT) == 20.0
        assert stats.oldest_age(EntryStatus.DEAD) == 10.0
        assert await inbox.ack(one)
        assert await inbox.drop(two.id)
        after = await inbox.stats()
        assert dict(after.counts) == {
            EntryStatus.PENDING: 2,
            EntryStatus.IN_FLIGHT: 0,
            EntryStatus.DEAD: 0,
        }
        assert dict(after.oldest_admitted_at) == {EntryStatus.PENDING: t0 + 15}

    @pytest.mark.asyncio
    async def test_backlog_ranks_units_by_live_entries_then_age(
        self, inbox: Inbox, clock: ManualClock
    ) -> None:
        t0 = clock.now
        plan = [(1, "chat:b"), (2, "chat:d"), (3, "chat:a"), (4, "chat:d"), (5, "chat:e")]
        plan += [(6, "chat:c"), (7, "chat:a"), (8, "chat:c"), (9, "chat:a")]
        for uid, chat in plan:
            await inbox.admit(entry(uid, chat), retention=RETENTION)
            clock.advance(1)
        taken = [await inbox.take(lease=LEASE) for _ in range(4)]  # heads of b, d, a, e
        assert [t and t.id for t in taken] == [f"idem:7:u:{u}" for u in (1, 2, 3, 5)]
        assert taken[3] is not None and await inbox.bury(taken[3], error="bad")  # e: dead
        got = await inbox.backlog()
        assert [(u.ordering_key, u.pending, u.in_flight, u.oldest_admitted_at) for u in got] == [
            ("chat:a", 2, 1, t0 + 2),
            ("chat:d", 1, 1, t0 + 1),
            ("chat:c", 2, 0, t0 + 5),
            ("chat:b", 0, 1, t0),
        ]
        assert [u.ordering_key for u in await inbox.backlog(limit=2)] == ["chat:a", "chat:d"]
        assert taken[0] is not None and await inbox.ack(taken[0])
        assert "chat:b" not in [u.ordering_key for u in await inbox.backlog()]

    @pytest.mark.asyncio
    async def test_stats_follow_retries_redrives_and_readmissions(
        self, inbox: Inbox, clock: ManualClock
    ) -> None:
        def counts(pending: int, in_flight: int, dead: int) -> dict[EntryStatus, int]:
            return {
                EntryStatus.PENDING: pending,
                EntryStatus.IN_FLIGHT: in_flight,
                EntryStatus.DEAD: dead,
            }

        t0 = clock.now
        await inbox.admit(entry(1, "chat:a"), retention=10)
        await inbox.admit(entry(2, "chat:b"), retention=RETENTION)
        one = await inbox.take(lease=LEASE)
        assert one is not None
        assert await inbox.retry(one, delay=0, error="boom")
        assert dict((await inbox.stats()).counts) == counts(2, 0, 0)
        again = await inbox.take(lease=LEASE)
        assert again is not None and again.id == one.id
        assert await inbox.bury(again, error="bad")
        assert dict((await inbox.stats()).counts) == counts(1, 0, 1)
        assert await inbox.redrive(one.id)
        redriven = await inbox.stats()
        assert dict(redriven.counts) == counts(2, 0, 0)
        assert dict(redriven.oldest_admitted_at) == {EntryStatus.PENDING: t0}
        two = await inbox.take(lease=LEASE)
        assert two is not None and two.id == "idem:7:u:2" and await inbox.ack(two)
        assert dict((await inbox.stats()).counts) == counts(1, 0, 0)
        # update 1's guard record expires while its entry waits: a re-delivery of the
        # update is admitted again and replaces the entry (admitted now)
        clock.advance(11)
        assert await inbox.admit(entry(1, "chat:a"), retention=10)
        readmitted = await inbox.stats()
        assert dict(readmitted.counts) == counts(1, 0, 0)
        assert dict(readmitted.oldest_admitted_at) == {EntryStatus.PENDING: t0 + 11}
        got = await inbox.get(one.id)
        assert got is not None and (got.admitted_at, got.attempts) == (t0 + 11, 0)
