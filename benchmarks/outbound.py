"""Outbound benchmark: the outbox in a transaction, flood control across processes, bytes.

    .venv/bin/python benchmarks/outbound.py [--quick] [--runs 5] [--n 300] [--messages 270]
        [--skip tx,flood,bytes]

Three measures, each against a baseline run on this machine in the same run:

- **(a) enqueue inside a transaction**: ``N`` transactions of a business ``INSERT`` +
  ``COMMIT`` vs ``N`` of the same ``INSERT`` + ``Outbox.enqueue_in(conn, call)`` +
  ``COMMIT``, interleaved in rounds whose order alternates, on PostgreSQL (asyncpg) and
  SQLite (sqlite3). Goal ≤ 1.3× per store. Beside them, in the same rounds, the *floor*:
  the same transaction with one hand-written ``INSERT`` of the key and params into a table
  that has only its primary key, the least any outbox row can add.
- **(b) throughput under enforced limits**: a fake Bot API in its own process enforcing
  Telegram's default limits (30 messages/s in all, ~1/s per chat; it answers 429 as
  Telegram does), ``--messages`` messages to 100 private chats, sent by **two processes**
  at once: our relays sharing one store (Redis, PostgreSQL) with ``FloodControl`` on its
  default limits (``Limits().with_headroom()``: the server's rates, each burst smaller
  by what its rate spends in 0.2 s), on exactly the server's ``Limits()``, on
  ``Limits().scaled(0.95)`` and on ``Limits().with_headroom(0.1)``;
  aiogram sending directly (no limiter); python-telegram-bot's ``AIORateLimiter`` (its
  limits kept per process). Reports the rate the fake accepted, the share of what the
  limits allow in that time (goal ≥ 95 % for ours) and the 429s the fake answered
  (goal 0 for ours).
- **(c) bytes of store per pending entry**: ``--n`` × 5 pending ``sendMessage`` calls of
  ~100 characters enqueued in a fresh store; PostgreSQL ``pg_total_relation_size`` delta,
  Redis ``MEMORY USAGE`` summed over the store's keys, SQLite file size after a checkpoint,
  memory ``tracemalloc`` delta, each divided by the count.

``--quick`` runs each measure with its smallest settings, and (b) on the default limits only.
Services by the pytest plugin's variables (docs/testing.md): ``IDEM_POSTGRES_URL``
(default ``postgresql://postgres@127.0.0.1:5432/test``), ``IDEM_REDIS_URL`` (default
``redis://127.0.0.1:6379/0``). A store that is unreachable or has no outbox yet is skipped
with a note. Everything created (tables, keys, files) is removed at the end. Writes the
tables into docs/performance.md (section "outbound") and the chart of (a) and (b) into
docs/img/bench/outbound.png.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import secrets
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from _outbound_sender import BOT_ID, chat_of, text_of
from _report import Bar, Chart, Panel, chart_link, write_section
from stores import CHUNKS, Call, Ratio, command_line, measure, on_exit, with_query

from telegram_idem.backends import store_from_url
from telegram_idem.backends._abilities import outbox_of
from telegram_idem.flood import Limits
from telegram_idem.outbox import (
    NewCall,
    Outbox,
    default_policy,
    encode_params,
    ordering_key_of,
)
from telegram_idem.testing._stores import SERVER_STORES

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

TX_GOAL = 1.3
RATE_GOAL = 0.95
CHATS = 100
PROCESSES = 2
SIDE_TIMEOUT = 120.0

POSTGRES_URL = os.environ.get(
    SERVER_STORES["postgres"].env, "postgresql://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get(SERVER_STORES["redis"].env, "redis://127.0.0.1:6379/0")

TAG = secrets.token_hex(4)
"""Names everything this run creates (keys, tables), so concurrent runs never collide."""


def new_call(name: str, j: int, *, chats: int = CHATS) -> NewCall:
    """A typical reply: ``sendMessage`` of ~100 characters to a private chat."""
    params = {"chat_id": chat_of(j, chats), "text": text_of(j)}
    return NewCall(
        key=f"bench:{TAG}:{BOT_ID}:o:{name}:{j}",
        bot_id=BOT_ID,
        method="sendMessage",
        params=encode_params(params),
        ordering_key=ordering_key_of(params),
        collapse_key=None,
        policy=default_policy("sendMessage"),
    )


def postgres_url(name: str) -> str:
    return with_query(POSTGRES_URL, table_prefix=f"bench_{TAG}_{name}", auto_create=1)


def redis_url(name: str) -> str:
    return with_query(REDIS_URL, key_prefix=f"bench-{TAG}-{name}")


async def drop_postgres_tables(name: str) -> None:
    """Drop every table of ``bench_<tag>_<name>_*``."""
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        mine = await conn.fetch(
            "SELECT quote_ident(tablename) AS name FROM pg_tables "
            "WHERE schemaname = current_schema() AND tablename LIKE $1",
            f"bench\\_{TAG}\\_{name}\\_%",
        )
        if mine:
            await conn.execute(f"DROP TABLE IF EXISTS {', '.join(r['name'] for r in mine)}")
    finally:
        await conn.close()


async def redis_keys(prefix: str) -> list[bytes]:
    from redis.asyncio import Redis

    client = Redis.from_url(REDIS_URL)
    try:
        return [k async for k in client.scan_iter(match=f"{prefix}*", count=1000)]
    finally:
        await client.aclose()


async def drop_redis_keys(name: str) -> None:
    """Delete every key of ``bench-<tag>-<name>``."""
    from redis.asyncio import Redis

    keys = await redis_keys(f"bench-{TAG}-{name}")
    client = Redis.from_url(REDIS_URL)
    try:
        for i in range(0, len(keys), 500):
            await client.delete(*keys[i : i + 500])
    finally:
        await client.aclose()


async def open_store(url: str, stack: AsyncExitStack) -> Outbox:
    """The outbox of a store of ``url``, closed with ``stack`` (``ConfigurationError``
    when the store has none)."""
    store = store_from_url(url)
    on_exit(stack, store.close)
    return outbox_of(store)


# ----------------------------------------------------------------------------- (a) transaction


@dataclass
class TxRow:
    store: str
    ratio: Ratio
    floor: list[float]
    """µs per transaction of the floor: the business write plus the least a second row
    can cost, one hand-written ``INSERT`` of the key and params into a table with nothing
    but its primary key."""
    info: str


async def tx_postgres(n: int, runs: int, stack: AsyncExitStack) -> TxRow:
    import asyncpg

    on_exit(stack, drop_postgres_tables, "tx")
    outbox = await open_store(postgres_url("tx"), stack)
    await outbox.get("warm")  # tables created (auto_create)
    conn = await asyncpg.connect(POSTGRES_URL)
    on_exit(stack, conn.close)
    table = f"bench_{TAG}_tx_orders"
    await conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, chat bigint, note text)")
    await conn.execute(f"CREATE TABLE {table}_floor (key text PRIMARY KEY, params bytea)")
    insert = f"INSERT INTO {table} (id, chat, note) VALUES ($1, $2, $3)"
    floor_insert = f"INSERT INTO {table}_floor (key, params) VALUES ($1, $2)"
    ids = iter(range(10**9))

    def sides(count: int) -> tuple[Call, Call, Call]:
        calls = [new_call("tx", next(ids)) for _ in range(count)]
        floor_calls = [new_call("floor", next(ids)) for _ in range(count)]

        async def baseline(i: int) -> None:
            async with conn.transaction():
                await conn.execute(insert, next(ids), chat_of(i, CHATS), "paid")

        async def subject(i: int) -> None:
            async with conn.transaction():
                await conn.execute(insert, next(ids), chat_of(i, CHATS), "paid")
                await outbox.enqueue_in(conn, calls[i])

        async def floor(i: int) -> None:
            async with conn.transaction():
                await conn.execute(insert, next(ids), chat_of(i, CHATS), "paid")
                await conn.execute(floor_insert, floor_calls[i].key, floor_calls[i].params)

        return baseline, subject, floor

    base, ours, least = await measure(n, runs, sides)
    version = await conn.fetchval("SHOW server_version")
    sync = await conn.fetchval("SHOW synchronous_commit")
    return TxRow(
        "postgres",
        Ratio(ours, base),
        least,
        f"PostgreSQL {str(version).split()[0]} (synchronous_commit={sync}), one asyncpg "
        "connection: `async with conn.transaction()`",
    )


async def tx_sqlite(n: int, runs: int, stack: AsyncExitStack) -> TxRow:
    tmp = tempfile.mkdtemp(prefix="idem-bench-outbound-")
    on_exit(stack, shutil.rmtree, tmp, True)
    path = Path(tmp) / "bot.db"
    outbox = await open_store(f"sqlite:///{path}", stack)
    await outbox.get("warm")  # tables created
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    on_exit(stack, conn.close)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=5000")
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, chat INTEGER, note TEXT)")
    conn.execute("CREATE TABLE floor (key TEXT PRIMARY KEY, params BLOB) WITHOUT ROWID")
    insert = "INSERT INTO orders (chat, note) VALUES (?, ?)"
    floor_insert = "INSERT INTO floor (key, params) VALUES (?, ?)"
    ids = iter(range(10**9))

    def sides(count: int) -> tuple[Call, Call, Call]:
        calls = [new_call("tx", next(ids)) for _ in range(count)]
        floor_calls = [new_call("floor", next(ids)) for _ in range(count)]

        async def baseline(i: int) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(insert, (chat_of(i, CHATS), "paid"))
            conn.execute("COMMIT")

        async def subject(i: int) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(insert, (chat_of(i, CHATS), "paid"))
            await outbox.enqueue_in(conn, calls[i])
            conn.execute("COMMIT")

        async def floor(i: int) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(insert, (chat_of(i, CHATS), "paid"))
            conn.execute(floor_insert, (floor_calls[i].key, floor_calls[i].params))
            conn.execute("COMMIT")

        return baseline, subject, floor

    base, ours, least = await measure(n, runs, sides)
    return TxRow(
        "sqlite",
        Ratio(ours, base),
        least,
        f"SQLite {sqlite3.sqlite_version} (WAL, synchronous=NORMAL) in {tempfile.gettempdir()}, "
        "one sqlite3 connection of the bot on the store's file: `BEGIN IMMEDIATE … COMMIT` "
        "in the event loop",
    )


TX: dict[str, Callable[[int, int, AsyncExitStack], Awaitable[TxRow]]] = {
    "postgres": tx_postgres,
    "sqlite": tx_sqlite,
}


# ----------------------------------------------------------------------------- (b) flood


class FakeProcess:
    """``_outbound_fake.py`` in a child process: the fake Bot API enforcing the limits."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "_outbound_fake.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            self.stop()
            raise RuntimeError(f"the fake Bot API did not start (said {self.url!r})")

    def finish(self) -> dict[str, Any]:
        """Stop it and read what it counted."""
        out, _ = self.proc.communicate(timeout=30)
        return dict(json.loads(out.strip().splitlines()[-1]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class FloodRow:
    side: str
    messages: int
    accepted: int = 0
    throttled: int = 0
    other: int = 0
    span: float = 0.0
    elapsed: float = 0.0
    retry_after_seen: int = 0
    note: str = ""

    @property
    def rate(self) -> float:
        return self.accepted / self.span if self.span > 0 else float("nan")

    @property
    def allowed_share(self) -> float:
        """Accepted calls / the most the fake's global budget passes in their span."""
        g = Limits().global_
        return self.accepted / (g.burst + self.span / g.interval) if self.span > 0 else 0.0


def flood_side(
    side: str, kind: str, messages: int, store_url: str | None = None, limits: str = "default"
) -> FloodRow:
    """Run ``PROCESSES`` senders of ``kind`` at once against a fresh fake."""
    fake = FakeProcess()
    procs: list[subprocess.Popen[str]] = []
    row = FloodRow(side, messages)
    try:
        for i in range(PROCESSES):
            args = [kind, fake.url, str(i), str(PROCESSES), str(messages), str(CHATS)]
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(HERE / "_outbound_sender.py"), *args]
                    + ([store_url, limits] if store_url else []),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    cwd=ROOT,
                )
            )
        for p in procs:
            assert p.stdout is not None
            said = p.stdout.readline().strip()
            if said != "ready":
                raise RuntimeError(f"a {kind} sender did not start (said {said!r})")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [
            json.loads(p.communicate(timeout=SIDE_TIMEOUT)[0].strip().splitlines()[-1])
            for p in procs
        ]
        stats = fake.finish()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        fake.stop()
    ok_at: list[float] = stats["ok_at"]
    row.accepted = len(ok_at)
    row.throttled = int(stats["throttled"])
    row.other = int(stats["other"])
    row.span = (max(ok_at) - min(ok_at)) if len(ok_at) > 1 else 0.0
    row.elapsed = max(float(o["elapsed"]) for o in outs)
    row.retry_after_seen = sum(int(o["retry_after_seen"]) for o in outs)
    return row


async def enqueue_all(url: str, messages: int) -> None:
    """Put every message in the outbox of ``url``, chat by chat in message order."""
    async with AsyncExitStack() as stack:
        outbox = await open_store(url, stack)
        for j in range(messages):
            _, stored = await outbox.enqueue(new_call("flood", j))
            assert stored, j


@dataclass
class FloodPlan:
    side: str
    kind: str
    store: str | None = None
    """For ``relay``: ``redis`` or ``postgres``."""
    limits: str = "default"
    """For ``relay``: the limits of its ``FloodControl`` (``_outbound_sender.limits_of``)."""


async def run_flood(plan: FloodPlan, messages: int, notes: list[str]) -> FloodRow | None:
    print(f"flood: {plan.side}, {messages} messages from {PROCESSES} processes …", flush=True)
    url: str | None = None
    try:
        if plan.store == "redis":
            url = redis_url("flood")
        elif plan.store == "postgres":
            url = postgres_url("flood")
        if url is not None:
            await enqueue_all(url, messages)
        return await asyncio.to_thread(flood_side, plan.side, plan.kind, messages, url, plan.limits)
    except Exception as exc:
        note = f"flood {plan.side}: skipped ({type(exc).__name__}: {exc})"
        print(note, flush=True)
        notes.append(note)
        return None
    finally:
        if plan.store == "redis":
            await drop_redis_keys("flood")
        elif plan.store == "postgres":
            await drop_postgres_tables("flood")


FLOOD_PLANS = (
    FloodPlan("ours on Redis, default limits (`Limits().with_headroom()`)", "relay", "redis"),
    FloodPlan("ours on Redis, exactly the fake's `Limits()`", "relay", "redis", "exact"),
    FloodPlan("ours on Redis, `Limits().scaled(0.95)`", "relay", "redis", "scaled:0.95"),
    FloodPlan(
        "ours on Redis, half the default's room (`Limits().with_headroom(0.1)`)",
        "relay",
        "redis",
        "jitter:0.1",
    ),
    FloodPlan("ours on PostgreSQL, default limits", "relay", "postgres"),
    FloodPlan("ours on PostgreSQL, exactly the fake's `Limits()`", "relay", "postgres", "exact"),
    FloodPlan("aiogram direct (default session, no limiter)", "aiogram"),
    FloodPlan("python-telegram-bot `AIORateLimiter`", "ptb"),
)


# ----------------------------------------------------------------------------- (c) bytes


@dataclass
class BytesRow:
    store: str
    per_entry: float
    how: str


async def bytes_postgres(n: int, stack: AsyncExitStack) -> BytesRow:
    import asyncpg

    on_exit(stack, drop_postgres_tables, "bytes")
    outbox = await open_store(postgres_url("bytes"), stack)
    await outbox.get("warm")
    conn = await asyncpg.connect(POSTGRES_URL)
    on_exit(stack, conn.close)
    size = (
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
        "JOIN pg_namespace s ON s.oid = c.relnamespace "
        "WHERE s.nspname = current_schema() AND c.relkind = 'r' AND c.relname LIKE $1"
    )
    like = f"bench\\_{TAG}\\_bytes\\_%"
    before = int(await conn.fetchval(size, like))
    for j in range(n):
        await outbox.enqueue(new_call("bytes", j))
    after = int(await conn.fetchval(size, like))
    return BytesRow(
        "postgres",
        (after - before) / n,
        "`pg_total_relation_size` of the store's tables (heap, TOAST, indexes), delta",
    )


async def bytes_redis(n: int, stack: AsyncExitStack) -> BytesRow:
    from redis.asyncio import Redis

    on_exit(stack, drop_redis_keys, "bytes")
    outbox = await open_store(redis_url("bytes"), stack)
    client = Redis.from_url(REDIS_URL)
    on_exit(stack, client.aclose)

    async def used() -> int:
        total = 0
        for key in await redis_keys(f"bench-{TAG}-bytes"):
            total += int(await client.memory_usage(key, samples=0) or 0)
        return total

    before = await used()
    for j in range(n):
        await outbox.enqueue(new_call("bytes", j))
    after = await used()
    return BytesRow(
        "redis", (after - before) / n, "`MEMORY USAGE key SAMPLES 0` summed over the store's keys"
    )


async def bytes_sqlite(n: int, stack: AsyncExitStack) -> BytesRow:
    tmp = tempfile.mkdtemp(prefix="idem-bench-outbound-")
    on_exit(stack, shutil.rmtree, tmp, True)
    path = Path(tmp) / "bot.db"
    outbox = await open_store(f"sqlite:///{path}", stack)
    await outbox.get("warm")

    def size() -> int:
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return path.stat().st_size

    before = size()
    for j in range(n):
        await outbox.enqueue(new_call("bytes", j))
    after = size()
    return BytesRow("sqlite", (after - before) / n, "file size after `wal_checkpoint(TRUNCATE)`")


async def bytes_memory(n: int, stack: AsyncExitStack) -> BytesRow:
    outbox = await open_store("memory://", stack)
    await outbox.get("warm")
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for j in range(n):
            await outbox.enqueue(new_call("bytes", j))  # the call: only the store keeps it
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return BytesRow("memory", (after - before) / n, "`tracemalloc` delta of the process")


BYTES: dict[str, Callable[[int, AsyncExitStack], Awaitable[BytesRow]]] = {
    "memory": bytes_memory,
    "sqlite": bytes_sqlite,
    "postgres": bytes_postgres,
    "redis": bytes_redis,
}


# ----------------------------------------------------------------------------- report


@dataclass
class Results:
    tx: list[TxRow] = field(default_factory=list)
    flood: list[FloodRow] = field(default_factory=list)
    bytes: list[BytesRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def us(values: list[float]) -> str:
    v = statistics.median(values)
    return f"{v:.1f}" if v < 100 else f"{v:.0f}"


def tx_table(rows: list[TxRow], n: int, runs: int) -> list[str]:
    lines = [
        "### (a) Enqueue inside the bot's transaction",
        "",
        f"| store | `INSERT` + `COMMIT` µs | with `enqueue_in` µs | added µs "
        f"| ratio (≤ {TX_GOAL}×) | floor: one more row by hand |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        added = statistics.median(r.ratio.top) - statistics.median(r.ratio.bottom)
        least = Ratio(r.floor, r.ratio.bottom)
        lines.append(
            f"| {r.store} | {us(r.ratio.bottom)} | {us(r.ratio.top)} | {added:.0f} "
            f"| {r.ratio.cell(lambda v: v <= TX_GOAL)} "
            f"| {least.cell(lambda v: v <= TX_GOAL)} ({us(r.floor)} µs) |"
        )
    lines += [
        "",
        f"Median of {runs} runs (min–max in brackets); each run is {n} transactions of each "
        f"kind, interleaved in {CHUNKS} chunks whose order alternates. The baseline is a "
        "business `INSERT` and its `COMMIT`; the subject adds "
        "`Outbox.enqueue_in(conn, call)` of one `sendMessage` (~100 characters) to the same "
        "transaction, so the message exists if and only if the row commits. The *floor* "
        "is the least any outbox can add, measured in the same rounds: the same transaction "
        "with one hand-written `INSERT` of the call's key and params into a table that has "
        "nothing but its primary key (no status, no order, no index a relay could take "
        "from). Where the floor itself is over the goal, no outbox row written in the "
        "bot's transaction can meet it on this machine: one more statement (a round trip "
        "on PostgreSQL) and one more table's pages in the commit cost more than the goal "
        "leaves.",
        "",
        *[f"- {r.store}: {r.info}" for r in rows],
    ]
    return lines


def flood_table(rows: list[FloodRow], messages: int) -> list[str]:
    g = Limits().global_
    lines = [
        "### (b) Sending under Telegram's limits, two processes",
        "",
        "| sender (2 processes) | accepted | 429s answered | accepted msg/s "
        f"| of allowed (ours ≥ {RATE_GOAL:.0%}) | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        ours = r.side.startswith("ours")
        share = f"{r.allowed_share:.1%}"
        if ours:
            share += " ✔" if r.allowed_share >= RATE_GOAL else " ✘"
        throttled = f"{r.throttled}"
        if ours:
            throttled += " ✔" if r.throttled == 0 else " ✘"
        lines.append(
            f"| {r.side} | {r.accepted} of {r.messages} | {throttled} | {r.rate:.1f} "
            f"| {share} | {r.elapsed:.1f} |"
        )
    lines += [
        "",
        f"The fake Bot API (`FakeBotAPI(limits=Limits())`, its own process) passes "
        f"{g.burst:.0f} messages at once and then {1 / g.interval:.0f}/s in all, about 1/s "
        f"per chat, and answers anything faster 429 with `retry_after`, as Telegram does. "
        f"{messages} `sendMessage` of ~100 characters to {CHATS} private chats; each sender "
        "process takes every other hundred, one task per chat. *accepted msg/s* is the "
        "accepted calls over the time from the first to the last one the fake accepted; "
        "*of allowed* divides them by the most the limits pass in that time (the burst plus "
        "the rate × the time). A 429 costs the sender its `retry_after` (aiogram and PTB "
        "wait it and send again), and on Telegram repeated 429s lengthen it.",
        "",
        "Ours: two relay processes, each `Relay(outbox, HttpBotAPI(...), flood="
        "FloodControl.for_store(store, limits=...))` with its defaults, reserve every call "
        "from one GCRA budget in the store. On exactly the server's limits (`Limits()`) that "
        "budget leaves no room for the milliseconds a request takes to arrive: a call "
        "reserved at the budget's edge can reach the server ahead of the one reserved before "
        "it and is refused (and a 429 pauses every relay of the bot for its `retry_after`). "
        "A 5 % lower rate (`scaled(0.95)`) gains room only call by call, so the first calls "
        "after the opening burst can still be refused. FloodControl's default, "
        "`Limits().with_headroom()`, keeps the server's rates with each burst smaller by "
        "what its rate spends in 0.2 s (24 in all, 2 per chat): calls whose delays to the "
        "server differ by up to 200 ms still arrive inside its limits, from the first call "
        "on (the relay readies its HTTP session before its first take), at none of the "
        "rate; `with_headroom(0.1)` leaves 100 ms (27 in all), which a busy host can "
        "exceed (docs/outbound.md). *of allowed* counts the burst they leave unused at the "
        "start against them.",
    ]
    return lines


def bytes_table(rows: list[BytesRow], n: int) -> list[str]:
    lines = [
        "### (c) Store bytes per pending entry",
        "",
        "| store | bytes per entry | how |",
        "|---|---|---|",
        *[f"| {r.store} | {r.per_entry:.0f} | {r.how} |" for r in rows],
        "",
        f"{n} pending `sendMessage` entries (~100 characters of text, params "
        f"~{len(new_call('x', 0).params)} bytes of JSON, an effect key of "
        f"~{len(new_call('x', 0).key)} characters) enqueued in a fresh store.",
    ]
    return lines


def reading(res: Results) -> list[str]:
    """What the tables say, in a sentence or so each (written from the figures)."""
    out: list[str] = []
    if res.tx:
        cells = ", ".join(f"{r.ratio.median:.2f}× on {r.store}" for r in res.tx)
        floors = ", ".join(
            f"{Ratio(r.floor, r.ratio.bottom).median:.2f}× on {r.store}" for r in res.tx
        )
        out.append(
            f"- Enqueueing the message inside the bot's own transaction costs {cells} of the "
            f"transaction alone (goal ≤ {TX_GOAL}×); one hand-written row in a table with "
            f"only a primary key, the floor of any outbox, costs {floors}."
        )
    for r in res.flood:
        refused = "no 429" if r.throttled == 0 else f"{r.throttled} × 429"
        head = f"- {r.side}: {r.allowed_share:.0%} of what the limits allow, {refused}"
        if r.side.startswith("ours"):
            out.append(head + ".")
        elif r.side.startswith("aiogram"):
            out.append(head + ": nothing paces it, so it sends until the server refuses.")
        else:
            out.append(
                head + ": its limiter counts per process, so two processes allow twice the "
                "bot's rate."
            )
    if res.bytes:
        low, high = min(r.per_entry for r in res.bytes), max(r.per_entry for r in res.bytes)
        out.append(
            f"- A pending `sendMessage` costs {low:.0f}–{high:.0f} bytes of store, the effect "
            "key and the ~100-character params included."
        )
    return [*out, ""] if out else []


async def bench(args: argparse.Namespace) -> tuple[str, Chart | None]:
    res = Results()
    load_before = os.getloadavg()
    started = time.monotonic()
    if "tx" not in args.skip:
        for name, fn in TX.items():
            async with AsyncExitStack() as stack:
                print(f"tx: {name} ({args.runs} runs × {args.n} transactions) …", flush=True)
                try:
                    row = await asyncio.wait_for(fn(args.n, args.runs, stack), timeout=120)
                except Exception as exc:
                    res.notes.append(f"tx {name}: skipped ({type(exc).__name__}: {exc})")
                    print(res.notes[-1], flush=True)
                    continue
                res.tx.append(row)
                print("  " + tx_table([row], args.n, args.runs)[4], flush=True)
    if "flood" not in args.skip:
        plans = [p for p in FLOOD_PLANS if p.limits == "default"] if args.quick else FLOOD_PLANS
        for plan in plans:
            flood = await run_flood(plan, args.messages, res.notes)
            if flood is not None:
                res.flood.append(flood)
                print("  " + flood_table([flood], args.messages)[4], flush=True)
    if "bytes" not in args.skip:
        count = args.n * 5
        for name, bfn in BYTES.items():
            async with AsyncExitStack() as stack:
                print(f"bytes: {name} ({count} entries) …", flush=True)
                try:
                    res.bytes.append(await asyncio.wait_for(bfn(count, stack), timeout=120))
                except Exception as exc:
                    res.notes.append(f"bytes {name}: skipped ({type(exc).__name__}: {exc})")
                    print(res.notes[-1], flush=True)
    load_after = os.getloadavg()
    elapsed = time.monotonic() - started
    versions = ", ".join(
        f"{d} {metadata.version(d)}" for d in ("aiogram", "python-telegram-bot", "aiolimiter")
    )
    lines = [
        f"Command: `{command_line()}`",
        "",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, load average "
        f"{load_before[0]:.2f} at the start and {load_after[0]:.2f} at the end; "
        f"{elapsed:.0f} s. {versions}." + (f" While it ran: {args.note}" if args.note else ""),
        "",
        *reading(res),
    ]
    if res.tx:
        lines += [*tx_table(res.tx, args.n, args.runs), ""]
    if res.flood:
        lines += [*flood_table(res.flood, args.messages), ""]
    if res.bytes:
        lines += [*bytes_table(res.bytes, args.n * 5), ""]
    chart = outbound_chart(res)
    if chart is not None:
        lines += [chart_link("outbound", "The ratios of tables (a) and (b) as bars"), ""]
    if res.notes:
        lines += ["Skipped or incomplete:", "", *[f"- {note}" for note in res.notes]]
    return "\n".join(lines), chart


def outbound_chart(res: Results) -> Chart | None:
    """The section's chart: (a) per store, (b) per sender; ``None`` when neither ran."""
    panels = []
    if res.tx:
        panels.append(
            Panel(
                "(a) the bot's transaction with enqueue_in / the transaction alone",
                [
                    bar
                    for r in res.tx
                    for bar in (
                        r.ratio.bar(r.store),
                        Ratio(r.floor, r.ratio.bottom).bar(
                            f"{r.store}: floor, one row by hand", judged=False
                        ),
                    )
                ],
                goal=TX_GOAL,
            )
        )
    if res.flood:
        panels.append(
            Panel(
                "(b) accepted messages / the most the limits allow, two sender processes",
                [Bar(r.side, r.allowed_share, judged=r.side.startswith("ours")) for r in res.flood],
                goal=RATE_GOAL,
                better="higher",
                percent=True,
            )
        )
    return Chart("Outbound: the outbox in a transaction, flood control", panels) if panels else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="the smallest settings")
    parser.add_argument("--runs", type=int, default=None, help="runs of (a) (default 5)")
    parser.add_argument(
        "--n", type=int, default=None, help="transactions per run of (a); (c) enqueues 5× (300)"
    )
    parser.add_argument(
        "--messages", type=int, default=None, help="messages of (b) (default 270: ~8 s)"
    )
    parser.add_argument(
        "--skip", default="", help="comma-separated measures to leave out: tx,flood,bytes"
    )
    parser.add_argument(
        "--note", default="", help="what else the machine was doing (written with the tables)"
    )
    parser.add_argument(
        "--no-write", action="store_true", help="print only; leave docs/performance.md alone"
    )
    args = parser.parse_args()
    args.runs = args.runs or (2 if args.quick else 5)
    args.n = args.n or (30 if args.quick else 300)
    args.messages = args.messages or (60 if args.quick else 270)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if args.skip - {"tx", "flood", "bytes"} or args.runs < 1 or args.n < 1 or args.messages < 1:
        parser.error("--skip takes tx, flood, bytes; --runs, --n, --messages must be ≥ 1")
    report, chart = asyncio.run(bench(args))
    print()
    print(report)
    if not args.no_write:
        write_section("outbound", "## Outbound\n\n" + report, chart)


if __name__ == "__main__":
    main()
