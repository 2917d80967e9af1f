"""Cluster ingress benchmark: inbox admissions/s on a 3-master vs a 1-master Redis Cluster.

    .venv/bin/python benchmarks/cluster_ingress.py [--runs 5] [--seconds 4] [--quick]

Starts two private Redis Clusters on free ports (``scripts/services.py``
``start_redis_cluster``: 1 master, 3 masters; stopped at the end) and, in interleaved
runs, drives each with the same load: ``--clients`` load processes, each with many
concurrent callers of the inbox admission ``WebhookIngress`` uses
(``RedisInbox.admit``, one update per call, as webhooks deliver them) or of
``admit_many`` (batches of 100, as ``getUpdates`` delivers them), updates spread over
1,000 chats. Each row is admissions per second on 3 masters divided by the same on 1
master in the same run: the median, and the min–max range across runs. The inbox is
sharded (``inbox_shards=16``, recommended on a new cluster); the one-slot layout
(``inbox_shards=1``: the whole inbox and every update guard in one slot) is the
reference row, which adding masters cannot help. Goal: ≥ 1× for the sharded rows (more
masters never cost throughput); on the 2-core test machine the masters and the load
processes share the same two cores, so the ratio says how much Redis-side work the
sharding moves off one node, not what a real multi-host cluster gains. Writes the
``cluster`` section of docs/performance.md and its chart (docs/img/bench/cluster.png).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _report import Bar, Chart, Panel, chart_link, write_section

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GOAL = 1.0
CHATS = 1000
PAYLOAD = "x" * 250
SHAPES = {
    # row: (inbox_shards, batch size, concurrent callers per load process)
    "webhook `admit`, 16 shards": (16, 1, 32),
    "getUpdates `admit_many` (100), 16 shards": (16, 100, 4),
    "webhook `admit`, one slot (`inbox_shards=1`)": (1, 1, 32),
}


def _services() -> Any:
    spec = importlib.util.spec_from_file_location("idem_services", ROOT / "scripts" / "services.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["idem_services"] = module
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------- one load process


async def _load(url: str, batch: int, callers: int, seconds: float, base: int) -> int:
    from telegram_idem.backends.redis import RedisStore
    from telegram_idem.inbox import NewEntry

    store = RedisStore(url)
    inbox = store.inbox()
    rng = random.Random(base)
    counter = base

    def new() -> NewEntry:
        nonlocal counter
        counter += 1
        payload = json.dumps({"update_id": counter, "message": {"text": PAYLOAD}}).encode()
        return NewEntry(f"bench:7:u:{counter}", f"chat:{rng.randrange(CHATS)}", payload)

    await inbox.admit(new(), retention=3600)  # discovery, scripts cached
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # every process starts together
    end = time.time() + seconds
    admitted = 0

    async def caller() -> None:
        nonlocal admitted
        while time.time() < end:
            # read the answer first: `admitted += await …` would read the count before
            # the await and lose the other callers' additions
            if batch == 1:
                got = int(await inbox.admit(new(), retention=3600))
            else:
                got = sum(await inbox.admit_many([new() for _ in range(batch)], retention=3600))
            admitted += got

    await asyncio.gather(*(caller() for _ in range(callers)))
    await store.close()
    return admitted


def _client_main(argv: list[str]) -> None:
    url, batch, callers, seconds, base = argv
    n = asyncio.run(_load(url, int(batch), int(callers), float(seconds), int(base)))
    print(json.dumps({"admitted": n}))


# ----------------------------------------------------------------- the runs


def measure(url: str, shape: str, clients: int, seconds: float, run: int) -> float:
    """Admissions per second of ``clients`` load processes on ``url``."""
    shards, batch, callers = SHAPES[shape]
    sep = "&" if "?" in url else "?"
    target = f"{url}{sep}key_prefix=bench{run}&inbox_shards={shards}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "_client",
                target,
                str(batch),
                str(callers),
                str(seconds),
                str((run * 100 + i) * 10**9),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )
        for i in range(clients)
    ]
    for p in procs:  # each has connected and admitted once
        assert p.stdout is not None
        if p.stdout.readline().strip() != b"ready":
            raise RuntimeError("a load process did not start")
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(b"go\n")
        p.stdin.flush()
    total = 0
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 120)
        if p.returncode != 0:
            raise RuntimeError(f"load process failed ({p.returncode})")
        total += json.loads(out.decode().strip().splitlines()[-1])["admitted"]
    return total / seconds


def flush(module: Any, services: Any) -> None:
    """Empty the benchmark's own private cluster between runs (memory stays flat)."""
    for port in services.redis_ports:
        module._redis_cli(port, "FLUSHALL")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--clients", type=int, default=2, help="load processes")
    parser.add_argument("--quick", action="store_true", help="3 runs of 2 s (a smoke run)")
    parser.add_argument("--no-write", action="store_true", help="print, leave the docs")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.seconds = 3, 2.0
    module = _services()
    clusters: dict[int, Any] = {}
    try:
        for masters in (1, 3):
            services = module.Services(dir=tempfile.mkdtemp(prefix=f"idem-bench-{masters}m-"))
            clusters[masters] = services
            module.start_redis_cluster(services, masters)
        rates: dict[str, dict[int, list[float]]] = {s: {1: [], 3: []} for s in SHAPES}
        for run in range(args.runs):
            for shape in SHAPES:
                order = (1, 3) if run % 2 == 0 else (3, 1)  # interleaved, alternating
                for masters in order:
                    services = clusters[masters]
                    rate = measure(
                        services.redis_cluster_url, shape, args.clients, args.seconds, run
                    )
                    flush(module, services)
                    rates[shape][masters].append(rate)
                    print(f"run {run + 1} {shape} {masters} master(s): {rate:,.0f}/s", flush=True)
    finally:
        for services in clusters.values():
            module.stop_services(services)
    rows, bars = [], []
    for shape, by in rates.items():
        ratios = [three / one for one, three in zip(by[1], by[3], strict=True)]
        ratio = statistics.median(ratios)
        judged = SHAPES[shape][0] > 1
        mark = ("✔" if ratio >= GOAL else "✘") if judged else "—"
        rows.append(
            f"| {shape} | {statistics.median(by[1]):,.0f} | {statistics.median(by[3]):,.0f} | "
            f"{ratio:.2f}× ({min(ratios):.2f}–{max(ratios):.2f}) | {mark} |"
        )
        bars.append(Bar(shape, ratio, min(ratios), max(ratios), judged=judged))
    cost_rows, cost_bars = [], []
    sharded_shape, one_slot = next(iter(SHAPES)), list(SHAPES)[-1]
    for masters in (1, 3):
        shares = [
            a / b
            for a, b in zip(rates[sharded_shape][masters], rates[one_slot][masters], strict=True)
        ]
        share = statistics.median(shares)
        label = f"{masters} master{'s' if masters > 1 else ''}"
        cost_rows.append(f"| {label} | {share:.2f}× ({min(shares):.2f}–{max(shares):.2f}) |")
        cost_bars.append(
            Bar(f"16 shards / one slot, {label}", share, min(shares), max(shares), judged=False)
        )
    command = "python benchmarks/cluster_ingress.py" + (" --quick" if args.quick else "")
    markdown = "\n".join(
        [
            "## Redis Cluster ingress: 3 masters vs 1",
            "",
            f"`{command}` — {args.runs} interleaved runs of {args.seconds:g} s, "
            f"{args.clients} load processes, updates over {CHATS:,} chats; admissions/s "
            "are medians, the ratio is 3 masters / 1 master per run (median, min–max). "
            f"Goal for the sharded rows: ≥ {GOAL:g}× (more masters never cost throughput).",
            "",
            "| admission | 1 master /s | 3 masters /s | 3 / 1 | goal |",
            "|---|---:|---:|---:|:---:|",
            *rows,
            "",
            "What the sharded admission costs, webhook `admit`, on the same cluster "
            "(16 shards / one slot, per run):",
            "",
            "| cluster | 16 shards / one slot |",
            "|---|---:|",
            *cost_rows,
            "",
            chart_link("cluster", "3-master / 1-master admissions per second"),
            "",
            "On this 2-core machine the masters and the load processes share the same two "
            "cores: a third master brings no CPU, and the Python load processes, not Redis, "
            "are the limit, so these ratios cannot show what a cluster on separate hosts "
            "gains. What they do show: a sharded admission is three steps (claim ∥ seq, "
            "write, complete) instead of one script, so each costs the client several "
            "times the CPU of a one-slot admission (second table); the sharded layout pays "
            "off only where one master's CPU is the limit, which a one-slot inbox hits "
            "first since all of a store's ingress runs on the master owning its slot.",
        ]
    )
    print(markdown)
    if not args.no_write:
        chart = Chart(
            "Redis Cluster ingress: 3 masters vs 1",
            [
                Panel("admissions/s, 3 masters / 1 master", bars, goal=GOAL, better="higher"),
                Panel("webhook admissions/s, 16 shards / one slot", cost_bars),
            ],
        )
        write_section("cluster", markdown, chart)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_client":
        _client_main(sys.argv[2:])
    else:
        main()
