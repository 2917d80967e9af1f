"""A poison entry, or an error no rule classifies, never ends the relay (issue 10: "a
poison entry never blocks its chat forever", "nothing lost"), on real stores (memory,
SQLite, PostgreSQL, Redis) and real HTTP to the fake Bot API:

- an entry whose stored params are not a JSON object (written past ``NewCall``'s check,
  as an older version or a hand-edited store could have) is a dead letter saying so;
  the calls after it in its chat and in other chats are sent, and the relay runs on;
- flood control failing on one call before it is sent: a dead letter (not sent),
  redrivable; a failing look for entries is looked past;
- the transport failing unexpectedly before or after the request was written, or
  returning an answer that cannot be recorded: the entry's policy (``hold`` → unknown,
  never sent again; ``resend`` → sent again), one ERROR line with the traceback naming
  the key and the method, never the params or the token; a caller delivering its own
  call inline gets the same outcome, not the exception;
- params that are not a JSON object are refused when the call is made: nothing stored.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest

from telegram_idem.backends import Store, store_from_url
from telegram_idem.errors import UnknownOutcomeError
from telegram_idem.flood import Bucket, FloodBudget, FloodControl, Limits, Rate
from telegram_idem.flood._control import budget_of
from telegram_idem.outbox import (
    AmbiguousPolicy,
    Answer,
    CallStatus,
    HttpBotAPI,
    NewCall,
    Outbound,
    OutboxEntry,
    Relay,
)
from telegram_idem.testing.bot_api import FakeBotAPI

TOKEN = "123456:SECRET-token_value-xyz"
BOT_ID = 123456
UNPACED = Limits(
    global_=Rate(10_000, 1.0, burst=10_000),
    chat=Rate(10_000, 1.0, burst=10_000),
    group=Rate(10_000, 1.0, burst=10_000),
)
SECRET_TEXT = "boom-params-text"
"""The text of the call that meets the error: it must be in no log line."""


def marked(names: list[str]) -> list[Any]:
    return [pytest.param(name, marks=getattr(pytest.mark, name)) for name in names]


@pytest.fixture(params=marked(["memory", "sqlite", "postgres", "redis"]))
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    made = store_from_url(request.getfixturevalue(f"{request.param}_url_factory")())
    yield made
    await made.close()


def relay_of(store: Store, api: HttpBotAPI, budget: FloodBudget | None = None) -> Relay:
    flood = FloodControl(
        budget if budget is not None else budget_of(store), bot_id=BOT_ID, limits=UNPACED
    )
    return Relay(
        store.outbox(),
        api,
        bot_id=BOT_ID,
        flood=flood,
        lease=1.0,
        poll_interval=0.05,
        backoff_base=0.05,
        backoff_max=0.5,
        concurrency=2,
    )


def written_past_the_check(key: str, chat: int, params: bytes) -> NewCall:
    """A call whose stored params are ``params``, whatever they are: ``NewCall`` refuses
    them now, but an older version, or an operator editing the store, could write them."""
    call = NewCall(
        key=key,
        bot_id=BOT_ID,
        method="sendMessage",
        params=json.dumps({"chat_id": chat, "text": "x"}).encode(),
        ordering_key=f"chat:{chat}",
        collapse_key=None,
        policy=AmbiguousPolicy.HOLD,
    )
    object.__setattr__(call, "params", params)  # the frozen dataclass, past __post_init__
    return call


async def until(check: Callable[[], Awaitable[bool]], within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s")
        await asyncio.sleep(0.02)


def settled(store: Store, *keys: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        for key in keys:
            entry = await store.outbox().get(key)
            if entry is None or entry.status in (CallStatus.PENDING, CallStatus.IN_FLIGHT):
                return False
        return True

    return check


async def entry_of(store: Store, key: str) -> OutboxEntry:
    entry = await store.outbox().get(key)
    assert entry is not None
    return entry


def errors_about(caplog: pytest.LogCaptureFixture, key: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "telegram_idem.outbox" and r.levelno >= logging.ERROR and key in r.getMessage()
    ]


# ----------------------------------------------------------------- stored poison


@pytest.mark.parametrize("params", [b"[1]", b'{"chat_id": 1, "text": "cut sh'])
async def test_a_poison_entry_is_a_dead_letter_and_its_chat_and_the_others_go_on(
    store: Store, fake_api: FakeBotAPI, caplog: pytest.LogCaptureFixture, params: bytes
) -> None:
    outbox = store.outbox()
    await outbox.enqueue(written_past_the_check("poison", 1, params))
    async with HttpBotAPI(TOKEN, base_url=fake_api.url) as api:
        relay = relay_of(store, api)
        out = Outbound(outbox, api, bot_id=BOT_ID, relay=relay)
        async with relay:
            after = await out.call(
                "sendMessage", {"chat_id": 1, "text": "after"}, key="a", wait=None
            )
            other = await out.call(
                "sendMessage", {"chat_id": 2, "text": "other"}, key="o", wait=None
            )
            await until(settled(store, "poison", after, other))
            assert relay.running
    poison = await entry_of(store, "poison")
    assert poison.status is CallStatus.DEAD
    assert poison.last_error == "stored params are not a JSON object"
    assert (await entry_of(store, after)).status is CallStatus.DELIVERED
    assert (await entry_of(store, other)).status is CallStatus.DELIVERED
    assert fake_api.sent_texts(1) == ["after"]  # the poison blocked its chat for one take
    assert fake_api.sent_texts(2) == ["other"]
    assert len(fake_api.calls) == 2  # the poison reached neither flood control nor Telegram
    [line] = errors_about(caplog, "poison")
    assert "sendMessage" in line.getMessage()
    assert await outbox.redrive("poison")  # the operator may put it back (once repaired)


class BrokenBudget(FloodBudget):
    """The store's real flood budget, with a bug: reserving ``bad``'s budget raises, and
    the first ``pause_faults`` looks at the pause gate raise (something else than a
    ``StoreError``: a store outage is the outage tests' matter)."""

    def __init__(self, inner: FloodBudget, bad: str, pause_faults: int) -> None:
        self.inner = inner
        self.bad: str | None = bad
        self.pause_faults = pause_faults

    async def reserve(self, buckets: Sequence[Bucket]) -> float:
        if any(b.key == self.bad for b in buckets):
            raise RuntimeError("a bug in a flood rule")
        return await self.inner.reserve(buckets)

    async def pause(self, key: str, seconds: float) -> None:
        await self.inner.pause(key, seconds)

    async def paused_for(self, key: str) -> float:
        if self.pause_faults > 0:
            self.pause_faults -= 1
            raise RuntimeError("a bug in the pause gate")
        return await self.inner.paused_for(key)


async def test_flood_control_failing_on_a_call_dead_letters_it_unsent_and_goes_on(
    store: Store, fake_api: FakeBotAPI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="telegram_idem.outbox")
    outbox = store.outbox()
    async with HttpBotAPI(TOKEN, base_url=fake_api.url) as api:
        probe = FloodControl(budget_of(store), bot_id=BOT_ID)
        budget = BrokenBudget(budget_of(store), bad=probe.key("chat:1"), pause_faults=3)
        relay = relay_of(store, api, budget)
        out = Outbound(outbox, api, bot_id=BOT_ID, relay=relay)
        async with relay:
            bad = await out.call("sendMessage", {"chat_id": 1, "text": "x"}, key="b", wait=None)
            good = await out.call("sendMessage", {"chat_id": 2, "text": "y"}, key="g", wait=None)
            await until(settled(store, bad, good))
            assert relay.running
            assert budget.pause_faults == 0  # the failing looks were met and looked past
            entry = await entry_of(store, bad)
            assert entry.status is CallStatus.DEAD
            assert entry.last_error is not None
            assert "not sent" in entry.last_error and "RuntimeError" in entry.last_error
            assert fake_api.sent_texts(1) == []
            budget.bad = None  # fixed: the operator redrives it, it goes once
            assert await outbox.redrive(bad)
            relay.notify()
            await until(settled(store, bad))
    assert (await entry_of(store, bad)).status is CallStatus.DELIVERED
    assert fake_api.sent_texts(1) == ["x"]
    assert fake_api.sent_texts(2) == ["y"]
    [line] = errors_about(caplog, bad)
    assert "Traceback" in line.getMessage()  # the traceback, once
    looks = [r for r in caplog.records if "looking for entries" in r.getMessage()]
    assert [r.levelno for r in looks] == [logging.ERROR, logging.INFO]  # once per run of them


# ----------------------------------------------------------------- the transport


class BuggyAPI(HttpBotAPI):
    """The real transport with a bug on the call whose text is :data:`SECRET_TEXT`, its
    first time: ``before`` raises before the request is written; ``after`` writes it
    (Telegram applies it), then raises; ``answer`` writes it, then returns an answer whose
    result JSON cannot hold. ``HttpBotAPI`` itself raises only ``CallNotSent`` and
    ``AmbiguousCall``, so an unexpected exception needs a transport with a bug: this one."""

    def __init__(self, *args: Any, mode: str, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.mode = mode
        self.tripped = False

    async def call(self, method: str, params: bytes) -> Answer:
        if self.tripped or json.loads(params).get("text") != SECRET_TEXT:
            return await super().call(method, params)
        self.tripped = True
        if self.mode == "before":
            # its text quotes the request URL, token and all: the log must mask it
            raise RuntimeError(f"a bug before writing {self.base_url}/bot{TOKEN}/{method}")
        await super().call(method, params)  # Telegram applies it
        if self.mode == "after":
            raise RuntimeError(f"a bug after writing {self.base_url}/bot{TOKEN}/{method}")
        return Answer(ok=True, result={"message": object()})


@pytest.mark.parametrize(
    ("policy", "mode", "status", "copies"),
    [
        (AmbiguousPolicy.HOLD, "before", CallStatus.UNKNOWN, 0),
        (AmbiguousPolicy.HOLD, "after", CallStatus.UNKNOWN, 1),  # applied: never again
        (AmbiguousPolicy.HOLD, "answer", CallStatus.UNKNOWN, 1),
        (AmbiguousPolicy.RESEND, "before", CallStatus.DELIVERED, 1),
        (AmbiguousPolicy.RESEND, "after", CallStatus.DELIVERED, 2),  # at-least-once, as asked
        (AmbiguousPolicy.RESEND, "answer", CallStatus.DELIVERED, 2),
    ],
)
async def test_an_unexpected_transport_error_follows_the_policy_and_the_relay_goes_on(
    store: Store,
    fake_api: FakeBotAPI,
    caplog: pytest.LogCaptureFixture,
    policy: AmbiguousPolicy,
    mode: str,
    status: CallStatus,
    copies: int,
) -> None:
    outbox = store.outbox()
    async with BuggyAPI(TOKEN, base_url=fake_api.url, mode=mode) as api:
        relay = relay_of(store, api)
        out = Outbound(outbox, api, bot_id=BOT_ID, relay=relay)
        async with relay:
            hit = await out.call(
                "sendMessage",
                {"chat_id": 1, "text": SECRET_TEXT},
                key="hit",
                policy=policy,
                wait=None,
            )
            after = await out.call(
                "sendMessage", {"chat_id": 1, "text": "after"}, key="a", wait=None
            )
            other = await out.call(
                "sendMessage", {"chat_id": 2, "text": "other"}, key="o", wait=None
            )
            await until(settled(store, hit, after, other))
            assert relay.running
    entry = await entry_of(store, hit)
    assert entry.status is status
    if status is CallStatus.UNKNOWN:
        assert entry.last_error is not None
        assert entry.last_error.startswith("unexpected ")  # its type, never its text
        assert "may have been written" in entry.last_error
        assert SECRET_TEXT not in entry.last_error
    assert fake_api.sent_texts(1) == [SECRET_TEXT] * copies + ["after"]
    assert fake_api.sent_texts(2) == ["other"]
    [line] = errors_about(caplog, hit)
    assert "sendMessage" in line.getMessage() and "Traceback" in line.getMessage()
    assert SECRET_TEXT not in line.getMessage()
    assert TOKEN not in caplog.text and TOKEN.split(":")[1] not in caplog.text


# ----------------------------------------------------------------- at enqueue


@pytest.mark.parametrize(
    "params",
    [b"[1]", b'"text"', b"null", b"", b"{cut", b"\xff{}", b'{"a": NaN}', b'{"a": -Infinity}'],
)
async def test_params_that_are_not_a_json_object_are_refused_and_nothing_is_stored(
    store: Store, params: bytes
) -> None:
    outbox = store.outbox()
    with pytest.raises(ValueError, match="params must be a JSON object") as raised:
        await outbox.enqueue(
            NewCall(
                key="k",
                bot_id=BOT_ID,
                method="sendMessage",
                params=params,
                ordering_key="chat:1",
                collapse_key=None,
                policy=AmbiguousPolicy.HOLD,
            )
        )
    if params:
        assert params.decode("latin-1") not in str(raised.value)  # the params not echoed
    assert await outbox.get("k") is None
    assert sum((await outbox.counts()).values()) == 0


async def test_a_caller_delivering_its_own_call_gets_the_policy_not_the_bug(
    store: Store, fake_api: FakeBotAPI
) -> None:
    """The sender's inline delivery (``call(..., wait=...)`` on an idle chat) meets the
    same rule: the caller sees the call's outcome (unknown under ``hold``), not the
    transport's exception."""
    async with BuggyAPI(TOKEN, base_url=fake_api.url, mode="answer") as api:
        relay = relay_of(store, api)
        out = Outbound(store.outbox(), api, bot_id=BOT_ID, relay=relay)
        with pytest.raises(UnknownOutcomeError):
            await out.call("sendMessage", {"chat_id": 1, "text": SECRET_TEXT}, key="k", wait=10.0)
        message = await out.call("sendMessage", {"chat_id": 1, "text": "next"}, key="n", wait=10.0)
        await relay.stop()
    assert message["text"] == "next"
    assert fake_api.sent_texts(1) == [SECRET_TEXT, "next"]  # held: never sent again
