"""Workers: take inbox entries with a lease, run the bot's dispatch, ack.

Many chats run in parallel (``concurrency`` tasks); the inbox guarantees at most one entry
per chat is in flight, in admission order. A failure is retried with exponential backoff
(``backoff_base * 2**(attempt-1)`` seconds, at most ``backoff_max``); after
``max_attempts`` the entry becomes a dead letter an operator can list and re-drive. A
worker that dies leaves its entry in flight until the lease ends; then another takes it.
Graceful shutdown (:meth:`InboxWorker.stop`) finishes in-flight entries within a grace
period and returns the rest to the inbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from telegram_idem.errors import StoreError
from telegram_idem.inbox.base import Inbox, InboxEntry

__all__ = ["Dispatch", "InboxWorker"]

log = logging.getLogger("telegram_idem.worker")

Dispatch = Callable[[dict[str, Any]], Awaitable[Any]]
"""Processes one update (a Bot API update dict); raising means "retry"."""


class InboxWorker:
    """A pool of tasks draining one inbox.

    Args:
        inbox: the inbox (``store.inbox()``).
        dispatch: processes one update: e.g. :func:`telegram_idem.adapters.aiogram.inbox_dispatch`.
        concurrency: entries processed at once (different chats).
        lease: seconds an entry is held; a heartbeat extends it every ``lease / 3``.
        max_attempts: takes before an entry becomes a dead letter (≥ 1).
        backoff_base, backoff_max: seconds of the retry delay schedule.
        poll_interval: seconds to wait when the inbox is empty (or until :meth:`notify`).
    """

    def __init__(
        self,
        inbox: Inbox,
        dispatch: Dispatch,
        *,
        concurrency: int = 8,
        lease: float = 60.0,
        max_attempts: int = 5,
        backoff_base: float = 1.0,
        backoff_max: float = 300.0,
        poll_interval: float = 0.5,
    ) -> None:
        if concurrency < 1 or max_attempts < 1 or lease <= 0:
            raise ValueError("concurrency and max_attempts must be ≥ 1 and lease > 0")
        self.inbox = inbox
        self.dispatch = dispatch
        self.concurrency = concurrency
        self.lease = lease
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.poll_interval = poll_interval
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._in_flight: dict[asyncio.Task[Any], InboxEntry] = {}
        self.processed = 0
        self.failures = 0

    def notify(self) -> None:
        """Wake idle workers now (ingress calls it after admitting an update)."""
        self._wake.set()

    def backoff(self, attempts: int) -> float:
        """Seconds to wait before attempt ``attempts + 1``."""
        return float(min(self.backoff_base * 2 ** max(attempts - 1, 0), self.backoff_max))

    async def run_once(self) -> bool:
        """Take and process one entry; ``False`` if none was takeable.

        Raises:
            StoreError: the inbox could not answer.
        """
        # A take cancelled mid-flight (shutdown) may still commit in the store: finish it
        # and hand the entry straight back, so it does not wait out a lease.
        taking = asyncio.ensure_future(self.inbox.take(lease=self.lease))
        try:
            entry = await asyncio.shield(taking)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                taken = await taking
                if taken is not None:
                    await self.inbox.retry(taken, delay=0.0, error="worker shut down")
            raise
        if entry is None:
            return False
        task = asyncio.create_task(self._process(entry))
        self._in_flight[task] = entry
        try:
            await asyncio.shield(task)
        finally:
            self._in_flight.pop(task, None)
        return True

    async def _process(self, entry: InboxEntry) -> None:
        beat = asyncio.create_task(self._heartbeat(entry))
        try:
            await self.dispatch(json.loads(entry.payload))
        except Exception as exc:
            self.failures += 1
            await self._failed(entry, exc)
            return
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        self.processed += 1
        if not await self.inbox.ack(entry):
            log.warning("entry %s finished after its lease was taken over", entry.id)

    async def _failed(self, entry: InboxEntry, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        if entry.attempts >= self.max_attempts:
            log.error(
                "entry %s dead-lettered after %d attempts: %s", entry.id, entry.attempts, error
            )
            await self.inbox.bury(entry, error=error)
        else:
            delay = self.backoff(entry.attempts)
            log.warning(
                "entry %s failed (attempt %d), retry in %.1f s: %s",
                entry.id,
                entry.attempts,
                delay,
                error,
            )
            await self.inbox.retry(entry, delay=delay, error=error)

    async def _heartbeat(self, entry: InboxEntry) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                if not await self.inbox.extend(entry, lease=self.lease):
                    log.error("lease of entry %s lost", entry.id)
                    return
            except StoreError:
                log.warning("heartbeat of entry %s failed", entry.id, exc_info=True)

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                took = await self.run_once()
            except StoreError:
                log.warning("inbox unavailable; retrying", exc_info=True)
                took = False
            if not took:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_interval):
                        await self._wake.wait()
            else:
                self._wake.set()  # there may be more: let idle siblings look too

    def start(self) -> None:
        """Start ``concurrency`` worker tasks in the running loop."""
        self._stopping.clear()
        self._tasks = [asyncio.create_task(self._loop()) for _ in range(self.concurrency)]

    async def stop(self, *, grace: float = 30.0) -> None:
        """Stop taking entries; let in-flight ones finish for ``grace`` seconds, then
        cancel them and return their entries to the inbox (retry without delay)."""
        self._stopping.set()
        self._wake.set()
        if self._in_flight:
            await asyncio.wait(list(self._in_flight), timeout=grace)
        for task, entry in list(self._in_flight.items()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            with contextlib.suppress(StoreError):
                await self.inbox.retry(entry, delay=0.0, error="worker shut down")
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def drain(self, *, limit: float = 60.0) -> None:
        """Process until the inbox has nothing takeable (tests and demos), at most
        ``limit`` seconds.

        Raises:
            TimeoutError: entries remain after ``limit`` seconds.
        """
        async with asyncio.timeout(limit):
            while await self.inbox.depth() > 0 or self._in_flight:
                if not self._tasks and not await self.run_once():
                    await asyncio.sleep(0.01)
                elif self._tasks:
                    await asyncio.sleep(0.01)
