"""FakeBotAPI driven by a real aiogram Bot over loopback HTTP."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import TelegramBadRequest, TelegramConflictError, TelegramRetryAfter
from aiogram.types import InlineKeyboardButton, InlineKeyboardMarkup

from telegram_idem.testing._delivery import load_fixture
from telegram_idem.testing.bot_api import NOT_MODIFIED, FakeBotAPI

TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"
CHAT = 5550001001


@pytest.fixture
async def api() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI(long_poll_cap=0.3) as fake:
        yield fake


@pytest.fixture
async def bot(api: FakeBotAPI) -> AsyncIterator[Bot]:
    session = AiohttpSession(api=TelegramAPIServer.from_base(api.url))
    async with Bot(token=TOKEN, session=session) as client:
        yield client


def keyboard(data: str) -> InlineKeyboardMarkup:
    button = InlineKeyboardButton(text="🗑️ Delete Post", callback_data=data)
    return InlineKeyboardMarkup(inline_keyboard=[[button]])


async def test_url_is_loopback_and_requires_start() -> None:
    fake = FakeBotAPI()
    with pytest.raises(RuntimeError):
        _ = fake.url
    await fake.start()
    try:
        assert fake.url.startswith("http://127.0.0.1:")
        assert fake.ptb_base_url == fake.url + "/bot"
    finally:
        await fake.close()
    await fake.close()  # idempotent


async def test_get_me_uses_the_id_from_the_token(api: FakeBotAPI, bot: Bot) -> None:
    me = await bot.get_me()
    assert me.id == 7000000001
    assert me.is_bot
    assert me.username == "example_blog_bot"
    assert [c.method for c in api.calls] == ["getMe"]
    assert api.calls[0].token == TOKEN


async def test_send_message_returns_messages_with_increasing_ids(api: FakeBotAPI, bot: Bot) -> None:
    first = await bot.send_message(CHAT, "1/3 drafting", reply_markup=keyboard("del:abc"))
    second = await bot.send_message(CHAT, "123")  # numeric-looking text stays a string
    assert second.message_id > first.message_id
    assert first.chat.id == CHAT and first.chat.type == "private"
    assert first.text == "1/3 drafting"
    assert first.from_user is not None and first.from_user.id == 7000000001
    assert first.reply_markup is not None
    assert first.reply_markup.model_dump() == keyboard("del:abc").model_dump()
    assert second.text == "123"
    assert second.reply_markup is None
    call = api.calls_of("sendmessage")[0]  # case-insensitive lookup
    assert call.params["chat_id"] == CHAT
    assert call.params["reply_markup"]["inline_keyboard"][0][0]["callback_data"] == "del:abc"
    assert [(m.message_id, m.text) for m in api.messages(CHAT)] == [
        (first.message_id, "1/3 drafting"),
        (second.message_id, "123"),
    ]


async def test_edit_with_unchanged_content_is_not_modified(api: FakeBotAPI, bot: Bot) -> None:
    sent = await bot.send_message(CHAT, "1/3", reply_markup=keyboard("del:x"))
    edited = await bot.edit_message_text(
        "2/3", chat_id=CHAT, message_id=sent.message_id, reply_markup=keyboard("del:x")
    )
    assert not isinstance(edited, bool)
    assert edited.text == "2/3" and edited.edit_date is not None
    with pytest.raises(TelegramBadRequest, match="message is not modified") as info:
        await bot.edit_message_text(
            "2/3", chat_id=CHAT, message_id=sent.message_id, reply_markup=keyboard("del:x")
        )
    assert NOT_MODIFIED.endswith(info.value.message)
    # Same text, different markup: that is a modification.
    await bot.edit_message_text(
        "2/3", chat_id=CHAT, message_id=sent.message_id, reply_markup=keyboard("del:y")
    )
    # Without reply_markup the keyboard goes away, as on Telegram.
    await bot.edit_message_text("2/3", chat_id=CHAT, message_id=sent.message_id)
    [current] = api.messages(CHAT)
    assert current.text == "2/3" and current.reply_markup is None and current.edits == 3


async def test_edit_unknown_message_is_not_found(bot: Bot) -> None:
    with pytest.raises(TelegramBadRequest, match="message to edit not found"):
        await bot.edit_message_text("x", chat_id=CHAT, message_id=999_999)


async def test_edit_reply_markup_and_delete(api: FakeBotAPI, bot: Bot) -> None:
    sent = await bot.send_message(CHAT, "✅ done", reply_markup=keyboard("del:1"))
    edited = await bot.edit_message_reply_markup(
        chat_id=CHAT, message_id=sent.message_id, reply_markup=keyboard("del:2")
    )
    assert not isinstance(edited, bool) and edited.reply_markup is not None
    assert edited.reply_markup.model_dump() == keyboard("del:2").model_dump()
    with pytest.raises(TelegramBadRequest, match="message is not modified"):
        await bot.edit_message_reply_markup(
            chat_id=CHAT, message_id=sent.message_id, reply_markup=keyboard("del:2")
        )
    assert await bot.delete_message(CHAT, sent.message_id) is True
    assert api.messages(CHAT) == []
    with pytest.raises(TelegramBadRequest, match="message to edit not found"):
        await bot.edit_message_text("again", chat_id=CHAT, message_id=sent.message_id)


async def test_callback_data_over_64_bytes_is_rejected(bot: Bot) -> None:
    with pytest.raises(TelegramBadRequest, match="BUTTON_DATA_INVALID"):
        await bot.send_message(CHAT, "x", reply_markup=keyboard("가" * 22))  # 66 bytes


async def test_answer_callback_query_is_recorded(api: FakeBotAPI, bot: Bot) -> None:
    assert await bot.answer_callback_query("111", text="Deleted") is True
    assert await bot.answer_callback_query("111") is True
    assert await bot.answer_callback_query("222") is True
    assert api.answered_callback_ids() == ["111", "111", "222"]
    assert api.calls_of("answerCallbackQuery")[0].params["text"] == "Deleted"


async def test_queued_callback_message_can_be_edited(api: FakeBotAPI, bot: Bot) -> None:
    update = load_fixture("callback_delete")
    api.queue_update(update)
    message = update["callback_query"]["message"]
    [known] = api.messages(CHAT)
    assert known.message_id == message["message_id"] and known.text == message["text"]
    with pytest.raises(TelegramBadRequest, match="message is not modified"):
        await bot.edit_message_text(
            message["text"],
            chat_id=CHAT,
            message_id=message["message_id"],
            reply_markup=InlineKeyboardMarkup.model_validate(message["reply_markup"]),
        )
    sent = await bot.send_message(CHAT, "next")
    assert sent.message_id > message["message_id"]
    assert sent.chat.username == "example_author"  # chat learned from the update


async def test_get_updates_honours_offset_and_limit(api: FakeBotAPI, bot: Bot) -> None:
    for update_id in (10, 11, 12):
        api.queue_update({"update_id": update_id, **_message(update_id)})
    assert [u.update_id for u in await bot.get_updates(limit=2)] == [10, 11]
    assert [u.update_id for u in await bot.get_updates()] == [10, 11, 12]  # not confirmed yet
    batch = await bot.get_updates(offset=11)
    assert [u.update_id for u in batch] == [11, 12]
    assert batch[0].message is not None and batch[0].message.text == "m11"
    assert [u.update_id for u in await bot.get_updates(offset=13)] == []
    assert api.pending_updates == []
    # Negative offset: the last -offset updates; everything before is forgotten.
    for update_id in (20, 21, 22):
        api.queue_update({"update_id": update_id, **_message(update_id)})
    assert [u.update_id for u in await bot.get_updates(offset=-1)] == [22]
    assert [u["update_id"] for u in api.pending_updates] == [22]


async def test_get_updates_long_polls_briefly(api: FakeBotAPI, bot: Bot) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await bot.get_updates(timeout=30) == []
    assert 0.25 <= loop.time() - started < 2.0  # capped at long_poll_cap=0.3 s

    async def later() -> None:
        await asyncio.sleep(0.05)
        api.queue_update({"update_id": 5, **_message(5)})

    api.long_poll_cap = 3.0
    started = loop.time()
    task = asyncio.create_task(later())
    updates = await bot.get_updates(timeout=30)
    await task
    assert [u.update_id for u in updates] == [5]
    assert loop.time() - started < 2.0  # woken by the update, not by the cap


async def test_get_updates_conflicts_with_active_webhook(api: FakeBotAPI, bot: Bot) -> None:
    api.queue_update({"update_id": 1, **_message(1)})
    assert await bot.set_webhook("https://example.com/hook", secret_token="s3cr3t_-X")
    info = await bot.get_webhook_info()
    assert info.url == "https://example.com/hook" and info.pending_update_count == 1
    assert api.webhook.secret_token == "s3cr3t_-X"
    with pytest.raises(TelegramConflictError, match="webhook is active"):
        await bot.get_updates()
    assert await bot.delete_webhook(drop_pending_updates=True)
    assert api.calls_of("deleteWebhook")[0].params["drop_pending_updates"] is True
    assert api.webhook.dropped_updates == 1
    assert (await bot.get_webhook_info()).url == ""
    assert await bot.get_updates() == []


async def test_set_webhook_rejects_bad_secret(bot: Bot) -> None:
    with pytest.raises(TelegramBadRequest, match="secret token"):
        await bot.set_webhook("https://example.com/hook", secret_token="has space")


async def test_429_injection_raises_retry_after(api: FakeBotAPI, bot: Bot) -> None:
    api.fail_next("sendMessage", status=429, retry_after=7)
    with pytest.raises(TelegramRetryAfter) as info:
        await bot.send_message(CHAT, "hi")
    assert info.value.retry_after == 7
    assert "Too Many Requests: retry after 7" in str(info.value)
    sent = await bot.send_message(CHAT, "hi")  # only the next call failed
    assert sent.text == "hi"
    assert len(api.calls_of("sendMessage")) == 2
    assert [m.text for m in api.messages(CHAT)] == ["hi"]


async def test_answer_failure_is_not_counted_as_answer(api: FakeBotAPI, bot: Bot) -> None:
    api.fail_next("answerCallbackQuery", status=500, times=1)
    with pytest.raises(Exception, match="Internal Server Error"):
        await bot.answer_callback_query("9")
    assert api.answered_callback_ids() == []


async def test_unknown_methods_fall_back_to_true(api: FakeBotAPI, bot: Bot) -> None:
    assert await bot.send_chat_action(CHAT, "typing") is True
    assert api.unknown_methods == ["sendChatAction"]
    api.set_result("sendChatAction", lambda params: params["action"] == "typing")
    assert await bot.send_chat_action(CHAT, "typing") is True
    assert api.unknown_methods == ["sendChatAction"]


async def test_json_and_raw_requests(api: FakeBotAPI) -> None:
    async with aiohttp.ClientSession() as http:
        url = f"{api.url}/bot{TOKEN}/sendMessage"
        async with http.post(url, json={"chat_id": CHAT, "text": "via json"}) as resp:
            body = await resp.json()
        assert body["ok"] is True and body["result"]["text"] == "via json"
        async with http.get(f"{api.url}/botnot-a-token/getMe") as resp:
            assert resp.status == 401
            assert (await resp.json())["ok"] is False
        async with http.post(url, json={"chat_id": CHAT, "text": ""}) as resp:
            assert resp.status == 400
            assert (await resp.json())["description"] == "Bad Request: message text is empty"


def _message(update_id: int) -> dict[str, object]:
    return {
        "message": {
            "message_id": update_id,
            "date": 1761025920,
            "chat": {"id": CHAT, "type": "private", "first_name": "Min"},
            "from": {"id": CHAT, "is_bot": False, "first_name": "Min"},
            "text": f"m{update_id}",
        }
    }


# ----------------------------------------------- the entry point, in another process


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _start_fake(*args: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "telegram_idem.testing.bot_api",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    async with asyncio.timeout(30):
        url = (await proc.stdout.readline()).decode().strip()
    return proc, url


@pytest.mark.parametrize("stop_with", [signal.SIGINT, signal.SIGTERM])
async def test_the_entry_point_serves_a_bot_in_another_process(
    tmp_path: Path, stop_with: signal.Signals
) -> None:
    port = _free_port()
    queued = tmp_path / "updates.json"
    queued.write_text(json.dumps([{"update_id": 7, **_message(7)}]), encoding="utf-8")
    proc, url = await _start_fake("--port", str(port), "--updates", str(queued))
    try:
        assert url == f"http://127.0.0.1:{port}"
        session = AiohttpSession(api=TelegramAPIServer.from_base(url))
        async with Bot(token=TOKEN, session=session) as bot:
            me = await bot.get_me()
            updates = await bot.get_updates(timeout=0)
        assert (me.id, me.username) == (7000000001, "example_blog_bot")
        assert [u.update_id for u in updates] == [7]
    finally:
        if proc.returncode is None:
            proc.send_signal(stop_with)
        async with asyncio.timeout(30):
            rc = await proc.wait()
    assert rc == 0


async def test_the_entry_point_refuses_a_file_without_updates(tmp_path: Path) -> None:
    bad = tmp_path / "updates.json"
    bad.write_text(json.dumps([{"message": {}}]), encoding="utf-8")
    proc, url = await _start_fake("--updates", str(bad))
    async with asyncio.timeout(30):
        rc = await proc.wait()
    assert proc.stderr is not None
    assert (url, rc) == ("", 2)
    assert "integer update_id" in (await proc.stderr.read()).decode()
