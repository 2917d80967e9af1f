"""Reading Bot API updates without a framework, and the update guard over real payloads."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from aiogram.types import Update as AiogramUpdate

from telegram_idem import (
    Admission,
    ConfigurationError,
    Idem,
    MalformedUpdateError,
    ManualClock,
    Store,
)
from telegram_idem._keys import render_template
from telegram_idem._updates import (
    KNOWN_UPDATE_TYPES,
    bot_id_from_token,
    business_connection_id,
    chat_id,
    ordering_key,
    payload,
    thread_id,
    topic_id,
    update_type,
    user_id,
    validate_update,
)
from telegram_idem.testing._delivery import fixture_names, load_fixture
from telegram_idem.testing._factories import UpdateFactory

BOT = 7000000001


async def admit_and_run(idem: Idem, update: dict[str, Any], call: Any) -> tuple[bool, Any]:
    """Admit ``update`` for BOT and run ``call`` if admitted: (ran, result)."""
    admitted = await idem.admit(update, bot_id=BOT)
    if admitted.outcome is Admission.DUPLICATE:
        return False, None
    return True, await admitted.run(call)


# fixture: (update_type, chat_id, user_id, ordering_key)
EXPECTED: dict[str, tuple[str, int | None, int | None, str | None]] = {
    "callback_delete": ("callback_query", 5550001001, 5550001001, "chat:5550001001"),
    "channel_post": ("channel_post", -1009876543210, None, "chat:-1009876543210"),
    "edited_message": ("edited_message", 5550001001, 5550001001, "chat:5550001001"),
    "group_command_with_botname": (
        "message",
        -1001234567890,
        5550002002,
        "chat:-1001234567890:topic:77",  # a forum topic is its own unit
    ),
    "inline_query": ("inline_query", None, 5550003003, "user:5550003003"),
    "my_chat_member": ("my_chat_member", -1001234567890, 5550002002, "chat:-1001234567890"),
    "poll_answer": ("poll_answer", None, 5550003003, "user:5550003003"),
    "pre_checkout_query": ("pre_checkout_query", None, 5550004004, "user:5550004004"),
    "random_id_after_silence": ("message", 5550001001, 5550001001, "chat:5550001001"),
    "successful_payment": ("message", 5550004004, 5550004004, "chat:5550004004"),
    "techpost_command": ("message", 5550001001, 5550001001, "chat:5550001001"),
    "techpost_no_title": ("message", 5550001001, 5550001001, "chat:5550001001"),
}


def test_every_fixture_has_expectations() -> None:
    assert sorted(EXPECTED) == fixture_names()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_readers_on_every_fixture(name: str) -> None:
    update = load_fixture(name)
    kind, chat, user, unit = EXPECTED[name]
    assert validate_update(update) is update
    assert update_type(update) == kind
    assert kind in KNOWN_UPDATE_TYPES
    assert payload(update) is update[kind]
    assert chat_id(update) == chat
    assert user_id(update) == user
    assert ordering_key(update) == unit


@pytest.mark.parametrize(
    "obj",
    [
        None,
        [],
        [{"update_id": 1}],
        "update",
        b'{"update_id": 1}',
        1,
        {},
        {"message": {"message_id": 1}},
        {"update_id": "734519001"},
        {"update_id": True},
        {"update_id": False},
        {"update_id": 1.0},
        {"update_id": None},
    ],
)
def test_validate_update_rejects(obj: Any) -> None:
    with pytest.raises(MalformedUpdateError):
        validate_update(obj)


def test_validate_update_accepts_zero_and_large_ids() -> None:
    assert validate_update({"update_id": 0})["update_id"] == 0
    assert validate_update({"update_id": 2**40, "message": {}})["update_id"] == 2**40


def test_unknown_and_empty_update_types() -> None:
    future = {"update_id": 1, "future_thing": {"chat": {"id": 5}, "from": {"id": 6}}}
    assert update_type(future) == "future_thing"
    assert update_type({"update_id": 1}) is None
    assert payload({"update_id": 1}) is None
    assert chat_id({"update_id": 1}) is None
    assert user_id({"update_id": 1}) is None
    assert ordering_key({"update_id": 1}) is None
    assert ordering_key({"update_id": 1, "future_thing": "text"}) is None


def test_chat_and_user_ignore_non_integer_ids() -> None:
    update = {"update_id": 1, "message": {"chat": {"id": "5"}, "from": {"id": "6"}}}
    assert chat_id(update) is None
    assert user_id(update) is None
    assert ordering_key(update) is None


def test_bot_id_from_token() -> None:
    assert bot_id_from_token("7000000001:AAFakeTokenForTestsOnly") == 7000000001
    for bad in ("", "abc:def", ":abc", "notatoken"):
        with pytest.raises(ConfigurationError):
            bot_id_from_token(bad)


async def test_malformed_update_is_rejected_by_the_guard(store: Store, clock: ManualClock) -> None:
    idem = Idem(store, clock=clock, heartbeat=False)
    with pytest.raises(MalformedUpdateError):
        await idem.claim_update({"update_id": "1"}, bot_id=BOT)
    malformed: Mapping[str, object]
    for malformed in ({"message": {}}, {"update_id": True}, {"update_id": 1.0}):
        with pytest.raises(MalformedUpdateError):
            await idem.admit(malformed, bot_id=BOT)
    assert await store.get(idem.keys.update(BOT, 1)) is None  # nothing was claimed


async def test_random_id_after_silence_is_not_a_duplicate(store: Store, clock: ManualClock) -> None:
    """After a week of silence Telegram restarts update_id at a random, possibly lower, value:
    the guard remembers ids it has seen, never "everything below the highest"."""
    idem = Idem(store, clock=clock, heartbeat=False)
    handled: list[int] = []

    def handler(update: dict[str, Any]) -> Any:
        async def call() -> int:
            handled.append(update["update_id"])
            return int(update["update_id"])

        return call

    earlier = [load_fixture(n) for n in ("techpost_command", "callback_delete", "channel_post")]
    for update in earlier:
        assert (await admit_and_run(idem, update, handler(update)))[0]
    clock.advance(7 * 86400)  # a week of silence
    late = load_fixture("random_id_after_silence")
    assert late["update_id"] < min(u["update_id"] for u in earlier)
    assert await admit_and_run(idem, late, handler(late)) == (True, 19283746)
    # its own re-delivery is still a duplicate
    assert await admit_and_run(idem, late, handler(late)) == (False, None)
    assert handled == [734519001, 734519010, 734519040, 19283746]


async def test_lower_id_is_processed_even_while_higher_ids_are_remembered(
    store: Store, clock: ManualClock
) -> None:
    idem = Idem(store, clock=clock, heartbeat=False)
    count = [0]

    async def call() -> None:
        count[0] += 1

    high = load_fixture("techpost_command")
    await admit_and_run(idem, high, call)
    low = load_fixture("random_id_after_silence")  # no time passes: ids simply out of order
    assert (await admit_and_run(idem, low, call))[0]
    assert not (await admit_and_run(idem, high, call))[0]
    assert count[0] == 2


async def test_update_ids_are_forgotten_after_retention(store: Store, clock: ManualClock) -> None:
    idem = Idem(store, clock=clock, heartbeat=False, update_retention=48 * 3600.0)
    count = [0]

    async def call() -> None:
        count[0] += 1

    update = load_fixture("techpost_command")
    await admit_and_run(idem, update, call)
    clock.advance(47 * 3600)
    assert not (await admit_and_run(idem, update, call))[0]
    clock.advance(2 * 3600)
    assert await idem.store.get(idem.keys.update(BOT, update["update_id"])) is None
    assert count[0] == 1


def test_fixtures_include_every_kind_of_chat() -> None:
    kinds = {EXPECTED[n][0] for n in EXPECTED}
    assert {"message", "callback_query", "inline_query", "channel_post"} <= kinds


# ------------------------------------------------ Bot API 9.6–10.2 types and ordering


def test_new_update_types_are_known_and_read() -> None:
    f = UpdateFactory()
    guest = f.guest_message()
    managed = f.managed_bot()
    sub = f.subscription(state="canceled")
    for update, kind in ((guest, "guest_message"), (managed, "managed_bot"), (sub, "subscription")):
        assert kind in KNOWN_UPDATE_TYPES and update_type(update) == kind
        assert AiogramUpdate.model_validate(update).event_type == kind
    assert chat_id(guest) == f.group()["id"] and user_id(guest) == f.user["id"]
    in_topic = f.guest_message(chat=f.group(forum=True), message_thread_id=3)
    assert thread_id(in_topic) == 3  # message-shaped: read like a message
    assert ordering_key(guest) == f"chat:{f.group()['id']}"
    assert chat_id(managed) is None and user_id(managed) == f.user["id"]
    assert ordering_key(managed) == ordering_key(sub) == f"user:{f.user['id']}"
    key = render_template("sub:{user_id}:{subscription.state}", sub, bot_id=1)
    assert key == f"sub:{f.user['id']}:canceled"


def test_a_future_update_type_passes_through_untouched() -> None:
    future = {"update_id": 9, "brand_new_thing": {"chat": {"id": 5}, "from": {"id": 6}, "x": 1}}
    before = json.dumps(future, sort_keys=True)
    assert update_type(future) == "brand_new_thing" and "brand_new_thing" not in KNOWN_UPDATE_TYPES
    assert (chat_id(future), user_id(future), ordering_key(future)) == (5, 6, "chat:5")
    assert validate_update(future) is future and json.dumps(future, sort_keys=True) == before


def test_the_ordering_unit_splits_forum_topics_and_business_connections() -> None:
    f = UpdateFactory()
    forum = f.group(forum=True)
    in_topic = f.message("hi", chat=forum, message_thread_id=20, is_topic_message=True)
    general = f.message("hi", chat=forum)
    assert ordering_key(in_topic) == f"chat:{forum['id']}:topic:20"
    assert ordering_key(general) == f"chat:{forum['id']}"
    # a reply thread of a plain group is not a topic
    reply = f.message("re", chat=f.group(), message_thread_id=5)
    assert topic_id(reply) is None and ordering_key(reply) == f"chat:{f.group()['id']}"
    tap = f.callback_query("go", from_message=in_topic["message"])
    assert ordering_key(tap) == f"chat:{forum['id']}:topic:20"

    customer = f.private_chat()

    def business(connection: str) -> dict[str, Any]:
        body = {
            "message_id": 1,
            "date": 1,
            "chat": customer,
            "from": f.user,
            "text": "hello",
            "business_connection_id": connection,
        }
        return {"update_id": 1, "business_message": body}

    assert business_connection_id(business("A1")) == "A1"
    assert ordering_key(business("A1")) == f"biz:A1:chat:{customer['id']}"
    assert ordering_key(business("A1")) != ordering_key(business("B2"))
    connection = {"update_id": 2, "business_connection": {"id": "A1", "user": f.user}}
    assert ordering_key(connection) == f"biz:A1:user:{f.user['id']}"
