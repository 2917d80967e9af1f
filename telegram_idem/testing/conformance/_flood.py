"""The flood-budget contract, for stores that keep one (the rules of the
:class:`~telegram_idem.flood.FloodBudget` module docstring): a bucket's burst then one
call per interval, all-or-nothing reservations over several buckets, gates paused by a
429 (pauses never shorten), races of many reservations, budgets shared by the store
objects of one URL."""

from __future__ import annotations

import asyncio

import pytest

from telegram_idem._clock import ManualClock
from telegram_idem.backends import Store, flood_budget_of
from telegram_idem.flood import Bucket, FloodBudget
from telegram_idem.testing.conformance._base import ConformanceBase, StoreMaker

__all__ = ["FloodBudgetContract"]

GLOBAL = Bucket("idem:7:f:global", interval=1 / 30, burst=30)
"""Telegram's "about 30 messages per second" of one bot, as a bucket."""


def _approx(seconds: float) -> object:
    return pytest.approx(seconds, abs=0.01)


class FloodBudgetContract(ConformanceBase):
    """The flood budget of ``store.flood_budget()`` (see the module docstring)."""

    @pytest.fixture
    def budget(self, store: Store) -> FloodBudget:
        """The flood budget of ``store`` (through
        :func:`~telegram_idem.backends.flood_budget_of`)."""
        return flood_budget_of(store)

    @pytest.mark.asyncio
    async def test_a_bucket_passes_its_burst_then_one_call_per_interval(
        self, budget: FloodBudget, clock: ManualClock
    ) -> None:
        chat = Bucket("idem:7:f:chat:1", interval=1.0, burst=3)
        assert [await budget.reserve([chat]) for _ in range(3)] == [0.0, 0.0, 0.0]
        assert await budget.reserve([chat]) == _approx(1.0)
        assert await budget.reserve([chat]) == _approx(1.0)  # a refusal spends nothing
        clock.advance(0.5)
        assert await budget.reserve([chat]) == _approx(0.5)
        clock.advance(0.5)
        assert await budget.reserve([chat]) == 0.0
        assert await budget.reserve([chat]) == _approx(1.0)
        clock.advance(10)  # idle: the burst refills, never beyond it
        assert [await budget.reserve([chat]) for _ in range(4)][3] == _approx(1.0)

    @pytest.mark.asyncio
    async def test_a_window_passes_at_most_burst_plus_window_over_interval(
        self, budget: FloodBudget, clock: ManualClock
    ) -> None:
        group = Bucket("idem:7:f:chat:-100", interval=3.0, burst=2)  # 20 a minute
        passed = 0
        for _ in range(60):  # one attempt every 0.5 s for 30 s
            if await budget.reserve([group]) == 0.0:
                passed += 1
            clock.advance(0.5)
        # the burst at once, then one per interval: t = 0, 0.5, 3, 6, ... 27 (the bound
        # burst + T / interval = 12 is reached only by a window that ends at an interval)
        assert passed == 11

    @pytest.mark.asyncio
    async def test_buckets_are_independent(self, budget: FloodBudget) -> None:
        a = Bucket("idem:7:f:chat:a", interval=10.0, burst=1)
        b = Bucket("idem:7:f:chat:b", interval=10.0, burst=1)
        other_bot = Bucket("idem:8:f:chat:a", interval=10.0, burst=1)
        assert await budget.reserve([a]) == 0.0
        assert await budget.reserve([b]) == 0.0
        assert await budget.reserve([other_bot]) == 0.0
        assert await budget.reserve([a]) > 0

    @pytest.mark.asyncio
    async def test_a_reservation_takes_every_bucket_or_none(
        self, budget: FloodBudget, clock: ManualClock
    ) -> None:
        chat = Bucket("idem:7:f:chat:1", interval=5.0, burst=1)
        spare = Bucket("idem:7:f:chat:2", interval=5.0, burst=1)
        assert await budget.reserve([GLOBAL, chat]) == 0.0
        assert await budget.reserve([GLOBAL, spare, chat]) == _approx(5.0)
        assert await budget.reserve([spare]) == 0.0  # the refused reservation spent nothing
        assert await budget.reserve([spare]) == _approx(5.0)

    @pytest.mark.asyncio
    async def test_the_wait_is_the_longest_of_the_buckets_that_refuse(
        self, budget: FloodBudget, clock: ManualClock
    ) -> None:
        short = Bucket("idem:7:f:chat:1", interval=2.0, burst=1)
        long = Bucket("idem:7:f:chat:2", interval=7.0, burst=1)
        assert await budget.reserve([short, long]) == 0.0
        assert await budget.reserve([short, long]) == _approx(7.0)
        clock.advance(2)
        assert await budget.reserve([long, short]) == _approx(5.0)
        clock.advance(5)
        assert await budget.reserve([long, short]) == 0.0

    @pytest.mark.asyncio
    async def test_a_paused_gate_refuses_until_its_pause_ends(
        self, budget: FloodBudget, clock: ManualClock
    ) -> None:
        gate = Bucket.gate("idem:7:f:pause")
        assert await budget.paused_for(gate.key) == 0.0
        assert await budget.reserve([gate, GLOBAL]) == 0.0  # an open gate stays open
        assert await budget.reserve([gate]) == 0.0
        assert await budget.paused_for(gate.key) == 0.0
        await budget.pause(gate.key, 12.0)  # a 429 with retry_after 12
        assert await budget.paused_for(gate.key) == _approx(12.0)
        chat = Bucket("idem:7:f:chat:1", interval=1.0, burst=1)
        assert await budget.reserve([gate, chat]) == _approx(12.0)
        clock.advance(4)
        assert await budget.paused_for(gate.key) == _approx(8.0)
        assert await budget.reserve([chat, gate]) == _approx(8.0)
        clock.advance(8)
        assert await budget.paused_for(gate.key) == 0.0
        assert await budget.reserve([gate, chat]) == 0.0  # chat was never spent while paused
        assert await budget.reserve([chat]) == _approx(1.0)

    @pytest.mark.asyncio
    async def test_pauses_never_shorten_each_other(
        self, budget: FloodBudget, clock: ManualClock
    ) -> None:
        await budget.pause("idem:7:f:pause", 30.0)
        await budget.pause("idem:7:f:pause", 5.0)  # a later, shorter 429 from another process
        assert await budget.paused_for("idem:7:f:pause") == _approx(30.0)
        clock.advance(10)
        await budget.pause("idem:7:f:pause", 40.0)
        assert await budget.paused_for("idem:7:f:pause") == _approx(40.0)
        assert await budget.paused_for("idem:8:f:pause") == 0.0  # another bot's gate

    @pytest.mark.asyncio
    async def test_concurrent_reservations_pass_exactly_the_burst(
        self, budget: FloodBudget
    ) -> None:
        bucket = Bucket("idem:7:f:chat:1", interval=100.0, burst=5)
        waits = await asyncio.gather(*(budget.reserve([bucket, GLOBAL]) for _ in range(40)))
        assert waits.count(0.0) == 5
        assert all(w > 0 for w in waits if w != 0.0)

    @pytest.mark.idem_shared_state
    @pytest.mark.asyncio
    async def test_store_objects_of_one_url_share_budgets(self, store_factory: StoreMaker) -> None:
        budgets = [flood_budget_of(await store_factory()) for _ in range(4)]
        bucket = Bucket("idem:7:f:chat:1", interval=100.0, burst=6)
        waits = await asyncio.gather(*(budgets[i % 4].reserve([bucket]) for i in range(30)))
        assert waits.count(0.0) == 6
        await budgets[0].pause("idem:7:f:pause", 20.0)
        assert await budgets[3].paused_for("idem:7:f:pause") == _approx(20.0)
        assert await budgets[2].reserve([Bucket.gate("idem:7:f:pause")]) == _approx(20.0)

    @pytest.mark.asyncio
    async def test_the_budget_is_one_object_per_store(self, store: Store) -> None:
        assert flood_budget_of(store) is flood_budget_of(store)
