"""OpenTelemetry from the decision events, checked with the SDK's in-memory exporters:
a span event per decision on the current span with the update id, chat id, key and
decision as attributes; counters and histograms whose attributes are bounded (no key,
no id); a claim span per measured decision when asked for."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from telegram_idem import Idem
from telegram_idem.otel import OTelInstrumentation
from telegram_idem.testing import UpdateFactory

BOT = 7000000001


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.fixture
def meters() -> Iterator[tuple[MeterProvider, InMemoryMetricReader]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield provider, reader
    provider.shutdown()


def points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, object], object]]]:
    """instrument name → [(attributes, value or histogram count)]."""
    data = reader.get_metrics_data()
    found: dict[str, list[tuple[dict[str, object], object]]] = {}
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    shown = getattr(point, "value", None)
                    if shown is None:
                        shown = getattr(point, "count", None)
                    found.setdefault(metric.name, []).append((dict(point.attributes or {}), shown))
    return found


async def test_decisions_are_span_events_and_bounded_metrics(
    spans: tuple[TracerProvider, InMemorySpanExporter],
    meters: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    tracer_provider, exporter = spans
    meter_provider, reader = meters
    idem = Idem("memory://", heartbeat=False)
    update = UpdateFactory().message("hello")
    tracer = tracer_provider.get_tracer("bot")
    try:
        with OTelInstrumentation(tracer_provider=tracer_provider, meter_provider=meter_provider):
            with tracer.start_as_current_span("telegram.update"):
                for _ in range(3):  # one delivery and two duplicates
                    await idem.admit(update, bot_id=BOT)
    finally:
        await idem.close()
    (span,) = exporter.get_finished_spans()
    events = [e for e in span.events if e.name == "idem.decision"]
    assert [e.attributes["idem.decision"] for e in events if e.attributes] == [
        "acquired",
        "in_progress",
        "in_progress",
    ]
    first = events[0].attributes
    assert first is not None
    assert first["telegram.update_id"] == update["update_id"]
    assert first["telegram.chat_id"] == update["message"]["chat"]["id"]
    assert first["idem.key"] == idem.keys.update(BOT, update["update_id"])
    assert first["idem.boundary"] == "update"
    assert first["telegram.bot_id"] == BOT
    assert isinstance(first["idem.duration"], float) and first["idem.duration"] > 0

    got = points(reader)
    counted = {(a["idem.boundary"], a["idem.decision"]): v for a, v in got["idem.decisions"]}
    assert counted == {("update", "acquired"): 1, ("update", "in_progress"): 2}
    for attributes, _ in got["idem.decisions"] + got["idem.decision.duration"]:
        assert set(attributes) <= {"idem.boundary", "idem.decision", "idem.handler"}
    durations = {
        (a["idem.boundary"], a["idem.decision"]): v for a, v in got["idem.decision.duration"]
    }
    assert durations == {("update", "acquired"): 1, ("update", "in_progress"): 2}


async def test_claim_spans_end_at_the_decision_and_last_its_round_trip(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    tracer_provider, exporter = spans
    idem = Idem("memory://", heartbeat=False)

    async def work() -> str:
        return "done"

    key = idem.keys.action(BOT, "report")
    try:
        with OTelInstrumentation(tracer_provider=tracer_provider, claim_spans=True):
            with tracer_provider.get_tracer("bot").start_as_current_span("handler"):
                await idem.run(key, work, handler="report")
                await idem.run(key, work, handler="report")
    finally:
        await idem.close()
    finished = {s.name: s for s in exporter.get_finished_spans()}
    assert set(finished) == {"handler", "idem.action acquired", "idem.action replay"}
    parent = finished["handler"]
    for name in ("idem.action acquired", "idem.action replay"):
        claim = finished[name]
        assert claim.parent is not None and claim.parent.span_id == parent.context.span_id
        assert claim.attributes is not None and claim.attributes["idem.key"] == key
        assert claim.start_time is not None and claim.end_time is not None
        assert claim.end_time > claim.start_time
        assert claim.attributes["idem.duration"] == pytest.approx(
            (claim.end_time - claim.start_time) / 1e9, abs=1e-6
        )


async def test_without_a_recording_span_only_the_metrics_are_recorded(
    meters: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    meter_provider, reader = meters
    idem = Idem("memory://", heartbeat=False)
    try:
        with OTelInstrumentation(meter_provider=meter_provider) as otel:
            otel.start()  # again: nothing
            await idem.admit(UpdateFactory().message("x"), bot_id=BOT)
        await idem.admit(UpdateFactory().message("y"), bot_id=BOT)  # stopped: not counted
    finally:
        await idem.close()
    counted = [v for _, v in points(reader)["idem.decisions"]]
    assert counted == [1]
