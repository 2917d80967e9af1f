"""Store benchmark: each store's decisions priced against one raw round trip of its own client.

    .venv/bin/python benchmarks/stores.py [--runs 5] [--n 300] [--quick]
        [--stores memory,sqlite,postgres,redis,dynamodb] [--no-powertools]

For each store, in one process, on this machine:

- P1, duplicate detection with a stored result: ``claim()`` of a key already completed
  (the REPLAY answer carries the result) vs one raw dedup write of the same client on a
  key that exists (goal ≤ 1.2×);
- P2, first execution with a stored result: ``claim()`` (acquired) + ``complete()`` of a
  fresh key vs one raw dedup write of a fresh key (goal ≤ 2.2×);
- P3: 100 sequential ``claim()``s vs one ``claim_many()`` of 100 fresh keys (goal ≥ 20×);
- the same P1/P2 workload through AWS Powertools' ``idempotent_function`` on the same
  Redis and on DynamoDB (moto), beside ours through ``Idem.run`` and through the bare
  store (goal: ours faster).

Baseline and subject run in the same process, interleaved in chunks whose order rotates,
so load from other processes falls on both alike. Each figure is the median over
``--runs`` runs (min–max in brackets). Services, by the pytest plugin's variables
(docs/testing.md): ``IDEM_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``), ``IDEM_REDIS_URL`` (default
``redis://127.0.0.1:6379/0``), ``IDEM_REDIS_CLUSTER_URL`` (optional store
``redis-cluster``), ``IDEM_DYNAMODB_URL`` (its ``endpoint_url``; default: a moto server
started on loopback in a child process). Unreachable services are skipped with a note. Everything
created (keys, tables, files, the moto server) is removed at the end. Writes the tables
into docs/performance.md (section "stores") and their chart into docs/img/bench/stores.png.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import inspect
import itertools
import os
import platform
import secrets
import shlex
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import warnings
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from _report import Bar, Chart, Panel, chart_link, write_section

from telegram_idem import Idem
from telegram_idem._records import Claim, Outcome
from telegram_idem.backends._base import Store
from telegram_idem.testing._stores import SERVER_STORES

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

ALL_STORES = ("memory", "sqlite", "postgres", "redis", "redis-cluster", "dynamodb")
LEASE = 60.0
RETENTION = 3600.0
RESULT_OBJ = {"ok": True, "message_id": 4242, "text": "done"}
RESULT = b'{"ok":true,"message_id":4242,"text":"done"}'
BATCH = 100
CHUNKS = 6
P1_GOAL, P2_GOAL, P3_GOAL = 1.2, 2.2, 20.0

POSTGRES_URL = os.environ.get(
    SERVER_STORES["postgres"].env, "postgresql://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get(SERVER_STORES["redis"].env, "redis://127.0.0.1:6379/0")
REDIS_CLUSTER_URL = os.environ.get(SERVER_STORES["redis-cluster"].env, "")
DYNAMODB_ENDPOINT = dict(
    urllib.parse.parse_qsl(
        urllib.parse.urlsplit(os.environ.get(SERVER_STORES["dynamodb"].env, "")).query
    )
).get("endpoint_url", "")

TAG = secrets.token_hex(4)
"""Names everything this run creates (keys, tables), so concurrent runs never collide."""

Call = Callable[[int], Awaitable[object]]
_counter = itertools.count()


def fresh(kind: str, n: int) -> list[str]:
    """``n`` keys never used before in this run."""
    return [f"{kind}:{next(_counter)}" for _ in range(n)]


def on_exit(stack: AsyncExitStack, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Call ``fn(*args, **kwargs)`` (awaiting its result if awaitable) when ``stack``
    closes; a failure is printed, never raised, so the other clean-up steps still run."""

    async def run() -> None:
        try:
            out = fn(*args, **kwargs)
            if inspect.isawaitable(out):
                await out
        except Exception as exc:
            print(f"  clean-up {getattr(fn, '__qualname__', fn)} failed: {exc!r}", flush=True)

    stack.push_async_callback(run)


def with_query(url: str, **options: object) -> str:
    extra = "&".join(f"{k}={v}" for k, v in options.items())
    return f"{url}{'&' if '?' in url else '?'}{extra}"


# ----------------------------------------------------------------------------- targets


@dataclass
class Target:
    """A store under test and its raw baseline (clean-up is on the opener's exit stack)."""

    name: str
    store: Store
    raw: Callable[[str], Awaitable[object]]
    """One raw dedup write of ``key`` by the store's own client: the baseline."""
    baseline: str
    scale: float = 1.0
    """Multiplies ``--n`` (memory calls are µs, moto calls are ms)."""
    powertools: PowertoolsSide | None = None
    info: str = ""
    own_raw: Callable[[str], Awaitable[object]] | None = None
    """The same raw write on the transport the store's calls take, when that is not
    ``raw``'s client (Redis's fast lane): measured beside P1 and P2, reported in ``info``."""


@dataclass
class PowertoolsSide:
    """``idempotent_function`` on the same service as the store."""

    layer: str
    call: Callable[..., Any]


async def open_memory(_: argparse.Namespace, stack: AsyncExitStack) -> Target:
    from telegram_idem.backends.memory import MemoryStore

    store = MemoryStore(max_items=1_000_000)
    seen: dict[str, bytes] = {}

    async def raw(key: str) -> None:
        seen.setdefault(key, RESULT)

    return Target("memory", store, raw, "`dict.setdefault` inside an `async def`", scale=20)


async def open_sqlite(_: argparse.Namespace, stack: AsyncExitStack) -> Target:
    from telegram_idem.backends.sqlite import SQLiteStore

    tmp = tempfile.mkdtemp(prefix="idem-bench-stores-")
    on_exit(stack, shutil.rmtree, tmp, True)
    store = SQLiteStore(Path(tmp) / "bench.db")
    on_exit(stack, store.close)
    sql = "INSERT OR IGNORE INTO bench_raw (k, v) VALUES (?, ?)"

    def insert(conn: sqlite3.Connection, key: str) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(sql, (key, RESULT))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    async def raw(key: str) -> None:
        await store.connection.run(lambda conn: insert(conn, key))

    await store.connection.run(
        lambda conn: conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_raw (k TEXT PRIMARY KEY, v BLOB) WITHOUT ROWID"
        )
    )
    return Target(
        "sqlite",
        store,
        raw,
        "`BEGIN IMMEDIATE; INSERT OR IGNORE …; COMMIT` on the store's own thread and "
        "connection (`store.connection.run`: one executor hop, as the store's calls)",
        info=f"SQLite {sqlite3.sqlite_version} (WAL, synchronous=NORMAL) in {tempfile.gettempdir()}",
    )


async def open_postgres(_: argparse.Namespace, stack: AsyncExitStack) -> Target:
    from telegram_idem.backends.postgres import PostgresStore

    prefix = f"bench_{TAG}"
    store = PostgresStore.from_url(
        with_query(POSTGRES_URL, table_prefix=prefix, auto_create=1, connect_timeout=3)
    )
    on_exit(stack, store.close)
    pool = await store.connection.pool()  # creates the store's table (auto_create)
    raw_table = f"{prefix}_raw"

    async def drop_tables() -> None:  # the records, the scratch table, any other of prefix
        mine = await pool.fetch(
            "SELECT quote_ident(tablename) AS name FROM pg_tables "
            "WHERE schemaname = current_schema() AND tablename LIKE $1",
            f"bench\\_{TAG}\\_%",
        )
        if mine:
            await pool.execute(f"DROP TABLE IF EXISTS {', '.join(r['name'] for r in mine)}")

    on_exit(stack, drop_tables)
    await pool.execute(f"CREATE TABLE {raw_table} (k text PRIMARY KEY, v bytea)")
    sql = f"INSERT INTO {raw_table} (k, v) VALUES ($1, $2) ON CONFLICT DO NOTHING"

    async def raw(key: str) -> None:
        await pool.execute(sql, key, RESULT)  # asyncpg prepares it once per connection

    version = await pool.fetchval("SHOW server_version")
    sync = await pool.fetchval("SHOW synchronous_commit")
    return Target(
        "postgres",
        store,
        raw,
        "prepared `INSERT … ON CONFLICT DO NOTHING` on a scratch table, through the store's "
        "asyncpg pool (`pool.execute`)",
        info=f"PostgreSQL {version.split()[0]} (synchronous_commit={sync})",
    )


async def _open_redis(name: str, url: str, powertools: bool, stack: AsyncExitStack) -> Target:
    from redis.asyncio.cluster import RedisCluster

    from telegram_idem.backends.redis import RedisStore

    prefix = f"bench-{TAG}"
    store = RedisStore.from_url(with_query(url, key_prefix=prefix, socket_connect_timeout=3))
    on_exit(stack, store.close)
    client = store.client
    px = int(RETENTION * 1000)

    async def raw(key: str) -> None:
        await client.set(f"{prefix}:raw:{key}", RESULT, nx=True, px=px)

    async def drop_keys() -> None:  # ours, the raw ones, and Powertools' (bench-<tag>-pt#…)
        keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=1000)]
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            if isinstance(client, RedisCluster):
                await asyncio.gather(*(client.delete(k) for k in chunk))
            else:
                await client.delete(*chunk)

    on_exit(stack, drop_keys)
    await store.get("bench-ping")  # connects (and discovers a cluster)
    info = await client.info("server")
    if isinstance(info, dict) and "redis_version" not in info:  # a cluster: per node
        info = next(iter(info.values()), {})
    target = Target(
        name,
        store,
        raw,
        "`SET key value NX PX` through the store's redis-py client (a single node's "
        "scripts take the store's fast lane instead: see the Redis info line)",
        info=f"Redis {info.get('redis_version', '?')}",
    )
    lane = store.connection.lane
    if lane is not None:

        async def own_raw(key: str) -> None:
            await lane.call("SET", f"{prefix}:raw:{key}", RESULT, "NX", "PX", str(px))

        target.own_raw = own_raw
    if powertools:
        target.powertools = _powertools_redis(url, prefix, stack)
    return target


async def open_redis(args: argparse.Namespace, stack: AsyncExitStack) -> Target:
    return await _open_redis("redis", REDIS_URL, args.powertools, stack)


async def open_redis_cluster(_: argparse.Namespace, stack: AsyncExitStack) -> Target:
    if not REDIS_CLUSTER_URL:
        raise LookupError(f"{SERVER_STORES['redis-cluster'].env} is not set")
    return await _open_redis("redis-cluster", REDIS_CLUSTER_URL, False, stack)


class Moto:
    """A moto server in a child process (see ``_stores_moto.py``)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "_stores_moto.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.isdigit():
            self.stop()
            raise RuntimeError(f"moto server did not start (said {line!r})")
        self.endpoint = f"http://127.0.0.1:{line}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()  # the server stops when its stdin closes
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def open_dynamodb(args: argparse.Namespace, stack: AsyncExitStack) -> Target:
    from botocore.exceptions import ClientError

    from telegram_idem.backends.dynamodb import DynamoDBStore

    endpoint = DYNAMODB_ENDPOINT
    where = endpoint
    if not endpoint:
        moto = await asyncio.to_thread(Moto)
        on_exit(stack, asyncio.to_thread, moto.stop)
        endpoint = moto.endpoint
        where = f"moto {metadata.version('moto')} server in a child process"
    table = f"bench-idem-{TAG}"
    store = DynamoDBStore(table, endpoint_url=endpoint, create_table=True)
    on_exit(stack, store.close)
    client = await store.client()
    await store.get("bench-ping")  # creates the table
    on_exit(stack, client.delete_table, TableName=table)

    async def raw(key: str) -> None:
        try:
            await client.put_item(
                TableName=table,
                Item={"pk": {"S": f"raw:{key}"}, "v": {"B": RESULT}},
                ConditionExpression="attribute_not_exists(pk)",
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise

    target = Target(
        "dynamodb",
        store,
        raw,
        "conditional `PutItem` (`attribute_not_exists`) through the store's aiobotocore client",
        scale=1 / 5,
        info=f"DynamoDB: {where}",
    )
    if args.powertools:
        target.powertools = _powertools_dynamodb(endpoint, stack)
    return target


OPENERS: dict[str, Callable[[argparse.Namespace, AsyncExitStack], Awaitable[Target]]] = {
    "memory": open_memory,
    "sqlite": open_sqlite,
    "postgres": open_postgres,
    "redis": open_redis,
    "redis-cluster": open_redis_cluster,
    "dynamodb": open_dynamodb,
}


# ----------------------------------------------------------------------------- powertools


class _FakeLambdaContext:
    """The one thing Powertools reads from a Lambda context."""

    @staticmethod
    def get_remaining_time_in_millis() -> int:
        return int(LEASE * 1000)


def _powertools_function(layer: Any, prefix: str) -> Callable[..., Any]:
    from aws_lambda_powertools.utilities.idempotency import (
        IdempotencyConfig,
        idempotent_function,
    )

    config = IdempotencyConfig(expires_after_seconds=int(RETENTION))
    # As inside a Lambda invocation: the in-progress expiry (our lease) comes from the
    # remaining time, and Powertools does not warn that it cannot tell it.
    config.register_lambda_context(_FakeLambdaContext())  # type: ignore[arg-type]

    # Powertools types the decorator's result as Any; named here, the decorated function
    # keeps a type.
    guarded: Callable[[Callable[..., Any]], Callable[..., Any]] = idempotent_function(
        data_keyword_argument="payload",
        persistence_store=layer,
        config=config,
        key_prefix=prefix,
    )

    def work(payload: dict[str, Any]) -> dict[str, Any]:
        return dict(RESULT_OBJ)

    return guarded(work)


def _powertools_redis(url: str, prefix: str, stack: AsyncExitStack) -> PowertoolsSide:
    import redis

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # renamed CachePersistenceLayer
        from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
            RedisCachePersistenceLayer,
        )

        client = redis.Redis.from_url(url, decode_responses=True)
        on_exit(stack, client.close)
        # Powertools' RedisClientProtocol types set(ex=) as a float, redis-py as an int:
        # a mismatch between the two libraries' annotations (Powertools passes an int).
        layer = RedisCachePersistenceLayer(client=client)  # type: ignore[arg-type]
    return PowertoolsSide(
        "`RedisCachePersistenceLayer` (sync redis-py client, keys `bench-<tag>-pt#<md5>`)",
        _powertools_function(layer, f"{prefix}-pt"),
    )


def _powertools_dynamodb(endpoint: str, stack: AsyncExitStack) -> PowertoolsSide:
    import boto3
    from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

    client = boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    on_exit(stack, client.close)
    table = f"bench-pt-{TAG}"
    client.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    on_exit(stack, client.delete_table, TableName=table)
    layer = DynamoDBPersistenceLayer(table_name=table, boto3_client=client)
    return PowertoolsSide(
        "`DynamoDBPersistenceLayer` (boto3 client, table with partition key `id`)",
        _powertools_function(layer, f"bench-{TAG}"),
    )


# ----------------------------------------------------------------------------- timing


async def interleave(n: int, sides: Sequence[Call], chunks: int = CHUNKS) -> list[float]:
    """Seconds per call of each side: ``n`` calls each, in ``chunks`` rounds; the order
    of the sides rotates every round."""
    totals = [0.0] * len(sides)
    bounds = [round(n * j / chunks) for j in range(chunks + 1)]
    for j in range(chunks):
        lo, hi = bounds[j], bounds[j + 1]
        for s in [(j + k) % len(sides) for k in range(len(sides))]:
            f = sides[s]
            start = time.perf_counter()
            for i in range(lo, hi):
                await f(i)
            totals[s] += time.perf_counter() - start
    return [t / n for t in totals]


async def measure(
    n: int, runs: int, make_sides: Callable[[int], Sequence[Call]]
) -> list[list[float]]:
    """µs per call of each side, one value per run, after a warm-up.

    ``make_sides(count)`` makes the sides for ``count`` calls (fresh keys each time)."""
    warm = max(20, n // 5)
    await interleave(warm, make_sides(warm), chunks=2)
    out: list[list[float]] = []
    for _ in range(runs):
        sides = make_sides(n)
        gc.collect()
        out.append([v * 1e6 for v in await interleave(n, sides)])
    return [list(side) for side in zip(*out, strict=True)]


@dataclass
class Ratio:
    """Per-run values of a numerator and a denominator, and their per-run ratios."""

    top: list[float]
    bottom: list[float]

    @property
    def ratios(self) -> list[float]:
        return [a / b for a, b in zip(self.top, self.bottom, strict=True)]

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    def cell(self, goal: Callable[[float], bool] | None = None) -> str:
        r = self.ratios
        mark = "" if goal is None else (" ✔" if goal(self.median) else " ✘")
        return f"{self.median:.2f}× ({min(r):.2f}–{max(r):.2f}){mark}"

    def bar(self, label: str, *, judged: bool = True) -> Bar:
        """This ratio as a chart's bar: the median, whiskers at the min and the max."""
        r = self.ratios
        return Bar(label, self.median, min(r), max(r), judged=judged)


def us(values: list[float]) -> str:
    v = statistics.median(values)
    return f"{v:.1f}" if v < 100 else f"{v:.0f}"


def ms(values: list[float]) -> str:
    v = statistics.median(values)
    return f"{v:.2f}" if v < 10 else f"{v:.1f}"


# ----------------------------------------------------------------------------- workloads


def _expect(claim: Claim, outcome: Outcome) -> None:
    if claim.outcome is not outcome:
        raise RuntimeError(f"expected {outcome.value}, got {claim.outcome.value}: {claim}")


async def p1(t: Target, n: int, runs: int) -> Ratio:
    """Replay of a completed key vs a raw dedup write of an existing key."""
    store = t.store
    key, raw_key = f"p1:{TAG}", f"p1raw:{TAG}"
    first = await store.claim(key, lease=LEASE, retention=RETENTION)
    _expect(first, Outcome.ACQUIRED)
    await store.complete(key, first.token, RESULT, retention=RETENTION)
    replay = await store.claim(key, lease=LEASE, retention=RETENTION)
    _expect(replay, Outcome.REPLAY)
    assert replay.record.result == RESULT, replay
    await t.raw(raw_key)

    async def baseline(_: int) -> None:
        await t.raw(raw_key)

    async def subject(_: int) -> None:
        _expect(await store.claim(key, lease=LEASE, retention=RETENTION), Outcome.REPLAY)

    own_raw = t.own_raw
    if own_raw is None:
        base, ours = await measure(n, runs, lambda count: (baseline, subject))
        return Ratio(ours, base)

    async def own(_: int) -> None:
        await own_raw(raw_key)

    base, ours, lane = await measure(n, runs, lambda count: (baseline, subject, own))
    t.info += _own_note("P1", Ratio(ours, lane), lane)
    return Ratio(ours, base)


def _own_note(what: str, ratio: Ratio, raw: list[float]) -> str:
    return f"; {what} against one raw `SET NX PX` on the fast lane ({us(raw)} µs): {ratio.cell()}"


async def p2(t: Target, n: int, runs: int) -> Ratio:
    """claim + complete of a fresh key vs a raw dedup write of a fresh key."""
    store = t.store

    def sides(count: int) -> tuple[Call, ...]:
        raw_keys, keys = fresh("p2raw", count), fresh("p2", count)

        async def baseline(i: int) -> None:
            await t.raw(raw_keys[i])

        async def subject(i: int) -> None:
            k = keys[i]
            claim = await store.claim(k, lease=LEASE, retention=RETENTION)
            _expect(claim, Outcome.ACQUIRED)
            await store.complete(k, claim.token, RESULT, retention=RETENTION)

        if t.own_raw is None:
            return (baseline, subject)
        own_raw, own_keys = t.own_raw, fresh("p2own", count)

        async def own(i: int) -> None:
            await own_raw(own_keys[i])

        return baseline, subject, own

    sides_measured = await measure(n, runs, sides)
    base, ours = sides_measured[:2]
    if len(sides_measured) == 3:
        t.info += _own_note("P2", Ratio(ours, sides_measured[2]), sides_measured[2])
    return Ratio(ours, base)


async def p3(t: Target, runs: int) -> Ratio:
    """100 sequential claims vs one claim_many of 100 (ms each, per run)."""
    store = t.store

    async def singles(keys: list[str]) -> float:
        start = time.perf_counter()
        for k in keys:
            _expect(await store.claim(k, lease=LEASE, retention=RETENTION), Outcome.ACQUIRED)
        return (time.perf_counter() - start) * 1e3

    async def batch(keys: list[str]) -> float:
        start = time.perf_counter()
        claims = await store.claim_many(keys, lease=LEASE, retention=RETENTION)
        elapsed = (time.perf_counter() - start) * 1e3
        for c in claims:
            _expect(c, Outcome.ACQUIRED)
        return elapsed

    await batch(fresh("p3", BATCH))
    await singles(fresh("p3", BATCH // 5))
    one, many = [], []
    for r in range(runs):
        a, b = fresh("p3", BATCH), fresh("p3", BATCH)
        gc.collect()
        if r % 2:
            many.append(await batch(b))
            one.append(await singles(a))
        else:
            one.append(await singles(a))
            many.append(await batch(b))
    return Ratio(one, many)


@dataclass
class VersusPowertools:
    pt_p1: list[float]
    run_p1: list[float]
    store_p1: list[float]
    pt_p2: list[float]
    run_p2: list[float]
    store_p2: list[float]


async def versus_powertools(t: Target, n: int, runs: int) -> VersusPowertools:
    """Powertools ``idempotent_function`` vs ``Idem.run`` vs the bare store, interleaved."""
    assert t.powertools is not None
    pt = t.powertools.call
    store = t.store
    idem = Idem(store)  # shares the store; never closed here (the target closes the store)

    async def work() -> dict[str, Any]:
        return dict(RESULT_OBJ)

    # P1: one payload / key, executed once beforehand, then replayed
    payload = {"update_id": -1, "chat": {"id": 1}, "text": f"hi {TAG}"}
    key = f"pt-p1:{TAG}"
    store_key = f"pt-p1-store:{TAG}"
    assert pt(payload=payload) == RESULT_OBJ
    assert await idem.run(key, work) == RESULT_OBJ
    first = await store.claim(store_key, lease=LEASE, retention=RETENTION)
    await store.complete(store_key, first.token, RESULT, retention=RETENTION)

    async def pt_p1(_: int) -> None:
        pt(payload=payload)

    async def run_p1(_: int) -> None:
        await idem.run(key, work)

    async def store_p1(_: int) -> None:
        _expect(await store.claim(store_key, lease=LEASE, retention=RETENTION), Outcome.REPLAY)

    a1, b1, c1 = await measure(n, runs, lambda count: (pt_p1, run_p1, store_p1))

    def p2_sides(count: int) -> tuple[Call, Call, Call]:
        ids = [next(_counter) for _ in range(count)]
        keys, store_keys = fresh("pt-p2", count), fresh("pt-p2-store", count)

        async def pt_p2(i: int) -> None:
            pt(payload={"update_id": ids[i], "chat": {"id": 1}, "text": f"hi {TAG}"})

        async def run_p2(i: int) -> None:
            await idem.run(keys[i], work)

        async def store_p2(i: int) -> None:
            k = store_keys[i]
            claim = await store.claim(k, lease=LEASE, retention=RETENTION)
            _expect(claim, Outcome.ACQUIRED)
            await store.complete(k, claim.token, RESULT, retention=RETENTION)

        return pt_p2, run_p2, store_p2

    a2, b2, c2 = await measure(n, runs, p2_sides)
    return VersusPowertools(a1, b1, c1, a2, b2, c2)


# ----------------------------------------------------------------------------- report


def command_line() -> str:
    exe = Path(sys.executable)
    with contextlib.suppress(ValueError):
        exe = exe.relative_to(Path.cwd())
    script = Path(sys.argv[0])
    with contextlib.suppress(ValueError):
        script = script.resolve().relative_to(Path.cwd())
    return shlex.join([str(exe), str(script), *sys.argv[1:]])


def legend(n: int, runs: int, targets: list[Target]) -> list[str]:
    scaled = "".join(f"; {t.name} {max(20, round(n * t.scale))}" for t in targets if t.scale != 1)
    lines = [
        f"Each figure: median of {runs} runs (min–max across runs in brackets); each run is "
        f"N calls of the baseline and N of the subject, interleaved in {CHUNKS} chunks "
        f"whose order alternates (N = {n}{scaled}). Ratios are "
        "per run, subject / baseline; ✔ / ✘ judge the median against the goal.",
        "",
        f"- **P1** duplicate detection with stored result: `claim()` of a key already "
        f"completed (REPLAY, the result in the answer) vs one raw dedup write of an "
        f"existing key. Goal ≤ {P1_GOAL}×.",
        f"- **P2** first execution with stored result: `claim()` (acquired) + `complete()` "
        f"of a fresh key vs one raw dedup write of a fresh key. Goal ≤ {P2_GOAL}×.",
        f"- **P3** {BATCH} sequential `claim()`s vs one `claim_many()` of {BATCH} fresh "
        f"keys; speedup = singles / batch. Goal ≥ {P3_GOAL:.0f}× (a one-round-trip batch "
        "on Redis and PostgreSQL; DynamoDB's `claim_many` is one conditional `PutItem` per "
        "key, 16 at a time, and memory/SQLite have no network round trip to save, so "
        "there it is reported, not expected).",
        "- Baselines (one raw round trip of the store's own client):",
    ]
    lines += [f"  - {t.name}: {t.baseline}" for t in targets]
    return lines


def store_table(rows: list[tuple[Target, Ratio, Ratio, Ratio]]) -> list[str]:
    lines = [
        f"| store | P1 raw µs | P1 ours µs | P1 ours / raw (≤ {P1_GOAL}×) | P2 raw µs "
        f"| P2 ours µs | P2 ours / raw (≤ {P2_GOAL}×) | P3 {BATCH} × claim ms "
        f"| P3 claim_many ms | P3 speedup (≥ {P3_GOAL:.0f}×) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t, r1, r2, r3 in rows:
        lines.append(
            f"| {t.name} | {us(r1.bottom)} | {us(r1.top)} | {r1.cell(lambda v: v <= P1_GOAL)} "
            f"| {us(r2.bottom)} | {us(r2.top)} | {r2.cell(lambda v: v <= P2_GOAL)} "
            f"| {ms(r3.top)} | {ms(r3.bottom)} | {r3.cell(lambda v: v >= P3_GOAL)} |"
        )
    return lines


def powertools_table(rows: list[tuple[Target, VersusPowertools]]) -> list[str]:
    lines = [
        "| store | workload | Powertools µs | ours `Idem.run` µs | ours store µs "
        "| Powertools / `Idem.run` (> 1×) | Powertools / store |",
        "|---|---|---|---|---|---|---|",
    ]
    for t, v in rows:
        for name, a, b, c in (
            ("P1 replay", v.pt_p1, v.run_p1, v.store_p1),
            ("P2 first execution", v.pt_p2, v.run_p2, v.store_p2),
        ):
            lines.append(
                f"| {t.name} | {name} | {us(a)} | {us(b)} | {us(c)} "
                f"| {Ratio(a, b).cell(lambda x: x > 1)} | {Ratio(a, c).cell(lambda x: x > 1)} |"
            )
    return lines


def powertools_legend(rows: list[tuple[Target, VersusPowertools]]) -> list[str]:
    version = metadata.version("aws-lambda-powertools")
    lines = [
        f"AWS Lambda Powertools {version} `idempotent_function` (sync, default config, no "
        f"local cache, a Lambda context registered that reports {LEASE:.0f} s left) on the "
        "same service, interleaved with ours in the same process: P1 "
        "calls it again with a payload already executed (replay from the store), P2 with a "
        "fresh payload (first execution, result stored). Ours: `Idem.run(key, fn)` (JSON "
        "codec, the decision log, the heartbeat registration) and the bare store "
        "(`claim` / `claim` + `complete`). Powertools derives its key from an md5 of the "
        "payload; ours is handed the key. A ratio > 1× means ours is faster (goal, judged "
        "on the `Idem.run` column).",
        "",
    ]
    lines += [f"- {t.name}: {t.powertools.layer}" for t, _ in rows if t.powertools]
    return lines


# ----------------------------------------------------------------------------- main


async def bench(args: argparse.Namespace) -> tuple[str, Chart | None]:
    notes: list[str] = []
    store_rows: list[tuple[Target, Ratio, Ratio, Ratio]] = []
    pt_rows: list[tuple[Target, VersusPowertools]] = []
    done: list[Target] = []
    load_before = os.getloadavg()
    started = time.monotonic()
    for name in args.stores:
        async with AsyncExitStack() as stack:
            print(f"{name}: opening …", flush=True)
            try:
                target = await asyncio.wait_for(OPENERS[name](args, stack), timeout=60)
            except Exception as exc:
                note = f"{name}: skipped ({type(exc).__name__}: {exc})"
                print(note, flush=True)
                notes.append(note)
                continue
            n = max(20, round(args.n * target.scale))
            try:
                print(f"{name}: P1 ({args.runs} runs × {n} calls) …", flush=True)
                r1 = await p1(target, n, args.runs)
                print(f"{name}: P2 …", flush=True)
                r2 = await p2(target, n, args.runs)
                print(f"{name}: P3 …", flush=True)
                r3 = await p3(target, args.runs)
                store_rows.append((target, r1, r2, r3))
                print("  " + store_table([(target, r1, r2, r3)])[-1], flush=True)
                if target.powertools is not None:
                    print(f"{name}: vs Powertools …", flush=True)
                    vs = await versus_powertools(target, n, args.runs)
                    pt_rows.append((target, vs))
                    for line in powertools_table([(target, vs)])[2:]:
                        print("  " + line, flush=True)
            except Exception as exc:
                note = f"{name}: failed while measuring ({type(exc).__name__}: {exc})"
                print(note, flush=True)
                notes.append(note)
            done.append(target)
    load_after = os.getloadavg()
    elapsed = time.monotonic() - started

    lines = [
        f"Command: `{command_line()}`",
        "",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, load average "
        f"{load_before[0]:.2f} at the start and {load_after[0]:.2f} at the end; "
        f"{elapsed:.0f} s." + "".join(f" {t.name}: {t.info}." for t in done if t.info),
        "",
    ]
    lines += store_table(store_rows)
    if store_rows:
        lines += ["", chart_link("stores", "The ratios of this section's tables as bars")]
    lines += ["", *legend(args.n, args.runs, done)]
    if pt_rows:
        lines += ["", "### Against AWS Lambda Powertools", "", *powertools_table(pt_rows), ""]
        lines += powertools_legend(pt_rows)
    if notes:
        lines += ["", "Skipped or incomplete:", "", *[f"- {note}" for note in notes]]
    return "\n".join(lines), stores_chart(store_rows, pt_rows)


def stores_chart(
    rows: list[tuple[Target, Ratio, Ratio, Ratio]], pt_rows: list[tuple[Target, VersusPowertools]]
) -> Chart | None:
    """The section's chart: P1, P2, P3 per store, and Powertools / ``Idem.run``."""
    panels = [
        Panel(
            "P1 duplicate detection: claim() of a completed key / one raw dedup write",
            [r1.bar(t.name) for t, r1, _, _ in rows],
            goal=P1_GOAL,
        ),
        Panel(
            "P2 first execution: claim() + complete() / one raw dedup write",
            [r2.bar(t.name) for t, _, r2, _ in rows],
            goal=P2_GOAL,
        ),
        Panel(
            f"P3 speedup: {BATCH} sequential claim()s / one claim_many() of {BATCH}",
            [
                r3.bar(t.name, judged=t.name in ("postgres", "redis", "redis-cluster"))
                for t, _, _, r3 in rows
            ],
            goal=P3_GOAL,
            better="higher",
        ),
    ]
    if pt_rows:
        panels.append(
            Panel(
                "Powertools idempotent_function / ours Idem.run (above 1×: ours is faster)",
                [
                    Ratio(a, b).bar(f"{t.name} {name}")
                    for t, v in pt_rows
                    for name, a, b in (
                        ("P1 replay", v.pt_p1, v.run_p1),
                        ("P2 first execution", v.pt_p2, v.run_p2),
                    )
                ],
                goal=1.0,
                better="higher",
            )
        )
    if not rows:
        return None
    return Chart("Stores: each decision priced against one raw round trip", panels)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5, help="runs per figure (default 5)")
    parser.add_argument("--n", type=int, default=300, help="calls per run (default 300)")
    default = [s for s in ALL_STORES if s != "redis-cluster" or REDIS_CLUSTER_URL]
    parser.add_argument(
        "--stores",
        default=",".join(default),
        help=f"comma-separated, of {','.join(ALL_STORES)} (default {','.join(default)})",
    )
    parser.add_argument(
        "--no-powertools", dest="powertools", action="store_false", help="skip Powertools"
    )
    parser.add_argument(
        "--no-write",
        dest="write",
        action="store_false",
        help="print the tables only (docs/performance.md and the chart stay as they are)",
    )
    parser.add_argument("--quick", action="store_true", help="3 runs of 100 calls")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.n = 3, 100
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    unknown = [s for s in args.stores if s not in OPENERS]
    if unknown or args.runs < 1 or args.n < 1:
        parser.error(f"unknown stores {unknown}" if unknown else "--runs and --n must be ≥ 1")
    report, chart = asyncio.run(bench(args))
    print()
    print(report)
    if args.write:
        write_section("stores", "## Stores\n\n" + report, chart)


if __name__ == "__main__":
    main()
