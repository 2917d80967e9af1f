"""Reading Bot API updates without a framework, and the update guard over real payloads."""

from __future__ import annotations

from typing import Any

import pytest

from telegram_idem import ConfigurationError, Idem, MalformedUpdateError, ManualClock, Store
from telegram_idem.testing.delivery import fixture_names, load_fixture
from telegram_idem.updates import (
    KNOWN_UPDATE_TYPES,
    bot_id_from_token,
    chat_id,
    ordering_key,
    payload,
    update_type,
    user_id,
    validate_update,
)

BOT = 7000000001

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
    ran: list[int] = []

    async def body() -> None:
        ran.append(1)

    with pytest.raises(MalformedUpdateError):
        await idem.process_update({"message": {}}, body, bot_id=BOT)
    assert ran == []


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
        assert (await idem.process_update(update, handler(update), bot_id=BOT))[0]
    clock.advance(7 * 86400)  # a week of silence
    late = load_fixture("random_id_after_silence")
    assert late["update_id"] < min(u["update_id"] for u in earlier)
    assert await idem.process_update(late, handler(late), bot_id=BOT) == (True, 19283746)
    # its own re-delivery is still a duplicate
    assert await idem.process_update(late, handler(late), bot_id=BOT) == (False, None)
    assert handled == [734519001, 734519010, 734519040, 19283746]


async def test_lower_id_is_processed_even_while_higher_ids_are_remembered(
    store: Store, clock: ManualClock
) -> None:
    idem = Idem(store, clock=clock, heartbeat=False)
    count = [0]

    async def call() -> None:
        count[0] += 1

    high = load_fixture("techpost_command")
    await idem.process_update(high, call, bot_id=BOT)
    low = load_fixture("random_id_after_silence")  # no time passes: ids simply out of order
    assert (await idem.process_update(low, call, bot_id=BOT))[0]
    assert not (await idem.process_update(high, call, bot_id=BOT))[0]
    assert count[0] == 2


async def test_update_ids_are_forgotten_after_retention(store: Store, clock: ManualClock) -> None:
    idem = Idem(store, clock=clock, heartbeat=False, update_retention=48 * 3600.0)
    count = [0]

    async def call() -> None:
        count[0] += 1

    update = load_fixture("techpost_command")
    await idem.process_update(update, call, bot_id=BOT)
    clock.advance(47 * 3600)
    assert not (await idem.process_update(update, call, bot_id=BOT))[0]
    clock.advance(2 * 3600)
    assert await idem.store.get(idem.keys.update(BOT, update["update_id"])) is None
    assert count[0] == 1


def test_fixtures_include_every_kind_of_chat() -> None:
    kinds = {EXPECTED[n][0] for n in EXPECTED}
    assert {"message", "callback_query", "inline_query", "channel_post"} <= kinds
