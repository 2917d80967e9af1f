"""The outbox contract, operator side and edges: parked chats, redrive, resolve, listing
and counts, retention of settled entries, races of many takers (one object and separate
connections), exact bytes, long and Unicode keys."""

from __future__ import annotations

import asyncio
import json
from typing import ClassVar, Literal

import pytest

from telegram_idem._clock import ManualClock
from telegram_idem._keys import bounded_key
from telegram_idem.backends import Store, outbox_of
from telegram_idem.outbox import CallStatus, NewCall, Outbox
from telegram_idem.testing.conformance._base import StoreMaker
from telegram_idem.testing.conformance._outbox import (
    BOT,
    LEASE,
    OutboxContract,
    approx,
    call,
    held,
    keys_of,
    to_status,
)
from telegram_idem.testing.conformance._payloads import ODD_PAYLOADS, ODD_TEXTS

__all__ = ["ODD_KEYS", "OutboxOpsContract"]

ODD_KEYS = [
    bounded_key("idem:7:o:" + "x" * 13_000),  # bounded: a head and a hash
    "idem:7:o:привет 👍🏽 שלום",
    bounded_key("idem:7:o:\ud800\x00tap"),  # a lone surrogate and NUL, spelled out
]
"""Effect keys as :func:`~telegram_idem._keys.bounded_key` gives them: long, Unicode."""


async def _relay(
    outboxes: list[Outbox], chats: int, per_chat: int, workers: int
) -> tuple[dict[str, list[str]], int]:
    """``workers`` relays taking from ``outboxes`` (round robin) until every call is
    delivered; returns each chat's delivery order and the most calls of one chat seen in
    flight at once."""
    holding: dict[str, int] = {}
    order: dict[str, list[str]] = {}
    most = 0
    done = 0
    total = chats * per_chat

    async def work(n: int) -> None:
        nonlocal most, done
        outbox = outboxes[n % len(outboxes)]
        for _ in range(50 * total):
            if done >= total:
                return
            entry = await outbox.take(bot_id=BOT, lease=LEASE)
            if entry is None:
                await asyncio.sleep(0.001)
                continue
            holding[entry.ordering_key] = holding.get(entry.ordering_key, 0) + 1
            most = max(most, holding[entry.ordering_key])
            await asyncio.sleep(0)  # let the others race while this call is "sent"
            order.setdefault(entry.ordering_key, []).append(entry.key)
            holding[entry.ordering_key] -= 1
            assert await outbox.deliver(entry, result=b"true")
            done += 1

    await asyncio.gather(*(work(n) for n in range(workers)))
    return order, most


async def _enqueue_chats(outboxes: list[Outbox], chats: int, per_chat: int) -> dict[str, list[str]]:
    """Enqueue ``per_chat`` calls into each of ``chats`` chats, interleaved; returns each
    chat's keys in enqueue order."""
    expected: dict[str, list[str]] = {}
    for i in range(per_chat):
        for c in range(chats):
            new = call(f"{c}-{i}", f"chat:{c}")
            await outboxes[(i + c) % len(outboxes)].enqueue(new)
            expected.setdefault(f"chat:{c}", []).append(new.key)
    return expected


class OutboxOpsContract(OutboxContract):
    """The operator side of ``store.outbox()`` and its edges (see the module docstring).

    Attributes:
        settled_expiry: how the store ends a settled entry's retention: ``"clock"`` (by
            the store's clock, the test's ``idem_clock``: the tests move it) or
            ``"wall"`` (by real time, a server-side TTL: the tests use a 1 s retention
            and sleep 1.5 s).
    """

    settled_expiry: ClassVar[Literal["clock", "wall"]] = "clock"

    # ----------------------------------------------------------------- parked chats

    @pytest.mark.asyncio
    async def test_park_parks_the_chat_until_unpark_restores_it_in_order(
        self, outbox: Outbox, clock: ManualClock
    ) -> None:
        for name, chat in [(1, "chat:a"), (2, "chat:a"), (3, "chat:b"), (4, "chat:a")]:
            await outbox.enqueue(call(name, chat))
        await outbox.enqueue(call("other-bot", "chat:a", bot=8))
        blocked = await outbox.take(bot_id=BOT, lease=LEASE)
        assert blocked is not None and blocked.key == "idem:7:o:1"
        clock.advance(1)
        assert await outbox.park(blocked, error="Forbidden: bot was blocked by the user")
        for name in (1, 2, 4):
            entry = await outbox.get(f"idem:7:o:{name}")
            assert entry is not None and entry.status is CallStatus.PARKED, name
            assert entry.settled_at == approx(clock.now)
        first = await outbox.get(blocked.key)
        assert first is not None and first.last_error == "Forbidden: bot was blocked by the user"
        assert await outbox.parked_units() == [(BOT, "chat:a")]
        assert await outbox.parked_units(bot_id=8) == []
        # other chats, and bot 8's chat of the same name, go on
        b = await outbox.take(bot_id=BOT, lease=LEASE)
        assert b is not None and b.key == "idem:7:o:3"
        assert await outbox.take(bot_id=BOT, lease=LEASE) is None
        other = await outbox.take(bot_id=8, lease=LEASE)
        assert other is not None and other.key == "idem:8:o:other-bot"
        # a later call to the parked chat is stored parked
        late, created = await outbox.enqueue(call(5, "chat:a"))
        assert created and late.status is CallStatus.PARKED
        assert await outbox.take(bot_id=BOT, lease=LEASE, ordering_key="chat:a") is None
        assert await outbox.unpark(bot_id=BOT, ordering_key="chat:a") == 4
        assert await outbox.parked_units() == []
        order = []
        for _ in range(4):
            entry = await outbox.take(bot_id=BOT, lease=LEASE, ordering_key="chat:a")
            assert entry is not None and entry.status is CallStatus.IN_FLIGHT
            order.append(entry.key)
            assert await outbox.deliver(entry, result=b"true")
        assert order == ["idem:7:o:1", "idem:7:o:2", "idem:7:o:4", "idem:7:o:5"]
        fresh, _ = await outbox.enqueue(call(6, "chat:a"))
        assert fresh.status is CallStatus.PENDING

    @pytest.mark.asyncio
    async def test_parked_units_are_listed_per_bot_and_unpark_counts(self, outbox: Outbox) -> None:
        for bot, chat in [(7, "chat:a"), (7, "chat:b"), (8, "chat:a")]:
            entry = await held(outbox, call(f"{chat}", chat, bot=bot))
            assert await outbox.park(entry, error="Forbidden")
        assert sorted(await outbox.parked_units()) == [(7, "chat:a"), (7, "chat:b"), (8, "chat:a")]
        assert sorted(await outbox.parked_units(bot_id=7)) == [(7, "chat:a"), (7, "chat:b")]
        assert await outbox.unpark(bot_id=7, ordering_key="chat:nowhere") == 0
        assert await outbox.unpark(bot_id=7, ordering_key="chat:a") == 1
        assert await outbox.unpark(bot_id=7, ordering_key="chat:a") == 0
        assert sorted(await outbox.parked_units()) == [(7, "chat:b"), (8, "chat:a")]
        assert await outbox.counts(bot_id=8) == {CallStatus.PARKED: 1}

    # ----------------------------------------------------------------- redrive, resolve

    @pytest.mark.parametrize("status", [CallStatus.DEAD, CallStatus.UNKNOWN])
    @pytest.mark.asyncio
    async def test_redrive_puts_a_dead_or_unknown_call_at_the_back_of_its_chat(
        self, outbox: Outbox, status: Literal[CallStatus.DEAD, CallStatus.UNKNOWN]
    ) -> None:
        for name in (1, 2, 3):
            await outbox.enqueue(call(name, "chat:a"))
        first = await outbox.take(bot_id=BOT, lease=LEASE)
        assert first is not None and first.key == "idem:7:o:1"
        assert await outbox.settle(first, status=status, error="boom")
        assert await outbox.redrive(first.key)
        assert not await outbox.redrive(first.key)  # pending now
        back = await outbox.get(first.key)
        third = await outbox.get("idem:7:o:3")
        assert back is not None and third is not None
        assert (back.status, back.attempts) == (CallStatus.PENDING, 0)
        assert back.seq > third.seq
        order = []
        for _ in range(3):
            entry = await outbox.take(bot_id=BOT, lease=LEASE)
            assert entry is not None
            order.append(entry.key)
            assert await outbox.deliver(entry, result=b"true")
        assert order == ["idem:7:o:2", "idem:7:o:3", "idem:7:o:1"]
        again = await outbox.get(first.key)
        assert again is not None and again.attempts == 1 and again.token > first.token

    @pytest.mark.asyncio
    async def test_a_redriven_call_waits_behind_its_chats_call_in_flight(
        self, outbox: Outbox
    ) -> None:
        await outbox.enqueue(call(1, "chat:a"))
        await outbox.enqueue(call(2, "chat:a"))
        poison = await outbox.take(bot_id=BOT, lease=LEASE)
        assert poison is not None and await outbox.settle(
            poison, status=CallStatus.DEAD, error="bad"
        )
        second = await outbox.take(bot_id=BOT, lease=LEASE)
        assert second is not None and second.key == "idem:7:o:2"
        assert await outbox.redrive(poison.key)
        assert await outbox.take(bot_id=BOT, lease=LEASE) is None  # never two of one chat
        assert await outbox.deliver(second, result=b"true")
        again = await outbox.take(bot_id=BOT, lease=LEASE)
        assert again is not None and again.key == poison.key

    @pytest.mark.asyncio
    async def test_redrive_of_a_parked_call_leaves_the_chat_parked(self, outbox: Outbox) -> None:
        blocked = await held(outbox, call(1, "chat:a"))
        assert await outbox.park(blocked, error="Forbidden")
        assert await outbox.redrive(blocked.key)
        back = await outbox.take(bot_id=BOT, lease=LEASE)
        assert back is not None and back.key == blocked.key and back.attempts == 1
        assert await outbox.parked_units() == [(BOT, "chat:a")]
        later, _ = await outbox.enqueue(call(2, "chat:a"))
        assert later.status is CallStatus.PARKED

    @pytest.mark.parametrize(
        "status",
        [CallStatus.PENDING, CallStatus.IN_FLIGHT, CallStatus.DELIVERED, CallStatus.SUPERSEDED],
    )
    @pytest.mark.asyncio
    async def test_redrive_refuses_a_live_or_settled_call(
        self, outbox: Outbox, status: CallStatus
    ) -> None:
        new = await to_status(outbox, status, "x")
        before = await outbox.get(new.key)
        assert not await outbox.redrive(new.key)
        assert await outbox.get(new.key) == before
        assert not await outbox.redrive("idem:7:o:never")

    @pytest.mark.asyncio
    async def test_resolve_settles_an_unknown_call_as_delivered(
        self, outbox: Outbox, clock: ManualClock
    ) -> None:
        sent = await held(outbox, call(1))
        assert await outbox.settle(sent, status=CallStatus.UNKNOWN, error="timed out")
        assert [e.key for e in await outbox.entries(status=CallStatus.UNKNOWN)] == [sent.key]
        clock.advance(60)
        assert await outbox.resolve(sent.key, result=b'{"message_id":5}')
        entry = await outbox.get(sent.key)
        assert entry is not None
        assert (entry.status, entry.result) == (CallStatus.DELIVERED, b'{"message_id":5}')
        assert entry.settled_at == approx(clock.now)
        assert not await outbox.resolve(sent.key, result=b"again")
        assert not await outbox.redrive(sent.key)
        assert await outbox.entries(status=CallStatus.UNKNOWN) == []

    @pytest.mark.parametrize(
        "status",
        [CallStatus.PENDING, CallStatus.IN_FLIGHT, CallStatus.DEAD, CallStatus.PARKED],
    )
    @pytest.mark.asyncio
    async def test_resolve_refuses_a_call_that_is_not_unknown(
        self, outbox: Outbox, status: CallStatus
    ) -> None:
        new = await to_status(outbox, status, "x")
        before = await outbox.get(new.key)
        assert not await outbox.resolve(new.key, result=b"true")
        assert await outbox.get(new.key) == before
        assert not await outbox.resolve("idem:7:o:never", result=b"true")

    # ----------------------------------------------------------------- listing

    @pytest.mark.asyncio
    async def test_entries_lists_one_status_oldest_first(self, outbox: Outbox) -> None:
        dead = []
        for name, bot in [("d1", 7), ("d2", 8), ("d3", 7), ("d4", 7)]:
            entry = await held(outbox, call(name, f"chat:{name}", bot=bot))
            assert await outbox.settle(entry, status=CallStatus.DEAD, error="x")
            dead.append(entry.key)
        await outbox.enqueue(call("p1", "chat:p"))
        await outbox.enqueue(call("p2", "chat:p", bot=8))
        assert keys_of(list(await outbox.entries(status=CallStatus.DEAD))) == dead
        mine = await outbox.entries(status=CallStatus.DEAD, bot_id=7)
        assert keys_of(list(mine)) == [dead[0], dead[2], dead[3]]
        seqs = [e.seq for e in mine]
        assert seqs == sorted(seqs)
        two = await outbox.entries(status=CallStatus.DEAD, limit=2)
        assert keys_of(list(two)) == dead[:2]
        pending = await outbox.entries(status=CallStatus.PENDING, bot_id=8)
        assert keys_of(list(pending)) == ["idem:8:o:p2"]
        assert await outbox.entries(status=CallStatus.PARKED) == []

    @pytest.mark.asyncio
    async def test_counts_per_status_and_bot(self, outbox: Outbox) -> None:
        for status in CallStatus:
            await to_status(outbox, status, status.value)
        await outbox.enqueue(call("theirs", bot=8))
        counts = {s: n for s, n in (await outbox.counts()).items() if n}
        expected = dict.fromkeys(CallStatus, 1)
        expected[CallStatus.PENDING] += 2  # the newer call of "superseded", bot 8's
        assert counts == expected
        assert {s: n for s, n in (await outbox.counts(bot_id=8)).items() if n} == {
            CallStatus.PENDING: 1
        }
        assert {s: n for s, n in (await outbox.counts(bot_id=9)).items() if n} == {}

    # ----------------------------------------------------------------- retention

    async def _pass_retention(self, clock: ManualClock, retention: float) -> None:
        """Let more than ``retention`` seconds pass, the way this store measures them."""
        clock.advance(retention + 1)
        if self.settled_expiry == "wall":
            await asyncio.sleep(retention + 0.5)

    @pytest.mark.asyncio
    async def test_delivered_and_superseded_calls_expire_after_their_retention(
        self, outbox: Outbox, clock: ManualClock
    ) -> None:
        retention = 1.0 if self.settled_expiry == "wall" else 100.0
        done = await held(outbox, call("done", "chat:a", retention=retention))
        assert await outbox.deliver(done, result=b"true")
        await outbox.enqueue(call("old", "chat:b", collapse="e", retention=retention))
        await outbox.enqueue(call("new", "chat:b", collapse="e", retention=LEASE * 100))
        for name in ("dead", "unknown", "parked", "in-flight"):
            entry = await held(outbox, call(name, f"chat:{name}", retention=retention))
            if name == "dead":
                assert await outbox.settle(entry, status=CallStatus.DEAD, error="x")
            elif name == "unknown":
                assert await outbox.settle(entry, status=CallStatus.UNKNOWN, error="x")
            elif name == "parked":
                assert await outbox.park(entry, error="x")
        await outbox.enqueue(call("pending", "chat:pending", retention=retention))
        replay, created = await outbox.enqueue(call("done", "chat:a", retention=retention))
        assert not created and replay.status is CallStatus.DELIVERED  # kept while retained

        await self._pass_retention(clock, retention)
        assert await outbox.get("idem:7:o:done") is None
        assert await outbox.get("idem:7:o:old") is None
        for name, status in [
            ("new", CallStatus.PENDING),
            ("dead", CallStatus.DEAD),
            ("unknown", CallStatus.UNKNOWN),
            ("parked", CallStatus.PARKED),
            ("in-flight", CallStatus.IN_FLIGHT),
            ("pending", CallStatus.PENDING),
        ]:
            kept = await outbox.get(f"idem:7:o:{name}")
            assert kept is not None and kept.status is status, name  # never by time
        again, created = await outbox.enqueue(call("done", "chat:a", retention=retention))
        assert created and again.status is CallStatus.PENDING  # a new call now

    @pytest.mark.asyncio
    async def test_retention_counts_from_when_the_call_settled(
        self, outbox: Outbox, clock: ManualClock
    ) -> None:
        if self.settled_expiry != "clock":
            pytest.skip("the store measures retention by real time")
        taken = await held(outbox, call(1, retention=100.0))
        clock.advance(80)
        assert await outbox.settle(taken, status=CallStatus.UNKNOWN, error="?")
        clock.advance(80)
        assert await outbox.resolve(taken.key, result=b"true")  # unknown: never expired
        clock.advance(99)
        assert await outbox.get(taken.key) is not None  # 259 s after enqueue, 99 after settle
        clock.advance(2)
        assert await outbox.get(taken.key) is None

    # ----------------------------------------------------------------- races

    @pytest.mark.asyncio
    async def test_concurrent_takers_of_one_chat_take_one_call(self, outbox: Outbox) -> None:
        for i in range(10):
            await outbox.enqueue(call(i, "chat:a"))
        taken = await asyncio.gather(*(outbox.take(bot_id=BOT, lease=LEASE) for _ in range(20)))
        assert keys_of([t for t in taken if t is not None]) == ["idem:7:o:0"]

    @pytest.mark.asyncio
    async def test_racing_relays_deliver_each_chat_in_order_one_at_a_time(
        self, outbox: Outbox
    ) -> None:
        expected = await _enqueue_chats([outbox], chats=4, per_chat=6)
        order, most = await _relay([outbox], chats=4, per_chat=6, workers=8)
        assert most == 1
        assert order == expected
        assert {s: n for s, n in (await outbox.counts()).items() if n} == {CallStatus.DELIVERED: 24}

    @pytest.mark.idem_shared_state
    @pytest.mark.asyncio
    async def test_relays_on_separate_connections_share_one_outbox(
        self, store_factory: StoreMaker
    ) -> None:
        outboxes = [outbox_of(await store_factory()) for _ in range(4)]
        expected = await _enqueue_chats(outboxes, chats=3, per_chat=5)
        stored, created = await outboxes[1].enqueue(call("0-0", "chat:0"))
        assert not created and stored.status is CallStatus.PENDING  # enqueued on another
        order, most = await _relay(outboxes, chats=3, per_chat=5, workers=8)
        assert most == 1
        assert order == expected
        entry = await outboxes[2].get("idem:7:o:2-4")
        assert entry is not None and entry.status is CallStatus.DELIVERED

    @pytest.mark.idem_shared_state
    @pytest.mark.asyncio
    async def test_takers_on_separate_connections_take_one_call_of_a_chat(
        self, store_factory: StoreMaker
    ) -> None:
        outboxes = [outbox_of(await store_factory()) for _ in range(5)]
        for i in range(12):
            await outboxes[i % 5].enqueue(call(i, f"chat:{i % 3}"))
        taken = await asyncio.gather(
            *(outboxes[i % 5].take(bot_id=BOT, lease=LEASE) for i in range(25))
        )
        got = sorted(k for k in keys_of(list(taken)) if k is not None)
        assert got == ["idem:7:o:0", "idem:7:o:1", "idem:7:o:2"]  # one head per chat

    @pytest.mark.idem_shared_state
    @pytest.mark.asyncio
    async def test_parking_and_fencing_hold_across_connections(
        self, store_factory: StoreMaker, clock: ManualClock
    ) -> None:
        one, two = outbox_of(await store_factory()), outbox_of(await store_factory())
        await one.enqueue(call(1, "chat:a"))
        zombie = await one.take(bot_id=BOT, lease=LEASE)
        assert zombie is not None
        clock.advance(LEASE + 1)
        heir = await two.take(bot_id=BOT, lease=LEASE)
        assert heir is not None and heir.token > zombie.token
        assert not await one.deliver(zombie, result=b"zombie")
        assert await two.park(heir, error="Forbidden")
        assert await one.parked_units() == [(BOT, "chat:a")]
        later, _ = await one.enqueue(call(2, "chat:a"))
        assert later.status is CallStatus.PARKED
        assert await one.unpark(bot_id=BOT, ordering_key="chat:a") == 2

    # ----------------------------------------------------------------- bytes and keys

    @pytest.mark.asyncio
    async def test_params_and_results_come_back_as_the_exact_bytes(self, outbox: Outbox) -> None:
        params = [
            json.dumps({"chat_id": 1, "text": t}, separators=(",", ":")).encode("ascii")
            for t in ODD_TEXTS
        ]
        params.append(b'{"chat_id":1,"text":"\\ud800\\u0000\\\\u0041"}')
        params.append(json.dumps({"chat_id": 1, "text": "x" * 65_536}).encode())  # 64 KB
        results = [*ODD_PAYLOADS, b'{"message_id":1,"text":"' + b"y" * 65_536 + b'"}']
        for i, body in enumerate(params):
            entry, _ = await outbox.enqueue(call(f"p{i}", f"chat:p{i}", params=body))
            assert entry.params == body, i
            stored = await outbox.get(entry.key)
            assert stored is not None and stored.params == body, i
            taken = await outbox.take(bot_id=BOT, lease=LEASE, ordering_key=f"chat:p{i}")
            assert taken is not None and taken.params == body, i
            result = results[i % len(results)]
            assert await outbox.deliver(taken, result=result)
            done = await outbox.get(entry.key)
            assert done is not None and done.result == result, i
        for i, result in enumerate(results):
            sent = await held(outbox, call(f"r{i}", f"chat:r{i}"))
            assert await outbox.settle(sent, status=CallStatus.UNKNOWN, error="?")
            assert await outbox.resolve(sent.key, result=result)
            done = await outbox.get(sent.key)
            assert done is not None and done.result == result, i

    @pytest.mark.asyncio
    async def test_retry_replaces_params_with_the_exact_bytes(self, outbox: Outbox) -> None:
        taken = await held(outbox, call(1))
        body = b'{"chat_id":-1001,"text":"\\ud83d\\udc4d \\u202e"}'
        assert await outbox.retry(taken, delay=0, error="migrated", params=body)
        again = await outbox.take(bot_id=BOT, lease=LEASE)
        assert again is not None and again.params == body

    @pytest.mark.asyncio
    async def test_odd_error_text_is_kept_as_text(self, outbox: Outbox) -> None:
        for i, text in enumerate(ODD_TEXTS):
            taken = await held(outbox, call(i, f"chat:{i}"))
            assert await outbox.settle(taken, status=CallStatus.DEAD, error=f"Bad: {text}")
            entry = await outbox.get(taken.key)
            assert entry is not None and entry.last_error is not None
            assert entry.last_error.startswith("Bad: "), i

    @pytest.mark.parametrize("key", ODD_KEYS)
    @pytest.mark.asyncio
    async def test_a_long_or_unicode_key_works_like_any(self, outbox: Outbox, key: str) -> None:
        base = call("k", None, collapse=f"edit:{key}")
        own = NewCall(
            key,
            base.bot_id,
            base.method,
            base.params,
            None,  # the key is the call's unit
            f"edit:{key}",
            base.policy,
        )
        entry, created = await outbox.enqueue(own)
        assert created and entry.key == key and entry.ordering_key == key
        taken = await outbox.take(bot_id=BOT, lease=LEASE, ordering_key=key)
        assert taken is not None and taken.key == key
        assert await outbox.extend(taken, lease=LEASE)
        assert await outbox.settle(taken, status=CallStatus.DEAD, error="x")
        assert keys_of(list(await outbox.entries(status=CallStatus.DEAD))) == [key]
        assert await outbox.redrive(key)
        again = await outbox.take(bot_id=BOT, lease=LEASE)
        assert again is not None and again.key == key
        assert await outbox.deliver(again, result=b"true")
        stored, created = await outbox.enqueue(own)
        assert not created and stored.status is CallStatus.DELIVERED

    @pytest.mark.asyncio
    async def test_the_outbox_is_one_object_per_store(self, store: Store) -> None:
        assert outbox_of(store) is outbox_of(store)
