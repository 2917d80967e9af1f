"""The decisions the metrics needed that were not events before, emitted on the one
path (:mod:`telegram_idem.events`): a claim or an inbox admission the store could not
answer (``store_error``), a 429 that paused the bot and a call that waited for its
flood budget (boundary ``flood``) — each seen by a hook and counted by the collector."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry

from telegram_idem import DecisionEvent, Idem, ManualClock, StoreError, store_from_url, subscribe
from telegram_idem.flood import FloodControl
from telegram_idem.inbox import NewEntry
from telegram_idem.outbox import HttpBotAPI, Outbound
from telegram_idem.prometheus import PrometheusMetrics
from telegram_idem.testing import UpdateFactory
from telegram_idem.testing.bot_api import FakeBotAPI, Fault

BOT = 7000000001
TOKEN = f"{BOT}:AAmetrics"


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


@pytest.fixture
async def down(closed_port: int) -> Idem:
    return Idem(f"redis://127.0.0.1:{closed_port}/0", heartbeat=False)


async def test_an_admission_the_store_cannot_answer_is_a_store_error(
    down: Idem, registry: CollectorRegistry
) -> None:
    update = UpdateFactory().message("hello")
    seen: list[DecisionEvent] = []
    try:
        with PrometheusMetrics(registry), subscribe(seen.append):
            admitted = await down.admit(update, bot_id=BOT)
            counted = value(
                registry,
                "telegram_idem_decisions_total",
                boundary="update",
                decision="store_error",
                handler="",
            )
    finally:
        await down.close()
    assert admitted.error is not None
    assert [(e.boundary, e.decision, e.update_id) for e in seen] == [
        ("update", "store_error", update["update_id"])
    ]
    assert seen[0].level >= 30 and seen[0].elapsed_ms > 0
    assert counted == 1


async def test_an_inbox_admission_the_store_cannot_answer_is_a_store_error_per_update(
    down: Idem,
) -> None:
    updates = [UpdateFactory().message(f"m{i}") for i in range(3)]
    entries = [
        NewEntry(down.keys.update(BOT, u["update_id"]), None, json.dumps(u).encode())
        for u in updates
    ]
    seen: list[DecisionEvent] = []
    try:
        with subscribe(seen.append):
            admitted = await down.admit_to_inbox(entries, updates, bot_id=BOT)
    finally:
        await down.close()
    assert all(a.error is not None for a in admitted)
    assert [(e.decision, e.update_id) for e in seen] == [
        ("store_error", u["update_id"]) for u in updates
    ]


async def test_an_action_claim_the_store_cannot_answer_is_a_store_error(
    down: Idem, registry: CollectorRegistry
) -> None:
    async def work() -> str:
        return "never"

    seen: list[DecisionEvent] = []
    try:
        with PrometheusMetrics(registry), subscribe(seen.append):
            with pytest.raises(StoreError):
                await down.run(down.keys.action(BOT, "report"), work, handler="report")
            counted = value(
                registry,
                "telegram_idem_decisions_total",
                boundary="action",
                decision="store_error",
                handler="report",
            )
    finally:
        await down.close()
    assert [(e.boundary, e.decision, e.handler) for e in seen] == [
        ("action", "store_error", "report")
    ]
    assert counted == 1


async def test_a_429_and_a_flood_wait_are_events_and_metrics(
    clock: ManualClock, registry: CollectorRegistry
) -> None:
    store = store_from_url("memory://", clock=clock)

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)

    flood = FloodControl(store.flood_budget(), bot_id=BOT, sleep=sleep)
    params = {"chat_id": 42, "text": "hi"}
    seen: list[DecisionEvent] = []
    try:
        with PrometheusMetrics(registry), subscribe(seen.append):
            waits = [await flood.wait_turn("sendMessage", params) for _ in range(3)]
            await flood.retry_after(3, method="sendMessage")
            got = {
                "retry_after": value(
                    registry, "telegram_idem_telegram_retry_after_total", method="sendMessage"
                ),
                "paused": value(
                    registry,
                    "telegram_idem_telegram_retry_after_seconds_total",
                    method="sendMessage",
                ),
                "waits": value(
                    registry, "telegram_idem_flood_wait_seconds_count", method="sendMessage"
                ),
                "waited": value(
                    registry, "telegram_idem_flood_wait_seconds_sum", method="sendMessage"
                ),
            }
        assert await flood.paused_for() == pytest.approx(3)
    finally:
        await store.close()
    assert waits[:2] == [0.0, 0.0] and waits[2] > 0  # the chat's burst is 2
    assert [(e.boundary, e.decision, e.handler, e.seconds) for e in seen] == [
        ("flood", "wait", "sendMessage", pytest.approx(waits[2])),
        ("flood", "retry_after", "sendMessage", 3.0),
    ]
    assert seen[0].key == flood.key("chat:42") and seen[1].key == flood.key("pause")
    assert got == {
        "retry_after": 1,
        "paused": 3,
        "waits": 1,
        "waited": pytest.approx(waits[2]),
    }


async def test_a_429_from_the_bot_api_reaches_the_metrics_through_outbound(
    clock: ManualClock, registry: CollectorRegistry
) -> None:
    store = store_from_url("memory://", clock=clock)

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)  # the pause passes on the store's clock, without waiting

    flood = FloodControl(store.flood_budget(), bot_id=BOT, sleep=sleep)
    seen: list[DecisionEvent] = []
    try:
        async with FakeBotAPI() as api:
            api.inject(Fault.retry_after(4, method="sendMessage"))
            outbound = Outbound(
                store.outbox(),
                HttpBotAPI(TOKEN, base_url=api.url),
                bot_id=BOT,
                flood=flood,
                owns_api=True,
            )
            with PrometheusMetrics(registry), subscribe(seen.append):
                async with outbound:
                    sent = await outbound.call("sendMessage", {"chat_id": 42, "text": "hi"})
                got = value(
                    registry, "telegram_idem_telegram_retry_after_total", method="sendMessage"
                )
                waited = value(
                    registry, "telegram_idem_flood_wait_seconds_sum", method="sendMessage"
                )
            calls = [c.method for c in api.calls]
    finally:
        await store.close()
    assert sent["text"] == "hi"
    assert calls == ["sendMessage", "sendMessage"]  # answered 429, then sent after the pause
    flood_events = [(e.decision, e.seconds) for e in seen if e.boundary == "flood"]
    assert flood_events == [("retry_after", 4.0), ("wait", pytest.approx(4.0))]
    assert got == 1 and waited == pytest.approx(4.0)
