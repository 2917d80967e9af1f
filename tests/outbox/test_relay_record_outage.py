"""A store outage while the relay records an outcome: the relay keeps what it knows and
retries the record for up to its lease, so a call Telegram accepted is recorded as
delivered (not turned unknown) and one handed back unsent is not sent twice.

Real Redis behind a TCP proxy that is cut and restored; real HTTP to the fake Bot API."""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from typing import Any

import pytest
from outbox.outbox_support import TOKEN
from services import UrlFactory
from store_proxy import Proxy

from telegram_idem import store_from_url
from telegram_idem.errors import StoreError
from telegram_idem.outbox import CallStatus, Outbound, encode_params
from telegram_idem.testing import Fault
from telegram_idem.testing.bot_api import FakeBotAPI

pytestmark = pytest.mark.redis


async def proxied(url: str) -> tuple[Proxy, str]:
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    proxy = Proxy(parts.hostname, parts.port)
    await proxy.start()
    return proxy, url.replace(parts.netloc, f"127.0.0.1:{proxy.port}", 1)


RECEIPT = {"chat_id": 7, "text": "paid"}


async def cut_during_the_answer(
    out: Outbound, fake_api: FakeBotAPI, proxy: Proxy
) -> asyncio.Future[Any]:
    """Send :data:`RECEIPT` (key ``receipt``) and cut the store once the request is at
    Telegram, so its (slow) answer comes back to a relay that cannot record it; the
    caller's call, still running."""
    sending = asyncio.ensure_future(out.call("sendMessage", RECEIPT, key="receipt"))
    while not fake_api.calls_of("sendMessage"):  # the request is at Telegram
        await asyncio.sleep(0.01)
    await proxy.cut()
    return sending


async def test_an_answer_that_arrives_during_an_outage_is_recorded_once_it_ends(
    redis_url_factory: UrlFactory, fake_api: FakeBotAPI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="telegram_idem.outbox")
    proxy, url = await proxied(redis_url_factory())
    store = store_from_url(url)
    fake_api.inject(Fault.slow(1.0, method="sendMessage"))
    try:
        async with Outbound.for_store(store, token=TOKEN, base_url=fake_api.url, lease=5.0) as out:
            sending = await cut_during_the_answer(out, fake_api, proxy)
            await asyncio.sleep(1.5)
            await proxy.start()
            message = await asyncio.wait_for(sending, timeout=10)
            key = out.effect_key("sendMessage", encode_params(RECEIPT), "receipt")
            assert key is not None
            entry = await store.outbox().get(key)
    finally:
        await store.close()
        await proxy.cut()
    assert message["text"] == "paid"
    assert entry is not None and entry.status is CallStatus.DELIVERED
    assert len(fake_api.calls_of("sendMessage")) == 1
    assert not [
        r for r in caplog.records if r.levelno >= logging.ERROR and "record" in r.getMessage()
    ]


async def test_an_outage_past_the_lease_logs_how_to_resolve_what_telegram_accepted(
    redis_url_factory: UrlFactory, fake_api: FakeBotAPI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="telegram_idem.outbox")
    proxy, url = await proxied(redis_url_factory())
    store = store_from_url(url)
    fake_api.inject(Fault.slow(0.5, method="sendMessage"))
    try:
        async with Outbound.for_store(store, token=TOKEN, base_url=fake_api.url, lease=1.0) as out:
            sending = await cut_during_the_answer(out, fake_api, proxy)
            with pytest.raises(StoreError):  # longer than the lease: nobody could record it
                await asyncio.wait_for(sending, timeout=10)
            await proxy.start()
    finally:
        await store.close()
        await proxy.cut()
    [line] = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and "could not record it" in r.getMessage()
    ]
    sent = fake_api.calls_of("sendMessage")
    assert len(sent) == 1
    assert "telegram-idem outbox resolve" in line and ":o:receipt" in line
    message_id = fake_api.messages(7)[0].message_id
    assert f'"message_id": {message_id}' in line and '"type": "private"' in line
    assert "paid" not in line  # the text sent is not logged
