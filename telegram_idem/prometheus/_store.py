"""Store gauges read at scrape time: inbox depth and oldest age per status, outbox entries
per status, and whether the store could be read.

Prometheus collects synchronously, while the stores are asyncio objects bound to the
event loop that made them. So the reads always run *on that loop*:

- a scrape from another thread (``prometheus_client.start_http_server``, a WSGI app,
  ``generate_latest`` in ``asyncio.to_thread``) schedules them there and waits at most
  ``timeout`` seconds (``asyncio.run_coroutine_threadsafe``): the loop is never blocked;
- a scrape on the loop itself cannot wait for the loop, so it uses the reading of the
  latest :meth:`StoreCollector.refresh`, which the aiohttp route awaits just before it
  renders (:meth:`telegram_idem.prometheus.PrometheusMetrics.add_route`).

A store that cannot be read in time (an outage, a closed port) makes
``…_store_up{part}`` 0 and leaves that part's gauges out; the scrape itself succeeds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from telegram_idem.inbox import EntryStatus, Inbox
from telegram_idem.outbox import CallStatus, Outbox

__all__ = ["StoreCollector", "StoreReading"]

log = logging.getLogger("telegram_idem.prometheus")


@dataclass(frozen=True, slots=True)
class StoreReading:
    """One reading of the store gauges.

    Attributes:
        up: part (``"inbox"``, ``"outbox"``) → whether it could be read.
        inbox_entries: inbox status → entries (every status; empty when not read).
        inbox_oldest_age: inbox status → seconds its oldest entry has waited since
            admission (``0.0`` for a status with none).
        outbox_entries: outbox status → entries (every status; empty when not read).
        read_at: ``time.monotonic()`` when the reading ended.
    """

    up: dict[str, bool] = field(default_factory=dict)
    inbox_entries: dict[str, int] = field(default_factory=dict)
    inbox_oldest_age: dict[str, float] = field(default_factory=dict)
    outbox_entries: dict[str, int] = field(default_factory=dict)
    read_at: float = 0.0


class StoreCollector(Collector):
    """A Prometheus collector of an inbox's and an outbox's numbers (see the module
    docstring for where the reads run).

    Args:
        namespace: the metric name prefix.
        inbox: the inbox to read (``Inbox.stats()``), or ``None``.
        outbox: the outbox to read (``Outbox.counts(bot_id=bot_id)``), or ``None``.
        bot_id: count only this bot's outbox entries (``None``: every bot's).
        timeout: seconds a scrape waits for the reads; past it, the part is down.
    """

    def __init__(
        self,
        namespace: str,
        *,
        inbox: Inbox | None,
        outbox: Outbox | None,
        bot_id: int | None,
        timeout: float,
    ) -> None:
        self.namespace = namespace
        self.inbox = inbox
        self.outbox = outbox
        self.bot_id = bot_id
        self.timeout = timeout
        self.loop: asyncio.AbstractEventLoop | None = None
        self._last = StoreReading()
        self._lock = threading.Lock()
        self._down: set[str] = set()

    @property
    def parts(self) -> tuple[str, ...]:
        """The parts read: ``"inbox"`` and/or ``"outbox"``."""
        return tuple(
            name for name, part in (("inbox", self.inbox), ("outbox", self.outbox)) if part
        )

    async def refresh(self) -> StoreReading:
        """Read the store now, on the running loop, each part bounded by ``timeout``;
        the reading is kept for scrapes on the loop. Never raises for a store that
        cannot be read (that part is down)."""
        reading = await self._read()
        with self._lock:
            self._last = reading
        return reading

    async def _read(self) -> StoreReading:
        """The inbox and the outbox are read at once, so a scrape waits at most
        ``timeout`` in all, not once per part."""
        reading = StoreReading()
        await asyncio.gather(self._read_inbox(reading), self._read_outbox(reading))
        return dataclasses.replace(reading, read_at=time.monotonic())

    async def _read_inbox(self, reading: StoreReading) -> None:
        if self.inbox is None:
            return
        try:
            async with asyncio.timeout(self.timeout):
                stats = await self.inbox.stats()
        except Exception as exc:
            self._mark("inbox", exc)
            reading.up["inbox"] = False
        else:
            self._mark("inbox", None)
            reading.up["inbox"] = True
            for status in EntryStatus:
                reading.inbox_entries[status.value] = int(stats.counts.get(status, 0))
                reading.inbox_oldest_age[status.value] = stats.oldest_age(status)

    async def _read_outbox(self, reading: StoreReading) -> None:
        if self.outbox is None:
            return
        try:
            async with asyncio.timeout(self.timeout):
                counts = await self.outbox.counts(bot_id=self.bot_id)
        except Exception as exc:
            self._mark("outbox", exc)
            reading.up["outbox"] = False
        else:
            self._mark("outbox", None)
            reading.up["outbox"] = True
            for call_status in CallStatus:
                reading.outbox_entries[call_status.value] = int(counts.get(call_status, 0))

    def _mark(self, part: str, error: BaseException | None) -> None:
        """Log a part going down (WARNING) or coming back (INFO), once per change."""
        with self._lock:
            was_down = part in self._down
            if error is None:
                self._down.discard(part)
            else:
                self._down.add(part)
        if error is not None and not was_down:
            log.warning(
                "metrics: the %s cannot be read (%s); %s_store_up{part=%r} is 0 until it can",
                part,
                f"timed out after {self.timeout} s"
                if isinstance(error, TimeoutError)
                else f"{type(error).__name__}: {error}",
                self.namespace,
                part,
            )
        elif error is None and was_down:
            log.info("metrics: the %s can be read again", part)

    def reading(self) -> StoreReading:
        """The reading for a scrape happening now (see the module docstring)."""
        if not self.parts:
            return StoreReading()
        loop = self.loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return StoreReading(up=dict.fromkeys(self.parts, False))
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            with self._lock:
                return self._last
        future = asyncio.run_coroutine_threadsafe(self.refresh(), loop)
        try:
            # The reads time out by themselves; the margin covers the loop being busy.
            return future.result(self.timeout * 2 + 1.0)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            future.cancel()
            for part in self.parts:
                self._mark(part, TimeoutError())
            return StoreReading(up=dict.fromkeys(self.parts, False))

    def describe(self) -> Iterator[Metric]:
        """The families' names, without reading the store (registration asks for them)."""
        return iter(self._families(StoreReading()))

    def collect(self) -> Iterator[Metric]:
        """The gauges of a reading taken for this scrape."""
        return iter(self._families(self.reading()))

    def _families(self, reading: StoreReading) -> list[Metric]:
        ns = self.namespace
        up = GaugeMetricFamily(
            f"{ns}_store_up",
            "1 if the part of the store could be read at this scrape, else 0.",
            labels=["part"],
        )
        for part in self.parts:
            up.add_metric([part], 1.0 if reading.up.get(part) else 0.0)
        families: list[Metric] = [up]
        if self.inbox is not None:
            depth = GaugeMetricFamily(
                f"{ns}_inbox_entries", "Inbox entries, by status.", labels=["status"]
            )
            age = GaugeMetricFamily(
                f"{ns}_inbox_oldest_age_seconds",
                "Seconds the oldest inbox entry of each status has waited since admission "
                "(0 when the status has none).",
                labels=["status"],
            )
            for status, count in reading.inbox_entries.items():
                depth.add_metric([status], float(count))
            for status, seconds in reading.inbox_oldest_age.items():
                age.add_metric([status], seconds)
            families += [depth, age]
        if self.outbox is not None:
            calls = GaugeMetricFamily(
                f"{ns}_outbox_entries", "Outbox entries, by status.", labels=["status"]
            )
            for status, count in reading.outbox_entries.items():
                calls.add_metric([status], float(count))
            families.append(calls)
        return families
