"""The PTB outbound glue's conversions, against PTB's own objects: the ``data`` PTB hands
its rate limiter as Bot API JSON, and a dead letter as the exception PTB would raise."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from telegram import InlineKeyboardButton, InlineKeyboardMarkup, InputFile, InputMediaPhoto
from telegram.error import BadRequest, Forbidden, TelegramError

from telegram_idem.adapters.ptb import request_params, to_ptb_error
from telegram_idem.errors import ChatParkedError, SendFailedError
from telegram_idem.outbox import FileRef, encode_params


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
