"""The outbox contract, relay side: the rules of the :class:`~telegram_idem.outbox.Outbox`
module docstring that a relay lives by.

Idempotent enqueue by key in every status; latest-wins collapse of pending calls; per-chat
order with one call in flight, chats in parallel, priority among chats; take by bot and
by chat; fencing of a relay whose lease was taken over; retries (delay, replaced params
and chat), dead letters and unknown outcomes. The operator side (parking, redrive,
resolve, listing, retention) and the races, bytes and keys are in ``_outbox_ops``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Literal

import pytest

from telegram_idem._clock import ManualClock
from telegram_idem.backends import Store, outbox_of
from telegram_idem.outbox import AmbiguousPolicy, CallStatus, NewCall, Outbox, OutboxEntry
from telegram_idem.testing.conformance._base import ConformanceBase

__all__ = [
    "BOT",
    "LEASE",
    "RETENTION",
    "OutboxContract",
    "approx",
    "call",
    "held",
    "keys_of",
    "to_status",
]

BOT = 7
LEASE = 30.0
RETENTION = 3600.0


def approx(seconds: float) -> object:
    """``seconds`` as a store may give it back (stores keep milliseconds at least)."""
    return pytest.approx(seconds, abs=0.01)


def call(
    name: str | int,
    chat: str | None = "chat:1",
    *,
    bot: int = BOT,
    collapse: str | None = None,
    priority: int = 0,
    params: bytes | None = None,
    retention: float = RETENTION,
    method: str = "sendMessage",
    policy: AmbiguousPolicy = AmbiguousPolicy.HOLD,
) -> NewCall:
    """A call with key ``idem:<bot>:o:<name>`` in ``chat`` (``None``: a unit of its own)."""
    body = params if params is not None else json.dumps({"chat": chat, "text": str(name)}).encode()
    return NewCall(
        key=f"idem:{bot}:o:{name}",
        bot_id=bot,
        method=method,
        params=body,
        ordering_key=chat,
        collapse_key=collapse,
        policy=policy,
        priority=priority,
        retention=retention,
    )


def keys_of(entries: list[OutboxEntry | None]) -> list[str | None]:
    """The keys of ``entries`` (``None`` stays ``None``)."""
    return [e.key if e is not None else None for e in entries]


async def held(outbox: Outbox, new: NewCall, *, lease: float = LEASE) -> OutboxEntry:
    """Enqueue ``new`` and take it (it must be its chat's takeable head)."""
    await outbox.enqueue(new)
    taken = await outbox.take(bot_id=new.bot_id, lease=lease, ordering_key=new.unit)
    assert taken is not None and taken.key == new.key, taken
    return taken


async def to_status(outbox: Outbox, status: CallStatus, name: str) -> NewCall:
    """Bring a new call named ``name`` (its own chat) into ``status``; returns the call."""
    new = call(name, f"chat:{name}", collapse=f"c:{name}")
    if status is CallStatus.PENDING:
        await outbox.enqueue(new)
        return new
    if status is CallStatus.SUPERSEDED:
        await outbox.enqueue(new)
        await outbox.enqueue(call(f"{name}-newer", f"chat:{name}", collapse=f"c:{name}"))
        return new
    entry = await held(outbox, new)
    done: dict[CallStatus, Callable[[], Awaitable[bool]]] = {
        CallStatus.IN_FLIGHT: lambda: asyncio.sleep(0, True),
        CallStatus.DELIVERED: lambda: outbox.deliver(entry, result=b'{"message_id":1}'),
        CallStatus.DEAD: lambda: outbox.settle(entry, status=CallStatus.DEAD, error="dead"),
        CallStatus.UNKNOWN: lambda: outbox.settle(entry, status=CallStatus.UNKNOWN, error="?"),
        CallStatus.PARKED: lambda: outbox.park(entry, error="Forbidden: bot was blocked"),
    }
    assert await done[status]()
    return new


class OutboxContract(ConformanceBase):
    """The relay side of ``store.outbox()`` (see the module docstring)."""

    @pytest.fixture
    def outbox(self, store: Store) -> Outbox:
        """The outbox of ``store`` (through :func:`~telegram_idem.backends.outbox_of`)."""
        return outbox_of(store)

    # ----------------------------------------------------------------- enqueue

    @pytest.mark.asyncio
    async def test_enqueue_stores_a_pending_entry_as_given(
        self, outbox: Outbox, clock: ManualClock
    ) -> None:
        new = call(1, "chat:42", collapse="editMessageText:42:9", priority=10)
        new = NewCall(
            new.key,
            new.bot_id,
            "editMessageText",
            new.params,
            new.ordering_key,
            new.collapse_key,
            AmbiguousPolicy.RESEND,
            priority=10,
            retention=600.0,
        )
        entry, created = await outbox.enqueue(new)
        assert created is True
        assert (entry.key, entry.bot_id, entry.method, entry.params) == (
            new.key,
            BOT,
            "editMessageText",
            new.params,
        )
        assert (entry.ordering_key, entry.collapse_key, entry.policy) == (
            "chat:42",
            "editMessageText:42:9",
            AmbiguousPolicy.RESEND,
        )
        assert (entry.priority, entry.retention, entry.status) == (10, 600.0, CallStatus.PENDING)
        assert (entry.attempts, entry.token, entry.lease_expires_at) == (0, 0, 0.0)
        assert entry.created_at == approx(clock.now) and entry.available_at == approx(clock.now)
        assert (entry.settled_at, entry.result, entry.last_error) == (0.0, None, None)
        assert await outbox.get(new.key) == entry
        assert await outbox.get("idem:7:o:never") is None

    @pytest.mark.asyncio
    async def test_a_call_without_an_ordering_key_is_a_unit_of_its_own(
        self, outbox: Outbox
    ) -> None:
        a, _ = await outbox.enqueue(call("a", None))
        await outbox.enqueue(call("b", None))
        assert a.ordering_key == a.key
        first = await outbox.take(bot_id=BOT, lease=LEASE)
        second = await outbox.take(bot_id=BOT, lease=LEASE)
        assert keys_of([first, second]) == ["idem:7:o:a", "idem:7:o:b"]  # not one chat

    @pytest.mark.asyncio
    async def test_seq_grows_with_each_enqueue_across_chats_and_bots(self, outbox: Outbox) -> None:
        seqs = [
            (await outbox.enqueue(call(i, f"chat:{i % 3}", bot=7 + i % 2)))[0].seq for i in range(6)
        ]
        assert seqs == sorted(seqs) and len(set(seqs)) == 6

    @pytest.mark.asyncio
    async def test_enqueue_twice_stores_once_and_answers_with_the_stored_entry(
        self, outbox: Outbox
    ) -> None:
        first, created = await outbox.enqueue(call(1, params=b'{"text":"first"}'))
        again, created_again = await outbox.enqueue(call(1, "chat:2", params=b'{"text":"other"}'))
        assert (created, created_again) == (True, False)
        assert again == first
        assert await outbox.counts() == {CallStatus.PENDING: 1}

    @pytest.mark.parametrize("status", list(CallStatus))
    @pytest.mark.asyncio
    async def test_enqueue_of_a_stored_key_in_any_status_writes_nothing(
        self, outbox: Outbox, status: CallStatus
    ) -> None:
        new = await to_status(outbox, status, "x")
        before = await outbox.get(new.key)
        counts = await outbox.counts()
        assert before is not None and before.status is status
        replay = NewCall(
            new.key,
            new.bot_id,
            "sendPhoto",
            b'{"photo":"other"}',
            "chat:elsewhere",
            new.collapse_key,
            AmbiguousPolicy.RESEND,
        )
        stored, created = await outbox.enqueue(replay)
        assert created is False
        assert stored == before
        assert await outbox.get(new.key) == before
        assert await outbox.counts() == counts  # and it superseded nothing

    @pytest.mark.asyncio
    async def test_concurrent_enqueues_of_one_key_store_it_once(self, outbox: Outbox) -> None:
        answers = await asyncio.gather(
            *(outbox.enqueue(call(i % 4, f"chat:{i % 4}", collapse=f"c{i % 4}")) for i in range(40))
        )
        assert sum(created for _, created in answers) == 4
        assert len({(e.key, e.seq) for e, _ in answers}) == 4
        assert await outbox.counts() == {CallStatus.PENDING: 4}

    # ----------------------------------------------------------------- latest wins

    @pytest.mark.asyncio
    async def test_a_call_supersedes_the_pending_calls_of_its_collapse_key(
        self, outbox: Outbox, clock: ManualClock
    ) -> None:
        await outbox.enqueue(call("v1", collapse="edit:1:9"))
        await outbox.enqueue(call("v2", "chat:2", collapse="edit:1:9"))  # any chat of the bot
        first_at = clock.now
        clock.advance(5)
        newest, created = await outbox.enqueue(call("v3", collapse="edit:1:9"))
        assert created and newest.status is CallStatus.PENDING
        for old, by, at in [("v1", "v2", first_at), ("v2", "v3", clock.now)]:
            entry = await outbox.get(f"idem:7:o:{old}")
            assert entry is not None and entry.status is CallStatus.SUPERSEDED
            assert entry.result is not None
            assert json.loads(entry.result) == {"superseded_by": f"idem:7:o:{by}"}
            assert entry.settled_at == approx(at)
        taken = await outbox.take(bot_id=BOT, lease=LEASE)  # superseded entries do not block
        assert taken is not None and taken.key == "idem:7:o:v3"
        assert await outbox.take(bot_id=BOT, lease=LEASE) is None

    @pytest.mark.asyncio
    async def test_a_call_in_flight_is_never_superseded(self, outbox: Outbox) -> None:
        sending = await held(outbox, call("v1", collapse="edit:1:9"))
        await outbox.enqueue(call("v2", collapse="edit:1:9"))
        entry = await outbox.get(sending.key)
        assert entry is not None and entry.status is CallStatus.IN_FLIGHT
        assert await outbox.deliver(sending, result=b"true")
        nxt = await outbox.take(bot_id=BOT, lease=LEASE)
        assert nxt is not None and nxt.key == "idem:7:o:v2"

    @pytest.mark.asyncio
    async def test_collapse_is_per_bot_and_collapse_key_and_spares_settled_entries(
        self, outbox: Outbox
    ) -> None:
        done = await held(outbox, call("done", collapse="edit:1:9"))
        assert await outbox.deliver(done, result=b"true")
        dead = await held(outbox, call("dead", "chat:2", collapse="edit:1:9"))
        assert await outbox.settle(dead, status=CallStatus.DEAD, error="bad")
        await outbox.enqueue(call("old", collapse="edit:1:9"))
        await outbox.enqueue(call("other-bot", collapse="edit:1:9", bot=8))
        await outbox.enqueue(call("other-key", collapse="edit:1:10"))
        await outbox.enqueue(call("no-key"))
        await outbox.enqueue(call("no-key-2"))  # calls without a collapse key never collapse
        await outbox.enqueue(call("new", collapse="edit:1:9"))
        statuses = {}
        for name, bot in [
            ("done", 7),
            ("dead", 7),
            ("old", 7),
            ("other-bot", 8),
            ("other-key", 7),
            ("no-key", 7),
            ("no-key-2", 7),
            ("new", 7),
        ]:
            entry = await outbox.get(f"idem:{bot}:o:{name}")
            assert entry is not None
            statuses[name] = entry.status
        assert statuses == {
            "done": CallStatus.DELIVERED,
            "dead": CallStatus.DEAD,
            "old": CallStatus.SUPERSEDED,
            "other-bot": CallStatus.PENDING,
            "other-key": CallStatus.PENDING,
            "no-key": CallStatus.PENDING,
            "no-key-2": CallStatus.PENDING,
            "new": CallStatus.PENDING,
        }

    @pytest.mark.asyncio
    async def test_a_pending_call_waiting_for_a_retry_is_superseded(
        self, outbox: Outbox, clock: ManualClock
    ) -> None:
        first = await held(outbox, call("v1", collapse="edit:1:9"))
        assert await outbox.retry(first, delay=60, error="Too Many Requests")
        await outbox.enqueue(call("v2", collapse="edit:1:9"))
        entry = await outbox.get(first.key)
        assert entry is not None and entry.status is CallStatus.SUPERSEDED
        taken = await outbox.take(bot_id=BOT, lease=LEASE)
        assert taken is not None and taken.key == "idem:7:o:v2"  # not behind v1's delay

    # ----------------------------------------------------------------- order

    @pytest.mark.asyncio
    async def test_one_call_in_flight_per_chat_in_enqueue_order(self, outbox: Outbox) -> None:
        for name, chat in [(1, "chat:a"), (2, "chat:a"), (3, "chat:b"), (4, "chat:a")]:
            await outbox.enqueue(call(name, chat))
        first = await outbox.take(bot_id=BOT, lease=LEASE)
        second = await outbox.take(bot_id=BOT, lease=LEASE)
        assert keys_of([first, second]) == ["idem:7:o:1", "idem:7:o:3"]
        assert await outbox.take(bot_id=BOT, lease=LEASE) is None  # chat a is busy
        assert first is not None and await outbox.deliver(first, result=b"1")
        nxt = await outbox.take(bot_id=BOT, lease=LEASE)
        assert nxt is not None and nxt.key == "idem:7:o:2"
        assert await outbox.deliver(nxt, result=b"2")
        last = await outbox.take(bot_id=BOT, lease=LEASE)
        assert last is not None and last.key == "idem:7:o:4"

    @pytest.mark.asyncio
    async def test_chats_are_taken_in_parallel(self, outbox: Outbox) -> None:
        for i in range(10):
            await outbox.enqueue(call(i, f"chat:{i % 5}"))
        taken = [await outbox.take(bot_id=BOT, lease=LEASE) for _ in range(6)]
        assert keys_of(taken) == [f"idem:7:o:{i}" for i in range(5)] + [None]

    @pytest.mark.asyncio
    async def test_take_many_takes_the_heads_of_distinct_chats(self, outbox: Outbox) -> None:
        for i in range(6):
            await outbox.enqueue(call(i, f"chat:{i % 3}"))
        taken = list(await outbox.take_many(bot_id=BOT, lease=LEASE, limit=10))
        assert sorted(e.key for e in taken) == ["idem:7:o:0", "idem:7:o:1", "idem:7:o:2"]
        assert all(e.status is CallStatus.IN_FLIGHT and e.attempts == 1 for e in taken)
        assert list(await outbox.take_many(bot_id=BOT, lease=LEASE, limit=10)) == []
        for e in taken:
            assert await outbox.deliver(e, result=b"true")
        assert len(await outbox.take_many(bot_id=BOT, lease=LEASE, limit=2)) == 2

    @pytest.mark.asyncio
    async def test_the_lowest_priority_goes_first_among_chats_then_the_oldest(
        self, outbox: Outbox
    ) -> None:
        await outbox.enqueue(call("bulk-1", "chat:a", priority=10))
        await outbox.enqueue(call("reply", "chat:b", priority=0))
        await outbox.enqueue(call("bulk-2", "chat:c", priority=10))
        await outbox.enqueue(call("mid", "chat:d", priority=5))
        taken = [await outbox.take(bot_id=BOT, lease=LEASE) for _ in range(4)]
        assert keys_of(taken) == [
            "idem:7:o:reply",
            "idem:7:o:mid",
            "idem:7:o:bulk-1",
            "idem:7:o:bulk-2",
        ]

    @pytest.mark.asyncio
    async def test_priority_never_reorders_one_chat(self, outbox: Outbox) -> None:
        await outbox.enqueue(call("bulk", "chat:a", priority=10))
        await outbox.enqueue(call("reply", "chat:a", priority=0))
        first = await outbox.take(bot_id=BOT, lease=LEASE)
        assert first is not None and first.key == "idem:7:o:bulk"
        assert await outbox.take(bot_id=BOT, lease=LEASE) is None

    @pytest.mark.asyncio
    async def test_take_is_per_bot(self, outbox: Outbox) -> None:
        await outbox.enqueue(call("mine", "chat:a", bot=7))
        await outbox.enqueue(call("theirs", "chat:a", bot=8))  # same chat name, other bot
        mine = await outbox.take(bot_id=7, lease=LEASE)
        theirs = await outbox.take(bot_id=8, lease=LEASE)  # not blocked by bot 7's chat
        assert keys_of([mine, theirs]) == ["idem:7:o:mine", "idem:8:o:theirs"]
        assert await outbox.take(bot_id=7, lease=LEASE) is None
        assert await outbox.take(bot_id=9, lease=LEASE) is None

    @pytest.mark.asyncio
    async def test_take_of_one_chat_gives_only_its_head(
        self, outbox: Outbox, clock: ManualClock
    ) -> None:
        await outbox.enqueue(call(1, "chat:a"))
        await outbox.enqueue(call(2, "chat:b"))
        await outbox.enqueue(call(3, "chat:b"))
        await outbox.enqueue(call(4, "chat:b", bot=8))
        b = await outbox.take(bot_id=BOT, lease=LEASE, ordering_key="chat:b")
        assert b is not None and b.key == "idem:7:o:2"  # not chat a's older call
        assert await outbox.take(bot_id=BOT, lease=LEASE, ordering_key="chat:b") is None
        assert await outbox.take(bot_id=BOT, lease=LEASE, ordering_key="chat:none") is None
        assert await outbox.retry(b, delay=10, error="wait")
        assert await outbox.take(bot_id=BOT, lease=LEASE, ordering_key="chat:b") is None
        clock.advance(10)
        again = await outbox.take(bot_id=BOT, lease=LEASE, ordering_key="chat:b")
        assert again is not None and again.key == "idem:7:o:2"
        a = await outbox.take(bot_id=BOT, lease=LEASE)
        assert a is not None and a.key == "idem:7:o:1"
        other = await outbox.take(bot_id=8, lease=LEASE, ordering_key="chat:b")
        assert other is not None and other.key == "idem:8:o:4"

    # ----------------------------------------------------------------- take, fencing

    @pytest.mark.asyncio
    async def test_take_gives_a_lease_a_token_and_one_attempt(
        self, outbox: Outbox, clock: ManualClock
    ) -> None:
        await outbox.enqueue(call(1))
        taken = await outbox.take(bot_id=BOT, lease=LEASE)
        assert taken is not None
        assert (taken.key, taken.status, taken.attempts) == ("idem:7:o:1", CallStatus.IN_FLIGHT, 1)
        assert taken.token > 0
        assert taken.lease_expires_at == approx(clock.now + LEASE)
        assert await outbox.get(taken.key) == taken

    @pytest.mark.asyncio
    async def test_a_call_whose_relay_died_is_taken_over_after_its_lease(
        self, outbox: Outbox, clock: ManualClock
    ) -> None:
        await outbox.enqueue(call(1))
        await outbox.enqueue(call(2))
        zombie = await outbox.take(bot_id=BOT, lease=LEASE)
        assert zombie is not None
        clock.advance(LEASE - 1)
        assert await outbox.take(bot_id=BOT, lease=LEASE) is None
        assert await outbox.extend(zombie, lease=LEASE)  # a heartbeat keeps it
        clock.advance(LEASE - 1)
        assert await outbox.take(bot_id=BOT, lease=LEASE) is None
        clock.advance(2)
        heir = await outbox.take(bot_id=BOT, lease=LEASE)
        assert heir is not None and heir.key == zombie.key  # its chat's turn is still its
        assert heir.token > zombie.token and heir.attempts == 2
        # the zombie, waking, can record nothing over the heir
        assert not await outbox.deliver(zombie, result=b"zombie")
        assert not await outbox.retry(zombie, delay=0, error="zombie")
        assert not await outbox.settle(zombie, status=CallStatus.DEAD, error="zombie")
        assert not await outbox.settle(zombie, status=CallStatus.UNKNOWN, error="zombie")
        assert not await outbox.park(zombie, error="zombie")
        assert not await outbox.extend(zombie, lease=LEASE)
        assert await outbox.get(heir.key) == heir
        assert await outbox.parked_units() == []
        assert await outbox.deliver(heir, result=b'"heir"')
        entry = await outbox.get(heir.key)
        assert entry is not None and (entry.status, entry.result) == (
            CallStatus.DELIVERED,
            b'"heir"',
        )
        assert not await outbox.deliver(zombie, result=b"zombie")

    @pytest.mark.asyncio
    async def test_tokens_keep_growing_over_takeovers_and_retries(
        self, outbox: Outbox, clock: ManualClock
    ) -> None:
        await outbox.enqueue(call(1))
        tokens = []
        for i in range(4):
            taken = await outbox.take(bot_id=BOT, lease=LEASE)
            assert taken is not None
            tokens.append(taken.token)
            if i % 2:
                assert await outbox.retry(taken, delay=0, error="again")
            else:
                clock.advance(LEASE + 1)
        assert tokens == sorted(tokens) and len(set(tokens)) == 4

    @pytest.mark.asyncio
    async def test_a_relay_past_its_lease_records_when_nobody_took_over(
        self, outbox: Outbox, clock: ManualClock
    ) -> None:
        late = await held(outbox, call(1))
        clock.advance(LEASE + 5)
        assert await outbox.deliver(late, result=b"true")  # the message went out: keep it

    @pytest.mark.asyncio
    async def test_an_entry_never_taken_cannot_be_recorded(self, outbox: Outbox) -> None:
        entry, _ = await outbox.enqueue(call(1))
        assert not await outbox.deliver(entry, result=b"true")
        assert not await outbox.retry(entry, delay=0, error="x")
        assert not await outbox.settle(entry, status=CallStatus.DEAD, error="x")
        assert not await outbox.park(entry, error="x")
        assert not await outbox.extend(entry, lease=LEASE)
        assert await outbox.get(entry.key) == entry

    @pytest.mark.asyncio
    async def test_extend_moves_the_lease(self, outbox: Outbox, clock: ManualClock) -> None:
        taken = await held(outbox, call(1))
        clock.advance(20)
        assert await outbox.extend(taken, lease=100)
        entry = await outbox.get(taken.key)
        assert entry is not None and entry.lease_expires_at == approx(clock.now + 100)
        assert entry.token == taken.token and entry.status is CallStatus.IN_FLIGHT
        clock.advance(99)
        assert await outbox.take(bot_id=BOT, lease=LEASE) is None
        clock.advance(2)
        assert await outbox.take(bot_id=BOT, lease=LEASE) is not None

    # ----------------------------------------------------------------- outcomes

    @pytest.mark.asyncio
    async def test_deliver_records_the_result_and_frees_the_chat(
        self, outbox: Outbox, clock: ManualClock
    ) -> None:
        taken = await held(outbox, call(1))
        await outbox.enqueue(call(2))
        clock.advance(3)
        assert await outbox.deliver(taken, result=b'{"message_id":77}')
        entry = await outbox.get(taken.key)
        assert entry is not None
        assert (entry.status, entry.result) == (CallStatus.DELIVERED, b'{"message_id":77}')
        assert entry.settled_at == approx(clock.now) and entry.attempts == 1
        assert not await outbox.deliver(taken, result=b"again")
        nxt = await outbox.take(bot_id=BOT, lease=LEASE)
        assert nxt is not None and nxt.key == "idem:7:o:2"

    @pytest.mark.asyncio
    async def test_retry_waits_its_delay_and_keeps_the_chat_in_order(
        self, outbox: Outbox, clock: ManualClock
    ) -> None:
        await outbox.enqueue(call(1, "chat:a"))
        await outbox.enqueue(call(2, "chat:a"))
        await outbox.enqueue(call(3, "chat:b"))
        first = await outbox.take(bot_id=BOT, lease=LEASE)
        assert first is not None and first.key == "idem:7:o:1"
        assert await outbox.retry(first, delay=10, error="Too Many Requests: retry after 10")
        entry = await outbox.get(first.key)
        assert entry is not None and entry.status is CallStatus.PENDING
        assert entry.available_at == approx(clock.now + 10)
        assert entry.last_error == "Too Many Requests: retry after 10"
        other = await outbox.take(bot_id=BOT, lease=LEASE)
        assert other is not None and other.key == "idem:7:o:3"  # another chat goes on
        assert await outbox.take(bot_id=BOT, lease=LEASE) is None  # 2 must not overtake 1
        clock.advance(10)
        again = await outbox.take(bot_id=BOT, lease=LEASE)
        assert again is not None and again.key == first.key
        assert again.attempts == 2 and again.token > first.token
        assert not await outbox.retry(first, delay=0, error="stale")

    @pytest.mark.asyncio
    async def test_retry_can_move_the_call_to_the_chat_a_group_migrated_to(
        self, outbox: Outbox
    ) -> None:
        await outbox.enqueue(call(1, "chat:-100", params=b'{"chat_id":-100,"text":"a"}'))
        await outbox.enqueue(call(2, "chat:-100", params=b'{"chat_id":-100,"text":"b"}'))
        first = await outbox.take(bot_id=BOT, lease=LEASE)
        assert first is not None and first.key == "idem:7:o:1"
        moved = b'{"chat_id":-1001234,"text":"a"}'
        assert await outbox.retry(
            first, delay=0, error="migrated", params=moved, ordering_key="chat:-1001234"
        )
        entry = await outbox.get(first.key)
        assert entry is not None
        assert (entry.params, entry.ordering_key, entry.status) == (
            moved,
            "chat:-1001234",
            CallStatus.PENDING,
        )
        old_chat = await outbox.take(bot_id=BOT, lease=LEASE, ordering_key="chat:-100")
        assert old_chat is not None and old_chat.key == "idem:7:o:2"  # 1 no longer blocks it
        new_chat = await outbox.take(bot_id=BOT, lease=LEASE, ordering_key="chat:-1001234")
        assert new_chat is not None and (new_chat.key, new_chat.params) == (first.key, moved)
        assert await outbox.retry(new_chat, delay=0, error="again")  # no params: kept
        kept = await outbox.get(first.key)
        assert kept is not None and (kept.params, kept.ordering_key) == (moved, "chat:-1001234")

    @pytest.mark.parametrize("status", [CallStatus.DEAD, CallStatus.UNKNOWN])
    @pytest.mark.asyncio
    async def test_a_dead_or_unknown_call_stops_blocking_its_chat(
        self,
        outbox: Outbox,
        clock: ManualClock,
        status: Literal[CallStatus.DEAD, CallStatus.UNKNOWN],
    ) -> None:
        taken = await held(outbox, call(1, "chat:a"))
        await outbox.enqueue(call(2, "chat:a"))
        clock.advance(2)
        error = "Bad Request: chat not found"
        assert await outbox.settle(taken, status=status, error=error)
        entry = await outbox.get(taken.key)
        assert entry is not None
        assert (entry.status, entry.last_error, entry.result) == (status, error, None)
        assert entry.settled_at == approx(clock.now)
        assert keys_of(list(await outbox.entries(status=status))) == [taken.key]
        assert not await outbox.settle(taken, status=status, error="again")
        assert not await outbox.deliver(taken, result=b"late")
        nxt = await outbox.take(bot_id=BOT, lease=LEASE)
        assert nxt is not None and nxt.key == "idem:7:o:2"
