"""Outbound.call against the fake Bot API on loopback, on the memory store: results,
replays without sending, effect keys inside actions (stable under gather), latest-wins
edits, each settled status as its error, a call of its own never waiting behind a chat."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from outbox.outbox_support import BOT_ID, TOKEN, ScriptedAPI, error

from telegram_idem import Idem
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.errors import (
    ChatParkedError,
    ConfigurationError,
    ConflictError,
    DeliveryTimeoutError,
    SendFailedError,
    UnknownOutcomeError,
)
from telegram_idem.outbox import CallStatus, HttpBotAPI, Outbound
from telegram_idem.testing import Fault
from telegram_idem.testing.bot_api import FakeBotAPI


def outbound_on(store: MemoryStore, url: str) -> Outbound:
    return Outbound.for_store(store, token=TOKEN, base_url=url)


async def test_a_call_returns_telegrams_result(fake_api: FakeBotAPI) -> None:
    store = MemoryStore()
    async with outbound_on(store, fake_api.url) as out:
        message = await out.call("sendMessage", {"chat_id": 1, "text": "hi"}, key="greet")
        again = await out.call("sendMessage", {"chat_id": 1, "text": "hi"}, key="greet")
    assert message["text"] == "hi" and again == message
    assert len(fake_api.calls_of("sendMessage")) == 1  # the replay sent nothing
    assert out.bot_id == BOT_ID


async def test_outside_an_action_without_a_key_nothing_is_stored(fake_api: FakeBotAPI) -> None:
    store = MemoryStore()
    async with outbound_on(store, fake_api.url) as out:
        await out.call("sendMessage", {"chat_id": 1, "text": "a"})
        await out.call("sendMessage", {"chat_id": 1, "text": "a"})
    assert len(fake_api.calls_of("sendMessage")) == 2
    assert await store.outbox().counts() in ({}, {CallStatus.DELIVERED: 0})


async def test_an_action_retried_after_a_crash_sends_nothing_new(fake_api: FakeBotAPI) -> None:
    store = MemoryStore()
    idem = Idem(store)
    runs = 0
    async with outbound_on(store, fake_api.url) as out:

        async def action() -> Any:
            nonlocal runs
            runs += 1
            first, second = ({"chat_id": 1, "text": "a"}, {"chat_id": 1, "text": "b"})
            calls = [first, second] if runs == 1 else [second, first]  # reversed on retry
            sent = await asyncio.gather(*(out.call("sendMessage", p) for p in calls))
            if runs == 1:
                raise RuntimeError("crash after sending")
            return sorted(m["text"] for m in sent)

        with pytest.raises(RuntimeError):
            await idem.run("order:1", action)
        assert await idem.run("order:1", action) == ["a", "b"]
    assert sorted(c.params["text"] for c in fake_api.calls_of("sendMessage")) == ["a", "b"]


async def test_a_superseded_edit_returns_the_newest_result(fake_api: FakeBotAPI) -> None:
    store = MemoryStore()
    sent = fake_api.seed_message(
        {"message_id": 7, "chat": {"id": 1, "type": "private"}, "text": "0", "date": 0}
    )
    out = outbound_on(store, fake_api.url)
    keys = [  # enqueued before any relay runs: the first two are still pending
        await out.call(
            "editMessageText",
            {"chat_id": 1, "message_id": 7, "text": str(i)},
            key=f"e{i}",
            wait=None,
        )
        for i in range(1, 4)
    ]
    async with out:
        results = await asyncio.gather(*(out.result(k) for k in keys))
    assert {r["text"] for r in results} == {"3"}
    assert sent.text == "3" and len(fake_api.calls_of("editMessageText")) == 1


@pytest.mark.parametrize(
    ("reply", "raised", "code"),
    [
        (error(400, "Bad Request: chat not found"), SendFailedError, 400),
        (error(403, "Forbidden: bot was blocked by the user"), ChatParkedError, 403),
        (error(500, "Internal Server Error"), UnknownOutcomeError, None),
    ],
)
async def test_settled_statuses_are_errors(
    scripted: ScriptedAPI, reply: Any, raised: type[Exception], code: int | None
) -> None:
    scripted.script("sendMessage", reply)
    async with outbound_on(MemoryStore(), scripted.url) as out:
        with pytest.raises(raised) as caught:
            await out.call("sendMessage", {"chat_id": 1, "text": "a"}, key="k")
    assert getattr(caught.value, "key", "").endswith(":o:k")
    if code is not None:
        assert isinstance(caught.value, SendFailedError) and caught.value.error_code == code


async def test_not_delivered_within_wait_stays_queued(fake_api: FakeBotAPI) -> None:
    store = MemoryStore()
    out = outbound_on(store, fake_api.url)
    await out.call("sendMessage", {"chat_id": 1, "text": "first"}, key="a", wait=None)
    held = await store.outbox().take(bot_id=BOT_ID, lease=60.0)  # in flight elsewhere
    assert held is not None
    with pytest.raises(DeliveryTimeoutError, match=r"within 0\.2 s"):
        await out.call("sendMessage", {"chat_id": 1, "text": "second"}, key="b", wait=0.2)
    entry = await store.outbox().get(out.keys.effect(BOT_ID, "b"))
    assert entry is not None and entry.status is CallStatus.PENDING
    await out.close()


async def test_an_answer_never_waits_behind_a_busy_chat(fake_api: FakeBotAPI) -> None:
    store = MemoryStore()
    out = outbound_on(store, fake_api.url)
    await out.call("sendMessage", {"chat_id": 1, "text": "slow"}, key="a", wait=None)
    head = await store.outbox().take(bot_id=BOT_ID, lease=60.0)  # in flight for a minute
    assert head is not None
    answered = await out.call(  # behind the chat, it could only go after the lease
        "answerCallbackQuery", {"callback_query_id": "q1"}, key="answer:q1", wait=2.0
    )
    assert answered is True
    assert fake_api.answered_callback_ids() == ["q1"]
    entry = await store.outbox().get(head.key)
    assert entry is not None and entry.status is CallStatus.IN_FLIGHT  # the chat still busy
    assert fake_api.calls_of("sendMessage") == []  # answered ahead of the chat's head
    await out.close()


async def test_params_that_cannot_be_encoded_store_nothing(fake_api: FakeBotAPI) -> None:
    store = MemoryStore()
    async with outbound_on(store, fake_api.url) as out:
        with pytest.raises(TypeError):
            await out.call("sendDocument", {"chat_id": 1, "document": b"raw"}, key="k")
    assert await store.outbox().get(out.keys.effect(BOT_ID, "k")) is None


async def test_in_a_transaction_the_store_must_join_it(fake_api: FakeBotAPI) -> None:
    async with outbound_on(MemoryStore(), fake_api.url) as out:
        with pytest.raises(ConfigurationError):
            await out.call("sendMessage", {"chat_id": 1, "text": "a"}, key="k", conn=object())


def test_for_store_needs_an_outbox_and_a_bot_id() -> None:
    with pytest.raises(ConfigurationError):
        Outbound.for_store(object(), token=TOKEN)
    with pytest.raises(ConfigurationError) as caught:
        Outbound.for_store(MemoryStore(), token="no-id-here")
    assert "no-id-here" not in str(caught.value)
    out = Outbound.for_store(MemoryStore(), token=TOKEN, bot_id=9)
    assert out.bot_id == 9 and isinstance(out.api, HttpBotAPI) and TOKEN not in repr(out.api)


async def test_enqueue_inside_the_bots_sqlite_transaction_sends_only_what_committed(
    fake_api: FakeBotAPI, tmp_path: Any
) -> None:
    """``enqueue(conn=...)``: the call commits or rolls back with the bot's own row, and
    the relay sends only what committed; ``result`` waits for it after the commit."""
    import sqlite3

    from telegram_idem.backends.sqlite import SQLiteStore

    path = tmp_path / "bot.db"
    store = SQLiteStore(str(path))
    await store.outbox().counts()  # the store sets its tables up
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, state TEXT)")
    async with Outbound.for_store(store, token=TOKEN, base_url=fake_api.url) as out:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO orders VALUES (1, 'paid')")
        paid = await out.enqueue("sendMessage", {"chat_id": 9, "text": "paid"}, key="o1", conn=conn)
        conn.execute("COMMIT")
        conn.execute("BEGIN")
        conn.execute("INSERT INTO orders VALUES (2, 'paid')")
        await out.enqueue("sendMessage", {"chat_id": 9, "text": "never"}, key="o2", conn=conn)
        conn.execute("ROLLBACK")
        message = await out.result(paid, wait=10)
        await asyncio.sleep(0.5)  # the relay polls: a rolled-back call would show by now
    assert message["text"] == "paid"
    assert [c.params["text"] for c in fake_api.calls_of("sendMessage")] == ["paid"]
    assert conn.execute("SELECT id FROM orders").fetchall() == [(1,)]
    conn.close()
    await store.close()


async def test_enqueue_outside_an_action_needs_a_key(fake_api: FakeBotAPI) -> None:
    async with outbound_on(MemoryStore(), fake_api.url) as out:
        with pytest.raises(ConfigurationError, match="key="):
            await out.enqueue("sendMessage", {"chat_id": 1, "text": "a"})
    assert fake_api.calls_of("sendMessage") == []


async def test_an_unknown_method_is_delivered_as_given_and_held_if_ambiguous(
    fake_api: FakeBotAPI,
) -> None:
    """The Bot API grows: a method this library does not know is sent by its name, with
    the cautious policy (hold), not refused."""
    fake_api.set_result("sendFutureThing", {"ok_future": 1})
    store = MemoryStore()
    async with outbound_on(store, fake_api.url) as out:
        result = await out.call("sendFutureThing", {"chat_id": 1, "x": "é\u202e"}, key="f")
    assert result == {"ok_future": 1}
    [sent] = fake_api.calls_of("sendFutureThing")
    assert sent.params["x"] == "é\u202e"
    entry = await store.outbox().get(out.keys.effect(BOT_ID, "f"))
    assert entry is not None and entry.method == "sendFutureThing"
    assert entry.policy.value == "hold"


async def test_a_store_outage_at_enqueue_raises_store_error_and_sends_nothing(
    fake_api: FakeBotAPI, closed_port: int
) -> None:
    from telegram_idem.backends import store_from_url
    from telegram_idem.errors import StoreError

    store = store_from_url(f"redis://127.0.0.1:{closed_port}/0?socket_timeout=1")
    out = Outbound.for_store(store, token=TOKEN, base_url=fake_api.url)
    try:
        with pytest.raises(StoreError):
            await out.call("sendMessage", {"chat_id": 1, "text": "a"}, key="k", wait=5)
    finally:
        await out.close()
        await store.close()
    assert fake_api.calls_of("sendMessage") == []


async def test_a_refused_call_settled_by_an_operator_lets_its_action_run_again(
    fake_api: FakeBotAPI,
) -> None:
    """A refusal is kept by the outbox entry, not copied into the action's record: after
    the operator fixes the cause and redrives the call (``telegram-idem outbox redrive``),
    the retried action gets the call's new answer instead of a stored failure."""
    store = MemoryStore()
    idem = Idem(store)
    fake_api.inject(Fault.error(400, "Bad Request: chat not found", chat_id=9))
    async with outbound_on(store, fake_api.url) as out:

        async def action() -> Any:
            return await out.call("sendMessage", {"chat_id": 9, "text": "receipt"})

        with pytest.raises(SendFailedError):
            await idem.run("order:9", action)
        (dead,) = await store.outbox().entries(status=CallStatus.DEAD)
        assert await store.outbox().redrive(dead.key)  # the operator's redrive
        message = await idem.run("order:9", action)
    assert message["text"] == "receipt"
    assert len(fake_api.calls_of("sendMessage")) == 2  # the refused one and the redriven one


async def test_a_key_given_to_two_different_calls_is_refused_not_replayed(
    fake_api: FakeBotAPI,
) -> None:
    store = MemoryStore()
    async with outbound_on(store, fake_api.url) as out:
        first = await out.call("sendMessage", {"chat_id": 111, "text": "hello A"}, key="welcome")
        with pytest.raises(ConflictError, match="already stored for another call") as caught:
            await out.call("sendMessage", {"chat_id": 222, "text": "hello B"}, key="welcome")
        with pytest.raises(ConflictError):  # the same text to another chat: another call
            await out.call("sendMessage", {"chat_id": 222, "text": "hello A"}, key="welcome")
        with pytest.raises(ConflictError):  # another method
            await out.call("sendPhoto", {"chat_id": 111, "photo": "AgAD"}, key="welcome")
        again = await out.call("sendMessage", {"chat_id": 111, "text": "hello A"}, key="welcome")
        as_text = await out.call(  # Telegram reads "111" as 111: the same chat
            "sendMessage", {"chat_id": "111", "text": "hello A"}, key="welcome"
        )
    assert again == first == as_text  # the same call is still replayed
    assert "differs in chat_id, text" in str(caught.value)
    assert caught.value.key.endswith(":o:welcome")
    assert "hello" not in str(caught.value)  # no params in the message
    assert [c.params["chat_id"] for c in fake_api.calls_of("sendMessage")] == [111]


async def test_a_call_retried_after_its_group_migrated_still_replays(
    fake_api: FakeBotAPI,
) -> None:
    fake_api.inject(Fault.migrated(-5, -1001234567890))
    store = MemoryStore()
    async with outbound_on(store, fake_api.url) as out:
        first = await out.call("sendMessage", {"chat_id": -5, "text": "a"}, key="notice")
        again = await out.call("sendMessage", {"chat_id": -5, "text": "a"}, key="notice")
    assert first["chat"]["id"] == -1001234567890 and again == first
    assert [c.params["chat_id"] for c in fake_api.calls_of("sendMessage")] == [-5, -1001234567890]


# ----------------------------------------------------------------- store outage at enqueue
# Redis above; PostgreSQL cut by a TCP proxy, SQLite locked by another writer. Either way:
# StoreError, nothing sent, and once the store answers the same call goes exactly once.


async def send_after_outage(out: Outbound) -> list[Any]:
    """The same call retried twice after the outage ended (one send, one replay)."""
    async with out:
        return [
            await out.call("sendMessage", {"chat_id": 1, "text": "a"}, key="k", wait=10)
            for _ in range(2)
        ]


@pytest.mark.postgres
async def test_a_postgres_outage_at_enqueue_raises_store_error_and_sends_nothing(
    fake_api: FakeBotAPI, postgres_url_factory: Any
) -> None:
    from urllib.parse import urlsplit

    from store_proxy import Proxy

    from telegram_idem.backends import store_from_url
    from telegram_idem.errors import StoreError

    url = postgres_url_factory()
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    proxy = Proxy(parts.hostname, parts.port)
    await proxy.start()
    store = store_from_url(url.replace(parts.netloc, f"{parts.username}@127.0.0.1:{proxy.port}"))
    out = Outbound.for_store(store, token=TOKEN, base_url=fake_api.url)
    try:
        await store.outbox().counts()  # the store answers through the proxy
        await proxy.cut()
        with pytest.raises(StoreError):
            await out.call("sendMessage", {"chat_id": 1, "text": "a"}, key="k", wait=5)
        assert fake_api.calls_of("sendMessage") == []
        await proxy.start()  # the server is back, on the same address
        sent = await send_after_outage(out)
    finally:
        await out.close()
        await store.close()
        await proxy.cut()
    assert sent[0]["text"] == "a" and sent[1] == sent[0]
    assert len(fake_api.calls_of("sendMessage")) == 1


@pytest.mark.sqlite
async def test_a_locked_sqlite_file_at_enqueue_raises_store_error_and_sends_nothing(
    fake_api: FakeBotAPI, sqlite_url_factory: Any
) -> None:
    import sqlite3
    from urllib.parse import urlsplit

    from telegram_idem.backends import store_from_url
    from telegram_idem.errors import StoreError

    url = sqlite_url_factory()
    sep = "&" if "?" in url else "?"
    store = store_from_url(f"{url}{sep}busy_timeout=0.3")
    out = Outbound.for_store(store, token=TOKEN, base_url=fake_api.url)
    await store.outbox().counts()  # the store sets its file up
    holder = sqlite3.connect(urlsplit(url).path, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")  # another process writing, past busy_timeout
        with pytest.raises(StoreError):
            await out.call("sendMessage", {"chat_id": 1, "text": "a"}, key="k", wait=5)
        assert fake_api.calls_of("sendMessage") == []
        holder.execute("COMMIT")  # the lock is released
        sent = await send_after_outage(out)
    finally:
        holder.close()
        await out.close()
        await store.close()
    assert sent[0]["text"] == "a" and sent[1] == sent[0]
    assert len(fake_api.calls_of("sendMessage")) == 1


async def test_a_later_call_to_a_parked_chat_says_why_it_is_parked(
    fake_api: FakeBotAPI,
) -> None:
    fake_api.inject(Fault.blocked(9, times=None))
    store = MemoryStore()
    async with outbound_on(store, fake_api.url) as out:
        with pytest.raises(ChatParkedError, match="blocked"):
            await out.call("sendMessage", {"chat_id": 9, "text": "one"}, key="b1")
        with pytest.raises(ChatParkedError) as later:
            await out.call("sendMessage", {"chat_id": 9, "text": "two"}, key="b2")
    assert "403" in str(later.value) and "unpark" in str(later.value)
    assert len(fake_api.calls_of("sendMessage")) == 1  # the second one waits, unsent
