"""The Grafana dashboard (docs/grafana/telegram-idem.json) is importable and asks only for
metrics the collector exports: every panel's PromQL, parsed, names exported samples."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from telegram_idem import store_from_url
from telegram_idem.events import emit_decision
from telegram_idem.prometheus import PrometheusMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "telegram-idem.json"

FUNCTIONS = {"sum", "min", "max", "avg", "count", "rate", "increase", "histogram_quantile"}
KEYWORDS = {"by", "without", "on", "ignoring", "and", "or", "unless", "bool"}


def dashboard() -> dict[str, Any]:
    loaded = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers left once the label
    matchers, range selectors, groupings and strings are taken out, that are not
    functions, keywords or numbers."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}", "", bare)
    bare = re.sub(r"\[[^\]]*\]", "", bare)
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", bare)
    names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare))
    return names - FUNCTIONS - KEYWORDS


async def exported_samples() -> set[str]:
    """Every sample name the collector exports once each kind of event was seen."""
    store = store_from_url("memory://")
    registry = CollectorRegistry()
    try:
        with PrometheusMetrics(registry, inbox=store.inbox(), outbox=store.outbox()) as metrics:
            emit_decision(
                boundary="update", key="k", decision="acquired", update=None, elapsed_ms=1
            )
            emit_decision(boundary="flood", key="f", decision="retry_after", update=None, seconds=1)
            emit_decision(boundary="flood", key="f", decision="wait", update=None, seconds=1)
            await metrics.refresh()  # the reading a scrape on the loop uses
            return {s.name for family in registry.collect() for s in family.samples}
    finally:
        await store.close()


def test_the_dashboard_is_importable_with_a_prometheus_input() -> None:
    board = dashboard()
    assert [i["name"] for i in board["__inputs"]] == ["DS_PROMETHEUS"]
    assert board["__inputs"][0]["pluginId"] == "prometheus"
    assert board["uid"] and board["title"] and board["id"] is None
    grid: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}"
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & grid, f"{panel['title']} overlaps another panel"
        grid |= cells
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])


async def test_every_panel_queries_only_exported_metrics() -> None:
    exported = await exported_samples()
    used: set[str] = set()
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names, f"{panel['title']}: {target['expr']} selects no metric"
            missing = names - exported
            assert not missing, f"{panel['title']} asks for {sorted(missing)}, not exported"
            used |= names
    # The panels the issue asks for are there: decisions, latency, inbox, outbox, 429s,
    # flood waits, store up.
    for family in (
        "telegram_idem_decisions_total",
        "telegram_idem_decision_seconds_bucket",
        "telegram_idem_inbox_entries",
        "telegram_idem_inbox_oldest_age_seconds",
        "telegram_idem_outbox_entries",
        "telegram_idem_telegram_retry_after_total",
        "telegram_idem_flood_wait_seconds_count",
        "telegram_idem_store_up",
    ):
        assert family in used, f"no panel shows {family}"


def test_the_parser_finds_the_names_and_only_them() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, boundary) (rate(a_b_bucket{job=~"$job", '
        'x="rate(no_metric)"}[$__rate_interval]))) / sum(c_total)'
    )
    assert metric_names(expr) == {"a_b_bucket", "c_total"}
