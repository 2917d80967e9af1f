"""The store gauges, read at scrape time: inbox entries and the age of the oldest per
status against a real inbox with pending, in-flight and dead entries, outbox entries per
status, and ``store_up 0`` (never a failed scrape) for a store that cannot be read: a
Redis on a closed port, and one that accepts the connection and never answers (the read
is bounded by ``store_timeout``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.parse
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from services import UrlFactory
from store_proxy import Proxy

from telegram_idem import ManualClock, Store, store_from_url
from telegram_idem.errors import ConfigurationError
from telegram_idem.events import emit_decision
from telegram_idem.inbox import Inbox, NewEntry
from telegram_idem.outbox import AmbiguousPolicy, CallStatus, NewCall
from telegram_idem.prometheus import PrometheusMetrics
from telegram_idem.testing._loopback import serve_app

BOT = 7000000001


def scrape_samples(text: str) -> dict[tuple[str, str], float]:
    """(sample name, its one label's value, or "") → value."""
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            label = next(iter(sample.labels.values()), "") if len(sample.labels) == 1 else ""
            found[(sample.name, label)] = sample.value
    return found


async def scrape(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    """Render the registry in another thread, as a scrape by ``start_http_server``."""
    text = await asyncio.to_thread(generate_latest, registry)
    return scrape_samples(text.decode())


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def store(request: pytest.FixtureRequest, clock: ManualClock) -> AsyncIterator[Store]:
    factory: UrlFactory = request.getfixturevalue(f"{request.param}_url_factory")
    made = store_from_url(factory(), clock=clock)
    yield made
    await made.close()


def entry(update_id: int, chat: int) -> NewEntry:
    update = {"update_id": update_id, "message": {"chat": {"id": chat}}}
    return NewEntry(f"idem:{BOT}:u:{update_id}", f"chat:{chat}", json.dumps(update).encode())


async def test_inbox_gauges_count_each_status_and_age_its_oldest_entry(
    store: Store, clock: ManualClock, registry: CollectorRegistry
) -> None:
    inbox = store.inbox()
    if type(inbox).stats is Inbox.stats:
        pytest.skip(f"{type(inbox).__name__} does not implement Inbox.stats() yet")
    admitted_at: dict[str, float] = {}
    for update_id, chat, wait in ((1, 1, 3.0), (2, 1, 0.0), (3, 2, 7.0), (4, 3, 5.0)):
        new = entry(update_id, chat)
        assert await inbox.admit(new, retention=3600)
        admitted_at[new.update_key] = clock()
        clock.advance(wait)
    now = clock()  # 15 s after the first admission
    held = await inbox.take(lease=60)
    buried = await inbox.take(lease=60)
    assert held is not None and buried is not None
    assert await inbox.bury(buried, error="poison")
    pending = set(admitted_at) - {held.id, buried.id}

    with PrometheusMetrics(registry, inbox=inbox):
        got = await scrape(registry)

    assert got[("telegram_idem_store_up", "inbox")] == 1
    assert got[("telegram_idem_inbox_entries", "pending")] == 2
    assert got[("telegram_idem_inbox_entries", "in_flight")] == 1
    assert got[("telegram_idem_inbox_entries", "dead")] == 1
    ages = {
        "pending": now - min(admitted_at[k] for k in pending),
        "in_flight": now - admitted_at[held.id],
        "dead": now - admitted_at[buried.id],
    }
    for status, age in ages.items():
        assert got[("telegram_idem_inbox_oldest_age_seconds", status)] == pytest.approx(age)


def call(n: int, chat: int) -> NewCall:
    params = json.dumps({"chat_id": chat, "text": f"call {n}"}).encode()
    return NewCall(
        key=f"idem:{BOT}:o:{n}",
        bot_id=BOT,
        method="sendMessage",
        params=params,
        ordering_key=f"chat:{chat}",
        collapse_key=None,
        policy=AmbiguousPolicy.HOLD,
    )


async def test_outbox_gauges_count_each_status(store: Store, registry: CollectorRegistry) -> None:
    outbox = store.outbox()
    for n in range(4):
        _, stored = await outbox.enqueue(call(n, chat=n))
        assert stored
    taken = [await outbox.take(bot_id=BOT, lease=60) for _ in range(3)]
    dead, unknown, parked = taken
    assert dead is not None and unknown is not None and parked is not None
    assert await outbox.settle(dead, status=CallStatus.DEAD, error="400: chat not found")
    assert await outbox.settle(unknown, status=CallStatus.UNKNOWN, error="timed out")
    assert await outbox.park(parked, error="403: blocked")

    with PrometheusMetrics(registry, outbox=outbox, bot_id=BOT):
        got = await scrape(registry)

    assert got[("telegram_idem_store_up", "outbox")] == 1
    expected = {"pending": 1, "dead": 1, "unknown": 1, "parked": 1, "in_flight": 0}
    for status, count in expected.items():
        assert got[("telegram_idem_outbox_entries", status)] == count


async def test_a_store_on_a_closed_port_reads_as_down_and_the_scrape_succeeds(
    closed_port: int, registry: CollectorRegistry
) -> None:
    store = store_from_url(f"redis://127.0.0.1:{closed_port}/0")
    metrics = PrometheusMetrics(registry, inbox=store.inbox(), outbox=store.outbox())
    app = web.Application()
    metrics.add_route(app)
    runner, base = await serve_app(app)
    try:
        with metrics:
            emit_decision(boundary="update", key="k", decision="acquired", update=None)
            threaded = await scrape(registry)
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base}/metrics") as response:
                    assert response.status == 200
                    served = scrape_samples(await response.text())
    finally:
        await runner.cleanup()
        await store.close()
    for got in (threaded, served):
        assert got[("telegram_idem_store_up", "inbox")] == 0
        assert got[("telegram_idem_store_up", "outbox")] == 0
        assert not any(name.startswith("telegram_idem_inbox_") for name, _ in got)
        assert not any(name.startswith("telegram_idem_outbox_") for name, _ in got)
        assert ("telegram_idem_decisions_total", "") in got  # the events still count


async def test_a_store_that_never_answers_is_down_after_the_timeout(
    registry: CollectorRegistry,
) -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # reads nothing, answers nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = store_from_url(f"redis://127.0.0.1:{port}/0")
    try:
        with PrometheusMetrics(registry, outbox=store.outbox(), store_timeout=0.2):
            got = await scrape(registry)
    finally:
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()
        with contextlib.suppress(Exception):
            await store.close()
    assert accepted, "the read never reached the silent server"
    assert got[("telegram_idem_store_up", "outbox")] == 0


def test_starting_with_a_store_outside_an_event_loop_is_refused(
    registry: CollectorRegistry,
) -> None:
    store = store_from_url("memory://")
    with pytest.raises(ConfigurationError, match="event loop"):
        PrometheusMetrics(registry, inbox=store.inbox()).start()
    assert list(registry.collect()) == []  # nothing left registered


async def test_start_and_stop_are_idempotent_and_keep_the_counts(
    registry: CollectorRegistry,
) -> None:
    metrics = PrometheusMetrics(registry)
    labels = {"boundary": "action", "decision": "acquired", "handler": "h"}

    def count() -> float | None:
        return registry.get_sample_value("telegram_idem_decisions_total", labels)

    metrics.start().start()
    emit_decision(boundary="action", key="k", decision="acquired", update=None, handler="h")
    assert count() == 1
    metrics.stop()
    metrics.stop()
    assert count() is None  # unregistered
    emit_decision(boundary="action", key="k", decision="acquired", update=None, handler="h")
    with metrics:
        assert count() == 1  # kept, and nothing counted while stopped
    with pytest.raises(ValueError), PrometheusMetrics(registry), PrometheusMetrics(registry):
        pass
    assert list(registry.collect()) == []


async def test_store_up_follows_the_store_going_away_and_coming_back(
    redis_url_factory: UrlFactory, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="telegram_idem.prometheus")
    url = redis_url_factory()
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    proxy = Proxy(parts.hostname, parts.port)
    await proxy.start()
    store = store_from_url(url.replace(parts.netloc, f"127.0.0.1:{proxy.port}", 1))
    ups: list[float] = []
    try:
        with PrometheusMetrics(registry, outbox=store.outbox(), store_timeout=1.0):
            ups.append((await scrape(registry))[("telegram_idem_store_up", "outbox")])
            await proxy.cut()
            ups.append((await scrape(registry))[("telegram_idem_store_up", "outbox")])
            await proxy.start()  # the same port again
            ups.append((await scrape(registry))[("telegram_idem_store_up", "outbox")])
    finally:
        await store.close()
        await proxy.cut()
    assert ups == [1, 0, 1]
    said = [r.getMessage() for r in caplog.records if r.name == "telegram_idem.prometheus"]
    assert len(said) == 2 and "cannot be read" in said[0] and "read again" in said[1]
