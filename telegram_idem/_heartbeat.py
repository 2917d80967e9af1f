"""Lease heartbeats for long work: one ticker per event loop for every holder.

Registering a holder is a dict insert and leaving is a dict pop, so work that finishes
before its first beat (almost all of it) costs nothing more: the ticker task starts only
when the earliest beat is due (a timer until then, cancelled when the last holder
leaves), then wakes while holders exist and extends each lease that is due, every
``interval`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["heartbeat"]

log = logging.getLogger("telegram_idem")

Extend = Callable[[], Awaitable[bool]]


@dataclass(slots=True)
class _Holder:
    extend: Extend
    interval: float
    due: float
    name: str
    beating: bool = False


class _Ticker:
    """Extends the leases of the holders of one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._holders: dict[int, _Holder] = {}
        self._ids = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._start_at: asyncio.TimerHandle | None = None
        self._beats: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()

    def add(self, extend: Extend, interval: float, name: str) -> int:
        hid = next(self._ids)
        self._holders[hid] = _Holder(extend, interval, time.monotonic() + interval, name)
        if self._task is None or self._task.done():
            # A timer, not a task, until a beat is due: a task started and ended per
            # holder cost each short run ~20 µs (benchmarks/redis_profile.py).
            at = self.loop.time() + interval
            if self._start_at is None or self._start_at.when() > at:
                if self._start_at is not None:
                    self._start_at.cancel()
                self._start_at = self.loop.call_at(at, self._start)
        elif interval < 1.0:
            self._wake.set()  # a short interval may be due before the ticker's next look
        return hid

    def _start(self) -> None:
        self._start_at = None
        if self._holders and (self._task is None or self._task.done()):
            self._task = self.loop.create_task(self._run())

    def remove(self, hid: int) -> None:
        self._holders.pop(hid, None)
        if not self._holders:
            # The ticker ends now rather than at its next look (up to 1 s): a loop
            # closed right after the last holder left (PTB's run_polling closes its loop
            # without cancelling tasks) finds no pending ticker to complain about.
            self._wake.set()
            if self._start_at is not None:
                self._start_at.cancel()
                self._start_at = None

    async def _run(self) -> None:
        while self._holders:
            now = time.monotonic()
            next_due = min(h.due for h in self._holders.values())
            if next_due > now:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(next_due - now, 1.0)):
                        await self._wake.wait()
                continue
            for hid, holder in list(self._holders.items()):
                if holder.due <= now and not holder.beating:
                    holder.beating = True
                    task = self.loop.create_task(self._beat(hid, holder))
                    self._beats.add(task)
                    task.add_done_callback(self._beats.discard)
            await asyncio.sleep(0)

    async def _beat(self, hid: int, holder: _Holder) -> None:
        if hid not in self._holders:
            # The holder left between this beat's scheduling and its start, and may have
            # released already: an extend now would renew a released lease (a holder
            # past its lease may still extend), holding the key for one more lease.
            holder.beating = False
            return
        try:
            held = await holder.extend()
        except Exception:  # an outage must not kill the work; completion will tell
            if hid in self._holders:
                log.warning("heartbeat of %s failed; trying again", holder.name, exc_info=True)
            held = True
        holder.beating = False
        if not held:
            if self._holders.pop(hid, None) is not None:
                log.error("lease of %s lost: another holder took it over", holder.name)
            return
        holder.due = time.monotonic() + holder.interval


_tickers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Ticker] = (
    weakref.WeakKeyDictionary()
)


# The ticker used last (one loop is the usual case), found without the weak mapping; it
# keeps that one loop alive until another loop's ticker is used.
_last: _Ticker | None = None


def _ticker_of(loop: asyncio.AbstractEventLoop) -> _Ticker:
    global _last
    last = _last
    if last is not None and last.loop is loop:
        return last
    ticker = _tickers.get(loop)
    if ticker is None:
        ticker = _tickers[loop] = _Ticker(loop)
    _last = ticker
    return ticker


class heartbeat:
    """Call ``extend()`` every ``interval`` seconds while the ``with`` block runs.

    A class, not a generator-based context manager: entering and leaving is on the path
    of every update (a generator's ``with`` costs several times more).

    Args:
        extend: renews the lease; ``False`` means the lease was lost (beats stop).
        interval: seconds between beats (a third of the lease is usual).
        name: what is held, for the log.
        enabled: ``False`` does nothing.
    """

    __slots__ = ("_enabled", "_extend", "_hid", "_interval", "_name", "_ticker")

    def __init__(self, extend: Extend, *, interval: float, name: str, enabled: bool = True) -> None:
        self._extend = extend
        self._interval = interval
        self._name = name
        self._enabled = enabled
        self._ticker: _Ticker | None = None
        self._hid = 0

    def __enter__(self) -> None:
        if not self._enabled:
            return
        ticker = _ticker_of(asyncio.get_running_loop())
        self._hid = ticker.add(self._extend, self._interval, self._name)
        self._ticker = ticker

    def __exit__(self, *exc: object) -> None:
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.remove(self._hid)
