"""The relay over real HTTP on loopback: each outcome class recorded as the contract says,
ambiguous sends under resend and hold, a 429 pausing every relay of the bot, migration,
parking, per-chat order under retries, racing relays, takes that recorded nothing, and
the token in no log line."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from outbox.outbox_support import (
    BOT_ID,
    TOKEN,
    ClockBudget,
    Reply,
    ScriptedAPI,
    error,
)

from telegram_idem.backends.memory import MemoryStore
from telegram_idem.events import DecisionEvent, subscribe
from telegram_idem.flood import FloodControl, Limits, Rate
from telegram_idem.outbox import (
    AmbiguousPolicy,
    CallStatus,
    HttpBotAPI,
    NewCall,
    Outbox,
    OutboxEntry,
    Relay,
    collapse_key,
    default_policy,
    encode_params,
    ordering_key_of,
)

FAST = Limits(chat=Rate(1000, 1.0, burst=1000), group=Rate(1000, 1.0, burst=1000))


def new_call(
    key: str, method: str, params: dict[str, Any], policy: AmbiguousPolicy | None = None
) -> NewCall:
    return NewCall(
        key=key,
        bot_id=BOT_ID,
        method=method,
        params=encode_params(params),
        ordering_key=ordering_key_of(params),
        collapse_key=collapse_key(method, params),
        policy=policy or default_policy(method),
    )


@pytest.fixture
async def http(scripted: ScriptedAPI) -> AsyncIterator[HttpBotAPI]:
    async with HttpBotAPI(TOKEN, base_url=scripted.url, timeout=1.0) as api:
        yield api


def relay_of(outbox: Outbox, api: HttpBotAPI, **kw: Any) -> Relay:
    kw.setdefault("backoff_base", 0.01)
    kw.setdefault("poll_interval", 0.02)
    return Relay(outbox, api, bot_id=BOT_ID, **kw)


async def send_one(
    outbox: Outbox, relay: Relay, method: str, params: dict[str, Any], **kw: Any
) -> OutboxEntry:
    entry, _ = await outbox.enqueue(new_call("k", method, params, **kw))
    done = await relay.deliver_unit(entry.ordering_key, until_key="k")
    assert done is not None
    return done


async def test_delivered_records_the_result(scripted: ScriptedAPI, http: HttpBotAPI) -> None:
    outbox = MemoryStore().outbox()
    done = await send_one(
        outbox, relay_of(outbox, http), "sendMessage", {"chat_id": 1, "text": "a"}
    )
    assert done.status is CallStatus.DELIVERED
    assert done.result is not None and json.loads(done.result)["text"] == "a"


@pytest.mark.parametrize(
    ("method", "reply", "status", "error_text"),
    [
        ("editMessageText", error(400, "Bad Request: message is not modified"), "delivered", None),
        (
            "sendMessage",
            error(400, "Bad Request: chat not found"),
            "dead",
            "400: Bad Request: chat not found",
        ),
        (
            "answerCallbackQuery",
            error(400, "Bad Request: query is too old and response timeout expired"),
            "dead",
            "400: Bad Request: query is too old and response timeout expired",
        ),
        (
            "sendMessage",
            error(403, "Forbidden: bot was blocked by the user"),
            "parked",  # tagged: unpark keeps the attempts, the next take must see a record
            "attempt 1 (0 failed): 403: Forbidden: bot was blocked by the user",
        ),
        ("sendMessage", error(500, "Internal Server Error"), "unknown", "Internal Server Error"),
        ("sendMessage", Reply(drop=True), "unknown", None),
    ],
)
async def test_each_outcome_class_is_recorded(
    scripted: ScriptedAPI,
    http: HttpBotAPI,
    method: str,
    reply: Reply,
    status: str,
    error_text: str | None,
) -> None:
    scripted.script(method, reply)
    outbox = MemoryStore().outbox()
    params = {"chat_id": 1, "message_id": 5, "text": "a", "callback_query_id": "q"}
    done = await send_one(outbox, relay_of(outbox, http), method, params)
    assert done.status == status
    if error_text is not None:
        assert done.last_error == error_text
    if status == "delivered":
        assert done.result == b"true"
    assert len(scripted.calls_of(method)) == 1  # nothing was sent twice


async def test_a_transport_failure_is_recorded_without_the_method_again(
    scripted: ScriptedAPI, http: HttpBotAPI, closed_port: int
) -> None:
    """The entry has its method and every listing shows it beside the error, so the
    recorded error does not start with it too ("sendMessage: sendMessage: no answer")."""
    scripted.script("sendMessage", Reply(drop=True))
    outbox = MemoryStore().outbox()
    params = {"chat_id": 1, "text": "a"}
    done = await send_one(outbox, relay_of(outbox, http), "sendMessage", params)
    assert done.status is CallStatus.UNKNOWN and done.last_error is not None
    assert done.last_error.startswith("no answer: ") and "sendMessage" not in done.last_error
    async with HttpBotAPI(TOKEN, base_url=f"http://127.0.0.1:{closed_port}") as down:
        await outbox.enqueue(new_call("n", "sendMessage", {"chat_id": 2, "text": "b"}))
        again = await relay_of(outbox, down).deliver_unit("chat:2", until_key="n")
    assert again is not None and again.last_error is not None
    assert again.last_error.startswith("attempt 1 (1 failed): not sent: ")
    assert "sendMessage" not in again.last_error


async def test_ambiguous_under_resend_is_sent_again(
    scripted: ScriptedAPI, http: HttpBotAPI
) -> None:
    scripted.script("sendMessage", Reply(drop=True), error(502, "Bad Gateway"))
    outbox = MemoryStore().outbox()
    relay = relay_of(outbox, http)
    async with relay:
        await outbox.enqueue(
            new_call("k", "sendMessage", {"chat_id": 1, "text": "a"}, AmbiguousPolicy.RESEND)
        )
        relay.notify()
        await wait_for(outbox, "k", CallStatus.DELIVERED)
    assert len(scripted.calls_of("sendMessage")) == 3


async def test_ambiguous_under_hold_is_never_sent_again(
    scripted: ScriptedAPI, http: HttpBotAPI
) -> None:
    scripted.script("sendMessage", Reply(drop=True))
    outbox = MemoryStore().outbox()
    async with relay_of(outbox, http) as relay:
        await outbox.enqueue(new_call("k", "sendMessage", {"chat_id": 1, "text": "a"}))
        relay.notify()
        await wait_for(outbox, "k", CallStatus.UNKNOWN)
        await asyncio.sleep(0.2)
    assert len(scripted.calls_of("sendMessage")) == 1


async def test_not_sent_retries_then_becomes_a_dead_letter(closed_port: int) -> None:
    outbox = MemoryStore().outbox()
    async with HttpBotAPI(TOKEN, base_url=f"http://127.0.0.1:{closed_port}") as api:
        async with relay_of(outbox, api, max_attempts=3) as relay:
            await outbox.enqueue(new_call("k", "sendMessage", {"chat_id": 1, "text": "a"}))
            relay.notify()
            done = await wait_for(outbox, "k", CallStatus.DEAD)
    assert done.attempts == 3
    assert done.last_error is not None and "3 failed attempts" in done.last_error


async def test_a_429_pauses_every_relay_of_the_bot_and_is_not_a_failure(
    scripted: ScriptedAPI, http: HttpBotAPI
) -> None:
    scripted.script(
        "sendMessage",
        error(429, "Too Many Requests: retry after 0.4", retry_after=0.4),
        error(429, "Too Many Requests: retry after 0.1", retry_after=0.1),
    )
    outbox = MemoryStore().outbox()
    budget = ClockBudget(time.time)
    one = relay_of(
        outbox, http, flood=FloodControl(budget, bot_id=BOT_ID, limits=FAST), max_attempts=1
    )
    two_flood = FloodControl(budget, bot_id=BOT_ID, limits=FAST)
    two = relay_of(outbox, http, flood=two_flood)
    await outbox.enqueue(new_call("a", "sendMessage", {"chat_id": 1, "text": "a"}))
    first = await one.deliver_unit("chat:1", until_key="a")
    assert first is not None and first.status is CallStatus.PENDING
    assert await two_flood.paused_for() > 0.2  # the other process sees the pause
    paused_until = budget.tats[two_flood.key("pause")]  # the gate, on the budget's clock
    await outbox.enqueue(new_call("b", "sendMessage", {"chat_id": 2, "text": "b"}))
    async with two, one:
        one.notify()
        two.notify()
        await wait_for(outbox, "b", CallStatus.DELIVERED)
        done = await wait_for(outbox, "a", CallStatus.DELIVERED)
    b_at = min(
        at for (_, p), at in zip(scripted.calls, scripted.arrived, strict=True) if p["chat_id"] == 2
    )
    assert b_at >= paused_until  # chat 2 reached Telegram only after the bot's pause ended
    assert done.attempts == 3  # two 429s, one delivery: never dead at max_attempts=1
    assert budget.pauses == 2


async def test_a_migrated_group_is_sent_to_its_supergroup(
    scripted: ScriptedAPI, http: HttpBotAPI
) -> None:
    scripted.script(
        "sendMessage",
        error(
            400,
            "Bad Request: group chat was upgraded to a supergroup chat",
            migrate_to_chat_id=-1001,
        ),
    )
    outbox = MemoryStore().outbox()
    done = await send_one(
        outbox, relay_of(outbox, http), "sendMessage", {"chat_id": -5, "text": "a"}
    )
    assert done.status is CallStatus.DELIVERED and done.ordering_key == "chat:-1001"
    assert [p["chat_id"] for p in scripted.calls_of("sendMessage")] == [-5, -1001]


async def test_a_blocked_chat_is_parked_and_so_are_its_later_calls(
    scripted: ScriptedAPI, http: HttpBotAPI
) -> None:
    scripted.script("sendMessage", error(403, "Forbidden: bot was blocked by the user"))
    outbox = MemoryStore().outbox()
    relay = relay_of(outbox, http)
    await outbox.enqueue(new_call("a", "sendMessage", {"chat_id": 1, "text": "a"}))
    await outbox.enqueue(new_call("b", "sendMessage", {"chat_id": 1, "text": "b"}))
    await relay.deliver_unit("chat:1")
    later, _ = await outbox.enqueue(new_call("c", "sendMessage", {"chat_id": 1, "text": "c"}))
    statuses = [(await outbox.get(k)) for k in "ab"]
    assert [e.status for e in statuses if e] == [CallStatus.PARKED] * 2
    assert later.status is CallStatus.PARKED
    assert len(scripted.calls_of("sendMessage")) == 1


async def test_a_chat_keeps_its_order_under_retries(
    scripted: ScriptedAPI, http: HttpBotAPI
) -> None:
    scripted.script("sendMessage", Reply(drop=True), error(500, "Internal Server Error"))
    outbox = MemoryStore().outbox()
    for text in "abc":
        await outbox.enqueue(
            new_call(text, "sendMessage", {"chat_id": 1, "text": text}, AmbiguousPolicy.RESEND)
        )
    async with relay_of(outbox, http, concurrency=4) as relay:
        relay.notify()
        await wait_for(outbox, "c", CallStatus.DELIVERED)
    assert [p["text"] for p in scripted.calls_of("sendMessage")] == ["a", "a", "a", "b", "c"]


async def test_two_relays_racing_on_one_chat_send_each_call_once(
    scripted: ScriptedAPI, http: HttpBotAPI
) -> None:
    outbox = MemoryStore().outbox()
    texts = [str(i) for i in range(12)]
    for text in texts:
        await outbox.enqueue(new_call(text, "sendMessage", {"chat_id": 1, "text": text}))
    async with relay_of(outbox, http, concurrency=3), relay_of(outbox, http, concurrency=3):
        await wait_for(outbox, texts[-1], CallStatus.DELIVERED)
    assert [p["text"] for p in scripted.calls_of("sendMessage")] == texts


@pytest.mark.parametrize(
    ("policy", "status", "sent"),
    [
        (AmbiguousPolicy.HOLD, CallStatus.UNKNOWN, 0),
        (AmbiguousPolicy.RESEND, CallStatus.DELIVERED, 1),
    ],
)
async def test_a_take_that_recorded_nothing(
    scripted: ScriptedAPI, http: HttpBotAPI, policy: AmbiguousPolicy, status: CallStatus, sent: int
) -> None:
    """A relay took the entry and died before recording (maybe after sending): after the
    lease, hold makes it unknown without calling the API; resend sends it."""
    outbox = MemoryStore().outbox()
    await outbox.enqueue(new_call("k", "sendMessage", {"chat_id": 1, "text": "a"}, policy))
    abandoned = await outbox.take(bot_id=BOT_ID, lease=0.05)
    assert abandoned is not None
    await asyncio.sleep(0.1)
    done = await relay_of(outbox, http).deliver_unit("chat:1", until_key="k")
    assert done is not None and done.status is status
    assert len(scripted.calls_of("sendMessage")) == sent


async def test_a_poison_entry_whose_takes_never_record_is_buried(
    scripted: ScriptedAPI, http: HttpBotAPI
) -> None:
    outbox = MemoryStore().outbox()
    await outbox.enqueue(
        new_call("k", "editMessageText", {"chat_id": 1, "message_id": 1, "text": "a"})
    )
    for _ in range(3):
        assert await outbox.take(bot_id=BOT_ID, lease=0.0) is not None
    await outbox.enqueue(new_call("next", "sendMessage", {"chat_id": 1, "text": "b"}))
    await relay_of(outbox, http, max_attempts=3).deliver_unit("chat:1")
    dead, after = await outbox.get("k"), await outbox.get("next")
    assert dead is not None and dead.status is CallStatus.DEAD
    assert after is not None and after.status is CallStatus.DELIVERED  # the chat moves on
    assert scripted.calls_of("editMessageText") == []


async def test_outcomes_are_decision_events(scripted: ScriptedAPI, http: HttpBotAPI) -> None:
    scripted.script("sendMessage", error(400, "Bad Request: chat not found"))
    outbox = MemoryStore().outbox()
    seen: list[DecisionEvent] = []
    relay = relay_of(outbox, http)
    with subscribe(seen.append):
        await outbox.enqueue(new_call("a", "sendMessage", {"chat_id": 1, "text": "a"}))
        await outbox.enqueue(new_call("b", "sendMessage", {"chat_id": 1, "text": "b"}))
        await relay.deliver_unit("chat:1")
    assert [(e.boundary, e.key, e.decision, e.handler) for e in seen] == [
        ("outbox", "a", "dead", "sendMessage"),
        ("outbox", "b", "delivered", "sendMessage"),
    ]


async def test_the_token_is_never_logged_or_stored(
    scripted: ScriptedAPI, closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = TOKEN.partition(":")[2]
    scripted.script("sendMessage", Reply(drop=True), error(500, "Internal Server Error"))
    outbox = MemoryStore().outbox()
    async with (
        HttpBotAPI(TOKEN, base_url=scripted.url) as good,
        HttpBotAPI(TOKEN, base_url=f"http://127.0.0.1:{closed_port}") as down,
    ):
        for i in range(3):
            await outbox.enqueue(new_call(f"s{i}", "sendMessage", {"chat_id": i, "text": "x"}))
        await relay_of(outbox, good).deliver_unit("chat:0")
        await relay_of(outbox, good).deliver_unit("chat:1")
        await relay_of(outbox, down).deliver_unit("chat:2")
    assert len(caplog.records) >= 3
    logged = [r.getMessage() + repr(r.args) + str(r.exc_info) for r in caplog.records]
    assert not [line for line in logged if secret in line]
    stored = [repr(e) for s in CallStatus for e in await outbox.entries(status=s)]
    assert not [row for row in stored if secret in row]
    assert secret in scripted.tokens[0]  # the token did reach the API


async def wait_for(outbox: Outbox, key: str, status: CallStatus, limit: float = 5.0) -> OutboxEntry:
    async with asyncio.timeout(limit):
        while True:
            entry = await outbox.get(key)
            if entry is not None and entry.status is status:
                return entry
            await asyncio.sleep(0.01)


async def test_a_call_waiting_long_for_the_flood_budget_is_handed_back_never_held(
    scripted: ScriptedAPI, http: HttpBotAPI
) -> None:
    """A relay does not sit on an entry through a long flood wait: it hands it back with a
    record and a delay, so a relay dying during the wait cannot make the unsent hold call
    unknown. Its next take sends it, once."""
    store = MemoryStore()
    outbox = store.outbox()
    slow_chat = Limits(chat=Rate(1, 2.0, burst=1))  # one message per 2 s in a chat
    flood = FloodControl(store.flood_budget(), bot_id=BOT_ID, limits=slow_chat)
    relay = relay_of(outbox, http, flood=flood, lease=30.0)
    for key, text in (("a", "first"), ("b", "second")):
        await outbox.enqueue(new_call(key, "sendMessage", {"chat_id": 1, "text": text}))
    first = await relay.deliver_unit("chat:1", until_key="a")
    assert first is not None and first.status is CallStatus.DELIVERED
    taken = await outbox.take(bot_id=BOT_ID, lease=30.0)
    assert taken is not None and taken.key == "b"
    handed_back = await relay.deliver(taken)
    assert handed_back.status is CallStatus.PENDING, "a 2 s wait must not be spent holding it"
    assert "flood budget" in (handed_back.last_error or "")
    assert handed_back.available_at > handed_back.created_at + 1.0
    assert len(scripted.calls_of("sendMessage")) == 1
    # The relay "dies" here: the next relay takes it when due and sends it, not unknown.
    await asyncio.sleep(max(handed_back.available_at - time.time(), 0) + 0.05)
    other = relay_of(outbox, http, flood=flood)
    done = await other.deliver_unit("chat:1", until_key="b")
    assert done is not None and done.status is CallStatus.DELIVERED
    assert [c["text"] for c in scripted.calls_of("sendMessage")] == ["first", "second"]


async def test_a_wait_of_a_chats_pacing_is_handed_back_too(
    scripted: ScriptedAPI, http: HttpBotAPI
) -> None:
    """Under a chat's own pacing (here one message per 0.4 s, shorter than a second) nearly
    every call waits: a relay that held entries through such waits made every waiting call
    unknown when it was killed. Anything longer than a moment is handed back."""
    store = MemoryStore()
    outbox = store.outbox()
    paced = Limits(chat=Rate(1, 0.4, burst=1))
    flood = FloodControl(store.flood_budget(), bot_id=BOT_ID, limits=paced)
    relay = relay_of(outbox, http, flood=flood, lease=30.0)
    for key, text in (("a", "first"), ("b", "second")):
        await outbox.enqueue(new_call(key, "sendMessage", {"chat_id": 1, "text": text}))
    first = await relay.deliver_unit("chat:1", until_key="a")
    assert first is not None and first.status is CallStatus.DELIVERED
    taken = await outbox.take(bot_id=BOT_ID, lease=30.0)
    assert taken is not None and taken.key == "b"
    handed_back = await relay.deliver(taken)
    assert handed_back.status is CallStatus.PENDING, "a 0.4 s wait is not held either"
    assert len(scripted.calls_of("sendMessage")) == 1
