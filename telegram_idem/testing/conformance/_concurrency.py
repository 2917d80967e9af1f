"""Concurrency: one key claimed at once from many connections and OS processes."""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing
from typing import Any

import pytest

from telegram_idem._clock import ManualClock
from telegram_idem._records import Outcome
from telegram_idem.backends import Store
from telegram_idem.testing.conformance._base import ConformanceBase, StoreMaker

__all__ = ["ConcurrencyContract"]

KEY = "idem:7000000001:u:734519002"


def _conformance_class(module: str, qualname: str) -> Any:
    """The class ``qualname`` of ``module``, imported here (its stores register)."""
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _claim_in_process(
    where: tuple[str, str], url: str, key: str, n: int, queue: multiprocessing.Queue[list[str]]
) -> None:
    """In a child process: ``n`` concurrent claims of ``key`` on a store of ``url`` made
    by the conformance class ``where`` (module, qualname); the outcomes go to ``queue``."""
    conformance = _conformance_class(*where)()

    async def run() -> list[str]:
        store: Store = conformance.open_store(url, None)
        try:
            claims = await asyncio.gather(
                *(store.claim(key, lease=60, retention=3600) for _ in range(n))
            )
            return [c.outcome.value for c in claims]
        finally:
            await store.close()

    queue.put(asyncio.run(run()))


class ConcurrencyContract(ConformanceBase):
    """Races: many claims of one key at once acquire it once, from one connection, from
    separate connections and from separate OS processes; a zombie loses across
    connections."""

    @pytest.mark.asyncio
    async def test_concurrent_claims_of_one_key_on_one_object_acquire_once(
        self, store: Store
    ) -> None:
        claims = await asyncio.gather(
            *(store.claim(KEY, lease=30, retention=3600) for _ in range(20))
        )
        outcomes = [c.outcome for c in claims]
        assert outcomes.count(Outcome.ACQUIRED) == 1
        assert outcomes.count(Outcome.IN_PROGRESS) == 19
        assert len({c.token for c in claims}) == 1

    @pytest.mark.asyncio
    async def test_50_concurrent_claims_from_separate_connections_acquire_once(
        self, store_factory: StoreMaker
    ) -> None:
        if self.shares_state:
            stores = [await store_factory() for _ in range(50)]
        else:
            stores = [await store_factory()] * 50
        claims = await asyncio.gather(
            *(s.claim(KEY, fingerprint="fp", lease=30, retention=3600) for s in stores)
        )
        outcomes = [c.outcome for c in claims]
        assert outcomes.count(Outcome.ACQUIRED) == 1
        assert set(outcomes) == {Outcome.ACQUIRED, Outcome.IN_PROGRESS}
        assert len({c.token for c in claims}) == 1

    @pytest.mark.asyncio
    async def test_zombie_completion_after_takeover_is_rejected_across_connections(
        self, store_factory: StoreMaker, clock: ManualClock
    ) -> None:
        first = await store_factory()
        second = await store_factory() if self.shares_state else first
        zombie = await first.claim(KEY, lease=30, retention=3600)
        clock.advance(31)
        heir = await second.claim(KEY, lease=30, retention=3600)
        assert heir.outcome is Outcome.ACQUIRED
        assert heir.token == zombie.token + 1
        assert await second.complete(KEY, heir.token, b'"heir"', retention=3600)
        assert not await first.complete(KEY, zombie.token, b'"zombie"', retention=3600)
        assert not await first.release(KEY, zombie.token)
        replay = await first.claim(KEY, lease=30, retention=3600)
        assert replay.outcome is Outcome.REPLAY
        assert replay.record.result == b'"heir"'

    @pytest.mark.idem_shared_state
    def test_claims_from_4_os_processes_acquire_once(self, store_url: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        queue: multiprocessing.Queue[list[str]] = ctx.Queue()
        where = (type(self).__module__, type(self).__qualname__)
        procs = [
            ctx.Process(target=_claim_in_process, args=(where, store_url, KEY, 10, queue))
            for _ in range(4)
        ]
        for p in procs:
            p.start()
        results = [queue.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
        outcomes = [o for r in results for o in r]
        assert len(outcomes) == 40
        assert outcomes.count("acquired") == 1, outcomes
