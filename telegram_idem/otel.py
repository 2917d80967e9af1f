"""OpenTelemetry from the decision events (extra ``otel``:
``pip install 'telegram-idem[otel]'``, which needs only ``opentelemetry-api``; you bring
the SDK and exporters).

The design follows what the events are: **points, not intervals**. A decision happens at
one instant, in the task that made it, inside whatever span that task is in (your
webhook's server span, the span around your dispatcher, an inbox worker's dispatch you
wrapped). So :class:`OTelInstrumentation`, a decision hook
(:func:`telegram_idem.events.subscribe`; no second event path):

- adds a **span event** ``idem.decision`` to the current span (when it is recording),
  with the attributes ``idem.boundary``, ``idem.decision``, ``idem.key``,
  ``idem.handler``, ``idem.fencing_token``, ``telegram.update_id``, ``telegram.chat_id``,
  ``telegram.bot_id``, ``idem.duration`` (seconds the store took) and ``idem.seconds``
  (flood control's pause or wait); absent values are left out;
- records **metrics** through the OTel metrics API, whose attributes are only the
  bounded ones (``idem.boundary``, ``idem.decision``, ``idem.handler`` or
  ``telegram.method``): ``idem.decisions`` (counter, ``{decision}``),
  ``idem.decision.duration`` (histogram, ``s``), ``idem.telegram.retry_after``
  (counter, ``{response}``), ``idem.flood.wait.duration`` (histogram, ``s``);
- with ``claim_spans=True``, also makes one **span per measured decision** (claims,
  inbox admissions, outbox calls), named ``idem.<boundary> <decision>``, child of the
  current span, that *ends* at the decision and *starts* ``elapsed_ms`` before it: the
  store round trip that decided, drawn where it happened in the trace.

It makes no span for "processing one update": the events mark decisions, not the
start and end of work. Wrap the work you want timed in your own span (the dispatch
callable you give :class:`~telegram_idem.inbox.InboxWorker`, a webhook handler); the
decisions made inside it land on it.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Self

from opentelemetry import metrics, trace
from opentelemetry.util.types import AttributeValue

from telegram_idem.events import DecisionEvent, Subscription, subscribe

__all__ = ["OTelInstrumentation", "event_attributes"]

_SCOPE = "telegram_idem"


def event_attributes(event: DecisionEvent) -> dict[str, AttributeValue]:
    """The span-event attributes of ``event`` (see the module docstring); ``None``
    values are left out.

    Args:
        event: the decision event.
    """
    values: dict[str, AttributeValue | None] = {
        "idem.boundary": event.boundary,
        "idem.decision": event.decision,
        "idem.key": event.key,
        "idem.handler": event.handler,
        "idem.fencing_token": event.fencing_token,
        "telegram.update_id": event.update_id,
        "telegram.chat_id": event.chat_id,
        "telegram.bot_id": event.bot_id,
        "idem.duration": event.elapsed_ms / 1000 if event.elapsed_ms > 0 else None,
        "idem.seconds": event.seconds,
    }
    return {name: value for name, value in values.items() if value is not None}


class OTelInstrumentation:
    """The decision events as OpenTelemetry span events, metrics and (optionally) claim
    spans (see the module docstring).

    Args:
        tracer_provider: where spans come from (default: the global one).
        meter_provider: where the instruments come from (default: the global one).
        claim_spans: also make a span per measured decision.

    Use ``with OTelInstrumentation():`` or :meth:`start` / :meth:`stop` (both idempotent).
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        claim_spans: bool = False,
    ) -> None:
        self.tracer = trace.get_tracer(_SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(_SCOPE, meter_provider=meter_provider)
        self.claim_spans = claim_spans
        self._decisions = meter.create_counter(
            "idem.decisions", unit="{decision}", description="Guard decisions."
        )
        self._duration = meter.create_histogram(
            "idem.decision.duration",
            unit="s",
            description="Seconds the store took to decide (measured decisions only).",
        )
        self._retry_after = meter.create_counter(
            "idem.telegram.retry_after",
            unit="{response}",
            description="429 answers from Telegram (the bot was paused).",
        )
        self._wait = meter.create_histogram(
            "idem.flood.wait.duration",
            unit="s",
            description="Seconds calls waited for their flood-control budgets.",
        )
        self._subscription: Subscription | None = None

    def start(self) -> Self:
        """Subscribe to the decision events (again while started: nothing).

        Returns:
            ``self``.
        """
        if self._subscription is None:
            self._subscription = subscribe(self._observe)
        return self

    def stop(self) -> None:
        """Unsubscribe (again: nothing)."""
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            subscription()

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
        now = time.time_ns()
        attributes = event_attributes(event)
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event("idem.decision", attributes, timestamp=now)
        bounded: dict[str, AttributeValue] = {
            "idem.boundary": event.boundary,
            "idem.decision": event.decision,
        }
        if event.boundary == "flood":
            method = {"telegram.method": event.handler or ""}
            if event.decision == "retry_after":
                self._retry_after.add(1, method)
            elif event.decision == "wait":
                self._wait.record(event.seconds or 0.0, method)
        if event.handler is not None:
            bounded["idem.handler"] = event.handler
        self._decisions.add(1, bounded)
        if event.elapsed_ms > 0 and event.boundary != "flood":
            self._duration.record(
                event.elapsed_ms / 1000,
                {"idem.boundary": event.boundary, "idem.decision": event.decision},
            )
            if self.claim_spans:
                started = now - int(event.elapsed_ms * 1_000_000)
                claim = self.tracer.start_span(
                    f"idem.{event.boundary} {event.decision}",
                    attributes=attributes,
                    start_time=started,
                )
                claim.end(end_time=now)
