"""HttpBotAPI over real HTTP on loopback: answers of every status come back as answers,
and what raises when none comes (not sent vs ambiguous); the token stays out of every
message, repr and log line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from outbox.outbox_support import BOT_ID, TOKEN, Reply, ScriptedAPI, body_of, error

from telegram_idem.outbox import (
    AmbiguousCall,
    CallNotSent,
    FileRef,
    HttpBotAPI,
    OutcomeClass,
    classify,
    encode_params,
)
from telegram_idem.outbox._transport import bot_id_of_token
from telegram_idem.testing.bot_api import FakeBotAPI, UploadedFile


async def test_a_message_comes_back_as_its_result(fake_api: FakeBotAPI) -> None:
    async with HttpBotAPI(TOKEN, base_url=fake_api.url) as api:
        answer = await api.call("sendMessage", body_of({"chat_id": 42, "text": "hi"}))
    assert answer.ok and answer.result["text"] == "hi"
    assert answer.result["chat"]["id"] == 42
    [call] = fake_api.calls_of("sendMessage")
    assert call.token == TOKEN and call.params == {"chat_id": 42, "text": "hi"}


async def test_refusals_are_answers_not_exceptions(fake_api: FakeBotAPI) -> None:
    fake_api.fail_next("sendMessage", 429, retry_after=7)
    fake_api.fail_next("sendMessage", 403, description="Forbidden: bot was blocked by the user")
    fake_api.fail_next("sendMessage", 502)
    async with HttpBotAPI(TOKEN, base_url=fake_api.url) as api:
        body = body_of({"chat_id": 1, "text": "x"})
        flood, blocked, bad_gateway = [await api.call("sendMessage", body) for _ in range(3)]
    assert (flood.error_code, flood.retry_after) == (429, 7.0)
    assert classify(flood).outcome is OutcomeClass.RETRY
    assert classify(blocked).outcome is OutcomeClass.BLOCKED
    assert classify(bad_gateway).outcome is OutcomeClass.AMBIGUOUS


async def test_connection_refused_is_not_sent(closed_port: int) -> None:
    async with HttpBotAPI(TOKEN, base_url=f"http://127.0.0.1:{closed_port}") as api:
        with pytest.raises(CallNotSent) as caught:
            await api.call("sendMessage", b"{}")
    assert caught.value.method == "sendMessage"
    assert TOKEN not in str(caught.value) and caught.value.__cause__ is None


async def test_a_connection_dropped_after_the_request_is_ambiguous(scripted: ScriptedAPI) -> None:
    scripted.script("sendMessage", Reply(drop=True))
    async with HttpBotAPI(TOKEN, base_url=scripted.url) as api:
        with pytest.raises(AmbiguousCall) as caught:
            await api.call("sendMessage", body_of({"chat_id": 1, "text": "x"}))
    assert len(scripted.calls_of("sendMessage")) == 1  # it did arrive
    assert TOKEN not in str(caught.value)


async def test_a_timeout_after_the_request_is_ambiguous(scripted: ScriptedAPI) -> None:
    scripted.script("sendMessage", Reply(hang=2.0, body={"ok": True, "result": True}))
    async with HttpBotAPI(TOKEN, base_url=scripted.url, timeout=0.2) as api:
        with pytest.raises(AmbiguousCall):
            await api.call("sendMessage", body_of({"chat_id": 1, "text": "x"}))


async def test_a_body_that_is_not_an_answer(scripted: ScriptedAPI) -> None:
    scripted.script("sendMessage", Reply(status=502, body="<html>bad gateway</html>"))
    scripted.script("getMe", Reply(status=404, body="no such path"))
    scripted.script("getChat", error(400, "Bad Request: chat not found"))
    async with HttpBotAPI(TOKEN, base_url=scripted.url) as api:
        with pytest.raises(AmbiguousCall):
            await api.call("sendMessage", b"{}")
        missing = await api.call("getMe", b"{}")
        refused = await api.call("getChat", b"{}")
    assert (missing.ok, missing.error_code) == (False, 404)
    assert (refused.error_code, refused.description) == (400, "Bad Request: chat not found")


async def test_a_file_reference_is_uploaded_as_multipart(
    fake_api: FakeBotAPI, tmp_path: Path
) -> None:
    doc = tmp_path / "report.txt"
    doc.write_bytes(b"contents")
    fake_api.set_result("sendDocument", {"message_id": 9})
    fake_api.set_result("sendMediaGroup", [{"message_id": 10}])
    params = encode_params({"chat_id": 5, "document": FileRef(str(doc)), "caption": "c"})
    media = encode_params(
        {"chat_id": 5, "media": [{"type": "document", "media": FileRef(str(doc))}]}
    )
    async with HttpBotAPI(TOKEN, base_url=fake_api.url) as api:
        answer = await api.call("sendDocument", params)
        grouped = await api.call("sendMediaGroup", media)
    assert answer.ok and grouped.ok
    [call] = fake_api.calls_of("sendDocument")
    assert call.params["chat_id"] == 5 and call.params["caption"] == "c"
    upload = call.params["document"]
    assert isinstance(upload, UploadedFile) and upload.data == b"contents"
    [group] = fake_api.calls_of("sendMediaGroup")
    assert group.params["media"] == [{"type": "document", "media": "attach://file0"}]
    assert isinstance(group.params["file0"], UploadedFile)


async def test_a_missing_file_is_not_sent(fake_api: FakeBotAPI, tmp_path: Path) -> None:
    params = encode_params({"chat_id": 5, "document": FileRef(str(tmp_path / "gone"))})
    async with HttpBotAPI(TOKEN, base_url=fake_api.url) as api:
        with pytest.raises(CallNotSent):
            await api.call("sendDocument", params)
    assert fake_api.calls_of("sendDocument") == []


async def test_a_request_that_cannot_be_built_is_not_sent(fake_api: FakeBotAPI) -> None:
    # a path with a NUL byte: open() raises ValueError, not OSError, before any request
    params = encode_params({"chat_id": 5, "document": FileRef("bad\x00name.pdf")})
    async with HttpBotAPI(TOKEN, base_url=fake_api.url) as api:
        with pytest.raises(CallNotSent, match="could not be built: ValueError"):
            await api.call("sendDocument", params)
    assert fake_api.calls_of("sendDocument") == []


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:1", "127.0.0.1:8081", "http://", "file:///x"])
def test_a_base_url_that_is_no_http_server_is_refused_at_once(url: str) -> None:
    # aiohttp would refuse it only at the first call (NonHttpUrlClientError), which a
    # relay must not mistake for "maybe sent"
    with pytest.raises(ValueError, match="http:// or https://"):
        HttpBotAPI(TOKEN, base_url=url)


async def test_the_token_is_in_no_repr_message_or_log(
    closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    api = HttpBotAPI(TOKEN, base_url=f"http://127.0.0.1:{closed_port}", timeout=1.0)
    seen = [repr(api), str(api)]
    for base in (f"http://127.0.0.1:{closed_port}", "http://[bad"):
        api.base_url = base
        with pytest.raises(CallNotSent) as caught:
            await api.call("sendMessage", b"{}")
        seen += [str(caught.value), repr(caught.value), repr(caught.value.__context__)]
    await api.close()
    seen += [r.getMessage() for r in caplog.records]
    secret = TOKEN.partition(":")[2]
    assert not [s for s in seen if secret in s]


def test_the_bot_id_is_read_from_the_token() -> None:
    assert bot_id_of_token(TOKEN) == BOT_ID
    with pytest.raises(ValueError) as caught:
        bot_id_of_token("nonsense-secret")
    assert "nonsense-secret" not in str(caught.value)
