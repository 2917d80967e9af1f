"""Where the time of a Redis store call goes: clients compared, commands, bytes, CPU.

    .venv/bin/python benchmarks/redis_profile.py [--runs 7] [--n 300] [--quick]

Starts a redis-server of its own on a free loopback port (so its ``INFO commandstats``
count this run's commands only) and, in one process, interleaved in rounds whose order
rotates:

- one raw ``SET key value NX PX`` of an existing key through each client: the store's
  fast lane (``telegram_idem/backends/redis/_lane.py``), redis-py asyncio with hiredis
  (the store's redis-py client) and with redis-py's own Python parser, redis-py sync (what
  AWS Powertools uses), coredis and valkey-glide when installed: wall µs and CPU µs per
  round trip (CPU = ``time.process_time``, this process's threads: glide's Rust thread
  included);
- each store call on the fast lane and on redis-py's path (the same store over a
  client passed in): wall and CPU µs per call, Redis commands per call and the server's
  µs per call (``INFO commandstats`` deltas), reply bytes per call (the lane counts them);
- a cProfile of the fast lane's ``Idem.run`` first executions: the functions that take
  the most time of their own.

Each figure is the median over ``--runs`` runs (min–max in brackets). Writes the section
"redis-profile" of docs/performance.md and its chart (docs/img/bench/redis-profile.png).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import importlib.util
import inspect
import os
import platform
import pstats
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import redis
import redis.asyncio as aredis
from _report import Bar, Chart, Panel, chart_link, write_section
from redis._parsers import _AsyncRESP2Parser
from redis.asyncio.connection import DefaultParser

from telegram_idem import Idem
from telegram_idem.backends.redis import RedisStore
from telegram_idem.backends.redis._lane import _Protocol

ROOT = Path(__file__).resolve().parents[1]
RESULT = b'{"ok":true,"message_id":4242,"text":"done"}'
RESULT_OBJ = {"ok": True, "message_id": 4242, "text": "done"}
LEASE, RETENTION = 60.0, 3600.0
PX = str(int(RETENTION * 1000))
BATCH = 100

Step = Callable[[int], Awaitable[object] | object]


def services() -> ModuleType:
    spec = importlib.util.spec_from_file_location("idem_services", ROOT / "scripts/services.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["idem_services"] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class Side:
    """One thing timed: ``step(i)`` is its i-th call of a run (sync or async)."""

    name: str
    step: Step
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    scripts: list[float] = field(default_factory=list)
    commands: list[float] = field(default_factory=list)
    server_us: list[float] = field(default_factory=list)
    reply_bytes: list[float] = field(default_factory=list)


async def commandstats(client: aredis.Redis) -> tuple[int, int, float, float]:
    """(scripts run, other commands, the scripts' server µs, the others' server µs) so
    far, the INFO calls left out. A script's own calls (``HMGET``, ``HSET``…) count as
    other commands, and the script's time includes theirs."""
    info = await client.info("commandstats")
    scripted = {"cmdstat_evalsha", "cmdstat_eval"}
    scripts = sum(int(v["calls"]) for k, v in info.items() if k in scripted)
    script_us = sum(float(v["usec"]) for k, v in info.items() if k in scripted)
    others = [v for k, v in info.items() if k not in scripted and k != "cmdstat_info"]
    calls = sum(int(v["calls"]) for v in others)
    return scripts, calls, script_us, sum(float(v["usec"]) for v in others)


class ByteCount:
    """Counts the bytes the lane's connections receive (wraps ``data_received``)."""

    def __init__(self) -> None:
        self.total = 0
        original = _Protocol.data_received

        def counting(protocol: _Protocol, data: bytes) -> None:
            self.total += len(data)
            original(protocol, data)

        _Protocol.data_received = counting  # type: ignore[method-assign,assignment]


async def timed(
    sides: list[Side], n: int, runs: int, stats: aredis.Redis, bytes_: ByteCount
) -> None:
    """``n`` calls of each side per run, in 4 chunks whose side order rotates."""
    warm = max(20, n // 10)
    for side in sides:
        for i in range(warm):
            out = side.step(-1 - i)
            if inspect.isawaitable(out):
                await out
    chunks = 4
    bounds = [round(n * j / chunks) for j in range(chunks + 1)]
    for _ in range(runs):
        gc.collect()
        totals = {s.name: [0.0, 0.0, 0, 0, 0.0, 0] for s in sides}
        for j in range(chunks):
            for k in range(len(sides)):
                side = sides[(j + k) % len(sides)]
                scripts0, calls0, script_us0, other_us0 = await commandstats(stats)
                bytes0 = bytes_.total
                start, cpu0 = time.perf_counter(), time.process_time()
                for i in range(bounds[j], bounds[j + 1]):
                    out = side.step(i + _ * n)
                    if inspect.isawaitable(out):
                        await out
                wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
                scripts1, calls1, script_us1, other_us1 = await commandstats(stats)
                t = totals[side.name]
                t[0] += wall
                t[1] += cpu
                t[2] += scripts1 - scripts0
                t[3] += calls1 - calls0
                # the server's time: the scripts' when any ran (it includes their calls')
                t[4] += script_us1 - script_us0 if scripts1 > scripts0 else other_us1 - other_us0
                t[5] += bytes_.total - bytes0
        for side in sides:
            wall, cpu, scripts, calls, usec, nbytes = totals[side.name]
            side.wall.append(wall / n * 1e6)
            side.cpu.append(cpu / n * 1e6)
            side.scripts.append(scripts / n)
            side.commands.append(calls / n)
            side.server_us.append(usec / n)
            side.reply_bytes.append(nbytes / n)


def cell(values: list[float], digits: int = 1) -> str:
    med = statistics.median(values)
    return f"{med:.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def ratio(top: list[float], bottom: list[float]) -> list[float]:
    return [a / b for a, b in zip(top, bottom, strict=True)]


async def client_sides(
    url: str, store: RedisStore, stack: list[Callable[[], Awaitable[None]]]
) -> list[Side]:
    lane = store.connection.lane
    assert lane is not None, "a redis:// store without the lane"
    key = f"{store.key_prefix}:raw"
    hiredis_client = aredis.Redis.from_url(url)
    python_parser = aredis.Redis(
        connection_pool=aredis.ConnectionPool.from_url(url, parser_class=_AsyncRESP2Parser)
    )
    sync_client = redis.Redis.from_url(url)
    stack += [hiredis_client.aclose, python_parser.aclose]
    stack.append(lambda: asyncio.to_thread(sync_client.close))
    await hiredis_client.set(key, RESULT)

    sides = [
        Side("store's fast lane", lambda i: lane.call("SET", key, RESULT, "NX", "PX", PX)),
        Side(
            f"redis-py {redis.__version__} asyncio, hiredis ({DefaultParser.__name__})",
            lambda i: hiredis_client.set(key, RESULT, nx=True, px=int(PX)),
        ),
        Side(
            "redis-py asyncio, Python parser",
            lambda i: python_parser.set(key, RESULT, nx=True, px=int(PX)),
        ),
        Side(
            "redis-py sync (Powertools' client)",
            lambda i: sync_client.set(key, RESULT, nx=True, px=int(PX)),
        ),
    ]
    try:
        import coredis

        co = coredis.Redis.from_url(url)
        await co.__aenter__()

        async def close_coredis() -> None:
            await co.__aexit__(None, None, None)

        stack.append(close_coredis)
        sides.append(
            Side(
                f"coredis {coredis.__version__}",
                lambda i: co.set(key, RESULT, condition=coredis.PureToken.NX, px=int(PX)),
            )
        )
    except ImportError:
        pass
    try:
        from glide import GlideClient, GlideClientConfiguration, NodeAddress

        host, port = url.split("//")[1].split("/")[0].split(":")
        glide = await GlideClient.create(GlideClientConfiguration([NodeAddress(host, int(port))]))
        stack.append(glide.close)
        sides.append(
            Side(
                "valkey-glide", lambda i: glide.custom_command(["SET", key, RESULT, "NX", "PX", PX])
            )
        )
    except ImportError:
        pass
    return sides


def call_sides(store: RedisStore, label: str) -> list[Side]:
    idem = Idem(store)

    async def work() -> dict[str, Any]:
        return dict(RESULT_OBJ)

    async def p2(i: int) -> None:
        key = f"p2:{label}:{i}"
        claim = await store.claim(key, lease=LEASE, retention=RETENTION)
        await store.complete(key, claim.token, RESULT, retention=RETENTION)

    async def many(i: int) -> None:
        if i % BATCH == 0:
            keys = [f"many:{label}:{i}:{j}" for j in range(BATCH)]
            await store.claim_many(keys, lease=LEASE, retention=RETENTION)

    return [
        Side(
            f"{label}: claim (REPLAY)",
            lambda i: store.claim("done", lease=LEASE, retention=RETENTION),
        ),
        Side(f"{label}: claim + complete", p2),
        Side(f"{label}: Idem.run, first execution", lambda i: idem.run(f"run:{label}:{i}", work)),
        Side(f"{label}: Idem.run, replay", lambda i: idem.run("run-done", work)),
        Side(f"{label}: claim_many of {BATCH}, per key", many),
    ]


async def prepare(store: RedisStore) -> None:
    claim = await store.claim("done", lease=LEASE, retention=RETENTION)
    await store.complete("done", claim.token, RESULT, retention=RETENTION)
    await Idem(store).run("run-done", lambda: asyncio.sleep(0, dict(RESULT_OBJ)))


async def profile_run(store: RedisStore, n: int) -> list[str]:
    idem = Idem(store)

    async def work() -> dict[str, Any]:
        return dict(RESULT_OBJ)

    for i in range(100):
        await idem.run(f"prof-warm:{i}", work)
    profiler = cProfile.Profile(time.process_time)  # CPU: waiting in epoll is not time
    profiler.enable()
    for i in range(n):
        await idem.run(f"prof:{i}", work)
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
    total = sum(v[2] for _, v in rows)
    lines = ["| function (file:line) | calls per `Idem.run` | own CPU share |", "|---|---|---|"]
    for (file, line, name), (_cc, calls, own, _cum, _callers) in rows[:12]:
        where = file.replace(str(ROOT) + "/", "").split("site-packages/")[-1]
        if "lib/python3" in where:
            where = "stdlib " + where.split("lib/python3")[1].split("/", 1)[-1]
        lines.append(f"| `{name}` ({where}:{line}) | {calls / n:.1f} | {own / total:.0%} |")
    return lines


async def bench(args: argparse.Namespace) -> tuple[str, Chart]:
    module = services()
    directory = Path(tempfile.mkdtemp(prefix="idem-redis-profile-"))
    port = module.free_port()
    pid = module.start_redis_server(directory, port)
    url = f"redis://127.0.0.1:{port}/0"
    closers: list[Callable[[], Awaitable[None]]] = []
    load_before = os.getloadavg()
    started = time.monotonic()
    try:
        stats = aredis.Redis.from_url(url)
        closers.append(stats.aclose)
        byte_count = ByteCount()
        lane_store = RedisStore(url, key_prefix="lane")
        passed = aredis.Redis.from_url(url)
        redis_py_store = RedisStore(passed, key_prefix="redispy")
        closers += [lane_store.close, redis_py_store.close, passed.aclose]
        await prepare(lane_store)
        await prepare(redis_py_store)
        print("clients …", flush=True)
        clients = await client_sides(url, lane_store, closers)
        await timed(clients, args.n, args.runs, stats, byte_count)
        print("store calls …", flush=True)
        baseline = Side("(baseline) raw SET NX PX on the fast lane", clients[0].step)
        calls = [baseline, *call_sides(lane_store, "lane"), *call_sides(redis_py_store, "redis-py")]
        await timed(calls, args.n, args.runs, stats, byte_count)
        print("profile …", flush=True)
        profile = await profile_run(lane_store, args.n * 4)
    finally:
        for close in reversed(closers):
            try:
                await close()
            except Exception as exc:
                print(f"  clean-up failed: {exc!r}", flush=True)
        os.kill(pid, signal.SIGKILL)
        shutil.rmtree(directory, ignore_errors=True)
    elapsed = time.monotonic() - started
    load_after = os.getloadavg()

    lane_raw = clients[0]
    lines = [
        f"Command: `.venv/bin/python benchmarks/redis_profile.py{' ' + ' '.join(sys.argv[1:]) if sys.argv[1:] else ''}`",
        "",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, load average "
        f"{load_before[0]:.2f} at the start and {load_after[0]:.2f} at the end; {elapsed:.0f} s; "
        f"a redis-server of the run's own. Median of {args.runs} runs of {args.n} calls "
        "(min–max in brackets).",
        "",
        "**One raw round trip** (`SET key value NX PX` of an existing key):",
        "",
        "| client | wall µs | CPU µs | wall / fast lane |",
        "|---|---|---|---|",
    ]
    for side in clients:
        lines.append(
            f"| {side.name} | {cell(side.wall)} | {cell(side.cpu)} "
            f"| {cell(ratio(side.wall, lane_raw.wall), 2)} |"
        )
    lines += [
        "",
        "**Each store call** (the same store code; `lane` = a store made from its URL, "
        "`redis-py` = the same store over a `redis.asyncio.Redis` passed in):",
        "",
        "| call | wall µs | CPU µs | wall / raw SET on the lane | scripts (round trips) "
        "| commands inside | Redis server µs | reply bytes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for side in calls:
        on_lane = side.name.startswith(("lane", "(baseline)"))
        nbytes = cell(side.reply_bytes, 0) if on_lane else "–"
        lines.append(
            f"| {side.name} | {cell(side.wall)} | {cell(side.cpu)} "
            f"| {cell(ratio(side.wall, baseline.wall), 2)} "
            f"| {statistics.median(side.scripts):.2f} | {statistics.median(side.commands):.2f} "
            f"| {cell(side.server_us)} | {nbytes} |"
        )
    lines += [
        "",
        f"**Own CPU time of the fast lane's `Idem.run` first executions** (cProfile on "
        f"`time.process_time`, {args.n * 4} calls; system calls count as their caller's):",
        "",
        *profile,
        "",
        chart_link(
            "redis-profile",
            "Wall time of a raw round trip per client and of each store call, "
            "against the fast lane's raw round trip",
        ),
    ]
    chart = Chart(
        "Redis: where the time goes (wall time / the fast lane's raw SET NX)",
        [
            Panel(
                "One raw SET NX PX, per client / the fast lane's",
                [
                    Bar(
                        s.name,
                        statistics.median(r := ratio(s.wall, lane_raw.wall)),
                        min(r),
                        max(r),
                        judged=False,
                    )
                    for s in clients
                ],
            ),
            Panel(
                "Each store call / the fast lane's raw SET NX",
                [
                    Bar(
                        s.name,
                        statistics.median(r := ratio(s.wall, baseline.wall)),
                        min(r),
                        max(r),
                        judged=False,
                    )
                    for s in calls[1:]
                ],
            ),
        ],
    )
    return "\n".join(lines), chart


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=7, help="runs per figure (default 7)")
    parser.add_argument("--n", type=int, default=300, help="calls per run (default 300)")
    parser.add_argument("--quick", action="store_true", help="3 runs of 100 calls")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.n = 3, 100
    args.n = max(BATCH, args.n // BATCH * BATCH)  # claim_many runs once per BATCH calls
    report, chart = asyncio.run(bench(args))
    print()
    print(report)
    write_section("redis-profile", "## Redis: where the time goes\n\n" + report, chart)


if __name__ == "__main__":
    main()
