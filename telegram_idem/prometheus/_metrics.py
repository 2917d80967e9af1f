"""``PrometheusMetrics``: the decision events and the store gauges in one registry."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from telegram_idem.errors import ConfigurationError
from telegram_idem.events import DecisionEvent, Subscription, subscribe
from telegram_idem.inbox import Inbox
from telegram_idem.outbox import Outbox
from telegram_idem.prometheus._events import DECISION_BUCKETS, WAIT_BUCKETS, EventMetrics
from telegram_idem.prometheus._store import StoreCollector, StoreReading

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["PrometheusMetrics"]


class PrometheusMetrics:
    """Prometheus metrics of the guards' decisions and of the store, for one process.

    A decision hook (:func:`telegram_idem.events.subscribe`) counts every decision event;
    a collector reads the inbox and outbox numbers when Prometheus scrapes. Metric names
    (``namespace`` ``telegram_idem``; units in the names)::

        telegram_idem_decisions_total{boundary,decision,handler}
        telegram_idem_decision_seconds{boundary,decision}            (histogram)
        telegram_idem_telegram_retry_after_total{method}
        telegram_idem_telegram_retry_after_seconds_total{method}
        telegram_idem_flood_wait_seconds{method}                     (histogram)
        telegram_idem_store_up{part}                                 (inbox, outbox)
        telegram_idem_inbox_entries{status}
        telegram_idem_inbox_oldest_age_seconds{status}
        telegram_idem_outbox_entries{status}

    Labels never carry a key or an id (one series per boundary, decision and handler).

    Mount it one of two ways, after :meth:`start` inside the event loop that runs the
    store (or with ``loop=``)::

        metrics = PrometheusMetrics(inbox=inbox, outbox=outbox).start()
        metrics.add_route(app)                    # aiohttp: GET /metrics on your app
        # or: prometheus_client.start_http_server(9464) (its own thread; default registry)

    Either way the store reads run on the store's loop, bounded by ``store_timeout``,
    and never block it (:mod:`telegram_idem.prometheus._store`); a store that cannot be
    read in time reports ``telegram_idem_store_up{part} 0`` and the scrape succeeds.

    Args:
        registry: where the metrics are registered (default ``prometheus_client.REGISTRY``,
            the one ``start_http_server`` serves).
        namespace: the prefix of every metric name.
        inbox: an inbox whose depth and oldest ages to report, or ``None``.
        outbox: an outbox whose entries per status to report, or ``None``.
        bot_id: report only this bot's outbox entries (``None``: all bots').
        store_timeout: seconds a scrape waits for each store read (> 0).
        loop: the event loop the inbox and outbox run on (default: the one running when
            :meth:`start` is called).
        decision_buckets: seconds, the buckets of ``…_decision_seconds``.
        wait_buckets: seconds, the buckets of ``…_flood_wait_seconds``.

    Raises:
        ValueError: ``store_timeout`` ≤ 0.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        namespace: str = "telegram_idem",
        inbox: Inbox | None = None,
        outbox: Outbox | None = None,
        bot_id: int | None = None,
        store_timeout: float = 2.0,
        loop: asyncio.AbstractEventLoop | None = None,
        decision_buckets: Sequence[float] = DECISION_BUCKETS,
        wait_buckets: Sequence[float] = WAIT_BUCKETS,
    ) -> None:
        if not store_timeout > 0:
            raise ValueError("store_timeout must be > 0 seconds")
        self.registry = registry if registry is not None else REGISTRY
        self.namespace = namespace
        self._events = EventMetrics(
            namespace, decision_buckets=decision_buckets, wait_buckets=wait_buckets
        )
        self._store = StoreCollector(
            namespace, inbox=inbox, outbox=outbox, bot_id=bot_id, timeout=store_timeout
        )
        self._loop = loop
        self._subscription: Subscription | None = None

    @property
    def started(self) -> bool:
        """Whether it is subscribed and registered."""
        return self._subscription is not None

    def start(self) -> Self:
        """Register the metrics and subscribe to the decision events. Calling it again
        while started does nothing.

        Returns:
            ``self``.

        Raises:
            ConfigurationError: an inbox or outbox is given, no ``loop`` was, and no event
                loop is running (the store reads need the loop the store runs on).
            ValueError: a metric of the same name is already in ``registry`` (another
                ``PrometheusMetrics`` with the same namespace).
        """
        if self._subscription is not None:
            return self
        loop = self._loop
        if loop is None and self._store.parts:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                raise ConfigurationError(
                    "PrometheusMetrics reads the inbox/outbox on their event loop: start it "
                    "inside that loop, or pass loop="
                ) from None
        self._store.loop = loop
        registered: list[Any] = []
        try:
            for collector in (*self._events.collectors, self._store):
                self.registry.register(collector)
                registered.append(collector)
        except ValueError:
            for collector in registered:
                self.registry.unregister(collector)
            raise
        self._subscription = subscribe(self._observe)
        return self

    def stop(self) -> None:
        """Unsubscribe and unregister (the counts are kept for a later :meth:`start`).
        Calling it again does nothing."""
        subscription, self._subscription = self._subscription, None
        if subscription is None:
            return
        subscription()
        for collector in (*self._events.collectors, self._store):
            self.registry.unregister(collector)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _observe(self, event: DecisionEvent) -> None:
        self._events.observe(event)

    async def refresh(self) -> StoreReading:
        """Read the store gauges now (each part bounded by ``store_timeout``), for a
        scrape rendered on the loop right after (what the aiohttp route does). Never
        raises for a store that cannot be read: that part reads as down.

        Returns:
            The reading.
        """
        return await self._store.refresh()

    async def render(self) -> bytes:
        """The exposition text of the registry, with the store read now
        (:meth:`refresh`, then ``generate_latest`` on the loop)."""
        await self.refresh()
        return generate_latest(self.registry)

    def add_route(self, app: web.Application, path: str = "/metrics") -> None:
        """Serve the metrics at ``GET path`` on an aiohttp application (needs aiohttp:
        extra ``aiohttp``).

        Args:
            app: the application (not yet started).
            path: the route.
        """
        from aiohttp import web

        async def metrics(request: web.Request) -> web.Response:
            body = await self.render()
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        app.router.add_get(path, metrics)
