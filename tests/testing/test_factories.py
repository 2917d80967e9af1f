"""UpdateFactory: every update it builds parses in aiogram 3 and python-telegram-bot 22,
with no field either library does not know, and routes to the handler it is meant for."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from aiogram.types import Update as AiogramUpdate
from pydantic import BaseModel
from telegram import Bot as PTBBot
from telegram import TelegramObject
from telegram import Update as PTBUpdate

from telegram_idem import _updates as u
from telegram_idem._keys import render_template
from telegram_idem.testing import (
    DEFAULT_BOT_ID,
    OMIT,
    UpdateFactory,
    chat_member_status,
    fixture_names,
    load_fixture,
    make_double_tap,
)
from telegram_idem.testing._factories import merge

PTB_BOT = PTBBot("123:offline")  # never initialised: de_json needs a bot only for shortcuts

# Bot API 9.6 fields aiogram 3.31 requires that python-telegram-bot 22.8 does not know yet
# (kept in api_kwargs). Anything else unknown to either library fails the test.
PTB_UNKNOWN_OK = {"can_send_welcome_messages"}

Build = Callable[[UpdateFactory], dict[str, Any]]


def member_becomes(status: str) -> Build:
    """A builder of a ``chat_member`` update moving a member to ``status``."""
    return lambda f: f.chat_member(old_status="member", new_status=status)


def recorded(name: str) -> Build:
    """A builder of the shipped recorded update ``name``."""
    return lambda f: f.recorded(name)


BUILDERS: dict[str, Build] = {
    "message": lambda f: f.message("hello"),
    "command": lambda f: f.command("/techpost", "Exactly once"),
    "command_in_forum_topic": lambda f: f.command(
        "draft", ["a", "b"], mention=True, chat=f.group(forum=True), message_thread_id=77
    ),
    "edited_message": lambda f: f.edited_message("edited"),
    "edited_message_of_original": lambda f: f.edited_message(
        "v2", original=f.command("/techpost", "v1")
    ),
    "callback_query_default": lambda f: f.callback_query("approve:1"),
    "callback_query_from_message": lambda f: f.callback_query(
        "del:42", from_message=f.bot_message("Published", buttons={"Delete": "del:42"})
    ),
    "callback_query_inline": lambda f: f.callback_query("vote:up", inline_message_id="AgAAAB"),
    "channel_post": lambda f: f.channel_post("news"),
    "inline_query": lambda f: f.inline_query("idempotency"),
    "chat_member": lambda f: f.chat_member(),
    "my_chat_member": lambda f: f.my_chat_member(),
    "chat_join_request": lambda f: f.chat_join_request(),
    "pre_checkout_query": lambda f: f.pre_checkout_query(payload="premium:1"),
    "successful_payment": lambda f: f.successful_payment(charge_id="stxCharge1"),
    "poll_answer": lambda f: f.poll_answer([0, 2]),
    "poll_answer_retracted": lambda f: f.poll_answer([]),
    "message_reaction": lambda f: f.message_reaction("👍", old="🔥"),
    "message_reaction_removed": lambda f: f.message_reaction([]),
    **{
        f"chat_member_{status}": member_becomes(status)
        for status in ("creator", "administrator", "member", "restricted", "left", "kicked")
    },
    **{f"recorded_{name}": recorded(name) for name in fixture_names()},
}


def aiogram_extras(model: object, path: str = "update") -> list[str]:
    """Fields aiogram kept as unknown extras, anywhere in the model tree."""
    found: list[str] = []
    if isinstance(model, BaseModel):
        found += [f"{path}.{k}" for k in model.model_extra or {}]
        for name in type(model).model_fields:
            found += aiogram_extras(getattr(model, name), f"{path}.{name}")
    elif isinstance(model, list | tuple):
        for i, item in enumerate(model):
            found += aiogram_extras(item, f"{path}[{i}]")
    return found


def ptb_extras(obj: object, path: str = "update") -> list[str]:
    """Fields python-telegram-bot did not know (its api_kwargs), anywhere in the tree."""
    found: list[str] = []
    if isinstance(obj, TelegramObject):
        found += [f"{path}.{k}" for k in obj.api_kwargs if k not in PTB_UNKNOWN_OK]
        for name, value in obj._get_attrs(recursive=False).items():
            found += ptb_extras(value, f"{path}.{name}")
    elif isinstance(obj, list | tuple):
        for i, item in enumerate(obj):
            found += ptb_extras(item, f"{path}[{i}]")
    return found


def contained(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Where ``expected`` (our JSON) is not reproduced inside ``actual`` (PTB's JSON)."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [path]
        return [
            miss
            for k, v in expected.items()
            if k not in PTB_UNKNOWN_OK
            for miss in (
                contained(v, actual.get(k), f"{path}.{k}")
                if k in actual or v != []  # PTB leaves empty lists out of its JSON
                else []
            )
        ]
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [path]
        return [
            m
            for i, (e, a) in enumerate(zip(expected, actual, strict=True))
            for m in contained(e, a, f"{path}[{i}]")
        ]
    return [] if expected == actual else [f"{path}: {expected!r} != {actual!r}"]


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_every_update_parses_in_aiogram_and_ptb_without_unknown_fields(kind: str) -> None:
    update = BUILDERS[kind](UpdateFactory())
    kind_field = u.update_type(update)
    assert kind_field is not None and kind_field in u.KNOWN_UPDATE_TYPES

    parsed = AiogramUpdate.model_validate(update)
    assert parsed.update_id == update["update_id"]
    assert parsed.event_type == kind_field
    assert aiogram_extras(parsed) == []

    ptb = PTBUpdate.de_json(update, PTB_BOT)
    assert ptb.update_id == update["update_id"]
    assert ptb_extras(ptb) == []
    ptb_json = json.loads(ptb.to_json())
    assert contained(update, ptb_json) == []


def test_ids_rise_and_every_call_returns_a_new_object() -> None:
    f = UpdateFactory(first_update_id=500, first_message_id=10)
    a, b = f.message("a"), f.command("/b")
    assert (a["update_id"], b["update_id"]) == (500, 501)
    assert (a["message"]["message_id"], b["message"]["message_id"]) == (10, 11)
    a["message"]["chat"]["id"] = 1
    assert f.message()["message"]["chat"]["id"] == f.user["id"]


def test_command_text_entity_and_mention() -> None:
    f = UpdateFactory()
    plain = f.command("techpost", ["웹훅", "재시도"])["message"]
    assert plain["text"] == "/techpost 웹훅 재시도"
    assert plain["entities"] == [{"offset": 0, "length": 9, "type": "bot_command"}]
    mentioned = f.command("/draft", mention=True)["message"]
    assert mentioned["text"] == "/draft@example_blog_bot"
    assert mentioned["entities"][0]["length"] == len(mentioned["text"])


def test_overrides_merge_nested_and_omit_removes() -> None:
    f = UpdateFactory()
    update = f.message("hi", from_={"language_code": "ko"}, chat={"title": "ignored"})
    sender = update["message"]["from"]
    assert sender["language_code"] == "ko" and sender["id"] == f.user["id"]
    # ``chat=`` is the keyword that replaces the chat wholesale:
    assert update["message"]["chat"] == {"title": "ignored"}
    anonymous = f.message("hi", from_=OMIT)
    assert "from" not in anonymous["message"]
    assert merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3, "b": OMIT}}) == {"a": {"c": 3}}


def test_callback_query_shapes() -> None:
    f = UpdateFactory()
    cmd = f.command("/techpost")
    tap = f.callback_query("del:1", from_message=cmd)["callback_query"]
    assert tap["message"] == cmd["message"] and tap["data"] == "del:1"
    inline = f.callback_query("x", inline_message_id="AgAAAB")["callback_query"]
    assert "message" not in inline and inline["inline_message_id"] == "AgAAAB"
    default = f.callback_query("approve:7")["callback_query"]
    assert default["message"]["from"]["id"] == DEFAULT_BOT_ID
    assert (
        default["message"]["reply_markup"]["inline_keyboard"][0][0]["callback_data"] == "approve:7"
    )
    with pytest.raises(ValueError, match="1-64 bytes"):
        f.callback_query("x" * 65)
    with pytest.raises(ValueError, match="not both"):
        f.callback_query("x", from_message=cmd, inline_message_id="A")


def test_double_tap_is_another_update_meaning_the_same_action() -> None:
    f = UpdateFactory()
    first = f.callback_query("del:9")
    second = f.double_tap(first)
    assert second["update_id"] > first["update_id"]
    assert second["callback_query"]["id"] != first["callback_query"]["id"]
    template = "button:{callback_query.message.message_id}:{callback_data}:{user_id}"
    assert render_template(template, first, bot_id=1) == render_template(template, second, bot_id=1)


def test_no_update_gets_the_id_of_a_default_second_tap() -> None:
    # make_double_tap's default second tap takes the tap's update_id + 1; the factory
    # skips that id, whichever way the callback query was made.
    f = UpdateFactory(first_update_id=1)
    tap = f.callback_query("del:1")
    message = f.message("hello")
    assert make_double_tap(tap)["update_id"] == 2
    assert message["update_id"] == 3
    renumbered = f.recorded("callback_delete")
    generic = f.update("callback_query", tap["callback_query"])
    again = f.double_tap(generic)
    ids = [f.message()["update_id"] for _ in range(4)]
    assert (renumbered["update_id"], generic["update_id"], again["update_id"]) == (4, 6, 8)
    assert ids == [10, 11, 12, 13]  # 5, 7 and 9 kept for second taps


def test_edited_message_keeps_the_original_identity() -> None:
    f = UpdateFactory()
    original = f.command("/techpost", "v1")
    edited = f.edited_message("/techpost v2", original=original)["edited_message"]
    assert edited["message_id"] == original["message"]["message_id"]
    assert edited["edit_date"] > edited["date"]
    assert "entities" not in edited


def test_readers_find_chat_and_user_in_every_type() -> None:
    f = UpdateFactory()
    assert u.chat_id(f.inline_query()) is None and u.user_id(f.inline_query()) == f.user["id"]
    assert u.user_id(f.poll_answer()) == f.user["id"]
    assert u.user_id(f.channel_post()) is None
    assert u.chat_id(f.chat_join_request()) == f.group()["id"]
    pay = f.successful_payment(charge_id="stx1")
    key = render_template(
        "pay:{message.successful_payment.telegram_payment_charge_id}", pay, bot_id=1
    )
    assert key == "pay:stx1"


def test_recorded_payloads_renumber_and_override() -> None:
    f = UpdateFactory(first_update_id=9)
    a = f.recorded("callback_delete")
    b = f.recorded("callback_delete.json", data="unpub:1")
    assert (a["update_id"], b["update_id"]) == (9, 11)  # 10: kept for a's second tap
    assert b["callback_query"]["data"] == "unpub:1"
    assert f.recorded("techpost_command", renumber=False) == load_fixture("techpost_command")
    with pytest.raises(FileNotFoundError, match="available"):
        f.recorded("no_such_payload")


def test_recorded_reads_any_file(tmp_path: Any) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"update_id": 1, "poll_answer": {"poll_id": "p"}}))
    assert UpdateFactory().recorded(str(path), renumber=False)["update_id"] == 1


def test_dates_follow_the_clock() -> None:
    now = [1_800_000_000.9]
    f = UpdateFactory(clock=lambda: now[0])
    assert f.message()["message"]["date"] == 1_800_000_000


def test_unknown_member_status_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown chat member status"):
        chat_member_status("banned", {"id": 1, "is_bot": False, "first_name": "x"})
