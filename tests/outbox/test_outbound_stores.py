"""The outbound path end to end on real stores (memory, SQLite, PostgreSQL, Redis) and
real HTTP to the fake Bot API, with the crashes of docs/outbound.md's failure model made
real: relay and action processes killed with SIGKILL (``outbound_worker.py``).

- crash between the state write and delivery: a transaction that writes a business row
  and enqueues with ``conn=`` (sqlite3, aiosqlite; asyncpg, SQLAlchemy ``AsyncSession``)
  and commits is delivered once by a relay started afterwards; one rolled back sends
  nothing, ever;
- crash between delivery and its record: a relay process killed while Telegram's answer
  is late; the next relay after the lease: ``hold`` → unknown, never sent twice;
  ``resend`` → sent exactly once more;
- crash between the record and the caller: an ``@idempotent`` action process killed after
  its call was delivered; the retried action gets the recorded result, nothing is sent;
- relay restarts and two relay processes racing: every call once, each chat in order,
  under injected 429s and 5xx;
- a 429 storm dead-letters nothing; ambiguous drops under each policy; latest-wins edits
  across a chat whose head is slow; two processes on one flood budget against the fake's
  enforced limits: zero 429s.

The relay logic on the memory store with a scripted server is tests/outbox/test_relay.py
and test_sender.py; the store primitives are the conformance suite's.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiosqlite
import asyncpg
import pytest
from services import UrlFactory, postgres_dsn
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from telegram_idem import Idem, bind_update, idempotent
from telegram_idem.backends import Store, store_from_url
from telegram_idem.errors import UnknownOutcomeError
from telegram_idem.flood import FloodControl, Limits, Rate
from telegram_idem.outbox import AmbiguousPolicy, CallStatus, HttpBotAPI, Outbound, Relay
from telegram_idem.testing.bot_api import FakeBotAPI, Fault

TOKEN = "123456:SECRET-token_value-xyz"
BOT_ID = 123456
LEASE = 1.0
"""Seconds a relay holds a call: a killed relay's calls are takeable a second later."""
WORKER = Path(__file__).with_name("outbound_worker.py")
UNPACED = Limits(
    global_=Rate(10_000, 1.0, burst=10_000),
    chat=Rate(10_000, 1.0, burst=10_000),
    group=Rate(10_000, 1.0, burst=10_000),
)

SHARED = ["sqlite", "postgres", "redis"]
"""Stores whose state another process sees (the crash tests run on these)."""
ALL = ["memory", *SHARED]

UPDATE = {
    "update_id": 1,
    "message": {
        "message_id": 5,
        "date": 0,
        "chat": {"id": 1, "type": "private"},
        "from": {"id": 1, "is_bot": False, "first_name": "U"},
        "text": "/order",
    },
}


# ----------------------------------------------------------------- fixtures


def url_of(request: pytest.FixtureRequest) -> str:
    factory: UrlFactory = request.getfixturevalue(f"{request.param}_url_factory")
    return factory()


def marked(names: list[str]) -> list[Any]:
    """Each store name as a parameter carrying its marker (``-m postgres``)."""
    return [pytest.param(name, marks=getattr(pytest.mark, name)) for name in names]


@pytest.fixture(params=marked(ALL))
def any_url(request: pytest.FixtureRequest) -> str:
    """A fresh URL of every store with an outbox."""
    return url_of(request)


@pytest.fixture(params=marked(SHARED))
def shared_url(request: pytest.FixtureRequest) -> str:
    """A fresh URL of every store another process can share."""
    return url_of(request)


@pytest.fixture
async def opened() -> AsyncIterator[Callable[[str], Store]]:
    """Opens store objects on a URL (real clock); closes them after the test."""
    made: list[Store] = []

    def open_(url: str) -> Store:
        made.append(store_from_url(url))
        return made[-1]

    yield open_
    for store in made:
        await store.close()


@pytest.fixture
async def fake() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI() as api:
        yield api


class Bot:
    """One bot process's outbound side, in this process: an ``Outbound`` whose relay is
    fast (short lease and polls), not started until ``async with``."""

    def __init__(self, store: Store, api_url: str, *, limits: Limits = UNPACED, **kw: Any):
        self.store = store
        self.api = HttpBotAPI(TOKEN, base_url=api_url, timeout=kw.pop("timeout", 5.0))
        flood = FloodControl.for_store(store, bot_id=BOT_ID, limits=limits)
        kw.setdefault("lease", LEASE)
        kw.setdefault("poll_interval", 0.05)
        kw.setdefault("backoff_base", 0.05)
        kw.setdefault("backoff_max", 0.5)
        self.relay = Relay(store.outbox(), self.api, bot_id=BOT_ID, flood=flood, **kw)
        self.out = Outbound(store.outbox(), self.api, bot_id=BOT_ID, flood=flood, relay=self.relay)

    async def __aenter__(self) -> Outbound:
        self.relay.start()
        return self.out

    async def __aexit__(self, *exc: object) -> None:
        await self.relay.stop(grace=1.0)
        await self.api.close()


@pytest.fixture
async def bots() -> AsyncIterator[Callable[..., Bot]]:
    made: list[Bot] = []

    def make(store: Store, api_url: str, **kw: Any) -> Bot:
        made.append(Bot(store, api_url, **kw))
        return made[-1]

    yield make
    for bot in made:
        await bot.relay.stop(grace=0.5)
        await bot.api.close()


class Worker:
    """A bot process (``outbound_worker.py``), killed with SIGKILL at the test's end."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def line(self) -> str:
        """The worker's next stdout line (20 s at most)."""
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), 20.0)
        if not raw:
            assert self.proc.stderr is not None
            err = await self.proc.stderr.read()
            raise AssertionError(f"the worker ended: {err.decode(errors='replace')}")
        return raw.decode().strip()

    async def kill(self) -> None:
        """SIGKILL: nothing runs after it (no finally, no shutdown grace)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
        await self.proc.wait()


@pytest.fixture
async def workers() -> AsyncIterator[Callable[..., Awaitable[Worker]]]:
    made: list[Worker] = []

    async def start(mode: str, url: str, api_url: str, *args: str, ready: bool = True) -> Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            mode,
            "--url",
            url,
            "--api",
            api_url,
            "--lease",
            str(LEASE),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        worker = Worker(proc)
        made.append(worker)
        if ready:
            assert await worker.line() == "ready"
        return worker

    yield start
    for worker in made:
        await worker.kill()


async def until(check: Callable[[], bool | Awaitable[bool]], within: float = 15.0) -> None:
    """Wait until ``check()`` holds (polled every 20 ms); fail after ``within`` s."""
    deadline = time.monotonic() + within
    while not await holds(check):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s")
        await asyncio.sleep(0.02)


async def holds(check: Callable[[], bool | Awaitable[bool]]) -> bool:
    found = check()
    return await found if inspect.isawaitable(found) else found


async def status_of(store: Store, key: str) -> CallStatus | None:
    entry = await store.outbox().get(key)
    return entry.status if entry is not None else None


async def enqueue_texts(out: Outbound, chats: dict[int, int], **kw: Any) -> dict[int, list[str]]:
    """Enqueue ``n`` sendMessage calls for each ``chat: n`` (interleaved), keyed, without
    waiting; returns the texts per chat in enqueue order."""
    texts: dict[int, list[str]] = {chat: [] for chat in chats}
    for i in range(max(chats.values())):
        for chat, n in chats.items():
            if i < n:
                text = f"c{chat}-{i}"
                await out.call(
                    "sendMessage", {"chat_id": chat, "text": text}, key=text, wait=None, **kw
                )
                texts[chat].append(text)
    return texts


async def all_delivered(store: Store, n: int) -> bool:
    return (await store.outbox().counts()).get(CallStatus.DELIVERED, 0) >= n


# ----------------------------------------------------------------- crash: state write → delivery


class Tx:
    """The bot's own database transaction: ``write`` a business row and enqueue in it,
    then ``commit`` or ``rollback``; ``rows`` counts committed rows."""

    conn: object

    async def write(self, order: int) -> None:
        raise NotImplementedError

    async def commit(self) -> None:
        raise NotImplementedError

    async def rollback(self) -> None:
        raise NotImplementedError

    async def rows(self) -> int:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class Sqlite3Tx(Tx):
    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, timeout=10.0)
        self.db.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
        self.db.commit()
        self.conn = self.db

    async def write(self, order: int) -> None:
        self.db.execute("INSERT INTO orders VALUES (?)", (order,))

    async def commit(self) -> None:
        self.db.commit()

    async def rollback(self) -> None:
        self.db.rollback()

    async def rows(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM orders").fetchone()[0])

    async def close(self) -> None:
        self.db.close()


class AiosqliteTx(Tx):
    def __init__(self, db: aiosqlite.Connection) -> None:
        self.db = db
        self.conn = db

    @classmethod
    async def open(cls, path: str) -> AiosqliteTx:
        db = await aiosqlite.connect(path, timeout=10.0)
        await db.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
        await db.commit()
        return cls(db)

    async def write(self, order: int) -> None:
        await self.db.execute("INSERT INTO orders VALUES (?)", (order,))

    async def commit(self) -> None:
        await self.db.commit()

    async def rollback(self) -> None:
        await self.db.rollback()

    async def rows(self) -> int:
        async with self.db.execute("SELECT count(*) FROM orders") as cursor:
            row = await cursor.fetchone()
        assert row is not None
        return int(row[0])

    async def close(self) -> None:
        await self.db.close()


class AsyncpgTx(Tx):
    def __init__(self, db: asyncpg.Connection, table: str) -> None:
        self.db = db
        self.conn = db
        self.table = table
        self.tx: Any = None

    @classmethod
    async def open(cls, dsn: str, table: str) -> AsyncpgTx:
        db = await asyncpg.connect(dsn)
        await db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
        return cls(db, table)

    async def write(self, order: int) -> None:
        self.tx = self.db.transaction()
        await self.tx.start()
        await self.db.execute(f"INSERT INTO {self.table} VALUES ($1)", order)

    async def commit(self) -> None:
        await self.tx.commit()

    async def rollback(self) -> None:
        await self.tx.rollback()

    async def rows(self) -> int:
        return int(await self.db.fetchval(f"SELECT count(*) FROM {self.table}"))

    async def close(self) -> None:
        await self.db.execute(f"DROP TABLE IF EXISTS {self.table}")
        await self.db.close()


class SessionTx(Tx):
    def __init__(self, engine: AsyncEngine, table: str) -> None:
        self.engine = engine
        self.table = table
        self.session = AsyncSession(engine)
        self.conn = self.session

    @classmethod
    async def open(cls, dsn: str, table: str) -> SessionTx:
        engine = create_async_engine(dsn.replace("postgresql://", "postgresql+asyncpg://", 1))
        async with engine.begin() as conn:
            await conn.execute(text(f"CREATE TABLE {table} (id int PRIMARY KEY)"))
        return cls(engine, table)

    async def write(self, order: int) -> None:
        await self.session.execute(text(f"INSERT INTO {self.table} VALUES ({order})"))

    async def commit(self) -> None:
        await self.session.commit()

    async def rollback(self) -> None:
        await self.session.rollback()

    async def rows(self) -> int:
        async with self.engine.connect() as conn:
            found = await conn.scalar(text(f"SELECT count(*) FROM {self.table}"))
        return int(found or 0)

    async def close(self) -> None:
        await self.session.close()
        async with self.engine.begin() as conn:
            await conn.execute(text(f"DROP TABLE IF EXISTS {self.table}"))
        await self.engine.dispose()


@pytest.fixture(
    params=[
        pytest.param("sqlite3", marks=pytest.mark.sqlite),
        pytest.param("aiosqlite", marks=pytest.mark.sqlite),
        pytest.param("asyncpg", marks=pytest.mark.postgres),
        pytest.param("sqlalchemy-session", marks=pytest.mark.postgres),
    ]
)
async def bot_tx(
    request: pytest.FixtureRequest, opened: Callable[[str], Store]
) -> AsyncIterator[tuple[str, Tx]]:
    """A store URL and the bot's own transaction on the store's database."""
    kind = request.param
    if kind in ("sqlite3", "aiosqlite"):
        url = request.getfixturevalue("sqlite_url_factory")()
        await opened(url).outbox().counts()  # the store sets its file up first
        path = urlsplit(url).path
        tx: Tx = Sqlite3Tx(path) if kind == "sqlite3" else await AiosqliteTx.open(path)
    else:
        url = request.getfixturevalue("postgres_url_factory")()
        prefix = dict(p.split("=", 1) for p in urlsplit(url).query.split("&"))["table_prefix"]
        table = f"{prefix}_orders"
        tx = await (AsyncpgTx if kind == "asyncpg" else SessionTx).open(postgres_dsn(), table)
    yield url, tx
    await tx.close()


async def test_a_committed_transaction_is_delivered_once_by_a_relay_started_later(
    bot_tx: tuple[str, Tx],
    fake: FakeBotAPI,
    opened: Callable[[str], Store],
    bots: Callable[..., Bot],
) -> None:
    url, tx = bot_tx
    crashed = bots(opened(url), fake.url)  # its relay never runs: the process "dies"
    await tx.write(1)
    key = await crashed.out.call(
        "sendMessage", {"chat_id": 1, "text": "order 1 placed"}, key="order:1", conn=tx.conn
    )
    await tx.commit()
    assert await tx.rows() == 1
    await crashed.store.close()
    await asyncio.sleep(0.2)
    assert fake.sent_texts(1) == []  # nothing delivered it yet

    async with bots(opened(url), fake.url) as out:  # the restarted bot
        message = await out.result(key, wait=10.0)
        await asyncio.sleep(0.3)  # more polls: nothing else goes out
    assert message["text"] == "order 1 placed"
    fake.assert_sent_once(1, "order 1 placed")
    assert len(fake.calls_of("sendMessage")) == 1


async def test_a_rolled_back_transaction_sends_nothing_ever(
    bot_tx: tuple[str, Tx],
    fake: FakeBotAPI,
    opened: Callable[[str], Store],
    bots: Callable[..., Bot],
) -> None:
    url, tx = bot_tx
    store = opened(url)
    async with bots(store, fake.url) as out:  # a relay runs all along
        await tx.write(1)
        key = await out.call(
            "sendMessage", {"chat_id": 1, "text": "never"}, key="order:1", conn=tx.conn
        )
        await tx.rollback()
        await asyncio.sleep(0.5)  # ten polls of the running relay
    async with bots(opened(url), fake.url):  # and a relay started afterwards
        await asyncio.sleep(0.3)
    assert await tx.rows() == 0
    assert fake.calls == []
    assert await store.outbox().get(key) is None
    assert await store.outbox().counts() in ({}, {CallStatus.DELIVERED: 0})


@pytest.fixture(params=marked(["sqlite", "postgres"]))
async def bot_db(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, list[str]]]:
    """A store URL, the worker arguments naming the bot's own table on the store's
    database (created here for PostgreSQL, dropped after)."""
    url = url_of(request)
    if request.param == "sqlite":
        yield url, ["--table", "orders"]
        return
    prefix = dict(p.split("=", 1) for p in urlsplit(url).query.split("&"))["table_prefix"]
    table = f"{prefix}_orders"
    db = await asyncpg.connect(postgres_dsn())
    await db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
    try:
        yield url, ["--table", table, "--dsn", postgres_dsn()]
    finally:
        await db.execute(f"DROP TABLE IF EXISTS {table}")
        await db.close()


async def orders_in(url: str, args: list[str]) -> int:
    table = args[args.index("--table") + 1]
    if url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(urlsplit(url).path)) as lite:
            return int(lite.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    db = await asyncpg.connect(postgres_dsn())
    try:
        return int(await db.fetchval(f"SELECT count(*) FROM {table}"))
    finally:
        await db.close()


@pytest.mark.parametrize("rollback", [False, True], ids=["committed", "rolled-back"])
async def test_a_process_killed_after_its_transaction_is_delivered_once_by_a_later_relay(
    bot_db: tuple[str, list[str]],
    rollback: bool,
    fake: FakeBotAPI,
    opened: Callable[[str], Store],
    workers: Callable[..., Awaitable[Worker]],
) -> None:
    """A child process commits (or rolls back) a business row and its enqueue in one
    transaction and is SIGKILLed before any relay ran: a relay process started afterwards
    delivers a committed call exactly once, and a rolled-back one never."""
    url, args = bot_db
    flag = ["--rollback"] if rollback else []
    child = await workers("commit", url, fake.url, *args, *flag, ready=False)
    assert await child.line() == ("rolled back" if rollback else "committed")
    await child.kill()
    assert fake.calls == []  # nothing was delivered by the dead process
    assert await orders_in(url, args) == (0 if rollback else 1)

    store = opened(url)
    await workers("relay", url, fake.url)  # the restarted bot
    if rollback:
        await asyncio.sleep(0.5)  # ten polls of the relay: a stored call would go now
        assert fake.calls_of("sendMessage") == []
        assert await store.outbox().counts() in ({}, {CallStatus.DELIVERED: 0})
        return
    await until(lambda: all_delivered(store, 1))
    await asyncio.sleep(0.3)  # more polls: nothing else goes out
    fake.assert_sent_once(1, "order 1 placed")
    assert len(fake.calls_of("sendMessage")) == 1


# ----------------------------------------------------------------- crash: delivery → record


async def test_a_relay_killed_before_recording_hold_is_unknown_resend_goes_once_more(
    shared_url: str,
    fake: FakeBotAPI,
    opened: Callable[[str], Store],
    bots: Callable[..., Bot],
    workers: Callable[..., Awaitable[Worker]],
) -> None:
    store = opened(shared_url)
    out = bots(store, fake.url).out  # enqueues only: its relay never runs
    hold = await out.call("sendMessage", {"chat_id": 1, "text": "hold"}, key="pay:1", wait=None)
    resend = await out.call(
        "sendMessage",
        {"chat_id": 2, "text": "resend"},
        key="pay:2",
        wait=None,
        policy=AmbiguousPolicy.RESEND,
    )
    fake.inject(Fault.slow(30, method="sendMessage", times=2))  # applied now, answered late
    first = await workers("relay", shared_url, fake.url)

    async def both_applied() -> bool:
        return fake.sent_texts(1) == ["hold"] and fake.sent_texts(2) == ["resend"]

    await until(both_applied)
    await first.kill()  # Telegram has both; no answer was recorded
    assert await status_of(store, hold) is CallStatus.IN_FLIGHT
    assert await status_of(store, resend) is CallStatus.IN_FLIGHT

    await workers("relay", shared_url, fake.url)  # takes them after the lease

    async def decided() -> bool:
        return (await status_of(store, hold), await status_of(store, resend)) == (
            CallStatus.UNKNOWN,
            CallStatus.DELIVERED,
        )

    await until(decided)
    await asyncio.sleep(0.5)  # ten more polls
    assert fake.sent_texts(1) == ["hold"]  # never sent twice
    assert fake.sent_texts(2) == ["resend", "resend"]  # exactly once more
    assert await status_of(store, hold) is CallStatus.UNKNOWN
    with pytest.raises(UnknownOutcomeError):
        await out.result(hold, wait=0.0)


# ----------------------------------------------------------------- crash: record → caller


async def test_an_action_killed_after_its_call_was_recorded_is_retried_without_sending(
    shared_url: str,
    fake: FakeBotAPI,
    opened: Callable[[str], Store],
    bots: Callable[..., Bot],
    workers: Callable[..., Awaitable[Worker]],
) -> None:
    action = await workers(
        "action", shared_url, fake.url, "--update", json.dumps(UPDATE), ready=False
    )
    line = await action.line()
    assert line.startswith("sent ")
    first = json.loads(line.removeprefix("sent "))
    await action.kill()  # before the action completed: its claim dies with it
    assert len(fake.calls_of("sendMessage")) == 1

    store = opened(shared_url)
    idem = Idem(store, lease=LEASE)
    bot = bots(store, fake.url)
    out = Outbound(store.outbox(), bot.api, bot_id=BOT_ID, keys=idem.keys, relay=bot.relay)
    runs = 0

    @idempotent(key="order:{message_id}", in_progress="wait", wait_timeout=10.0)
    async def place_order(update: dict[str, Any]) -> Any:
        nonlocal runs
        runs += 1
        return await out.call("sendMessage", {"chat_id": 1, "text": "order placed"})

    with bind_update(UPDATE, bot_id=BOT_ID, idem=idem):
        again = await place_order(UPDATE)
    assert runs == 1  # the action ran again (it had not completed)...
    assert again == first  # ...and got the recorded message
    assert len(fake.calls_of("sendMessage")) == 1  # nothing new was sent


async def test_a_step_killed_after_its_call_was_sent_is_rerun_without_sending(
    shared_url: str,
    fake: FakeBotAPI,
    opened: Callable[[str], Store],
    bots: Callable[..., Bot],
    workers: Callable[..., Awaitable[Worker]],
) -> None:
    """An outbound call inside ``idem.step``: the process is SIGKILLed after the call was
    sent (and recorded by the outbox) but before the step recorded its result; the re-run
    step makes the same call, gets the first message and sends nothing new."""
    step = await workers("step", shared_url, fake.url, "--update", json.dumps(UPDATE), ready=False)
    line = await step.line()
    assert line.startswith("sent ")
    first = json.loads(line.removeprefix("sent "))
    await step.kill()  # inside the step: it never recorded
    assert len(fake.calls_of("sendMessage")) == 1

    store = opened(shared_url)
    idem = Idem(store, lease=LEASE)
    bot = bots(store, fake.url)
    out = Outbound(store.outbox(), bot.api, bot_id=BOT_ID, keys=idem.keys, relay=bot.relay)
    runs = 0

    async def announce() -> Any:
        nonlocal runs
        runs += 1
        return await out.call("sendMessage", {"chat_id": 1, "text": "order placed"})

    @idempotent(key="order:{message_id}", in_progress="wait", wait_timeout=10.0)
    async def place_order(update: dict[str, Any]) -> Any:
        return await idem.step("announce", announce)

    with bind_update(UPDATE, bot_id=BOT_ID, idem=idem):
        again = await place_order(UPDATE)
    assert runs == 1  # the step ran again (it had not recorded)...
    assert again["message_id"] == first["message_id"]  # ...and carries the first message
    assert again == first
    assert len(fake.calls_of("sendMessage")) == 1  # nothing new was sent


# ----------------------------------------------------------------- restarts, races


async def test_calls_left_by_a_killed_relay_are_delivered_by_the_next_in_order(
    shared_url: str,
    fake: FakeBotAPI,
    opened: Callable[[str], Store],
    bots: Callable[..., Bot],
    workers: Callable[..., Awaitable[Worker]],
) -> None:
    store = opened(shared_url)
    out = bots(store, fake.url).out
    # 5xx before taking effect (sent again under resend), and per-chat 429s
    fake.inject(Fault.server_error(502, chat_id=2, times=3))
    fake.inject(Fault.retry_after(1, chat_id=3, times=1))
    texts = await enqueue_texts(out, {1: 6, 2: 6, 3: 6}, policy=AmbiguousPolicy.RESEND)
    first = await workers("relay", shared_url, fake.url)

    async def some_sent() -> bool:
        return len(fake.sent_texts(1)) >= 3

    await until(some_sent)
    fake.inject(Fault.retry_after(1))  # the whole bot pauses: nothing is in flight...
    await until(lambda: sum(e.error_code == 429 for e in fake.errors) > 1)
    await asyncio.sleep(0.3)
    await first.kill()  # ...when the relay dies
    left = sum(len(t) for t in texts.values()) - sum(len(fake.sent_texts(c)) for c in texts)
    assert left > 0  # the next relay has work

    await workers("relay", shared_url, fake.url)
    await until(lambda: all_delivered(store, 18), within=20.0)
    for chat, expected in texts.items():
        assert fake.sent_texts(chat) == expected  # each once, in enqueue order
    counts = await store.outbox().counts()
    assert counts.get(CallStatus.DEAD, 0) == 0 and counts.get(CallStatus.UNKNOWN, 0) == 0


async def test_two_relay_processes_racing_send_each_call_once_in_order(
    shared_url: str,
    fake: FakeBotAPI,
    opened: Callable[[str], Store],
    bots: Callable[..., Bot],
    workers: Callable[..., Awaitable[Worker]],
) -> None:
    store = opened(shared_url)
    out = bots(store, fake.url).out
    texts = await enqueue_texts(out, {1: 15, 2: 15})
    await asyncio.gather(
        workers("relay", shared_url, fake.url), workers("relay", shared_url, fake.url)
    )
    await until(lambda: all_delivered(store, 30), within=20.0)
    for chat, expected in texts.items():
        assert fake.sent_texts(chat) == expected
    assert len(fake.calls_of("sendMessage")) == 30


# ----------------------------------------------------------------- faults, every store


async def test_a_429_storm_dead_letters_nothing(
    any_url: str, fake: FakeBotAPI, opened: Callable[[str], Store], bots: Callable[..., Bot]
) -> None:
    store = opened(any_url)
    fake.inject(Fault.retry_after(1, times=3))  # every call of the bot, three times
    async with bots(store, fake.url, max_attempts=1) as out:  # a failure would be fatal
        texts = await enqueue_texts(out, {1: 4, 2: 4, -100: 4})
        await until(lambda: all_delivered(store, 12), within=20.0)
    assert sum(1 for e in fake.errors if e.error_code == 429) == 3
    for chat, expected in texts.items():
        assert fake.sent_texts(chat) == expected
    assert (await store.outbox().counts()).get(CallStatus.DEAD, 0) == 0


async def test_a_dropped_answer_under_hold_is_unknown_and_under_resend_delivered(
    any_url: str, fake: FakeBotAPI, opened: Callable[[str], Store], bots: Callable[..., Bot]
) -> None:
    store = opened(any_url)
    fake.inject(Fault.drop(method="sendMessage", times=2))  # applied, never answered
    async with bots(store, fake.url) as out:
        with pytest.raises(UnknownOutcomeError):
            await out.call("sendMessage", {"chat_id": 1, "text": "hold"}, key="h", wait=10.0)
        message = await out.call(
            "sendMessage",
            {"chat_id": 2, "text": "resend"},
            key="r",
            policy=AmbiguousPolicy.RESEND,
            wait=10.0,
        )
        edited = await out.call(  # an edit is resend by default
            "editMessageText",
            {"chat_id": 2, "message_id": message["message_id"], "text": "resend!"},
            key="e",
            wait=10.0,
        )
        await asyncio.sleep(0.3)
    assert fake.sent_texts(1) == ["hold"]  # held: sent once, never again
    assert fake.sent_texts(2) == ["resend", "resend"]  # the drop applied it: at-least-once
    assert edited is True or edited["text"] == "resend!"
    outbox = store.outbox()
    assert [e.method for e in await outbox.entries(status=CallStatus.UNKNOWN)] == ["sendMessage"]


async def test_ten_edits_of_one_message_behind_a_slow_call_collapse_to_the_last(
    any_url: str, fake: FakeBotAPI, opened: Callable[[str], Store], bots: Callable[..., Bot]
) -> None:
    store = opened(any_url)
    fake.seed_message(
        {"message_id": 7, "chat": {"id": 1, "type": "private"}, "text": "0%", "date": 0}
    )
    fake.inject(Fault.slow(1.0, method="sendMessage"))  # the chat's head is slow
    async with bots(store, fake.url) as out:
        head = await out.call("sendMessage", {"chat_id": 1, "text": "working"}, wait=None, key="w")
        await until(lambda: bool(fake.sent_texts(1)))
        keys = [
            await out.call(
                "editMessageText",
                {"chat_id": 1, "message_id": 7, "text": f"{10 * i}%"},
                key=f"progress-{i}",
                wait=None,
            )
            for i in range(1, 11)
        ]
        results = [await out.result(k, wait=10.0) for k in keys]
        await out.result(head, wait=10.0)
    edits = fake.calls_of("editMessageText")
    assert 1 <= len(edits) <= 2  # far fewer than ten
    assert edits[-1].params["text"] == "100%"
    message = fake.message(1, 7)
    assert message is not None and message.text == "100%"
    assert all(r["text"] == "100%" for r in results)  # every caller gets the newest edit


# ----------------------------------------------------------------- shared flood budget


async def test_two_processes_on_one_flood_budget_get_no_429(
    shared_url: str,
    opened: Callable[[str], Store],
    bots: Callable[..., Bot],
    workers: Callable[..., Awaitable[Worker]],
) -> None:
    async with FakeBotAPI(limits=Limits()) as fake:  # enforces Telegram's guidance
        store = opened(shared_url)
        out = bots(store, fake.url).out
        # Each process holds at most 3 entries at once (--concurrency 3, one per chat,
        # each held through its chat's short flood wait), so neither can keep all 6 chats
        # busy: with both running before the first entry is enqueued, both send (a
        # process that started late once found every chat taken by the other, in CI).
        args = ("--limits", "telegram", "--concurrency", "3")
        a, b = "123456:process-a", "123456:process-b"  # one bot, two processes
        await asyncio.gather(
            workers("relay", shared_url, fake.url, "--token", a, *args),
            workers("relay", shared_url, fake.url, "--token", b, *args),
        )
        chats = {chat: 5 for chat in range(1, 7)}  # 3 at once per chat, then 1 a second
        texts = await enqueue_texts(out, chats)
        await until(lambda: all_delivered(store, 30), within=30.0)
    fake.assert_no_429()
    for chat, expected in texts.items():
        assert fake.sent_texts(chat) == expected
    assert {c.token for c in fake.calls} == {a, b}  # both processes sent
    # paced: each chat got more calls than the fake's burst lets in at once, and the fake
    # answers 429 to any beyond its budget, so none of them came ahead of its turn
    assert all(n > Limits().chat.burst for n in chats.values())
    assert fake.limits == Limits() and fake.limit_429s == 0


async def test_two_processes_pacing_one_group_stay_within_its_budget(
    shared_url: str, workers: Callable[..., Awaitable[Worker]]
) -> None:
    """The group budget (20 a minute, edits counted) shared by two processes through
    FloodControl alone: each sends a message to one group and edits it — 4 calls where the
    fake allows 3 at once and then one each 3.3 s; each process's own burst (2) alone
    would let all 4 through at once."""
    async with FakeBotAPI(limits=Limits()) as fake:
        a, b = "123456:process-a", "123456:process-b"  # one bot, two processes
        pacers = await asyncio.gather(
            *(
                workers("pace", shared_url, fake.url, "--token", t, "--count", "1", ready=False)
                for t in (a, b)
            )
        )
        lines = [[await w.line() for _ in range(4)] for w in pacers]
    fake.assert_no_429()
    for output in lines:
        assert output[:2] == ["answer 200"] * 2 and output[3] == "done"
    waited = [float(output[2].removeprefix("waited ")) for output in lines]
    assert sum(waited) > 0  # the processes waited for each other's spending
    group = [c for c in fake.calls if c.params.get("chat_id") == -100]
    assert len(group) == 4 and {c.token for c in group} == {a, b}
    arrivals = sorted(c.at for c in group)  # the fake's clock, as it received them
    limit = Limits().group
    for first in range(len(arrivals) - int(limit.burst)):  # never more than the burst...
        later = arrivals[first + int(limit.burst)]
        assert later - arrivals[first] >= limit.interval * 0.9  # ...within an interval


async def test_three_cold_processes_on_one_flood_budget_get_no_429(
    shared_url: str,
    opened: Callable[[str], Store],
    bots: Callable[..., Bot],
    workers: Callable[..., Awaitable[Worker]],
) -> None:
    # Enough calls waiting that the global budget (30/s) is spent while the three
    # processes are still cold: each one's first requests leave it after its flood
    # reservations unless the relay readies its transport first (HttpBotAPI.warm), and a
    # request that leaves late lands on the fake together with later ones (a 429 there).
    async with FakeBotAPI(limits=Limits()) as fake:  # enforces Telegram's guidance
        store = opened(shared_url)
        out = bots(store, fake.url).out
        # 180 calls: 6 s of the global budget, so a process that started a second or two
        # after the others still finds calls to send (all three must send)
        texts = await enqueue_texts(out, {chat: 3 for chat in range(1, 61)})
        tokens = [f"123456:process-{name}" for name in "abc"]  # one bot, three processes
        args = ("--limits", "telegram", "--lease", "10")  # no crash here: no lease runs out
        await asyncio.gather(
            *(workers("relay", shared_url, fake.url, "--token", t, *args) for t in tokens)
        )
        await until(lambda: all_delivered(store, 180), within=60.0)
    fake.assert_no_429()
    for chat, expected in texts.items():
        assert fake.sent_texts(chat) == expected
    assert {c.token for c in fake.calls} == set(tokens)  # all three processes sent
