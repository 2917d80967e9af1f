"""Key templates over the shipped update fixtures, the key layout, and fingerprints."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from telegram_idem import (
    Idem,
    KeyBuilder,
    KeyTemplateError,
    ManualClock,
    Store,
    bind_update,
    fingerprint,
    idempotent,
    render_template,
)
from telegram_idem._keys import (
    KEY_PREFIX_BYTES,
    MAX_KEY_BYTES,
    bounded_key,
    escape_action,
    render_key,
)
from telegram_idem.testing._delivery import fixture_names, load_fixture

BOT = 7000000001
SHORTHANDS = ("chat_id", "user_id", "message_id", "thread_id", "callback_data")

# What each shorthand resolves to per fixture (None: absent, so a KeyTemplateError).
EXPECTED: dict[str, dict[str, Any]] = {
    "callback_delete": {
        "chat_id": 5550001001,
        "user_id": 5550001001,
        "message_id": 4130,
        "thread_id": None,
        "callback_data": "del:8f3a1b2c9d",
    },
    "channel_post": {
        "chat_id": -1009876543210,
        "user_id": None,
        "message_id": 310,
        "thread_id": None,
        "callback_data": None,
    },
    "edited_message": {
        "chat_id": 5550001001,
        "user_id": 5550001001,
        "message_id": 4121,
        "thread_id": None,
        "callback_data": None,
    },
    "group_command_with_botname": {
        "chat_id": -1001234567890,
        "user_id": 5550002002,
        "message_id": 88,
        "thread_id": 77,
        "callback_data": None,
    },
    "inline_query": {
        "chat_id": None,
        "user_id": 5550003003,
        "message_id": None,
        "thread_id": None,
        "callback_data": None,
    },
    "my_chat_member": {
        "chat_id": -1001234567890,
        "user_id": 5550002002,
        "message_id": None,
        "thread_id": None,
        "callback_data": None,
    },
    "poll_answer": {
        "chat_id": None,
        "user_id": 5550003003,
        "message_id": None,
        "thread_id": None,
        "callback_data": None,
    },
    "pre_checkout_query": {
        "chat_id": None,
        "user_id": 5550004004,
        "message_id": None,
        "thread_id": None,
        "callback_data": None,
    },
    "random_id_after_silence": {
        "chat_id": 5550001001,
        "user_id": 5550001001,
        "message_id": 4200,
        "thread_id": None,
        "callback_data": None,
    },
    "successful_payment": {
        "chat_id": 5550004004,
        "user_id": 5550004004,
        "message_id": 5001,
        "thread_id": None,
        "callback_data": None,
    },
    "techpost_command": {
        "chat_id": 5550001001,
        "user_id": 5550001001,
        "message_id": 4121,
        "thread_id": None,
        "callback_data": None,
    },
    "techpost_no_title": {
        "chat_id": 5550001001,
        "user_id": 5550001001,
        "message_id": 4122,
        "thread_id": None,
        "callback_data": None,
    },
}

APPROVE = "approve:{callback_query.message.message_id}:{callback_query.from.id}"


def test_every_fixture_has_expectations() -> None:
    assert sorted(EXPECTED) == fixture_names()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_dotted_template_on_every_fixture(name: str) -> None:
    update = load_fixture(name)
    if name == "callback_delete":
        assert render_template(APPROVE, update, bot_id=BOT) == "approve:4130:5550001001"
    else:
        with pytest.raises(KeyTemplateError) as info:
            render_template(APPROVE, update, bot_id=BOT)
        assert info.value.field == "callback_query.message.message_id"
        assert info.value.template == APPROVE
        assert "callback_query.message.message_id" in str(info.value)


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("shorthand", SHORTHANDS)
def test_shorthands_on_every_fixture(name: str, shorthand: str) -> None:
    update = load_fixture(name)
    expected = EXPECTED[name][shorthand]
    template = f"k:{{{shorthand}}}"
    if expected is None:
        with pytest.raises(KeyTemplateError) as info:
            render_template(template, update, bot_id=BOT)
        assert info.value.field == shorthand
        assert shorthand in str(info.value)
    else:
        key = render_template(template, update, bot_id=BOT)
        assert key == f"k:{expected}"
        assert "None" not in key


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_no_key_ever_contains_none(name: str) -> None:
    update = load_fixture(name)
    templates = [
        *(f"{{{s}}}" for s in SHORTHANDS),
        "{bot_id}:{chat_id}:{user_id}",
        "{bot_id}:{message_id}:{callback_data}",
        APPROVE,
        "pay:{message.successful_payment.telegram_payment_charge_id}",
        "{message.from.last_name}",
        "{callback_query.inline_message_id}",
        "{message.chat}",  # an object, not a value
        "{message.entities}",  # a list, not a value
    ]
    rendered = 0
    for template in templates:
        try:
            key = render_template(template, update, bot_id=BOT)
        except KeyTemplateError:
            continue
        rendered += 1
        assert "None" not in key
    assert rendered >= 1  # {bot_id} at least


def test_bot_id_shorthand() -> None:
    update = load_fixture("techpost_command")
    assert render_template("{bot_id}:{chat_id}", update, bot_id=BOT) == f"{BOT}:5550001001"
    with pytest.raises(KeyTemplateError) as info:
        render_template("{bot_id}:{chat_id}", update, bot_id=None)
    assert info.value.field == "bot_id"


def test_inline_query_chat_id_names_the_field() -> None:
    with pytest.raises(KeyTemplateError) as info:
        render_template("post:{chat_id}", load_fixture("inline_query"), bot_id=BOT)
    assert info.value.field == "chat_id"
    assert "{chat_id}" in str(info.value)
    assert "inline_query" in str(info.value)


def test_topic_and_payment_templates() -> None:
    group = load_fixture("group_command_with_botname")
    assert (
        render_template("draft:{chat_id}:{thread_id}:{message.from.id}", group, bot_id=BOT)
        == "draft:-1001234567890:77:5550002002"
    )
    pay = load_fixture("successful_payment")
    assert (
        render_template(
            "pay:{message.successful_payment.telegram_payment_charge_id}", pay, bot_id=1
        )
        == "pay:stxExampleCharge0001"
    )
    assert render_template("e:{message.entities.0.type}", group, bot_id=1) == "e:bot_command"
    with pytest.raises(KeyTemplateError):
        render_template("e:{message.entities.5.type}", group, bot_id=1)


def test_explicit_null_and_empty_values() -> None:
    update = {"update_id": 1, "message": {"message_id": 5, "text": None, "caption": ""}}
    with pytest.raises(KeyTemplateError):
        render_template("{message.text}", update, bot_id=1)
    assert render_template("c:{message.caption}", update, bot_id=1) == "c:"


def test_format_spec_is_applied() -> None:
    update = load_fixture("techpost_command")
    assert render_template("{message_id:08d}", update, bot_id=1) == "00004121"


@pytest.mark.parametrize(
    "template",
    [
        "{}",
        "a:{}:b",
        "{0}",
        "{message.text!r}",
        "{chat_id!s}",
        "{chat_id",
        "chat_id}",
        "{{chat_id}",
        "{chat_id:{message_id}}",  # nested replacement field in the spec
        "{message.text:d}",  # a spec the value cannot take
        "{chat_id:zz}",
    ],
)
def test_bad_templates_raise_key_template_error(template: str) -> None:
    update = load_fixture("techpost_command")
    with pytest.raises(KeyTemplateError) as info:
        render_template(template, update, bot_id=BOT)
    assert info.value.template == template


def test_literal_braces_are_allowed() -> None:
    update = load_fixture("techpost_command")
    assert render_template("{{x}}:{chat_id}", update, bot_id=1) == "{x}:5550001001"


def test_key_layout() -> None:
    keys = KeyBuilder()
    assert keys.update(BOT, 734519001) == f"idem:{BOT}:u:734519001"
    action = keys.action(BOT, "approve:4130")
    assert action == f"idem:{BOT}:a:approve:4130"
    assert keys.step(action, "commit") == f"idem:{BOT}:a:approve:4130:s:commit"
    assert keys.lock(BOT, "chat:42") == f"idem:{BOT}:l:chat:42"
    assert keys.callback(BOT, "abc") == f"idem:{BOT}:cb:abc"
    assert KeyBuilder("test").update(1, 2) == "test:1:u:2"
    # bots never share update keys
    assert keys.update(1, 5) != keys.update(2, 5)


def test_fingerprint_is_canonical() -> None:
    a = fingerprint({"title": "웹훅", "langs": ["ko", "en"], "n": 1})
    b = fingerprint({"n": 1, "langs": ["ko", "en"], "title": "웹훅"})
    assert a == b
    assert re.fullmatch(r"[0-9a-f]{32}", a)
    assert fingerprint({"title": "웹훅", "langs": ["en", "ko"], "n": 1}) != a  # lists keep order
    assert fingerprint({"title": "웹훅", "langs": ["ko", "en"], "n": 2}) != a
    assert fingerprint({"nested": {"b": 1, "a": 2}}) == fingerprint({"nested": {"a": 2, "b": 1}})
    assert fingerprint(None) != fingerprint(0) != fingerprint("") != fingerprint(False)
    with pytest.raises(TypeError):
        fingerprint(object())


# ----------------------------------------------------------------- long keys


def test_a_long_key_is_bounded_keeping_a_readable_prefix() -> None:
    long = "idem:7:a:report:" + "x" * 10_000
    short = bounded_key(long)
    assert len(short.encode()) <= MAX_KEY_BYTES
    assert short.startswith("idem:7:a:report:xxx")
    assert short == bounded_key(long) == bounded_key(short)  # stable and idempotent
    assert bounded_key(long + "y") != short  # the hash covers the whole key
    assert bounded_key("idem:7:a:pay:1") == "idem:7:a:pay:1"  # short keys untouched
    korean = "멱" * 2000  # 3 bytes a character: the prefix is never cut mid-character
    assert bounded_key(korean).startswith("멱" * (KEY_PREFIX_BYTES // 3) + ":h:")
    assert bounded_key("\ud800" * 600)  # a lone surrogate is hashed, never an error


async def test_a_10kb_key_runs_once_and_replays_on_every_store(
    store: Store, clock: ManualClock
) -> None:
    idem = Idem(store, clock=clock, heartbeat=False)
    runs: list[str] = []
    # ≈ 13 KB that does not compress (PostgreSQL compresses a repetitive key under its
    # index limit), with multi-byte characters
    topic = "웹훅" + "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(200))

    async def body() -> str:
        runs.append("run")
        return "done"

    key = idem.keys.action(BOT, f"report:{topic}")
    assert await idem.run(key, body) == "done"
    assert await idem.run(key, body) == "done"
    assert await idem.run(f"idem:{BOT}:a:raw:{topic}", body) == "done"  # a raw long key
    assert await idem.run(f"idem:{BOT}:a:raw:{topic}", body) == "done"
    assert runs == ["run", "run"]

    @idempotent(key="decorated:{message.text}")
    async def report() -> str:
        runs.append("decorated")
        return "reported"

    update = load_fixture("techpost_command")
    update["message"]["text"] = topic
    with bind_update(update, bot_id=BOT, idem=idem):
        assert await report() == "reported"
        assert await report() == "reported"
    assert runs.count("decorated") == 1


# ------------------------------------------------------- keys no store could hold


ODD_KEYS = ["\ud800", "a\udfffb", "nul\x00byte", "\x00"]
"""Strings a store driver refuses as they are: lone surrogates (valid JSON escapes, not
UTF-8) and NUL (PostgreSQL ``text`` cannot hold it)."""


def escape(odd: str) -> str:
    """``odd`` spelled with backslash escapes, as the readable part of its key shows it."""
    return odd.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")


@pytest.mark.parametrize("odd", ODD_KEYS)
def test_an_odd_key_becomes_a_readable_bounded_key(odd: str) -> None:
    escaped = escape(odd)
    key = bounded_key(f"idem:7:a:tap:{odd}")
    key.encode("utf-8")  # strict UTF-8: no surrogates left
    assert "\x00" not in key
    assert key.startswith(f"idem:7:a:tap:{escaped}:h:")  # readable in logs
    assert len(key.encode()) <= MAX_KEY_BYTES
    assert key == bounded_key(f"idem:7:a:tap:{odd}") == bounded_key(key)  # stable, idempotent
    assert len({bounded_key(f"k:{o}") for o in ODD_KEYS}) == len(ODD_KEYS)  # no collisions
    # the escape is only the readable part: a key spelling the escape out is another key
    assert bounded_key(f"k:{odd}") != bounded_key(f"k:{escaped}")
    assert bounded_key(("\ud800" + "x" * 300) * 10).encode()  # long and odd: hashed too


@pytest.mark.parametrize("odd", ["\ud800", "nul\x00"])
async def test_a_key_with_a_lone_surrogate_or_nul_runs_once_and_replays_on_every_store(
    store: Store, clock: ManualClock, odd: str
) -> None:
    idem = Idem(store, clock=clock, heartbeat=False)
    runs: list[str] = []

    @idempotent(key="{callback_data}")
    async def tap() -> str:
        runs.append("tap")
        return "answered"

    update = load_fixture("callback_delete")
    update["callback_query"]["data"] = odd
    with bind_update(update, bot_id=BOT, idem=idem):
        assert await tap() == "answered"
        assert await tap() == "answered"
    assert runs == ["tap"]
    record = await store.get(idem.keys.action(BOT, odd))
    assert record is not None and record.key == bounded_key(idem.keys.action(BOT, odd))
    other = load_fixture("callback_delete")
    other["callback_query"]["data"] = escape(odd)
    with bind_update(other, bot_id=BOT, idem=idem):
        assert await tap() == "answered"
    assert runs == ["tap", "tap"]  # its escaped spelling is another key


# ------------------------------------------------------- callable key results


@pytest.mark.parametrize("returned", [None, "", 42, b"bytes"])
async def test_a_key_callable_must_return_a_non_empty_str(
    store: Store, clock: ManualClock, returned: object
) -> None:
    idem = Idem(store, clock=clock, heartbeat=False)
    runs: list[int] = []

    @idempotent(key=lambda update: returned)  # type: ignore[arg-type,return-value]
    async def handler() -> None:
        runs.append(1)

    with bind_update(load_fixture("techpost_command"), bot_id=BOT, idem=idem):
        with pytest.raises(KeyTemplateError, match="non-empty str"):
            await handler()
    assert runs == []
    assert await store.get(idem.keys.action(BOT, str(returned))) is None


def test_render_key_takes_both_forms() -> None:
    update = load_fixture("techpost_command")
    assert render_key(lambda u: f"k:{u['update_id']}", update, bot_id=BOT) == (
        f"k:{update['update_id']}"
    )
    assert render_key("m:{message_id}", update, bot_id=BOT) == "m:4121"


async def test_an_action_name_cannot_spell_another_actions_step() -> None:
    """A template over user text (``pay{callback_data}`` with ``7:s:charge`` sent by
    a client) must not land on action ``pay7``'s step ``charge``: it would replay that
    step's result as its own and never run (found by a fresh-user trial)."""
    idem = Idem("memory://", heartbeat=False)
    pay7 = idem.keys.action(1, "pay7")

    async def charge() -> str:
        return "pay7's charge"

    assert await idem.run(pay7, lambda: idem.step("charge", charge)) == "pay7's charge"
    ran: list[str] = []

    async def other() -> str:
        ran.append("other")
        return "other"

    assert await idem.run(idem.keys.action(1, "pay7:s:charge"), other) == "other"
    assert await idem.run(idem.keys.action(1, "pay7:o:x:0"), other) == "other"
    assert ran == ["other", "other"]
    assert idem.keys.action(1, "approve:42") == "idem:1:a:approve:42"  # plain names unchanged


@given(st.lists(st.text(alphabet=":\\sor1a", max_size=12), min_size=2, max_size=2, unique=True))
def test_escaped_action_names_stay_distinct(names: list[str]) -> None:
    a, b = (escape_action(n) for n in names)
    assert a != b


def test_a_name_cut_before_a_run_or_step_separator_is_escaped_too() -> None:
    """``pay`` + ``7:r3`` + a step's ``:s:charge`` must not spell action ``pay7``'s step
    in its run 3, and a name spelling a long key's bounded form must not share its key
    (second fresh-user trial)."""
    keys = KeyBuilder()
    victim_step = keys.step(keys.action(1, "pay7"), "charge", 3)
    assert keys.step(keys.action(1, "pay7:r3"), "charge") != victim_step
    assert keys.step(keys.action(1, "pay7:s"), "charge") != keys.step(
        keys.action(1, "pay7"), "s:charge"
    )
    long = "pay" + "A" * 1500
    bounded = keys.action(1, long)
    assert ":h:" in bounded
    assert keys.action(1, bounded[len("idem:1:a:") :]) != bounded
