"""Ingress benchmark: POST → 200 latency of the durable fast-ack webhook vs a bare server.

    .venv/bin/python benchmarks/ingress.py [--rate 500] [--seconds 20]

For each server (bare aiohttp answering 200 without work; WebhookIngress with the update
guard claim + inbox entry on SQLite, and on Redis when its store has an inbox), a separate
load process sends updates open-loop at a fixed rate on loopback; latency counts from each
request's scheduled send time. Reports p50 / p99 and their ratios to the bare server
(goals: p50 ≤ 2×, p99 ≤ 3×, zero errors). Then the aiogram middleware with the memory
store vs aiogram's own ``feed_update`` alone (goal ≤ 1.2×). Writes the tables into
docs/performance.md and their chart into docs/img/bench/ingress.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _report import Bar, Chart, Panel, chart_link, percentile, write_section

from telegram_idem.testing._stores import SERVER_STORES

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SECRET = "bench-secret"
P50_GOAL, P99_GOAL, MIDDLEWARE_GOAL = 2.0, 3.0, 1.2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_up(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"server on {port} did not start")


def run_target(kind: str, store_url: str | None, rate: float, seconds: float) -> dict[str, float]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, str(HERE / "_server.py"), kind, str(port), SECRET]
    if store_url:
        args.append(store_url)
    server = subprocess.Popen(args, env=env, cwd=ROOT)
    try:
        _wait_up(port)
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
    finally:
        server.terminate()
        server.wait(timeout=30)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    lat = data["latencies_ms"]
    return {
        "p50": percentile(lat, 50),
        "p99": percentile(lat, 99),
        "errors": data["errors"],
        "sent": data["sent"],
    }


async def middleware_ratio(n: int = 3000, rounds: int = 5) -> tuple[float, float, float]:
    """(µs per update without, with the middleware, ratio) — medians over ``rounds``."""
    from aiogram import Bot, Dispatcher
    from aiogram.types import Message, Update

    from telegram_idem import Idem
    from telegram_idem.adapters.aiogram import IdempotencyMiddleware

    bot = Bot("7000000001:AAbench")
    plain, guarded = Dispatcher(), Dispatcher()
    guarded.update.outer_middleware(IdempotencyMiddleware(Idem("memory://?max_items=1000000")))

    async def handler(message: Message) -> None:
        return None

    plain.message.register(handler)
    guarded.message.register(handler)
    ids = iter(range(1, 10**9))

    def updates() -> list[Update]:
        return [
            Update.model_validate(
                {
                    "update_id": next(ids),
                    "message": {
                        "message_id": 1,
                        "date": 1761025920,
                        "chat": {"id": 1, "type": "private"},
                        "text": "hi",
                    },
                },
                context={"bot": bot},
            )
            for _ in range(n)
        ]

    async def timed(dp: Dispatcher) -> float:
        batch = updates()
        start = time.perf_counter()
        for u in batch:
            await dp.feed_update(bot, u)
        return (time.perf_counter() - start) / n * 1e6

    base, ours = [], []
    await timed(plain)
    await timed(guarded)
    for _ in range(rounds):
        base.append(await timed(plain))
        ours.append(await timed(guarded))
    await bot.session.close()
    b, o = statistics.median(base), statistics.median(ours)
    return b, o, o / b


def redis_has_inbox(url: str) -> bool:
    try:
        from telegram_idem.backends import store_from_url

        store_from_url(url).inbox()
        return True
    except Exception:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--redis-url",
        default=os.environ.get(SERVER_STORES["redis"].env, "redis://127.0.0.1:6379/0"),
        help="the Redis server (default: IDEM_REDIS_URL, the pytest plugin's variable)",
    )
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="idem-bench-")
    targets: list[tuple[str, str, str | None]] = [
        ("bare aiohttp (200, no work)", "bare", None),
        ("WebhookIngress + SQLite", "ingress", f"sqlite:///{tmp}/bench.db"),
    ]
    redis_url = (
        f"{args.redis_url}{'&' if '?' in args.redis_url else '?'}key_prefix=bench{os.getpid()}"
    )
    if redis_has_inbox(redis_url):
        targets.append(("WebhookIngress + Redis", "ingress", redis_url))
    results = {}
    for label, kind, url in targets:
        print(f"{label}: {args.rate:.0f} updates/s for {args.seconds:.0f} s …", flush=True)
        results[label] = run_target(kind, url, args.rate, args.seconds)
    bare = results[targets[0][0]]
    lines = [
        f"Command: `.venv/bin/python benchmarks/ingress.py --rate {args.rate:.0f} --seconds {args.seconds:.0f}` "
        f"(open loop, latency from the scheduled send time, load from a separate process).",
        "",
        "| server | p50 ms | p99 ms | p50 / bare | p99 / bare | errors |",
        "|---|---|---|---|---|---|",
    ]
    for label, r in results.items():
        lines.append(
            f"| {label} | {r['p50']:.2f} | {r['p99']:.2f} | {r['p50'] / bare['p50']:.2f}× | "
            f"{r['p99'] / bare['p99']:.2f}× | {int(r['errors'])} of {int(r['sent'])} |"
        )
    base_us, ours_us, ratio = asyncio.run(middleware_ratio())
    lines += [
        "",
        "| aiogram dispatch | µs per update | ratio |",
        "|---|---|---|",
        f"| `Dispatcher.feed_update` alone | {base_us:.1f} | 1.00× |",
        f"| with `IdempotencyMiddleware` (memory store) | {ours_us:.1f} | {ratio:.2f}× |",
    ]
    lines += [
        "",
        chart_link("ingress", "Ingress latency and dispatch ratios, drawn from the tables above"),
    ]
    table = "\n".join(lines)
    print(table)
    servers = [(label, r) for label, r in results.items() if label != targets[0][0]]
    chart = Chart(
        "Ingress: the webhook vs a bare server, the middleware vs aiogram alone",
        [
            Panel(
                "p50 POST → 200 latency / bare aiohttp",
                [Bar(label, r["p50"] / bare["p50"]) for label, r in servers],
                goal=P50_GOAL,
            ),
            Panel(
                "p99 POST → 200 latency / bare aiohttp",
                [Bar(label, r["p99"] / bare["p99"]) for label, r in servers],
                goal=P99_GOAL,
            ),
            Panel(
                "aiogram dispatch: with IdempotencyMiddleware / feed_update alone",
                [Bar("with `IdempotencyMiddleware` (memory store)", ratio)],
                goal=MIDDLEWARE_GOAL,
            ),
        ],
    )
    write_section("ingress", "## Ingress\n\n" + table, chart)


if __name__ == "__main__":
    main()
