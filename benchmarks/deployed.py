"""Deployed-shape benchmark: the blog bot's ``serve`` answering webhooks while its inbox
workers process them, vs a bare aiohttp server, in the same run.

    .venv/bin/python benchmarks/deployed.py [--rate 500] [--seconds 10] [--rounds 3] [--quick]

Each round starts, in an order that alternates from round to round: a bare aiohttp server
(200 without work), and ``python -m examples.blog_bot serve`` in each shape measured —
the default (the ingress and the inbox workers in one process, one event loop) and
``--workers process`` (the workers in a child process ``serve`` starts, at a lower CPU
priority). The bot runs on a fresh
SQLite file and git repository, its Bot API calls go to a fake Bot API (its own process,
no limits), and its handlers do the bot's work (``/techpost``: the posting pipeline with
the offline writer at ``WRITER_DELAY_SCALE=0``, a local git commit, the outbox), on a
fresh SQLite file (or, with ``--store redis://…``, a fresh Redis key prefix). A
separate load process POSTs updates open loop at ``--rate`` per second for ``--seconds``;
latency counts from each request's scheduled send time. After the load the benchmark
waits (up to ``--settle`` s) for the inbox to empty, so a backlog is reported, not hidden.

Reports per shape the median p50 / p99 over the rounds (min–max in brackets), their
ratios to the bare server of the same round, ✔ / ✘ against p50 ≤ 2× and p99 ≤ 3×, the
errors, and how long the inbox took to empty. Writes the ``deployed`` section of
docs/performance.md and its chart docs/img/bench/deployed.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _report import Bar, Chart, Panel, chart_link, percentile, write_section
from ingress import _free_port, _wait_up

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
P50_GOAL, P99_GOAL = 2.0, 3.0
TOKEN = "7000000001:AAdeployedbench"
SECRET = "bench-secret"

SHAPES: dict[str, list[str]] = {
    "`serve` (default: ingress + workers in one process)": [],
    "`serve --workers process` (workers in a child process)": ["--workers", "process"],
}
BARE = "bare aiohttp (200, no work)"


def _pending(store_url: str) -> int:
    """Inbox entries not finished yet (``Inbox.depth()``) in the bot's store."""
    from telegram_idem.backends import store_from_url

    async def depth() -> int:
        store = store_from_url(store_url)
        try:
            return await store.inbox().depth()
        finally:
            await store.close()

    return asyncio.run(depth())


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) the process ``pid`` has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (the worker process ``serve`` starts)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(t) for t in text)
    return found


def _load(port: int, rate: float, seconds: float, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run(
        [
            sys.executable,
            str(HERE / "_load.py"),
            f"http://127.0.0.1:{port}/webhook",
            str(rate),
            str(seconds),
            SECRET,
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    lat = data["latencies_ms"]
    return {
        "p50": percentile(lat, 50),
        "p99": percentile(lat, 99),
        "errors": data["errors"],
        "sent": data["sent"],
    }


def run_bare(rate: float, seconds: float) -> dict[str, float]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(
        [sys.executable, str(HERE / "_server.py"), "bare", str(port), SECRET], env=env, cwd=ROOT
    )
    try:
        _wait_up(port)
        before = _cpu(server.pid)
        result = _load(port, rate, seconds, env)
        result["cpu_ms"] = (_cpu(server.pid) - before) / result["sent"] * 1000
        return result
    finally:
        server.terminate()
        server.wait(timeout=30)


def run_serve(
    args: list[str], api_url: str, rate: float, seconds: float, settle: float, store: str
) -> dict[str, float]:
    port = _free_port()
    work = Path(tempfile.mkdtemp(prefix="idem-deployed-"))
    log = work / "serve.log"
    if store == "sqlite":
        store_url = f"sqlite:///{work / 'bot.db'}"
    else:  # a Redis server: keys of this run only
        sep = "&" if "?" in store else "?"
        store_url = f"{store}{sep}key_prefix=deployed{os.getpid()}{port}"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "BOT_TOKEN": TOKEN,
        "TELEGRAM_API_URL": api_url,
        "WEBHOOK_SECRET": SECRET,
        "IDEM_STORE_URL": store_url,
        "BLOG_REPO_PATH": str(work / "repo"),
        "WRITER_DELAY_SCALE": "0",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "examples.blog_bot", "serve", "--port", str(port), *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    try:
        _wait_up(port)
        if "process" in args:  # the worker process is up once it says so
            deadline = time.monotonic() + 120
            while "worker processing the inbox" not in log.read_text():
                if time.monotonic() > deadline:
                    raise RuntimeError("the worker process did not start")
                time.sleep(0.2)
        workers = _children(server.pid)
        before = _cpu(server.pid), sum(_cpu(w) for w in workers)
        result = _load(port, rate, seconds, env)
        # CPU per update, a figure the machine's other load does not inflate much: the
        # server's process, and the worker process when the shape has one.
        result["cpu_ms"] = (_cpu(server.pid) - before[0]) / result["sent"] * 1000
        result["worker_cpu_ms"] = (
            (sum(_cpu(w) for w in workers) - before[1]) / result["sent"] * 1000
        )
        started = time.monotonic()
        left = _pending(store_url)
        while left and time.monotonic() - started < settle:
            time.sleep(0.5)
            left = _pending(store_url)
        result["drain_s"] = time.monotonic() - started
        result["left"] = left
        return result
    finally:
        server.terminate()
        server.wait(timeout=60)


def _fmt(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def _mark(value: float, goal: float) -> str:
    return "✔" if value <= goal else "✘"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=120.0, help="seconds to wait for the inbox")
    parser.add_argument("--quick", action="store_true", help="one round of 4 s (a smoke run)")
    parser.add_argument("--only", choices=["inline", "process"], help="measure one shape")
    parser.add_argument(
        "--store",
        default="sqlite",
        help="sqlite (a fresh file per run, default) or a redis:// URL (a fresh key prefix)",
    )
    parser.add_argument("--no-write", action="store_true", help="print, do not rewrite the docs")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 4.0
    shapes = {
        label: shape_args
        for label, shape_args in SHAPES.items()
        if args.only is None or ("process" in shape_args) == (args.only == "process")
    }
    fake = subprocess.Popen(
        [sys.executable, str(HERE / "_outbound_fake.py"), "--no-limits"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert fake.stdout is not None and fake.stdin is not None
    api_url = fake.stdout.readline().strip()
    load_start = os.getloadavg()[0]
    began = time.monotonic()
    runs: dict[str, list[dict[str, float]]] = {BARE: [], **{label: [] for label in shapes}}
    ratios: dict[str, dict[str, list[float]]] = {label: {"p50": [], "p99": []} for label in shapes}
    try:
        for r in range(args.rounds):
            order = [BARE, *shapes]
            if r % 2:
                order.reverse()
            got: dict[str, dict[str, float]] = {}
            for label in order:
                print(
                    f"round {r + 1}: {label} at {args.rate:.0f}/s for {args.seconds:.0f} s …",
                    flush=True,
                )
                if label == BARE:
                    got[label] = run_bare(args.rate, args.seconds)
                else:
                    got[label] = run_serve(
                        shapes[label], api_url, args.rate, args.seconds, args.settle, args.store
                    )
                print(f"  {got[label]}", flush=True)
                runs[label].append(got[label])
            for label in shapes:
                ratios[label]["p50"].append(got[label]["p50"] / got[BARE]["p50"])
                ratios[label]["p99"].append(got[label]["p99"] / got[BARE]["p99"])
    finally:
        fake.stdin.close()
        fake.wait(timeout=30)
    cmd = (
        f"`.venv/bin/python benchmarks/deployed.py --rate {args.rate:.0f} --seconds {args.seconds:.0f} "
        f"--rounds {args.rounds}`"
    )
    lines = [
        f"Command: {cmd}",
        "",
        f"Machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}, load average "
        f"{load_start:.2f} at the start and {os.getloadavg()[0]:.2f} at the end; "
        f"{time.monotonic() - began:.0f} s.",
        "",
        "| server | p50 ms | p99 ms | p50 / bare (≤ 2×) | p99 / bare (≤ 3×) | errors | "
        "webhook process CPU ms / update | worker process CPU ms / update | "
        "inbox emptied after the load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, results in runs.items():
        p50s = [x["p50"] for x in results]
        p99s = [x["p99"] for x in results]
        errors = (
            f"{int(sum(x['errors'] for x in results))} of {int(sum(x['sent'] for x in results))}"
        )
        if label == BARE:
            cpu = _fmt([x["cpu_ms"] for x in results], 3)
            lines.append(
                f"| {label} | {_fmt(p50s)} | {_fmt(p99s)} | 1.00× | 1.00× | {errors} | {cpu} "
                "| — | — |"
            )
            continue
        r50, r99 = ratios[label]["p50"], ratios[label]["p99"]
        left = max(int(x["left"]) for x in results)
        worker_cpu = (
            _fmt([x["worker_cpu_ms"] for x in results], 3)
            if any(x["worker_cpu_ms"] for x in results)
            else "— (in the webhook process)"
        )
        drained = (
            f"in {_fmt([x['drain_s'] for x in results], 1)} s"
            if left == 0
            else f"✘ {left} entries still queued after {args.settle:.0f} s"
        )
        lines.append(
            f"| {label} | {_fmt(p50s)} | {_fmt(p99s)} | "
            f"{_fmt(r50)}× {_mark(statistics.median(r50), P50_GOAL)} | "
            f"{_fmt(r99)}× {_mark(statistics.median(r99), P99_GOAL)} | {errors} | "
            f"{_fmt([x['cpu_ms'] for x in results], 3)} | {worker_cpu} | {drained} |"
        )
    lines += [
        "",
        f"Median of {args.rounds} rounds (min–max in brackets); each round runs the bare "
        "server and every shape once, in an order that alternates, and its ratios are "
        "against the bare server of the same round. The bot: SQLite (WAL) in /tmp, "
        "`WRITER_DELAY_SCALE=0`, `/techpost` updates from 200 chats, the fake Bot API "
        "without limits in its own process.",
        "",
        chart_link("deployed", "The deployed shape against a bare aiohttp server"),
    ]
    table = "\n".join(lines)
    print(table)
    if args.no_write:
        return
    chart = Chart(
        "The blog bot's serve vs a bare aiohttp server, 500 updates/s",
        [
            Panel(
                "p50 POST → 200 latency / bare aiohttp",
                [
                    Bar(label, statistics.median(v["p50"]), min(v["p50"]), max(v["p50"]))
                    for label, v in ratios.items()
                ],
                goal=P50_GOAL,
            ),
            Panel(
                "p99 POST → 200 latency / bare aiohttp",
                [
                    Bar(label, statistics.median(v["p99"]), min(v["p99"]), max(v["p99"]))
                    for label, v in ratios.items()
                ],
                goal=P99_GOAL,
            ),
        ],
    )
    write_section("deployed", "## Deployed shape\n\n" + table, chart)


if __name__ == "__main__":
    main()
