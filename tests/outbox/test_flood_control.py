"""FloodControl: a call waits until every budget it spends has room, a 429 pauses the
whole bot for every FloodControl sharing the budget, a deadline gives up without
reserving."""

from __future__ import annotations

import os
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from outbox.outbox_support import BOT_ID, ClockBudget

from telegram_idem._clock import ManualClock
from telegram_idem._keys import KeyBuilder
from telegram_idem.backends import store_from_url
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.errors import ConfigurationError
from telegram_idem.flood import (
    BULK,
    HEADROOM_JITTER,
    REPLY,
    FloodControl,
    Limits,
    Rate,
    buckets_for,
    current_priority,
    decide,
    priority,
)


def control(budget: ClockBudget, **kwargs: object) -> FloodControl:
    clock = budget.clock
    assert isinstance(clock, ManualClock)

    async def sleep(seconds: float) -> None:  # time passes on the store's clock
        clock.advance(seconds)

    return FloodControl(budget, bot_id=BOT_ID, sleep=sleep, **kwargs)  # type: ignore[arg-type]


async def test_a_private_chat_gets_its_burst_then_one_per_second() -> None:
    budget = ClockBudget(ManualClock())
    flood = control(budget, limits=Limits(chat=Rate(1, 1.0, burst=2)))
    waits = [await flood.wait_turn("sendMessage", {"chat_id": 7}) for _ in range(4)]
    assert waits[:2] == [0.0, 0.0]
    assert waits[2] == pytest.approx(1.0) and waits[3] == pytest.approx(1.0)
    other = await flood.wait_turn("sendMessage", {"chat_id": 8})
    assert other == 0.0  # another chat has its own budget


async def test_answers_only_wait_at_the_gate() -> None:
    budget = ClockBudget(ManualClock())
    flood = control(budget, limits=Limits(chat=Rate(1, 1.0, burst=1)))
    for _ in range(5):
        assert await flood.wait_turn("answerCallbackQuery", {"callback_query_id": "q"}) == 0.0


async def test_a_429_pauses_every_process_of_the_bot() -> None:
    budget = ClockBudget(ManualClock())
    one, two = control(budget), control(budget)
    await one.retry_after(5)
    assert await two.paused_for() == pytest.approx(5.0)
    waited = await two.wait_turn("answerCallbackQuery", {"callback_query_id": "q"})
    assert waited == pytest.approx(5.0)
    await one.retry_after(1)  # a shorter pause never shortens a longer one
    await one.retry_after(3)
    assert await two.paused_for() == pytest.approx(3.0)


async def test_another_bot_or_prefix_is_not_paused() -> None:
    budget = ClockBudget(ManualClock())
    await control(budget).retry_after(30)
    other_bot = FloodControl(budget, bot_id=BOT_ID + 1)
    tenant = FloodControl(budget, bot_id=BOT_ID, keys=KeyBuilder("tenant"))
    assert await other_bot.paused_for() == 0.0 and await tenant.paused_for() == 0.0


async def test_a_deadline_gives_up_without_reserving() -> None:
    budget = ClockBudget(ManualClock())
    flood = control(budget)
    await flood.retry_after(60)
    before = budget.reservations
    with pytest.raises(TimeoutError):
        await flood.wait_turn("sendMessage", {"chat_id": 1}, deadline=time.monotonic() + 1)
    assert budget.reservations == before


async def test_bulk_sends_leave_the_burst_to_replies() -> None:
    budget = ClockBudget(ManualClock())
    flood = control(budget, limits=Limits(global_=Rate(10, 1.0, burst=10), bulk_share=0.5))
    bulk = [await flood.wait_turn("sendMessage", {"chat_id": i}, priority=BULK) for i in range(6)]
    assert bulk[:5] == [0.0] * 5 and bulk[5] > 0
    replies = [await flood.wait_turn("sendMessage", {"chat_id": 100 + i}) for i in range(4)]
    assert replies == [0.0] * 4  # the other half of the burst was kept for them


async def test_a_priority_block_is_the_default_of_the_calls_inside_it() -> None:
    budget = ClockBudget(ManualClock())
    flood = control(budget, limits=Limits(global_=Rate(10, 1.0, burst=10), bulk_share=0.5))
    with priority(BULK):
        bulk = [await flood.wait_turn("sendMessage", {"chat_id": i}) for i in range(6)]
        assert current_priority() == BULK and current_priority(REPLY) == REPLY
        explicit = await flood.try_turn("sendMessage", {"chat_id": 50}, priority=REPLY)
    assert bulk[:5] == [0.0] * 5 and bulk[5] > 0  # half the burst, as priority=BULK
    assert explicit == 0.0  # an explicit priority wins over the block's
    assert current_priority() == REPLY  # the block is over
    with pytest.raises(ValueError, match="from 0 to 10"):
        with priority(11):
            pass
    with pytest.raises(ValueError):
        with priority(True):
            pass


def test_for_store_needs_a_store_with_a_budget() -> None:
    budget = ClockBudget(ManualClock())

    class WithBudget:
        def flood_budget(self) -> ClockBudget:
            return budget

    assert FloodControl.for_store(WithBudget(), bot_id=1).budget is budget
    with pytest.raises(ConfigurationError):
        FloodControl.for_store(object(), bot_id=1)


# ----------------------------------------------------------------- group and paid budgets
# FloodControl itself on real stores (not the fake's enforcement, which shares the rule):
# memory on a manual clock, where a whole minute can pass; SQLite, PostgreSQL and Redis on
# their own clocks, where the pause FloodControl reports is the evidence.

GROUP = -100123
OPEN = Rate(10_000, 1.0, burst=10_000)
"""A budget that never makes a call wait (to look at one other budget alone)."""


def sequence(i: int) -> str:
    """The 21 calls to one group: sends, with edits at 6th and 21st place (edits count)."""
    return "editMessageText" if i in (5, 20) else "sendMessage"


def params(method: str, chat: int, **extra: object) -> dict[str, object]:
    if method == "editMessageText":
        return {"chat_id": chat, "message_id": 1, "text": "edited", **extra}
    return {"chat_id": chat, "text": "hi", **extra}


@pytest.mark.parametrize("limits", [Limits(), Limits().with_headroom()], ids=["limits", "default"])
async def test_no_minute_holds_more_than_20_messages_or_edits_in_a_group(limits: Limits) -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)

    async def sleep(seconds: float) -> None:  # time passes on the store's clock
        clock.advance(seconds)

    flood = FloodControl(store.flood_budget(), bot_id=BOT_ID, limits=limits, sleep=sleep)
    start = clock()
    at: list[float] = []
    waits: list[float] = []
    for i in range(42):
        waits.append(await flood.wait_turn(sequence(i % 21), params(sequence(i % 21), GROUP)))
        at.append(clock() - start)  # when the call was let through, on the store's clock
    assert waits[0] == 0.0 and waits[20] > 0  # the 21st within the minute waited...
    assert at[20] >= 60.0 - 1e-3  # ...until the first one was a minute old
    for first in range(len(at) - 20):
        assert at[first + 20] - at[first] >= 60.0 - 1e-3  # in no minute more than 20
    assert await flood.try_turn("sendMessage", {"chat_id": GROUP - 1}) == 0.0  # own budget
    for _ in range(30):  # an edit in a private chat spends no budget
        assert await flood.try_turn("editMessageText", params("editMessageText", 7)) == 0.0


def unique_bot() -> int:
    return 900_000_000 + int.from_bytes(os.urandom(3), "big")


@pytest.fixture(
    params=[
        pytest.param("memory"),
        pytest.param("sqlite", marks=pytest.mark.sqlite),
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("redis", marks=pytest.mark.redis),
    ]
)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """A store with a flood budget on its own (real) clock."""
    if request.param == "memory":
        made: Any = MemoryStore()
    else:
        made = store_from_url(request.getfixturevalue(f"{request.param}_url_factory")())
    yield made
    await made.close()


async def test_a_groups_21st_call_in_a_minute_is_refused_until_its_turn(store: Any) -> None:
    limits = Limits(global_=OPEN, chat=OPEN, group=Rate(20, 60.0, burst=20))
    flood = FloodControl.for_store(store, bot_id=unique_bot(), limits=limits)
    for i in range(20):  # 19 sends and an edit: the whole burst
        method = "editMessageText" if i == 5 else "sendMessage"
        assert await flood.try_turn(method, params(method, GROUP)) == 0.0
    for method in ("sendMessage", "editMessageText"):  # the 21st, a send or an edit
        wait = await flood.try_turn(method, params(method, GROUP))
        assert 2.0 < wait <= 3.0 + 1e-6  # the next place in the group: 60 s / 20 after
    again = await flood.try_turn("sendMessage", params("sendMessage", GROUP))
    assert again > 2.0  # a refused call reserved nothing: still no room
    assert await flood.try_turn("sendMessage", params("sendMessage", GROUP - 1)) == 0.0
    assert await flood.try_turn("sendMessage", params("sendMessage", 7)) == 0.0


async def test_paid_broadcasts_spend_their_own_budget_not_the_free_one(store: Any) -> None:
    limits = Limits(
        global_=Rate(5, 60.0, burst=5), chat=OPEN, group=OPEN, paid=Rate(10, 60.0, burst=10)
    )
    paid = {"allow_paid_broadcast": True}
    free_first = FloodControl.for_store(store, bot_id=unique_bot(), limits=limits)
    for chat in range(1, 6):
        assert await free_first.try_turn("sendMessage", params("sendMessage", chat)) == 0.0
    assert await free_first.try_turn("sendMessage", params("sendMessage", 6)) > 0  # spent
    for chat in range(1, 11):  # the free budget is spent: paid calls still go
        assert await free_first.try_turn("sendMessage", params("sendMessage", chat, **paid)) == 0
    assert await free_first.try_turn("sendMessage", params("sendMessage", 11, **paid)) > 0

    paid_first = FloodControl.for_store(store, bot_id=unique_bot(), limits=limits)
    for chat in range(1, 11):
        assert await paid_first.try_turn("sendPhoto", params("sendMessage", chat, **paid)) == 0
    assert await paid_first.try_turn("sendMessage", params("sendMessage", 11, **paid)) > 0
    for chat in range(1, 6):  # the paid budget is spent: free calls still have all theirs
        assert await paid_first.try_turn("sendMessage", params("sendMessage", chat)) == 0.0
    assert await paid_first.try_turn("sendMessage", params("sendMessage", 6)) > 0


def refused_on_arrival(delay: Callable[[float], float], limits: Limits) -> int:
    """Reserve 300 messages to 100 chats as fast as ``limits`` let them (store clock),
    each reaching the server ``delay(reserved_at)`` seconds after its reservation, and
    count the calls Telegram's own ``Limits()`` refuses in arrival order (the rule
    ``FakeBotAPI(limits=Limits())`` enforces)."""
    key = str
    arrivals: list[tuple[float, int]] = []
    tats: dict[str, float] = {}
    now = 0.0
    for i in range(300):
        buckets = buckets_for("sendMessage", {"chat_id": 1 + i % 100}, limits=limits, key=key)
        while True:
            wait, new = decide([tats.get(b.key) for b in buckets], buckets, now)
            if wait <= 0:
                break
            now += wait
        tats.update({b.key: t for b, t in zip(buckets, new, strict=True)})
        arrivals.append((now + delay(now), 1 + i % 100))
    server: dict[str, float] = {}
    refused = 0
    for at, chat in sorted(arrivals):
        buckets = buckets_for("sendMessage", {"chat_id": chat}, limits=Limits(), key=key)
        wait, new = decide([server.get(b.key) for b in buckets], buckets, at)
        if wait > 0:
            refused += 1
        else:
            server.update({b.key: t for b, t in zip(buckets, new, strict=True)})
    return refused


@pytest.mark.parametrize("jitter", [0.1, HEADROOM_JITTER, 0.3])
def test_with_headroom_keeps_arrivals_inside_the_limits_within_its_jitter(jitter: float) -> None:
    spread = random.Random(10)
    limits = Limits().with_headroom(jitter)
    for _ in range(20):
        assert refused_on_arrival(lambda _: spread.uniform(0.0, jitter), limits) == 0

        # the worst spread: every call of the first `jitter` seconds lands at its end
        # (a hair inside it: on the boundary itself, float rounding decides)
        def cold(at: float) -> float:
            return max(0.0, 0.999 * jitter - at)

        assert refused_on_arrival(cold, limits) == 0


def test_delays_spread_beyond_the_headroom_are_refused() -> None:
    def cold(at: float) -> float:  # the first 0.4 s of calls land together, as a cold
        return max(0.0, 0.4 - at)  # process's did before the relay warmed its session

    assert refused_on_arrival(cold, Limits().with_headroom()) > 0
    assert refused_on_arrival(cold, Limits().with_headroom(0.5)) == 0
    assert refused_on_arrival(lambda _: 0.0, Limits()) == 0  # no spread: no room needed


def test_the_default_headroom_is_what_each_rate_spends_in_its_jitter() -> None:
    limits = Limits().with_headroom()
    assert HEADROOM_JITTER == 0.2
    assert limits.global_.burst == 24  # 30 - 30/s × 0.2 s
    assert limits.chat.burst == 2 and limits.group.burst == 2  # at least one call
    assert limits.paid.burst == 800  # 1000 - 1000/s × 0.2 s
    assert Limits().with_headroom(0.1).global_.burst == 27
    assert limits.global_.calls == 30  # rates kept
    assert Limits().with_headroom(0) == Limits()
    with pytest.raises(ValueError):
        Limits().with_headroom(-0.1)
