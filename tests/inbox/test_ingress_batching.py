"""WebhookIngress admits the deliveries that arrive while one is written in one write."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from telegram_idem import Idem
from telegram_idem._admission import Admission
from telegram_idem._admitted import Admitted
from telegram_idem.errors import StoreError
from telegram_idem.inbox import NewEntry, new_entry
from telegram_idem.ingress._batching import AdmissionBatches
from telegram_idem.ingress._webhook import WebhookIngress
from telegram_idem.testing._loopback import serve_app

BOT_ID = 7000000001
SECRET = "batching-secret"


def _update(update_id: int) -> dict[str, Any]:
    return {
        "update_id": update_id,
        "message": {
            "message_id": update_id,
            "date": 1761025920,
            "chat": {"id": 100 + update_id % 7, "type": "private"},
            "text": f"hi {update_id}",
        },
    }


@pytest.fixture
async def idem(tmp_path: Path) -> AsyncIterator[Idem]:
    guard = Idem(f"sqlite:///{tmp_path / 'bot.db'}")
    yield guard
    await guard.close()


def _batches(idem: Idem, sizes: list[int]) -> AdmissionBatches:
    inbox = idem.store.inbox()

    async def admit(
        entries: Sequence[NewEntry], updates: Sequence[Mapping[str, Any]]
    ) -> list[Admitted]:
        sizes.append(len(entries))
        return await idem.admit_to_inbox(entries, updates, bot_id=BOT_ID, inbox=inbox)

    return AdmissionBatches(admit)


async def test_deliveries_arriving_together_are_written_once(idem: Idem) -> None:
    sizes: list[int] = []
    batches = _batches(idem, sizes)
    updates = [_update(i) for i in range(1, 31)]
    results = await asyncio.gather(
        *(batches.admit(new_entry(idem, u, bot_id=BOT_ID), u) for u in updates)
    )
    assert [r.outcome for r in results] == [Admission.RUN] * 30
    assert [r.update["update_id"] for r in results] == list(range(1, 31))
    assert all(r.queued for r in results)
    assert sizes == [30]  # one write for the thirty
    assert await idem.store.inbox().depth() == 30


async def test_two_deliveries_of_one_update_in_one_window_make_one_entry(idem: Idem) -> None:
    sizes: list[int] = []
    batches = _batches(idem, sizes)
    first, other = _update(5), _update(6)
    results = await asyncio.gather(
        batches.admit(new_entry(idem, first, bot_id=BOT_ID), first),
        batches.admit(new_entry(idem, first, bot_id=BOT_ID), first),
        batches.admit(new_entry(idem, other, bot_id=BOT_ID), other),
    )
    assert [r.outcome for r in results] == [Admission.RUN, Admission.DUPLICATE, Admission.RUN]
    assert sizes == [2, 1]  # the second copy is decided against the first, in the next write
    assert await idem.store.inbox().depth() == 2


async def test_a_failed_write_fails_every_delivery_of_its_batch_and_the_next_one_runs(
    idem: Idem,
) -> None:
    calls = 0
    inbox = idem.store.inbox()

    async def admit(
        entries: Sequence[NewEntry], updates: Sequence[Mapping[str, Any]]
    ) -> list[Admitted]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise StoreError("the store went away")
        return await idem.admit_to_inbox(entries, updates, bot_id=BOT_ID, inbox=inbox)

    batches = AdmissionBatches(admit)
    a, b = _update(1), _update(2)
    failed = await asyncio.gather(
        batches.admit(new_entry(idem, a, bot_id=BOT_ID), a),
        batches.admit(new_entry(idem, b, bot_id=BOT_ID), b),
        return_exceptions=True,
    )
    assert all(isinstance(f, StoreError) for f in failed)
    again = await batches.admit(new_entry(idem, a, bot_id=BOT_ID), a)
    assert again.outcome is Admission.RUN
    assert await inbox.depth() == 1


def test_a_batch_holds_at_least_one_delivery() -> None:
    async def admit(
        entries: Sequence[NewEntry], updates: Sequence[Mapping[str, Any]]
    ) -> list[Admitted]:
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="max_batch"):
        AdmissionBatches(admit, max_batch=0)


async def test_concurrent_posts_are_answered_200_with_fewer_writes_than_posts(
    idem: Idem,
) -> None:
    ingress = WebhookIngress(idem, bot_id=BOT_ID, secret_token=SECRET)
    app = web.Application()
    app.router.add_post("/webhook", ingress.handle)
    runner, base = await serve_app(app)
    headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}
    try:
        async with aiohttp.ClientSession() as session:

            async def post(update_id: int) -> int:
                body = json.dumps(_update(update_id))
                async with session.post(f"{base}/webhook", data=body, headers=headers) as r:
                    return r.status

            statuses = await asyncio.gather(*(post(i) for i in range(1, 61)))
            # A re-send of each, after: all duplicates.
            again = await asyncio.gather(*(post(i) for i in range(1, 61)))
    finally:
        await runner.cleanup()
    assert statuses == [200] * 60 and again == [200] * 60
    assert (ingress.admitted, ingress.duplicates) == (60, 60)
    assert await idem.store.inbox().depth() == 60
    assert ingress._batches.writes < 120
