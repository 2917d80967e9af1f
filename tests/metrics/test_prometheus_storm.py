"""A replayed duplicate storm, scraped: the counters say exactly what the storm did
(acquired = the distinct updates, replayed + in progress = every other delivery), whether the
registry is rendered in another thread (``generate_latest``, as ``start_http_server``
does), served by ``start_http_server`` itself, or by the aiohttp ``/metrics`` route."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from telegram_idem import Idem
from telegram_idem.inbox import Inbox
from telegram_idem.prometheus import PrometheusMetrics
from telegram_idem.testing import Replayer, ReplayResult, UpdateFactory
from telegram_idem.testing._loopback import serve_app

BOT = 7000000001
UPDATES, COPIES, RESENDS = 6, 5, 2


def implements_stats(inbox: Inbox) -> bool:
    """Whether this store's inbox answers ``stats()`` (the operator reads are being
    implemented store by store; the memory inbox has them)."""
    return type(inbox).stats is not Inbox.stats


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(sample name, labels) → value, parsed from an exposition text."""
    found: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def decisions(scraped: dict[tuple[str, frozenset[tuple[str, str]]], float], decision: str) -> float:
    labels = frozenset({"boundary": "update", "decision": decision, "handler": ""}.items())
    return scraped.get(("telegram_idem_decisions_total", labels), 0.0)


async def storm(idem: Idem) -> tuple[list[ReplayResult], Counter[int]]:
    """``UPDATES`` distinct updates, each delivered ``COPIES`` times at once, then
    ``RESENDS`` more times one after another."""
    runs: Counter[int] = Counter()

    async def handle(update: dict[str, Any]) -> None:
        runs[update["update_id"]] += 1
        await asyncio.sleep(0)

    factory = UpdateFactory()
    results = []
    async with Replayer(handle, guard=idem, bot_id=BOT) as replayer:
        for i in range(UPDATES):
            update = factory.message(f"storm {i}")
            results.append(await replayer.concurrent(update, COPIES))
            results.append(await replayer.sequential(update, RESENDS))  # after it completed
    return results, runs


def check_counts(text: str, results: list[ReplayResult], runs: Counter[int]) -> None:
    scraped = samples(text)
    acquired = decisions(scraped, "acquired")
    replayed = decisions(scraped, "replay")  # a duplicate of a completed update
    deferred = decisions(scraped, "in_progress")  # a copy racing the first delivery
    assert acquired == UPDATES == len(runs) == sum(r.updates_processed for r in results)
    assert replayed + deferred == UPDATES * (COPIES - 1 + RESENDS)
    assert replayed == sum(r.updates_dropped for r in results) >= UPDATES * RESENDS
    assert deferred == sum(sum(r.updates_deferred.values()) for r in results)
    assert set(runs.values()) == {1}
    latency = frozenset({"boundary": "update", "decision": "acquired"}.items())
    assert scraped[("telegram_idem_decision_seconds_count", latency)] == UPDATES
    assert scraped[("telegram_idem_decision_seconds_sum", latency)] > 0


async def test_a_storm_scraped_from_another_thread_counts_each_delivery(
    storm_url: str, registry: CollectorRegistry
) -> None:
    idem = Idem(storm_url)
    try:
        with PrometheusMetrics(registry):
            results, runs = await storm(idem)
            text = (await asyncio.to_thread(generate_latest, registry)).decode()
    finally:
        await idem.close()
    check_counts(text, results, runs)


async def test_a_storm_scraped_over_http_from_start_http_server(
    storm_url: str, registry: CollectorRegistry
) -> None:
    idem = Idem(storm_url)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        with PrometheusMetrics(registry):
            results, runs = await storm(idem)
            url = f"http://127.0.0.1:{server.server_port}/metrics"
            async with aiohttp.ClientSession() as session, session.get(url) as response:
                assert response.status == 200
                text = await response.text()
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
        await idem.close()
    check_counts(text, results, runs)


async def test_a_storm_scraped_over_http_from_the_aiohttp_route(
    storm_url: str, registry: CollectorRegistry
) -> None:
    idem = Idem(storm_url)
    metrics = PrometheusMetrics(registry, inbox=idem.store.inbox())
    app = web.Application()
    metrics.add_route(app)
    runner, base = await serve_app(app)
    try:
        with metrics:
            results, runs = await storm(idem)
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base}/metrics") as response:
                    assert response.status == 200
                    assert response.headers["Content-Type"].startswith("text/plain")
                    text = await response.text()
    finally:
        await runner.cleanup()
        await idem.close()
    check_counts(text, results, runs)
    up = samples(text)[("telegram_idem_store_up", frozenset({("part", "inbox")}))]
    # Read at the scrape: down only where the store does not implement Inbox.stats() yet.
    assert up == (1.0 if implements_stats(idem.store.inbox()) else 0.0)
