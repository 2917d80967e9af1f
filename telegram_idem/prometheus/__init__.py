"""Prometheus metrics from the decision events, and store gauges read at scrape time
(extra ``prometheus``: ``pip install 'telegram-idem[prometheus]'``).

:class:`PrometheusMetrics` subscribes to :mod:`telegram_idem.events` (the one source of
every decision) and registers a :class:`StoreCollector` for the inbox and outbox numbers;
see its docstring for the metric names and how to mount ``/metrics``, and
``docs/metrics.md`` for the Grafana dashboard.
"""

from __future__ import annotations

from telegram_idem.prometheus._events import DECISION_BUCKETS, WAIT_BUCKETS
from telegram_idem.prometheus._metrics import PrometheusMetrics
from telegram_idem.prometheus._store import StoreCollector, StoreReading

__all__ = [
    "DECISION_BUCKETS",
    "WAIT_BUCKETS",
    "PrometheusMetrics",
    "StoreCollector",
    "StoreReading",
]
