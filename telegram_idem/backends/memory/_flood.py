"""The flood budget of :class:`~telegram_idem.backends.memory.MemoryStore` (one process
only): :func:`telegram_idem.flood.decide` over a dict of ``tat`` values."""

from __future__ import annotations

from collections.abc import Sequence

from telegram_idem._clock import Clock
from telegram_idem.flood import Bucket, FloodBudget, decide

__all__ = ["MemoryFloodBudget"]

FORGET_AFTER = 60.0
"""Seconds after its ``tat`` has passed that a key is forgotten (it is a full bucket then,
as its ``tat`` said anyway)."""


class MemoryFloodBudget(FloodBudget):
    """GCRA ``tat`` values in a dict; every method is atomic (no await inside), so the
    tasks of one event loop share one budget. Processes do not: each has its own.

    Args:
        clock: seconds since the epoch (the store's clock).
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._tats: dict[str, float] = {}
        self._swept_at = float("-inf")

    def _now(self) -> float:
        """The clock, after forgetting the keys whose ``tat`` passed more than
        :data:`FORGET_AFTER` seconds ago (swept at most once per that interval)."""
        now = self._clock()
        if now - self._swept_at >= FORGET_AFTER:
            self._swept_at = now
            stale = [k for k, tat in self._tats.items() if tat < now - FORGET_AFTER]
            for key in stale:
                del self._tats[key]
        return now

    async def reserve(self, buckets: Sequence[Bucket]) -> float:
        now = self._now()
        wait, new = decide([self._tats.get(b.key) for b in buckets], buckets, now)
        if wait > 0:
            return wait
        for bucket, tat in zip(buckets, new, strict=True):
            self._tats[bucket.key] = max(self._tats.get(bucket.key, tat), tat)
        return 0.0

    async def pause(self, key: str, seconds: float) -> None:
        now = self._now()
        self._tats[key] = max(self._tats.get(key, now), now + seconds)

    async def paused_for(self, key: str) -> float:
        now = self._now()
        return max(self._tats.get(key, now) - now, 0.0)

    def __len__(self) -> int:
        return len(self._tats)
