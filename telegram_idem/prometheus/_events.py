"""The decision events as Prometheus counters and histograms (one hook, no store reads)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import Counter, Histogram
from prometheus_client.registry import Collector

from telegram_idem.events import DecisionEvent

__all__ = ["DECISION_BUCKETS", "WAIT_BUCKETS", "EventMetrics"]

DECISION_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
"""Seconds: the default buckets of ``…_decision_seconds`` (a store round trip: half a
millisecond on SQLite to seconds on a struggling server)."""

WAIT_BUCKETS: tuple[float, ...] = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Seconds: the default buckets of ``…_flood_wait_seconds``."""


class EventMetrics:
    """The counters and histograms fed by :meth:`observe` (a decision hook).

    Args:
        namespace: the metric name prefix (``telegram_idem``).
        decision_buckets: seconds, the buckets of ``…_decision_seconds``.
        wait_buckets: seconds, the buckets of ``…_flood_wait_seconds``.
    """

    def __init__(
        self,
        namespace: str,
        *,
        decision_buckets: Sequence[float] = DECISION_BUCKETS,
        wait_buckets: Sequence[float] = WAIT_BUCKETS,
    ) -> None:
        self.decisions = Counter(
            "decisions",
            "Guard decisions, by boundary, decision and handler (the step's name, or the "
            "Bot API method for outbox and flood control).",
            ["boundary", "decision", "handler"],
            namespace=namespace,
            registry=None,
        )
        self.decision_seconds = Histogram(
            "decision_seconds",
            "Seconds the store took to decide (claims, inbox admissions, outbox calls); "
            "decisions whose time is not measured (locks, flood control) are not observed.",
            ["boundary", "decision"],
            namespace=namespace,
            buckets=tuple(decision_buckets),
            registry=None,
        )
        self.retry_after = Counter(
            "telegram_retry_after",
            "429 answers from Telegram (flood control paused the bot), by Bot API method.",
            ["method"],
            namespace=namespace,
            registry=None,
        )
        self.retry_after_seconds = Counter(
            "telegram_retry_after_seconds",
            "Seconds of pause the 429 answers asked for, by Bot API method.",
            ["method"],
            namespace=namespace,
            registry=None,
        )
        self.flood_wait = Histogram(
            "flood_wait_seconds",
            "Seconds calls waited for their flood-control budgets, by Bot API method.",
            ["method"],
            namespace=namespace,
            buckets=tuple(wait_buckets),
            registry=None,
        )

    @property
    def collectors(self) -> tuple[Collector, ...]:
        """What to register."""
        return (
            self.decisions,
            self.decision_seconds,
            self.retry_after,
            self.retry_after_seconds,
            self.flood_wait,
        )

    def observe(self, event: DecisionEvent) -> None:
        """Count one decision event (the hook: quick, never blocking). Labels are the
        boundary, the decision and the handler or method only: never a key or an id."""
        handler = event.handler or ""
        self.decisions.labels(event.boundary, event.decision, handler).inc()
        if event.boundary == "flood":
            seconds = event.seconds or 0.0
            if event.decision == "retry_after":
                self.retry_after.labels(handler).inc()
                self.retry_after_seconds.labels(handler).inc(seconds)
            elif event.decision == "wait":
                self.flood_wait.labels(handler).observe(seconds)
            return
        if event.elapsed_ms > 0:
            self.decision_seconds.labels(event.boundary, event.decision).observe(
                event.elapsed_ms / 1000
            )
