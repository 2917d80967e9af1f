"""The aiogram outbound glue's conversions, against aiogram's own objects: a method as the
Bot API JSON aiogram would send, Telegram's answer as the object aiogram would return, and
a dead letter as the exception aiogram would raise."""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiogram import Bot, Dispatcher, Router
from aiogram.client.default import DefaultBotProperties
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import (
    TelegramAPIError,
    TelegramBadRequest,
    TelegramForbiddenError,
    TelegramRetryAfter,
)
from aiogram.methods import BanChatMember, SendMediaGroup, SendMessage, SendPhoto
from aiogram.types import (
    BufferedInputFile,
    FSInputFile,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    InputMediaPhoto,
    LinkPreviewOptions,
    Message,
    URLInputFile,
)

from telegram_idem import Idem, idempotent
from telegram_idem.adapters.aiogram import (
    FloodControlMiddleware,
    IdempotencyMiddleware,
    OutboxSessionMiddleware,
    method_params,
    returned,
    to_aiogram_error,
)
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.errors import ChatParkedError, SendFailedError, UnknownOutcomeError
from telegram_idem.flood import BULK, REPLY, FloodControl, Limits, Rate, priority
from telegram_idem.outbox import CallStatus, FileRef, Outbound, encode_params
from telegram_idem.testing.bot_api import FakeBotAPI, Fault

TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"
BOT = 7000000001
CHAT = 5550001001


@pytest.fixture
def bot() -> Bot:
    return Bot(
        TOKEN,
        default=DefaultBotProperties(
            parse_mode="HTML", link_preview=LinkPreviewOptions(is_disabled=True)
        ),
    )


def test_a_message_is_what_aiogram_sends_with_the_bot_defaults(bot: Bot) -> None:
    markup = InlineKeyboardMarkup(
        inline_keyboard=[[InlineKeyboardButton(text="Approve", callback_data="approve")]]
    )
    params = method_params(bot, SendMessage(chat_id=5, text="hi", reply_markup=markup))
    assert params == {
        "chat_id": 5,
        "text": "hi",
        "parse_mode": "HTML",
        "link_preview_options": {"is_disabled": True},
        "reply_markup": {"inline_keyboard": [[{"text": "Approve", "callback_data": "approve"}]]},
    }
    encode_params(params)  # storable as it is


def test_an_explicit_value_wins_over_the_default(bot: Bot) -> None:
    params = method_params(bot, SendMessage(chat_id=5, text="*hi*", parse_mode="MarkdownV2"))
    assert params["parse_mode"] == "MarkdownV2"


def test_dates_are_unix_time(bot: Bot) -> None:
    until = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    params = method_params(bot, BanChatMember(chat_id=-100, user_id=7, until_date=until))
    assert params["until_date"] == int(until.timestamp())


def test_local_files_by_reference_urls_as_urls(bot: Bot, tmp_path: Path) -> None:
    photo = tmp_path / "cat.jpg"
    photo.write_bytes(b"\xff\xd8")
    params = method_params(bot, SendPhoto(chat_id=5, photo=FSInputFile(photo), caption="c"))
    assert params["photo"] == FileRef(str(photo))
    assert b'"telegram_idem_file"' in encode_params(params)
    by_url = method_params(bot, SendPhoto(chat_id=5, photo=URLInputFile("https://e.x/cat.jpg")))
    assert by_url["photo"] == "https://e.x/cat.jpg"
    group = method_params(
        bot, SendMediaGroup(chat_id=5, media=[InputMediaPhoto(media=FSInputFile(photo))])
    )
    assert group["media"][0]["media"] == FileRef(str(photo))


def test_bytes_in_memory_are_refused_clearly(bot: Bot) -> None:
    with pytest.raises(TypeError, match="BufferedInputFile"):
        method_params(bot, SendPhoto(chat_id=5, photo=BufferedInputFile(b"x", "x.jpg")))


def test_the_answer_is_aiogram_s_object_bound_to_the_bot(bot: Bot) -> None:
    result = {
        "message_id": 42,
        "date": 1700000000,
        "chat": {"id": 5, "type": "private", "first_name": "U"},
        "text": "hi",
    }
    message = returned(bot, SendMessage(chat_id=5, text="hi"), result)
    assert isinstance(message, Message)
    assert message.message_id == 42
    assert message.bot is bot  # message.answer() works on it


@pytest.mark.parametrize(
    ("code", "aiogram_type"),
    [(400, TelegramBadRequest), (403, TelegramForbiddenError), (420, TelegramAPIError)],
)
def test_a_dead_letter_is_both_aiogram_s_error_and_ours(
    code: int, aiogram_type: type[Exception]
) -> None:
    method = SendMessage(chat_id=5, text="hi")
    err = SendFailedError("refused", key="k1", error_code=code, description="Bad Request: no")
    mapped = to_aiogram_error(err, method)
    assert isinstance(mapped, aiogram_type)
    assert isinstance(mapped, SendFailedError)
    assert (mapped.key, mapped.error_code, mapped.description) == ("k1", code, "Bad Request: no")
    assert "Bad Request: no" in str(mapped)
    assert isinstance(mapped, TelegramAPIError) and mapped.method is method


def test_a_parked_chat_is_forbidden_and_parked() -> None:
    err = ChatParkedError("parked", key="k", error_code=403, description="Forbidden: blocked")
    mapped = to_aiogram_error(err, SendMessage(chat_id=5, text="hi"))
    assert isinstance(mapped, TelegramForbiddenError)
    assert isinstance(mapped, ChatParkedError)


# ----------------------------------------------------------------- flood control only


def paced_bot(api: FakeBotAPI, flood: FloodControl, **options: Any) -> Bot:
    session = AiohttpSession(api=TelegramAPIServer.from_base(api.url))
    client = Bot(TOKEN, session=session)
    client.session.middleware(FloodControlMiddleware(flood, **options))
    return client


def flood_of(store: MemoryStore, limits: Limits | None = None) -> FloodControl:
    return FloodControl.for_store(store, bot_id=BOT, limits=limits)


async def test_a_429_pauses_every_sender_of_the_bot_and_the_call_goes_again(
    api: FakeBotAPI,
) -> None:
    store = MemoryStore()  # one store: two senders of one bot (two processes' share)
    first, second = paced_bot(api, flood_of(store)), paced_bot(api, flood_of(store))
    # The 429s hit this chat's sends only: the other sender's call must not take one.
    api.inject(Fault.retry_after(1, method="sendMessage", chat_id=CHAT, times=2))
    async with first, second:
        sending = asyncio.create_task(first.send_message(CHAT, "hi"))
        while not api.calls_of("sendMessage"):
            await asyncio.sleep(0.005)
        refused_at = api.calls_of("sendMessage")[0].at
        await asyncio.sleep(0.05)  # the 429 is answered and the pause stored
        other = await second.send_message(CHAT + 1, "elsewhere")
        message = await sending
    sends = api.calls_of("sendMessage")
    assert isinstance(message, Message) and message.text == "hi"
    assert [c.params["text"] for c in sends].count("hi") == 3  # two 429s, then delivered
    first_gap = [c for c in sends if c.params["text"] == "hi"][1].at - refused_at
    assert first_gap >= 0.95  # retry_after honoured
    # The other sender waited behind the bot-wide pause, though its chat is another.
    elsewhere = next(c for c in sends if c.params["text"] == "elsewhere")
    assert elsewhere.at - refused_at >= 0.95
    assert other.text == "elsewhere"


async def test_429_retries_are_bounded(api: FakeBotAPI) -> None:
    api.fail_next("sendMessage", 429, retry_after=1, times=5)
    async with paced_bot(api, flood_of(MemoryStore()), max_retries=1) as client:
        with pytest.raises(TelegramRetryAfter):
            await client.send_message(CHAT, "hi")
    assert len(api.calls_of("sendMessage")) == 2


async def test_one_chat_is_paced_by_its_budget(api: FakeBotAPI) -> None:
    limits = Limits(chat=Rate(10, 1.0, burst=1))  # one message per 0.1 s in a chat
    async with paced_bot(api, flood_of(MemoryStore(), limits)) as client:
        await asyncio.gather(*(client.send_message(CHAT, f"m{i}") for i in range(5)))
        await client.answer_callback_query("q1")  # not a message: no chat budget spent
    times = [c.at for c in api.calls_of("sendMessage")]
    assert times[-1] - times[0] >= 0.35  # 5 messages: 4 intervals of 0.1 s
    assert api.answered_callback_ids() == ["q1"]


# ----------------------------------------------------------------- through the outbox


def message_update(update_id: int, *, chat: int = CHAT) -> dict[str, Any]:
    user = {"id": chat, "is_bot": False, "first_name": "U"}
    return {
        "update_id": update_id,
        "message": {
            "message_id": update_id,
            "date": 1700000000,
            "chat": {"id": chat, "type": "private", "first_name": "U"},
            "from": user,
            "text": "hello",
        },
    }


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
async def outbound(api: FakeBotAPI, store: MemoryStore) -> AsyncIterator[Outbound]:
    limits = Limits(chat=Rate(10, 1.0, burst=1))
    async with Outbound.for_store(store, token=TOKEN, base_url=api.url, limits=limits) as out:
        yield out


@pytest.fixture
async def sending_bot(api: FakeBotAPI, outbound: Outbound) -> AsyncIterator[Bot]:
    session = AiohttpSession(api=TelegramAPIServer.from_base(api.url))
    async with Bot(TOKEN, session=session) as client:
        client.session.middleware(OutboxSessionMiddleware(outbound, wait=10.0))
        yield client


def guarded(store: MemoryStore, router: Router) -> Dispatcher:
    dp = Dispatcher()
    dp.update.outer_middleware(IdempotencyMiddleware(Idem(store, heartbeat=False)))
    dp.include_router(router)
    return dp


async def test_an_answer_in_an_action_is_a_delivered_outbox_call_and_a_message(
    api: FakeBotAPI, store: MemoryStore, sending_bot: Bot
) -> None:
    router, sent = Router(), []

    @router.message()
    @idempotent(key="reply:{message.message_id}")
    async def reply(message: Message) -> None:
        sent.append(await message.answer("hi"))

    await guarded(store, router).feed_raw_update(sending_bot, message_update(1))
    (answer,) = sent
    assert isinstance(answer, Message) and answer.bot is sending_bot
    assert answer.message_id == api.messages(CHAT)[0].message_id
    assert (await store.outbox().counts()).get(CallStatus.DELIVERED) == 1


async def test_a_bulk_block_gives_aiograms_calls_the_bulk_priority(
    api: FakeBotAPI, store: MemoryStore, sending_bot: Bot
) -> None:
    router = Router()

    @router.message()
    @idempotent(key="broadcast:{message.message_id}")
    async def broadcast(message: Message) -> None:
        await message.answer("you asked")  # a reply: REPLY
        with priority(BULK):  # aiogram has no per-call argument for it
            await sending_bot.send_message(CHAT + 1, "news")
            await sending_bot.send_message(CHAT + 2, "news", request_timeout=5)

    await guarded(store, router).feed_raw_update(sending_bot, message_update(1))
    entries = await store.outbox().entries(status=CallStatus.DELIVERED, limit=10)
    assert sorted((e.ordering_key, e.priority) for e in entries) == [
        (f"chat:{CHAT}", REPLY),
        (f"chat:{CHAT + 1}", BULK),
        (f"chat:{CHAT + 2}", BULK),
    ]


async def test_a_crash_retry_sends_once_and_answers_the_first_message(
    api: FakeBotAPI, store: MemoryStore, sending_bot: Bot
) -> None:
    router, sent = Router(), []

    @router.message()
    @idempotent(key="reply:{message.message_id}")
    async def reply(message: Message) -> None:
        sent.append(await message.answer("hi"))
        if len(sent) == 1:
            raise RuntimeError("crashed after the send")  # the action is released

    dp = guarded(store, router)
    with pytest.raises(RuntimeError):
        await dp.feed_raw_update(sending_bot, message_update(1))
    await dp.feed_raw_update(sending_bot, message_update(1))  # Telegram re-sends it
    assert len(api.calls_of("sendMessage")) == 1
    assert [m.message_id for m in sent] == [sent[0].message_id] * 2


async def test_an_ambiguous_send_is_held_and_never_sent_again(
    api: FakeBotAPI, store: MemoryStore, sending_bot: Bot
) -> None:
    router = Router()

    @router.message()
    @idempotent(key="reply:{message.message_id}")
    async def reply(message: Message) -> None:
        await message.answer("hi")

    api.fail_next("sendMessage", 502)  # may have been applied: policy hold (send*)
    dp = guarded(store, router)
    for _ in range(2):  # the update re-sent: the action runs again
        with pytest.raises(UnknownOutcomeError):
            await dp.feed_raw_update(sending_bot, message_update(1))
    assert len(api.calls_of("sendMessage")) == 1
    assert (await store.outbox().counts()).get(CallStatus.UNKNOWN) == 1


async def test_an_accepted_then_dropped_reply_is_held_and_never_sent_again(
    api: FakeBotAPI, store: MemoryStore, sending_bot: Bot
) -> None:
    router = Router()

    @router.message()
    @idempotent(key="reply:{message.message_id}")
    async def reply(message: Message) -> None:
        await message.answer("hi")

    api.inject(Fault.drop(method="sendMessage"))  # Telegram applies it, then no answer
    dp = guarded(store, router)
    for _ in range(2):  # the update re-sent: the action runs again
        with pytest.raises(UnknownOutcomeError):
            await dp.feed_raw_update(sending_bot, message_update(1))
    assert len(api.calls_of("sendMessage")) == 1
    assert api.sent_texts(CHAT) == ["hi"]  # it was delivered: sending again would repeat it
    assert (await store.outbox().counts()).get(CallStatus.UNKNOWN) == 1


async def test_a_429_storm_in_an_action_is_waited_out(
    api: FakeBotAPI, store: MemoryStore, sending_bot: Bot
) -> None:
    router, sent = Router(), []

    @router.message()
    @idempotent(key="reply:{message.message_id}")
    async def reply(message: Message) -> None:
        sent.append(await message.answer("hi"))

    api.fail_next("sendMessage", 429, retry_after=1, times=2)
    await guarded(store, router).feed_raw_update(sending_bot, message_update(1))
    calls = api.calls_of("sendMessage")
    assert len(calls) == 3 and calls[2].at - calls[0].at >= 1.9
    assert sent[0].message_id == api.messages(CHAT)[0].message_id


async def test_a_callback_answer_never_waits_behind_a_busy_chat(
    api: FakeBotAPI, store: MemoryStore, sending_bot: Bot
) -> None:
    router = Router()

    @router.message()
    @idempotent(key="burst:{message.message_id}")
    async def burst(message: Message) -> None:
        async def answer(text: str) -> Message:
            return await message.answer(text)

        await asyncio.gather(
            *(answer(f"m{i}") for i in range(5)),
            sending_bot.answer_callback_query("q1"),
        )

    await guarded(store, router).feed_raw_update(sending_bot, message_update(1))
    sends = [c.at for c in api.calls_of("sendMessage")]
    (answer,) = api.calls_of("answerCallbackQuery")
    assert sends[-1] - sends[0] >= 0.35  # the chat is paced: one per 0.1 s
    assert answer.at < sends[-1]  # the answer did not queue behind the chat


async def test_outside_an_action_a_call_is_sent_directly_and_paced(
    api: FakeBotAPI, store: MemoryStore, sending_bot: Bot
) -> None:
    sent = await asyncio.gather(*(sending_bot.send_message(CHAT, f"m{i}") for i in range(4)))
    assert sorted(m.message_id for m in sent) == [m.message_id for m in api.messages(CHAT)]
    times = [c.at for c in api.calls_of("sendMessage")]
    assert times[-1] - times[0] >= 0.25
    assert not await store.outbox().counts() or sum((await store.outbox().counts()).values()) == 0


async def test_a_refused_call_is_aiogram_s_error(api: FakeBotAPI, sending_bot: Bot) -> None:
    with pytest.raises(TelegramBadRequest, match="message text is empty") as caught:
        await sending_bot.send_message(CHAT, " ")
    assert isinstance(caught.value, SendFailedError) and caught.value.error_code == 400


async def test_a_url_input_file_with_the_token_is_refused_in_an_action(
    api: FakeBotAPI, store: MemoryStore, sending_bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    """The Bot API's own download URL (``/file/bot<token>/...``) as a ``URLInputFile``
    would store the token in the outbox entry: refused, nothing stored, nothing sent."""
    caplog.set_level(logging.DEBUG)
    secret = TOKEN.partition(":")[2]
    router, refused = Router(), []

    @router.message()
    @idempotent(key="doc:{message.message_id}")
    async def forward(message: Message) -> None:
        url = f"https://api.telegram.org/file/bot{TOKEN}/documents/file_1.pdf"
        for document in (url, url.replace(f"bot{BOT}:", f"bot{BOT}%3A")):
            try:
                await message.answer_document(URLInputFile(document))
            except ValueError as exc:
                refused.append(str(exc))

    await guarded(store, router).feed_raw_update(sending_bot, message_update(1))
    assert len(refused) == 2 and all("file_id instead" in text for text in refused)
    assert all(secret not in text for text in refused) and secret not in caplog.text
    assert api.calls_of("sendDocument") == []
    assert sum((await store.outbox().counts()).values()) == 0
