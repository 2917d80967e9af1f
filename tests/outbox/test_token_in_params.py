"""A bot token never reaches a stored outbox entry (issue 10, "Bad input"): a durable call
whose params hold the token (the Bot API's file download URL
``https://api.telegram.org/file/bot<token>/<file_path>``, as written or percent-encoded)
is refused before anything is stored, with an error that names the fix and masks the
token; Telegram's descriptions are recorded and logged with the token masked. Real stores
(SQLite, PostgreSQL, Redis), real HTTP to the fake Bot API on loopback."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import pytest
from services import UrlFactory

from telegram_idem import Idem
from telegram_idem._cli._common import redact_text
from telegram_idem.backends import Store, store_from_url
from telegram_idem.errors import SendFailedError
from telegram_idem.outbox import CallStatus, HttpBotAPI, Outbound
from telegram_idem.testing.bot_api import FakeBotAPI

TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"
SECRET = TOKEN.partition(":")[2]
FILE_URL = f"https://api.telegram.org/file/bot{TOKEN}/documents/file_1.pdf"

STORES = [
    pytest.param(name, marks=getattr(pytest.mark, name)) for name in ("sqlite", "postgres", "redis")
]


@pytest.fixture(params=STORES)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    factory: UrlFactory = request.getfixturevalue(f"{request.param}_url_factory")
    opened = store_from_url(factory())
    yield opened
    await opened.close()


@pytest.fixture
async def fake() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI() as api:
        yield api


def outbound_on(store: Store, fake: FakeBotAPI) -> Outbound:
    return Outbound.for_store(store, token=TOKEN, base_url=fake.url)


async def nothing_stored(store: Store) -> bool:
    counts = await store.outbox().counts()
    return not any(counts.values())


def assert_no_token(text: str) -> None:
    assert SECRET not in text and quote(SECRET) not in text


LEAKING = {
    "download URL": FILE_URL,
    "':' as %3A": FILE_URL.replace(":AA", "%3AAA"),
    "':' as %3a": FILE_URL.replace(":AA", "%3aAA"),
    "URL inside a URL": "https://proxy.example/get?u=" + quote(FILE_URL, safe=""),
    "URL inside a URL, twice": "https://p.example/?u=" + quote(quote(FILE_URL, safe=""), safe=""),
    "every character encoded": "".join(f"%{b:02X}" for b in FILE_URL.encode()),
    "secret alone": f"https://example.com/?s={SECRET}",
}


@pytest.mark.parametrize("document", LEAKING.values(), ids=LEAKING.keys())
async def test_a_durable_call_with_the_token_is_refused_and_nothing_is_stored(
    store: Store, fake: FakeBotAPI, document: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    idem = Idem(store, heartbeat=False)
    async with outbound_on(store, fake) as out:
        with pytest.raises(ValueError, match="file_id instead") as keyed:
            await out.call("sendDocument", {"chat_id": 1, "document": document}, key="doc1")

        async def action() -> Any:
            return await out.call("sendDocument", {"chat_id": 1, "document": document})

        with pytest.raises(ValueError, match="carries the bot token") as in_action:
            await idem.run("post:1", action)
        with pytest.raises(ValueError):
            await out.enqueue("sendDocument", {"chat_id": 1, "document": document}, key="d2")
        assert await out.outbox.get(out.keys.effect(out.bot_id, "doc1")) is None
    assert await nothing_stored(store)
    assert fake.calls_of("sendDocument") == []
    for text in (str(keyed.value), str(in_action.value), caplog.text):
        assert_no_token(text)


async def test_a_key_with_the_token_is_refused(store: Store, fake: FakeBotAPI) -> None:
    async with outbound_on(store, fake) as out:
        with pytest.raises(ValueError, match="key= carries the bot token") as caught:
            await out.call("sendMessage", {"chat_id": 1, "text": "hi"}, key=f"doc:{FILE_URL}")
    assert_no_token(str(caught.value))
    assert await nothing_stored(store)
    assert fake.calls_of("sendMessage") == []


async def test_the_token_nested_in_media_is_refused(store: Store, fake: FakeBotAPI) -> None:
    media = [{"type": "document", "media": FILE_URL}]
    async with outbound_on(store, fake) as out:
        with pytest.raises(ValueError, match="file_id"):
            await out.call("sendMediaGroup", {"chat_id": 1, "media": media}, key="album")
    assert await nothing_stored(store)


async def test_a_call_mentioning_bot_or_a_part_of_the_token_is_sent(
    store: Store, fake: FakeBotAPI
) -> None:
    texts = [
        "my bot sends https://api.telegram.org/file/bot/documents/x.pdf",
        "bot 7000000001 says hi",  # the bot id is no credential
        f"{TOKEN.partition(':')[0]}:AAFake",  # a short prefix of the token
        f"https://api.telegram.org/file/bot123:{SECRET[:-1]}X/doc.pdf",  # another token
    ]
    async with outbound_on(store, fake) as out:
        for n, text in enumerate(texts):
            sent = await out.call("sendMessage", {"chat_id": 1, "text": text}, key=f"m{n}")
            assert sent["text"] == text
    assert [c.params["text"] for c in fake.calls_of("sendMessage")] == texts
    assert (await store.outbox().counts()).get(CallStatus.DELIVERED) == len(texts)


async def test_a_direct_call_goes_to_telegram_only_and_logs_no_params(
    store: Store, fake: FakeBotAPI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with outbound_on(store, fake) as out:
        await out.call("sendDocument", {"chat_id": 1, "document": FILE_URL})
    assert [c.params["document"] for c in fake.calls_of("sendDocument")] == [FILE_URL]
    assert await nothing_stored(store)
    assert_no_token(caplog.text)


async def test_a_description_quoting_the_token_is_recorded_and_raised_masked(
    store: Store, fake: FakeBotAPI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    quoted = f"Bad Request: failed to get HTTP URL content {FILE_URL} (%3A: {quote(TOKEN)})"
    fake.fail_next("sendMessage", 400, description=quoted, times=2)
    async with outbound_on(store, fake) as out:
        with pytest.raises(SendFailedError) as durable:
            await out.call("sendMessage", {"chat_id": 1, "text": "hi"}, key="m")
        with pytest.raises(SendFailedError) as direct:
            await out.call("sendMessage", {"chat_id": 1, "text": "hi"})
        entry = await out.outbox.get(out.keys.effect(out.bot_id, "m"))
    assert entry is not None and entry.status is CallStatus.DEAD
    assert "failed to get HTTP URL content" in (entry.last_error or "")
    for err in (durable.value, direct.value):
        assert_no_token(str(err))
        assert_no_token(err.description or "")
    assert_no_token(entry.last_error or "")
    assert_no_token(caplog.text)


def test_the_transport_masks_every_form_of_its_token() -> None:
    api = HttpBotAPI(TOKEN)
    for form in LEAKING.values():
        assert api.carries_token(form.encode())
    text = f"{FILE_URL} {quote(TOKEN)} {quote(quote(TOKEN))} {SECRET}"
    assert_no_token(api.redact(text))
    assert not api.carries_token(b'{"text":"bot 7000000001"}')
    assert not HttpBotAPI("1:x").carries_token(b'{"text":"x marks the spot"}')


def test_the_cli_redacts_a_percent_encoded_token() -> None:
    for form in (TOKEN, quote(TOKEN), quote(quote(TOKEN)), TOKEN.replace(":", "%3a")):
        assert_no_token(redact_text(f"document: https://api.telegram.org/file/bot{form}/d.pdf"))
