"""The PTB outbound glue's conversions, against PTB's own objects: the ``data`` PTB hands
its rate limiter as Bot API JSON, and a dead letter as the exception PTB would raise."""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from telegram import (
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    InputFile,
    InputMediaPhoto,
    Message,
    Update,
)
from telegram.error import BadRequest, Forbidden, RetryAfter, TelegramError
from telegram.ext import Application, ApplicationBuilder, MessageHandler, filters

from telegram_idem import Idem
from telegram_idem.adapters.ptb import (
    FloodRateLimiter,
    IdempotentUpdateProcessor,
    OutboxRateLimiter,
    request_params,
    to_ptb_error,
)
from telegram_idem.adapters.ptb import idempotent as ptb_idempotent
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.errors import ChatParkedError, SendFailedError, UnknownOutcomeError
from telegram_idem.flood import FloodControl, Limits, Rate
from telegram_idem.outbox import CallStatus, FileRef, Outbound, encode_params
from telegram_idem.testing.bot_api import FakeBotAPI, Fault

TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"
BOT = 7000000001
CHAT = 5550001001


def test_objects_become_their_json() -> None:
    markup = InlineKeyboardMarkup([[InlineKeyboardButton("Approve", callback_data="approve")]])
    until = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    params = request_params({"chat_id": 5, "reply_markup": markup, "until_date": until})
    assert params == {
        "chat_id": 5,
        "reply_markup": {"inline_keyboard": [[{"text": "Approve", "callback_data": "approve"}]]},
        "until_date": int(until.timestamp()),
    }
    encode_params(params)


def test_a_file_ptb_kept_by_path_is_a_reference(tmp_path: Path) -> None:
    photo = tmp_path / "cat.jpg"
    photo.write_bytes(b"\xff\xd8")
    with photo.open("rb") as handle:
        params = request_params({"chat_id": 5, "photo": InputFile(handle, read_file_handle=False)})
        assert params["photo"] == FileRef(str(photo))
        media = InputMediaPhoto(InputFile(handle, read_file_handle=False, attach=True))
        group = request_params({"chat_id": 5, "media": [media]})
    assert group["media"] == [{"type": "photo", "media": FileRef(str(photo))}]
    assert b'"telegram_idem_file"' in encode_params(group)


def test_bytes_in_memory_are_refused_clearly() -> None:
    with pytest.raises(TypeError, match="read_file_handle=False"):
        request_params({"chat_id": 5, "photo": InputFile(b"\xff\xd8", filename="x.jpg")})


@pytest.mark.parametrize(
    ("code", "ptb_type"), [(400, BadRequest), (403, Forbidden), (420, TelegramError)]
)
def test_a_dead_letter_is_both_ptb_s_error_and_ours(code: int, ptb_type: type[Exception]) -> None:
    err = SendFailedError("refused", key="k1", error_code=code, description="Bad Request: no")
    mapped = to_ptb_error(err)
    assert isinstance(mapped, ptb_type)
    assert isinstance(mapped, SendFailedError)
    assert (mapped.key, mapped.error_code, mapped.description) == ("k1", code, "Bad Request: no")
    assert str(mapped) == "No"  # PTB's own message rule ("Bad Request: " cut, capitalised)


def test_a_parked_chat_is_forbidden_and_parked() -> None:
    err = ChatParkedError("parked", key="k", error_code=403, description="Forbidden: blocked")
    mapped = to_ptb_error(err)
    assert isinstance(mapped, Forbidden)
    assert isinstance(mapped, ChatParkedError)


# ----------------------------------------------------------------- flood control only

App = Application[Any, Any, Any, Any, Any, Any]


def paced_app(api: FakeBotAPI, flood: FloodControl, **options: Any) -> App:
    app: App = (
        ApplicationBuilder()
        .token(TOKEN)
        .base_url(api.ptb_base_url)
        .rate_limiter(FloodRateLimiter(flood, **options))
        .build()
    )
    return app


def flood_of(store: MemoryStore, limits: Limits | None = None) -> FloodControl:
    return FloodControl.for_store(store, bot_id=BOT, limits=limits)


@pytest.fixture
async def api() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI() as fake:
        yield fake


async def test_a_429_pauses_every_sender_of_the_bot_and_the_call_goes_again(
    api: FakeBotAPI,
) -> None:
    store = MemoryStore()  # one store: two senders of one bot (two processes' share)
    first, second = paced_app(api, flood_of(store)), paced_app(api, flood_of(store))
    # The 429s hit this chat's sends only: the other sender's call must not take one.
    api.inject(Fault.retry_after(1, method="sendMessage", chat_id=CHAT, times=2))
    async with first, second:
        sending = asyncio.create_task(first.bot.send_message(CHAT, "hi"))
        while not api.calls_of("sendMessage"):
            await asyncio.sleep(0.005)
        refused_at = api.calls_of("sendMessage")[0].at
        await asyncio.sleep(0.05)  # the 429 is answered and the pause stored
        other = await second.bot.send_message(CHAT + 1, "elsewhere")
        message = await sending
    sends = api.calls_of("sendMessage")
    assert isinstance(message, Message) and message.text == "hi"
    his = [c for c in sends if c.params["text"] == "hi"]
    assert len(his) == 3  # two 429s, then delivered
    assert his[1].at - refused_at >= 0.95  # retry_after honoured
    elsewhere = next(c for c in sends if c.params["text"] == "elsewhere")
    assert elsewhere.at - refused_at >= 0.95  # behind the bot-wide pause
    assert other.text == "elsewhere"


async def test_429_retries_are_bounded(api: FakeBotAPI) -> None:
    api.fail_next("sendMessage", 429, retry_after=1, times=5)
    async with paced_app(api, flood_of(MemoryStore()), max_retries=1) as app:
        with pytest.raises(RetryAfter):
            await app.bot.send_message(CHAT, "hi")
    assert len(api.calls_of("sendMessage")) == 2


async def test_one_chat_is_paced_by_its_budget(api: FakeBotAPI) -> None:
    limits = Limits(chat=Rate(10, 1.0, burst=1))  # one message per 0.1 s in a chat
    async with paced_app(api, flood_of(MemoryStore(), limits)) as app:
        await asyncio.gather(*(app.bot.send_message(CHAT, f"m{i}") for i in range(5)))
        await app.bot.answer_callback_query("q1")
    times = [c.at for c in api.calls_of("sendMessage")]
    assert times[-1] - times[0] >= 0.35  # 5 messages: 4 intervals of 0.1 s
    assert api.answered_callback_ids() == ["q1"]


# ----------------------------------------------------------------- through the outbox


def message_update(update_id: int) -> dict[str, Any]:
    user = {"id": CHAT, "is_bot": False, "first_name": "U"}
    chat = {"id": CHAT, "type": "private", "first_name": "U"}
    return {
        "update_id": update_id,
        "message": {
            "message_id": update_id,
            "date": 1700000000,
            "chat": chat,
            "from": user,
            "text": "hello",
        },
    }


async def run_outboxed(
    api: FakeBotAPI, handler: Any, *updates: dict[str, Any], limits: Limits | None = None
) -> MemoryStore:
    """A PTB application guarded by the processor, its calls through the outbox (flood
    ``limits``, Telegram's by default); each update fed in turn (a handler error is
    PTB's: logged, the update released)."""
    store = MemoryStore()
    idem = Idem(store, heartbeat=False)
    outbound = Outbound.for_store(store, token=TOKEN, base_url=api.url, limits=limits)
    async with outbound:
        app: App = (
            ApplicationBuilder()
            .token(TOKEN)
            .base_url(api.ptb_base_url)
            .concurrent_updates(IdempotentUpdateProcessor(idem, 1))
            .rate_limiter(OutboxRateLimiter(outbound, wait=10.0))
            .build()
        )
        app.add_handler(MessageHandler(filters.TEXT, handler))
        app.add_error_handler(lambda update, context: asyncio.sleep(0))
        async with app:
            await app.start()  # the processor runs what the update queue feeds
            for update in updates:
                await app.update_queue.put(Update.de_json(update, app.bot))
                await app.update_queue.join()
            await app.stop()
    return store


async def test_reply_text_in_an_action_is_sent_once_and_is_a_message(api: FakeBotAPI) -> None:
    sent: list[Message] = []

    @ptb_idempotent(key="reply:{message.message_id}")
    async def reply(update: Update, context: Any) -> None:
        assert update.message is not None
        sent.append(await update.message.reply_text("hi"))
        if len(sent) == 1:
            raise RuntimeError("crashed after the send")  # released: runs again

    store = await run_outboxed(api, reply, message_update(1), message_update(1))
    assert len(api.calls_of("sendMessage")) == 1
    assert len(sent) == 2 and sent[0].message_id == sent[1].message_id
    assert sent[0].message_id == api.messages(CHAT)[0].message_id
    assert (await store.outbox().counts()).get(CallStatus.DELIVERED) == 1


async def test_an_ambiguous_send_is_held_and_never_sent_again(api: FakeBotAPI) -> None:
    errors: list[BaseException] = []

    @ptb_idempotent(key="reply:{message.message_id}")
    async def reply(update: Update, context: Any) -> None:
        assert update.message is not None
        try:
            await update.message.reply_text("hi")
        except UnknownOutcomeError as exc:
            errors.append(exc)
            raise

    api.fail_next("sendMessage", 502)
    store = await run_outboxed(api, reply, message_update(1), message_update(1))
    assert len(errors) == 2 and len(api.calls_of("sendMessage")) == 1
    assert (await store.outbox().counts()).get(CallStatus.UNKNOWN) == 1


async def test_an_accepted_then_dropped_reply_is_held_and_never_sent_again(
    api: FakeBotAPI,
) -> None:
    errors: list[BaseException] = []

    @ptb_idempotent(key="reply:{message.message_id}")
    async def reply(update: Update, context: Any) -> None:
        assert update.message is not None
        try:
            await update.message.reply_text("hi")
        except UnknownOutcomeError as exc:
            errors.append(exc)
            raise

    api.inject(Fault.drop(method="sendMessage"))  # Telegram applies it, then no answer
    store = await run_outboxed(api, reply, message_update(1), message_update(1))
    assert len(errors) == 2 and len(api.calls_of("sendMessage")) == 1
    assert api.sent_texts(CHAT) == ["hi"]  # it was delivered: sending again would repeat it
    assert (await store.outbox().counts()).get(CallStatus.UNKNOWN) == 1


async def test_a_429_storm_in_an_action_is_waited_out(api: FakeBotAPI) -> None:
    sent: list[Message] = []

    @ptb_idempotent(key="reply:{message.message_id}")
    async def reply(update: Update, context: Any) -> None:
        assert update.message is not None
        sent.append(await update.message.reply_text("hi"))

    api.fail_next("sendMessage", 429, retry_after=1, times=2)
    store = await run_outboxed(api, reply, message_update(1))
    calls = api.calls_of("sendMessage")
    assert len(calls) == 3 and calls[2].at - calls[0].at >= 1.9  # retry_after honoured twice
    assert sent[0].message_id == api.messages(CHAT)[0].message_id
    assert (await store.outbox().counts()).get(CallStatus.DELIVERED) == 1  # no dead letter


async def test_a_callback_answer_never_waits_behind_a_busy_chat(api: FakeBotAPI) -> None:
    @ptb_idempotent(key="burst:{message.message_id}")
    async def burst(update: Update, context: Any) -> None:
        await asyncio.gather(
            *(context.bot.send_message(CHAT, f"m{i}") for i in range(5)),
            context.bot.answer_callback_query("q1"),
        )

    limits = Limits(chat=Rate(10, 1.0, burst=1))  # one message per 0.1 s in a chat
    await run_outboxed(api, burst, message_update(1), limits=limits)
    sends = [c.at for c in api.calls_of("sendMessage")]
    (answer,) = api.calls_of("answerCallbackQuery")
    assert len(sends) == 5 and sends[-1] - sends[0] >= 0.35  # the chat is paced
    assert answer.at < sends[-1]  # the answer did not queue behind the chat


async def test_outside_an_action_a_call_is_sent_directly_and_paced(api: FakeBotAPI) -> None:
    store = MemoryStore()
    limits = Limits(chat=Rate(10, 1.0, burst=1))
    outbound = Outbound.for_store(store, token=TOKEN, base_url=api.url, limits=limits)
    app: App = (
        ApplicationBuilder()
        .token(TOKEN)
        .base_url(api.ptb_base_url)
        .rate_limiter(OutboxRateLimiter(outbound, wait=10.0))
        .build()
    )
    async with outbound, app:
        sent = await asyncio.gather(*(app.bot.send_message(CHAT, f"m{i}") for i in range(4)))
    assert all(isinstance(m, Message) for m in sent)
    assert sorted(m.message_id for m in sent) == [m.message_id for m in api.messages(CHAT)]
    times = [c.at for c in api.calls_of("sendMessage")]
    assert times[-1] - times[0] >= 0.25  # paced by flood control: 4 messages, 3 intervals
    assert sum((await store.outbox().counts()).values()) == 0  # not durable: no entry


async def test_a_document_url_with_the_token_is_refused_in_an_action(
    api: FakeBotAPI, caplog: pytest.LogCaptureFixture
) -> None:
    """PTB sends a URL document as the string: the Bot API's own download URL
    (``/file/bot<token>/...``) would store the token in the outbox entry. Refused,
    nothing stored, nothing sent, the token in no error or log line."""
    caplog.set_level(logging.DEBUG)
    head, _, secret = TOKEN.partition(":")
    refused: list[str] = []

    @ptb_idempotent(key="doc:{message.message_id}")
    async def forward(update: Update, context: Any) -> None:
        assert update.message is not None
        url = f"https://api.telegram.org/file/bot{TOKEN}/documents/file_1.pdf"
        for document in (url, url.replace(f"bot{head}:", f"bot{head}%3A")):
            try:
                await update.message.reply_document(document)
            except ValueError as exc:
                refused.append(str(exc))

    store = await run_outboxed(api, forward, message_update(1))
    assert len(refused) == 2 and all("file_id instead" in text for text in refused)
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("telegram_idem")]
    assert ours  # the action's decisions were logged (PTB's own DEBUG lines show the
    # token itself, "Set Bot API File URL": not ours to mask)
    assert all(secret not in text for text in refused + ours)
    assert api.calls_of("sendDocument") == []
    assert sum((await store.outbox().counts()).values()) == 0
