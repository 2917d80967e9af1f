"""Building inbox entries: ordering rules, the callback lane, lossless payloads, and
polling that one bad update never stalls (memory and SQLite inboxes)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from telegram_idem import ConfigurationError, Idem, KeyTemplateError
from telegram_idem.inbox._entries import (
    Ordering,
    decode_payload,
    new_entry,
    rejected_entry,
)
from telegram_idem.inbox._worker import InboxWorker
from telegram_idem.ingress._polling import PollingIngress
from telegram_idem.testing._factories import UpdateFactory

BOT = 7
SURROGATE = '{"update_id":1,"message":{"message_id":1,"date":1,"chat":{"id":42,"type":"private"},"text":"\\ud800"}}'


@pytest.fixture(params=["memory", "sqlite"])
async def idem(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Idem]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'bot.db'}"
    guard = Idem(url)
    yield guard
    await guard.close()


def test_the_default_unit_is_the_chat_and_taps_get_their_own_lane() -> None:
    updates = UpdateFactory()
    cmd = updates.command("/techpost", "x")
    tap = updates.callback_query("go", from_message=cmd["message"])
    chat = cmd["message"]["chat"]["id"]
    assert Ordering().key(cmd) == f"chat:{chat}"
    assert Ordering().key(tap) == f"chat:{chat}:cbq"
    assert Ordering(callback_lane=False).key(tap) == f"chat:{chat}"


def test_a_template_unit_and_one_the_update_cannot_fill() -> None:
    updates = UpdateFactory()
    cmd = updates.command("/x")
    per_user = Ordering("u:{user_id}")
    assert per_user.key(cmd) == f"u:{cmd['message']['from']['id']}"
    assert Ordering("topic:{thread_id}").key(cmd) is None  # no topic: a unit of its own


def test_malformed_or_constant_templates_are_refused() -> None:
    with pytest.raises(KeyTemplateError):
        Ordering("chat:{chat_id")
    with pytest.raises(KeyTemplateError, match="names no field"):
        Ordering("everything")


def test_a_callable_unit_must_return_a_string_or_none() -> None:
    cmd = UpdateFactory().command("/x")
    assert Ordering(lambda u: "all").key(cmd) == "all"
    assert Ordering(lambda u: None).key(cmd) is None
    with pytest.raises(ConfigurationError, match="non-empty string"):
        Ordering(lambda u: 42).key(cmd)  # type: ignore[arg-type,return-value]


async def test_a_failing_ordering_rule_still_admits_the_update(idem: Idem) -> None:
    def broken(update: Any) -> str:
        raise KeyError("oops")

    made = new_entry(idem, UpdateFactory().command("/x"), bot_id=BOT, ordering=Ordering(broken))
    assert made.ordering_key is None
    assert await idem.store.inbox().admit(made, retention=60)


async def test_a_lone_surrogate_is_admitted_and_handled_with_its_text_kept(idem: Idem) -> None:
    update = json.loads(SURROGATE)
    made = new_entry(idem, update, bot_id=BOT)
    assert made.payload.isascii()
    inbox = idem.store.inbox()
    assert await inbox.admit(made, retention=60)
    taken = await inbox.take(lease=30)
    assert taken is not None
    assert decode_payload(taken.payload)["message"]["text"] == "\ud800"


async def test_polling_moves_past_bad_updates_and_keeps_them_as_dead_letters(
    idem: Idem,
) -> None:
    good = UpdateFactory().command("/x", update_id=10)
    batch: list[Any] = [
        good,
        "not an update",
        {"update_id": 11, "message": {"text": object()}},  # a value JSON cannot encode
        json.loads(SURROGATE.replace('"update_id":1', '"update_id":12')),
    ]
    sent = [batch, []]

    async def get_updates(offset: int | None, limit: int, wait: float) -> list[Any]:
        return sent.pop(0)

    ingress = PollingIngress(idem, get_updates, bot_id=BOT, poll_timeout=0)
    assert await ingress.poll_once() == 4
    assert ingress.offset == 13 and ingress.rejected == 2
    assert await ingress.poll_once() == 0

    handled: list[dict[str, Any]] = []

    async def dispatch(update: dict[str, Any]) -> None:
        handled.append(update)

    worker = InboxWorker(idem.store.inbox(), dispatch, poll_interval=0.01)
    await worker.drain(limit=10)
    assert [u["update_id"] for u in handled] == [10, 12]
    assert handled[1]["message"]["text"] == "\ud800"
    dead = await idem.store.inbox().dead_letters()
    assert len(dead) == 2 and all(d.attempts == 1 for d in dead)
    errors = sorted(d.last_error or "" for d in dead)
    assert "MalformedUpdateError" in errors[0] and "TypeError" in errors[1]


def test_a_rejected_entry_is_keyed_by_its_update_id_when_it_has_one() -> None:
    idem = Idem("memory://")
    with_id = rejected_entry(idem, {"update_id": 5, "x": object()}, bot_id=BOT, error="e")
    without = rejected_entry(idem, [1, 2], bot_id=BOT, error="e")
    assert with_id.update_key == idem.keys.update(BOT, 5)
    assert without.update_key.startswith(f"idem:{BOT}:u:rejected:")
