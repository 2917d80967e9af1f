"""``telegram-idem outbox`` against real SQLite, PostgreSQL and Redis stores, with the
states made by the real outbound path: a relay sending to the fake Bot API over loopback
HTTP, whose injected faults lose an answer (an unknown call), block a chat (a 403 parks
it) and refuse a call for good (a 400 dead letter). The commands list, show, resolve,
redrive and unpark them; the store is read afterwards, and what is redriven is delivered
once by the running relay. Also: empty stores, ``--json``, exit codes 1/2/3/4, and
Ctrl-C during ``redrive --all-dead`` in a real process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cli.ops_support import (
    BOT_ID,
    STORES,
    Bot,
    as_json,
    invoke,
    marked,
    url_of,
)

from telegram_idem import ChatParkedError, SendFailedError, UnknownOutcomeError
from telegram_idem.backends import Store, outbox_of, store_from_url
from telegram_idem.outbox import AmbiguousPolicy, CallStatus, NewCall, Outbound
from telegram_idem.testing.bot_api import FakeBotAPI, Fault

UNKNOWN_CHAT, PARKED_CHAT, DEAD_CHAT = 5550001, 5550002, 5550003


@pytest.fixture(params=marked(STORES))
def url(request: pytest.FixtureRequest) -> str:
    """A fresh URL of each store an operator reads from outside."""
    return url_of(request)


@pytest.fixture
async def store(url: str) -> AsyncIterator[Store]:
    """The bot's own store object on ``url`` (real clock)."""
    made = store_from_url(url)
    yield made
    await made.close()


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
async def fake() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI() as api:
        yield api


@pytest.fixture
async def outbound(store: Store, fake: FakeBotAPI) -> AsyncIterator[Outbound]:
    """The bot's outbound side, its relay running."""
    async with Bot(store, fake.url) as out:
        yield out


async def make_states(outbound: Outbound, fake: FakeBotAPI) -> dict[str, str]:
    """Through the relay and the fake's faults: an unknown call (its answer dropped after
    Telegram applied it), a parked chat (403) and a dead letter (400). Their keys."""
    fake.inject(Fault.drop(method="sendMessage", chat_id=UNKNOWN_CHAT))
    with pytest.raises(UnknownOutcomeError) as unknown:
        await outbound.call(
            "sendMessage", {"chat_id": UNKNOWN_CHAT, "text": "Your receipt"}, key="receipt:1"
        )
    fake.inject(Fault.blocked(PARKED_CHAT))
    with pytest.raises(ChatParkedError) as parked:
        await outbound.call("sendMessage", {"chat_id": PARKED_CHAT, "text": "News"}, key="news:1")
    fake.inject(Fault.error(400, "Bad Request: chat not found", chat_id=DEAD_CHAT))
    with pytest.raises(SendFailedError) as dead:
        await outbound.call("sendMessage", {"chat_id": DEAD_CHAT, "text": "Hello?"}, key="hello:1")
    return {"unknown": unknown.value.key, "parked": parked.value.key, "dead": dead.value.key}


async def status_of(store: Store, key: str) -> CallStatus:
    entry = await outbox_of(store).get(key)
    assert entry is not None
    return entry.status


# ------------------------------------------------------------------ reading


async def test_stats_list_and_show_name_each_state(
    url: str, outbound: Outbound, fake: FakeBotAPI
) -> None:
    keys = await make_states(outbound, fake)

    stats = as_json(await invoke("outbox", "stats", "--store", url, "--json"))
    counts = stats["counts"]
    assert (counts["unknown"], counts["parked"], counts["dead"]) == (1, 1, 1)
    assert counts["pending"] == counts["delivered"] == 0
    assert stats["parked_chats"] == [
        {"bot_id": BOT_ID, "ordering_key": f"chat:{PARKED_CHAT}", "chat": str(PARKED_CHAT)}
    ]
    assert stats["oldest_age"]["unknown"] >= 0 and stats["oldest_age"]["pending"] is None

    listed = as_json(await invoke("outbox", "list", "--store", url, "--json"))
    assert [(i["key"], i["status"]) for i in listed] == [
        (keys["unknown"], "unknown"),
        (keys["parked"], "parked"),
        (keys["dead"], "dead"),
    ]  # oldest first
    dead = listed[2]
    assert (dead["bot_id"], dead["method"], dead["chat"]) == (BOT_ID, "sendMessage", str(DEAD_CHAT))
    assert dead["last_error"] == "400: Bad Request: chat not found" and dead["attempts"] == 1

    only_dead = as_json(
        await invoke("outbox", "list", "--status", "dead", "--store", url, "--json")
    )
    assert [i["key"] for i in only_dead] == [keys["dead"]]
    other_bot = await invoke("outbox", "list", "--bot-id", "42", "--store", url, "--json")
    assert as_json(other_bot) == []

    people = await invoke("outbox", "list", "--store", url)
    assert people.exit_code == 0
    for text in (keys["unknown"], "sendMessage", str(PARKED_CHAT), "chat not found", "parked"):
        assert text in people.stdout

    shown = as_json(await invoke("outbox", "show", keys["unknown"], "--store", url, "--json"))
    assert shown["status"] == "unknown" and shown["policy"] == "hold"
    assert shown["params"] == {"chat_id": UNKNOWN_CHAT, "text": "Your receipt"}
    assert shown["result"] is None and shown["ordering_key"] == f"chat:{UNKNOWN_CHAT}"
    table = await invoke("outbox", "show", keys["unknown"], "--store", url)
    assert table.exit_code == 0 and '"Your receipt"' in table.stdout


async def test_an_entry_holding_a_token_is_shown_without_it(url: str, store: Store) -> None:
    """An entry stored before Outbound refused the token in params (or by a direct
    ``Outbox.enqueue``): the download URL in its params, the ``:`` as written and as
    ``%3A``, and Telegram's description quoting it. list and show, JSON and tables,
    never print the token, not even the part a column cut off."""
    token = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"
    secret = token.partition(":")[2]
    url_doc = f"https://api.telegram.org/file/bot{token}/documents/file_1.pdf"
    params = {"chat_id": 1, "document": url_doc, "caption": url_doc.replace(":AA", "%3AAA")}
    box = outbox_of(store)
    key = f"idem:{BOT_ID}:o:doc"
    await box.enqueue(
        NewCall(
            key=key,
            bot_id=BOT_ID,
            method="sendDocument",
            params=json.dumps(params).encode(),
            ordering_key="chat:1",
            collapse_key=None,
            policy=AmbiguousPolicy.HOLD,
        )
    )
    entry = await box.take(bot_id=BOT_ID, lease=30.0)
    assert entry is not None
    error = f"400: {url_doc.replace(':AA', '%3aAA')}"  # cut short in a list's column
    assert await box.settle(entry, status=CallStatus.DEAD, error=error)
    for args in (("list",), ("list", "--json"), ("show", key), ("show", key, "--json")):
        shown = await invoke("outbox", *args, "--store", url)
        assert shown.exit_code == 0 and "<token>" in shown.stdout, args
        assert secret[:6] not in shown.stdout, args  # not even a cut-off part of it


async def test_show_of_a_missing_key_exits_1(url: str) -> None:
    result = await invoke("outbox", "show", "idem:1:o:nothing", "--store", url)
    assert result.exit_code == 1
    assert "no outbox entry under 'idem:1:o:nothing'" in result.stderr


async def test_an_empty_store(url: str) -> None:
    stats = as_json(await invoke("outbox", "stats", "--store", url, "--json"))
    assert set(stats["counts"].values()) == {0} and stats["parked_chats"] == []
    assert as_json(await invoke("outbox", "list", "--store", url, "--json")) == []
    people = await invoke("outbox", "list", "--store", url)
    assert people.exit_code == 0 and "no entries to settle" in people.stdout
    result = await invoke("outbox", "redrive", "--all-dead", "--store", url, "--json")
    assert as_json(result) == {"redriven": 0, "dead_before": 0}


# ------------------------------------------------------------------ settling


async def test_resolve_an_unknown_call_with_the_message_found_in_the_chat(
    url: str, store: Store, outbound: Outbound, fake: FakeBotAPI
) -> None:
    keys = await make_states(outbound, fake)
    [seen] = fake.messages(UNKNOWN_CHAT)  # the drop came after Telegram applied it

    not_a_message = await invoke(
        "outbox", "resolve", keys["unknown"], "--result", '{"message_id": 1}', "--store", url
    )
    assert not_a_message.exit_code == 2
    assert "sendMessage returns a Message" in not_a_message.stderr
    other_chat = {**seen.message, "chat": {"id": 1, "type": "private"}}
    wrong = await invoke(
        "outbox", "resolve", keys["unknown"], "--result", _dumps(other_chat), "--store", url
    )
    assert wrong.exit_code == 2 and "not the call's chat_id" in wrong.stderr
    not_json = await invoke("outbox", "resolve", keys["unknown"], "--result", "{", "--store", url)
    assert not_json.exit_code == 2
    assert await status_of(store, keys["unknown"]) is CallStatus.UNKNOWN  # nothing written

    dead = await invoke(
        "outbox", "resolve", keys["dead"], "--result", _dumps(seen.message), "--store", url
    )
    assert dead.exit_code == 1
    assert f"'{keys['dead']}' is dead, not unknown" in dead.stderr
    assert "outbox redrive" in dead.stderr

    done = await invoke(
        "outbox", "resolve", keys["unknown"], "--result", _dumps(seen.message), "--store", url
    )
    assert done.exit_code == 0, done.output
    assert f"resolved: {keys['unknown']}" in done.stdout
    entry = await outbox_of(store).get(keys["unknown"])
    assert entry is not None and entry.status is CallStatus.DELIVERED
    assert (await outbound.result(keys["unknown"])) == seen.message  # replays answer with it
    fake.assert_sent_once(UNKNOWN_CHAT, "Your receipt")

    again = await invoke(
        "outbox", "resolve", keys["unknown"], "--result", _dumps(seen.message), "--store", url
    )
    assert again.exit_code == 1 and "is delivered, not unknown" in again.stderr
    missing = await invoke("outbox", "resolve", "idem:1:o:x", "--result", "true", "--store", url)
    assert missing.exit_code == 1 and "no outbox entry" in missing.stderr


async def test_redrive_sends_a_dead_letter_once(
    url: str, store: Store, outbound: Outbound, fake: FakeBotAPI
) -> None:
    keys = await make_states(outbound, fake)
    assert fake.sent_texts(DEAD_CHAT) == []  # the fault was used up: it can go now

    result = await invoke("outbox", "redrive", keys["dead"], "--store", url, "--json")
    assert as_json(result) == {"redriven": [keys["dead"]], "refused": []}
    message = await outbound.result(keys["dead"])  # the running relay sends it
    assert message["text"] == "Hello?"
    assert await status_of(store, keys["dead"]) is CallStatus.DELIVERED
    fake.assert_sent_once(DEAD_CHAT, "Hello?")

    twice = await invoke(
        "outbox", "redrive", keys["dead"], "idem:1:o:none", keys["parked"], "--store", url
    )
    assert twice.exit_code == 1
    assert f"not redriven: {keys['dead']}: it is delivered" in twice.stdout
    assert "not redriven: idem:1:o:none: no outbox entry under it" in twice.stdout
    assert f"redriven: {keys['parked']}" in twice.stdout  # the others still go
    assert await status_of(store, keys["parked"]) is not CallStatus.PARKED
    fake.assert_sent_once(DEAD_CHAT, "Hello?")


async def test_unpark_sends_the_chats_calls_once_the_user_unblocked_the_bot(
    url: str, store: Store, outbound: Outbound, fake: FakeBotAPI
) -> None:
    keys = await make_states(outbound, fake)
    later = await outbound.call(
        "sendMessage", {"chat_id": PARKED_CHAT, "text": "More news"}, key="news:2", wait=None
    )
    assert await status_of(store, later) is CallStatus.PARKED  # the chat stays parked

    fake.clear_faults(chat_id=PARKED_CHAT)  # the user unblocked the bot
    result = await invoke(
        "outbox", "unpark", "--bot-id", str(BOT_ID), str(PARKED_CHAT), "--store", url, "--json"
    )
    assert as_json(result) == {
        "bot_id": BOT_ID,
        "ordering_key": f"chat:{PARKED_CHAT}",
        "unparked": 2,
    }
    assert (await outbound.result(keys["parked"]))["text"] == "News"
    assert (await outbound.result(later))["text"] == "More news"
    assert fake.sent_texts(PARKED_CHAT) == ["News", "More news"]  # in their order, once
    assert await outbox_of(store).parked_units() == []

    again = await invoke(
        "outbox", "unpark", "--bot-id", str(BOT_ID), f"chat:{PARKED_CHAT}", "--store", url
    )
    assert again.exit_code == 1
    assert f"chat:{PARKED_CHAT} of bot {BOT_ID} is not parked" in again.stderr


async def test_redrive_all_dead_in_batches(
    url: str, store: Store, outbound: Outbound, fake: FakeBotAPI
) -> None:
    chats = list(range(7000, 7007))
    for chat in chats:
        fake.inject(Fault.error(400, "Bad Request: chat not found", chat_id=chat))
        with pytest.raises(SendFailedError):
            await outbound.call(
                "sendMessage", {"chat_id": chat, "text": f"hi {chat}"}, key=f"k{chat}"
            )
    keys = await make_states(outbound, fake)  # one more dead letter, and other states

    result = await invoke(
        "outbox", "redrive", "--all-dead", "--batch", "3", "--store", url, "--json"
    )
    assert as_json(result) == {"redriven": 8, "dead_before": 8}
    for chat in chats:
        await outbound.result(outbound.keys.effect(BOT_ID, f"k{chat}"))
        fake.assert_sent_once(chat, f"hi {chat}")
    await outbound.result(keys["dead"])
    counts = await outbox_of(store).counts()
    assert counts.get(CallStatus.DEAD, 0) == 0
    assert counts[CallStatus.UNKNOWN] == 1 and counts[CallStatus.PARKED] == 1  # untouched


# ------------------------------------------------------------------ exit codes


def _dumps(value: Any) -> str:
    return json.dumps(value)


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["outbox", "stats"], 2, "Missing option '--store'"),
        (["outbox", "redrive", "--store", "sqlite:///x.db"], 2, "KEY... or --all-dead"),
        (["outbox", "redrive", "k", "--all-dead", "--store", "sqlite:///x.db"], 2, "one of them"),
        (["outbox", "list", "--status", "lost", "--store", "sqlite:///x.db"], 2, "lost"),
        (["outbox", "stats", "--store", "memory://"], 4, "memory:// lives inside one process"),
        (["outbox", "stats", "--store", "nosuchstore://x"], 4, "nosuchstore"),
        (
            [
                "outbox",
                "stats",
                "--store",
                "dynamodb://idem_ops?region=us-east-1&endpoint_url=http://127.0.0.1:9",
            ],
            4,
            "outbox",
        ),
    ],
)
async def test_usage_and_configuration_exit_codes(args: list[str], code: int, says: str) -> None:
    result = await invoke(*args)
    assert result.exit_code == code, result.output
    assert says in result.stderr


@pytest.mark.parametrize(
    "scheme",
    ["postgresql://postgres:hunter2@127.0.0.1:{port}/test", "redis://:hunter2@127.0.0.1:{port}/0"],
)
async def test_an_unreachable_store_exits_3_without_its_password(
    scheme: str, closed_port: int
) -> None:
    url = scheme.format(port=closed_port)
    for args in (
        ["stats"],
        ["list"],
        ["show", "k"],
        ["redrive", "k"],
        ["unpark", "--bot-id", "1", "2"],
    ):
        result = await invoke("outbox", *args, "--store", url)
        assert result.exit_code == 3, (args, result.output)
        assert result.stderr.startswith("error: ") and "hunter2" not in result.output


async def test_the_store_url_comes_from_the_environment(url: str) -> None:
    result = await invoke("outbox", "stats", "--json", env={"IDEM_STORE_URL": url})
    assert as_json(result)["counts"]["dead"] == 0


# ------------------------------------------------------------------ Ctrl-C


async def test_ctrl_c_stops_redrive_all_dead_cleanly(tmp_path: Path) -> None:
    """A real process, SIGINT while a redrive waits for the SQLite write lock the test
    holds: it exits 130, says so, and the dead letters it did not reach stay dead."""
    db = tmp_path / "bot.db"
    url = f"sqlite:///{db}?busy_timeout=60"
    total = 20
    store = store_from_url(url)
    try:
        await _bury(store, total)
    finally:
        await store.close()
    lock = sqlite3.connect(db, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # every write waits behind it; reads do not
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from telegram_idem._cli import main; main()",
        "outbox",
        "redrive",
        "--all-dead",
        "--batch",
        "5",
        "--store",
        url,
        stderr=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stderr is not None
        line = await asyncio.wait_for(proc.stderr.readline(), 60.0)
        assert line.decode().strip() == f"redriving {total} dead letters"
        proc.send_signal(signal.SIGINT)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    _, err = await asyncio.wait_for(proc.communicate(), 60.0)
    assert proc.returncode == 130, err.decode()
    text = err.decode()
    assert "stopped after" in text and "interrupted: stopped" in text
    store = store_from_url(url)
    try:
        counts = await outbox_of(store).counts()
    finally:
        await store.close()
    assert counts.get(CallStatus.PENDING, 0) <= 1  # at most the redrive in flight finished
    assert counts.get(CallStatus.PENDING, 0) + counts[CallStatus.DEAD] == total


async def _bury(store: Store, count: int) -> None:
    """``count`` dead letters, as a relay buries a call Telegram refused."""
    box = outbox_of(store)
    for n in range(count):
        await box.enqueue(
            NewCall(
                key=f"idem:{BOT_ID}:o:n{n}",
                bot_id=BOT_ID,
                method="sendMessage",
                params=b'{"chat_id":%d,"text":"x"}' % n,
                ordering_key=f"chat:{n}",
                collapse_key=None,
                policy=AmbiguousPolicy.HOLD,
            )
        )
        entry = await box.take(bot_id=BOT_ID, lease=30.0)
        assert entry is not None
        assert await box.settle(entry, status=CallStatus.DEAD, error="400: Bad Request")
