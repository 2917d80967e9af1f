"""The aiogram outbound glue's conversions, against aiogram's own objects: a method as the
Bot API JSON aiogram would send, Telegram's answer as the object aiogram would return, and
a dead letter as the exception aiogram would raise."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from aiogram import Bot
from aiogram.client.default import DefaultBotProperties
from aiogram.exceptions import (
    TelegramAPIError,
    TelegramBadRequest,
    TelegramForbiddenError,
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

from telegram_idem.adapters.aiogram import method_params, returned, to_aiogram_error
from telegram_idem.errors import ChatParkedError, SendFailedError
from telegram_idem.outbox import FileRef, encode_params

TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"


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
