"""The outbox rules as pure functions (``telegram_idem._outbox_logic``), shared by the
in-process stores: which entry a take picks, what a call supersedes, when an entry
expires."""

from __future__ import annotations

import json
from dataclasses import replace

from telegram_idem import _outbox_logic as logic
from telegram_idem.outbox import AmbiguousPolicy, CallStatus, NewCall, OutboxEntry

NOW = 1_700_000_000.0


def new(name: str, chat: str | None = "chat:1", **kw: object) -> NewCall:
    fields: dict[str, object] = {
        "key": f"idem:7:o:{name}",
        "bot_id": 7,
        "method": "sendMessage",
        "params": b"{}",
        "ordering_key": chat,
        "collapse_key": None,
        "policy": AmbiguousPolicy.HOLD,
    }
    fields.update(kw)
    return NewCall(**fields)  # type: ignore[arg-type]


def entries(*calls: NewCall) -> list[OutboxEntry]:
    return [logic.new_entry(c, seq, NOW, parked=False) for seq, c in enumerate(calls, 1)]


def test_pick_takes_only_heads_lowest_priority_then_oldest() -> None:
    es = entries(
        new("a1", "chat:a", priority=10),
        new("a2", "chat:a", priority=0),  # behind a1: priority never reorders a chat
        new("b1", "chat:b", priority=5),
        new("c1", "chat:c", priority=5),
    )
    chosen = logic.pick(es, NOW, bot_id=7)
    assert chosen is not None and chosen.key == "idem:7:o:b1"
    assert logic.pick(es, NOW, bot_id=8) is None
    only_a = logic.pick(es, NOW, bot_id=7, ordering_key="chat:a")
    assert only_a is not None and only_a.key == "idem:7:o:a1"


def test_a_head_in_flight_blocks_its_chat_until_its_lease_ends() -> None:
    es = entries(new("a1"), new("a2"))
    es[0] = logic.taken(es[0], NOW, 30)
    assert (es[0].token, es[0].attempts) == (1, 1)
    assert logic.pick(es, NOW + 29, bot_id=7) is None
    again = logic.pick(es, NOW + 30, bot_id=7)
    assert again is not None and again.key == "idem:7:o:a1"
    assert logic.taken(again, NOW + 30, 30).token == 2


def test_settled_and_parked_entries_do_not_block_a_chat() -> None:
    es = entries(new("a1"), new("a2"), new("a3"))
    es[0] = logic.settled(es[0], CallStatus.DEAD, NOW, error="x")
    es[1] = logic.settled(es[1], CallStatus.PARKED, NOW)
    chosen = logic.pick(es, NOW, bot_id=7)
    assert chosen is not None and chosen.key == "idem:7:o:a3"


def test_a_call_supersedes_only_pending_entries_of_its_bot_and_collapse_key() -> None:
    es = entries(
        new("pending", collapse_key="e"),
        new("flight", collapse_key="e"),
        new("other-key", collapse_key="f"),
        new("other-bot", collapse_key="e", bot_id=8),
        new("none"),
    )
    es[1] = logic.taken(es[1], NOW, 30)
    gone = logic.collapsed(es, new("newest", collapse_key="e"), NOW + 1)
    assert [e.key for e in gone] == ["idem:7:o:pending"]
    assert gone[0].status is CallStatus.SUPERSEDED and gone[0].settled_at == NOW + 1
    assert gone[0].result is not None
    assert json.loads(gone[0].result) == {"superseded_by": "idem:7:o:newest"}
    assert logic.collapsed(es, new("plain"), NOW) == []


def test_the_superseded_result_is_ascii_json_for_any_key() -> None:
    result = logic.superseded_result("idem:7:o:привет")
    assert result.isascii() and json.loads(result) == {"superseded_by": "idem:7:o:привет"}


def test_only_delivered_and_superseded_entries_expire() -> None:
    [entry] = entries(new("x", retention=10.0))
    for status in CallStatus:
        settled = logic.settled(entry, status, NOW)
        if status in (CallStatus.DELIVERED, CallStatus.SUPERSEDED):
            assert logic.expires_at(settled) == NOW + 10.0
            assert not logic.is_expired(settled, NOW + 9.9) and logic.is_expired(settled, NOW + 10)
        else:
            assert logic.expires_at(replace(settled, status=status)) is None


def test_retry_keeps_the_place_redrive_moves_to_the_back() -> None:
    [entry] = entries(new("x"))
    held = logic.taken(entry, NOW, 30)
    back = logic.retried(held, NOW, 5.0, "boom", ordering_key="chat:2")
    assert (back.seq, back.status, back.available_at, back.ordering_key) == (
        1,
        CallStatus.PENDING,
        NOW + 5,
        "chat:2",
    )
    again = logic.redriven(logic.settled(held, CallStatus.DEAD, NOW), 9, NOW + 1)
    assert (again.seq, again.attempts, again.settled_at, again.token) == (9, 0, 0.0, 1)
