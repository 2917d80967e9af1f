"""A local, always-following copy of the state bucket (one watcher per inbox object).

The watcher is an ordered consumer over the bucket's stream, so the copy is always a
*prefix* of the bucket's history: it may lag, never reorder. Decisions read the copy and
write with compare-and-set on the revision they read, so a stale copy only costs a failed
write, never a wrong one. :meth:`View.sync` waits until the copy holds at least the
bucket's last revision at the time of the call: read-your-writes across processes for
one round trip (the stream's info)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.js.kv import KeyValue

from telegram_idem.backends.nats._state import State

__all__ = ["Known", "View"]

log = logging.getLogger("telegram_idem.nats")

LAG_TIMEOUT = 1.0
"""Seconds :meth:`View.sync` waits for the watcher before it starts a new one."""
CLOSE_TIMEOUT = 2.0
"""Seconds closing the watcher may take (its unsubscribe may never be answered)."""
SYNC_TIMEOUT = 5.0
"""Seconds :meth:`View.sync` then waits for the new one before it gives up."""


@dataclass(frozen=True, slots=True)
class Known:
    """A bucket entry as the copy holds it.

    Attributes:
        revision: its revision (the bucket stream's sequence): the compare-and-set token.
        state: its state.
    """

    revision: int
    state: State


class View:
    """The copy of one bucket.

    Args:
        kv: the bucket.
        last_revision: reads the bucket stream's last sequence (one round trip).
    """

    def __init__(self, kv: KeyValue, last_revision: Callable[[], Awaitable[int]]) -> None:
        self._kv = kv
        self._last_revision = last_revision
        self.known: dict[str, Known] = {}
        self._seen = 0
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    def _start(self) -> None:
        self.known = {}
        self._seen = 0
        self._task = asyncio.ensure_future(self._follow())

    async def _follow(self) -> None:
        try:
            watcher = await self._kv.watch(">")
        except Exception as exc:  # the next sync starts again, and reports the outage
            log.info("state watcher could not start: %s", exc)
            return
        try:
            async for update in watcher:
                if update is None:  # the end of the initial snapshot
                    continue
                async with self._changed:
                    self._apply(update)
                    self._changed.notify_all()
        except Exception as exc:
            log.info("state watcher ended: %s", exc)
        finally:
            with contextlib.suppress(Exception):  # bounded: a lost connection never answers
                await asyncio.wait_for(watcher.stop(), CLOSE_TIMEOUT)  # type: ignore[no-untyped-call]

    def _apply(self, update: KeyValue.Entry) -> None:
        revision = update.revision or 0
        self._seen = max(self._seen, revision)
        current = self.known.get(update.key)
        if current is not None and current.revision >= revision:
            return  # this process noted a later write already
        if update.operation is not None or not update.value:  # DEL / PURGE
            self.known.pop(update.key, None)
            return
        try:
            self.known[update.key] = Known(revision, State.decode(update.value))
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a value the inbox did not write at %s", update.key)

    def note(self, key: str, revision: int, state: State | None) -> None:
        """Record this process's own write at once (the watcher confirms it later).

        Args:
            key: the bucket key.
            revision: the revision the write returned.
            state: the state written (``None``: deleted).
        """
        current = self.known.get(key)
        if current is not None and current.revision >= revision:
            return
        if state is None:
            self.known.pop(key, None)
        else:
            self.known[key] = Known(revision, state)

    async def sync(self) -> None:
        """Wait until the copy holds the bucket's last revision as of now.

        Raises:
            nats errors: the server could not answer (the caller translates them).
        """
        if self._task is None or self._task.done():
            self._start()
        last = await self._last_revision()
        if await self._reaches(last, LAG_TIMEOUT):
            return
        # A watcher that stopped hearing the bucket (its server restarted, its ordered
        # consumer is gone) does not catch up: follow again from a fresh snapshot.
        log.info("state watcher lags behind revision %d; following the bucket again", last)
        await self.close()
        self._start()
        if not await self._reaches(last, SYNC_TIMEOUT):
            await self.close()
            raise TimeoutError(f"the state bucket's watcher did not reach revision {last}")

    async def _reaches(self, revision: int, within: float) -> bool:
        async with self._changed:
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self._seen >= revision), within
                )
            except TimeoutError:
                return False
        return True

    async def close(self) -> None:
        """Stop following."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, CLOSE_TIMEOUT)
