"""One asyncio lock per key, created on first use and dropped when nobody holds or
awaits it: the per-chat ordering of an in-process update processor."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["KeyedLocks"]


class KeyedLocks:
    """Serialise holders of one key in arrival order; different keys never wait for each
    other. ``asyncio.Lock`` wakes its waiters first in, first out, so holders of a key run
    in the order they called :meth:`hold`."""

    __slots__ = ("_locks",)

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        """Keys held or awaited now."""
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def hold(self, key: str | None) -> AsyncIterator[None]:
        """Hold ``key`` for the block (``None``: no ordering, enter at once)."""
        if key is None:
            yield
            return
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
