"""Ingress benchmark: POST → 200 latency of the durable fast-ack webhook vs a bare server.

    .venv/bin/python benchmarks/ingress.py [--rate 500] [--seconds 10] [--rounds 3] [--quick]

For each server (bare aiohttp answering 200 without work; WebhookIngress with the update
guard claim + inbox entry on SQLite, and on Redis when its store has an inbox), a separate
load process sends updates open-loop at a fixed rate on loopback; latency counts from each
request's scheduled send time. Each round runs every server once (the order alternating;
a fresh SQLite file / Redis key prefix per run); reports the median p50 / p99 over the
rounds with their min–max, their ratios to the bare server of the same round, ✔ / ✘
against p50 ≤ 2× and p99 ≤ 3×, and the errors. No worker drains the inbox: a lower bound
for a deployed bot (benchmarks/deployed.py measures that). Then the aiogram middleware with the memory
store vs aiogram's own ``feed_update`` alone (goal ≤ 1.2×), beside a pass-through
middleware (what aiogram itself charges for one more middleware). Writes the tables into
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
from typing import Any

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


async def middleware_ratios(n: int = 3000, rounds: int = 7) -> dict[str, list[float]]:
    """µs per update of ``feed_update`` alone, with a pass-through outer middleware (what
    aiogram charges for one more middleware: the floor), and with
    ``IdempotencyMiddleware`` on the memory store, per round (interleaved, the order
    alternating), plus the per-round ratios ``pass_ratio`` and ``ratio`` to the first."""
    from aiogram import BaseMiddleware, Bot, Dispatcher
    from aiogram.types import Message, TelegramObject, Update

    from telegram_idem import Idem
    from telegram_idem.adapters.aiogram import IdempotencyMiddleware

    class PassThrough(BaseMiddleware):
        async def __call__(self, handler: Any, event: TelegramObject, data: dict[str, Any]) -> Any:
            return await handler(event, data)

    bot = Bot("7000000001:AAbench")
    plain, passing, guarded = Dispatcher(), Dispatcher(), Dispatcher()
    passing.update.outer_middleware(PassThrough())
    guarded.update.outer_middleware(IdempotencyMiddleware(Idem("memory://?max_items=1000000")))

    async def handler(message: Message) -> None:
        return None

    for dp in (plain, passing, guarded):
        dp.message.register(handler)
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

    # Where the time goes: the guard's parts without aiogram, on another memory store.
    parts_idem = Idem("memory://?max_items=1000000")

    async def store_only() -> float:
        keys = [f"bench:{next(ids)}" for _ in range(n)]
        store = parts_idem.store
        start = time.perf_counter()
        for key in keys:
            claim = await store.claim(key, lease=60.0, retention=3600.0)
            await store.complete(key, claim.token, b"null", retention=3600.0)
        return (time.perf_counter() - start) / n * 1e6

    async def admit_and_run() -> float:
        batch = [{"update_id": next(ids)} for _ in range(n)]

        async def nothing() -> None:
            return None

        start = time.perf_counter()
        for update in batch:
            admitted = await parts_idem.admit(update, bot_id=7000000001)
            await admitted.run(nothing)
        return (time.perf_counter() - start) / n * 1e6

    out: dict[str, list[float]] = {
        "base": [],
        "pass": [],
        "ours": [],
        "pass_ratio": [],
        "ratio": [],
        "store": [],
        "guard": [],
    }
    for dp in (plain, passing, guarded):
        await timed(dp)  # warm-up
    for r in range(rounds):
        order = [("base", plain), ("pass", passing), ("ours", guarded)]
        if r % 2:
            order.reverse()
        got = {name: await timed(dp) for name, dp in order}
        for name, value in got.items():
            out[name].append(value)
        out["pass_ratio"].append(got["pass"] / got["base"])
        out["ratio"].append(got["ours"] / got["base"])
        out["store"].append(await store_only())
        out["guard"].append(await admit_and_run())
    await bot.session.close()
    return out


def _range(values: list[float], digits: int = 2) -> str:
    return (
        f"{statistics.median(values):.{digits}f} "
        f"({min(values):.{digits}f}–{max(values):.{digits}f})"
    )


def _mark(value: float, goal: float) -> str:
    return "✔" if value <= goal else "✘"


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
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round of 4 s (a smoke run)")
    parser.add_argument(
        "--redis-url",
        default=os.environ.get(SERVER_STORES["redis"].env, "redis://127.0.0.1:6379/0"),
        help="the Redis server (default: IDEM_REDIS_URL, the pytest plugin's variable)",
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 4.0
    tmp = tempfile.mkdtemp(prefix="idem-bench-")
    bare_label = "bare aiohttp (200, no work)"
    targets: list[tuple[str, str, str | None]] = [
        (bare_label, "bare", None),
        ("WebhookIngress + SQLite", "ingress", "sqlite"),
    ]
    redis_url = (
        f"{args.redis_url}{'&' if '?' in args.redis_url else '?'}key_prefix=bench{os.getpid()}"
    )
    if redis_has_inbox(redis_url):
        targets.append(("WebhookIngress + Redis", "ingress", "redis"))
    load_start = os.getloadavg()[0]
    runs: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in targets}
    ratios: dict[str, dict[str, list[float]]] = {
        label: {"p50": [], "p99": []} for label, _, _ in targets[1:]
    }
    for r in range(args.rounds):
        order = list(targets) if r % 2 == 0 else list(reversed(targets))
        got: dict[str, dict[str, float]] = {}
        for label, kind, store in order:
            url = None
            if store == "sqlite":
                url = f"sqlite:///{tmp}/bench-{r}.db"  # a fresh file per run
            elif store == "redis":
                url = f"{redis_url}{r}"
            print(f"round {r + 1}: {label} at {args.rate:.0f}/s for {args.seconds:.0f} s …")
            got[label] = run_target(kind, url, args.rate, args.seconds)
            runs[label].append(got[label])
        for label in ratios:
            ratios[label]["p50"].append(got[label]["p50"] / got[bare_label]["p50"])
            ratios[label]["p99"].append(got[label]["p99"] / got[bare_label]["p99"])
    mw = asyncio.run(middleware_ratios())
    cmd = (
        f"`.venv/bin/python benchmarks/ingress.py --rate {args.rate:.0f} "
        f"--seconds {args.seconds:.0f} --rounds {args.rounds}`"
    )
    lines = [
        f"Command: {cmd} (open loop, latency from the scheduled send time, load from a "
        "separate process).",
        "",
        f"Machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}, load average "
        f"{load_start:.2f} at the start and {os.getloadavg()[0]:.2f} at the end.",
        "",
        "**No worker drains the inbox here**: the servers only admit (the inbox grows by "
        f"{args.rate * args.seconds:.0f} entries per run), so these figures are a lower bound "
        "for a deployed bot, whose workers share the machine; the deployed shape is "
        "measured under [Deployed shape](#deployed-shape).",
        "",
        "| server | p50 ms | p99 ms | p50 / bare (≤ 2×) | p99 / bare (≤ 3×) | errors |",
        "|---|---|---|---|---|---|",
    ]
    for label, results in runs.items():
        p50s, p99s = [x["p50"] for x in results], [x["p99"] for x in results]
        errors = (
            f"{int(sum(x['errors'] for x in results))} of {int(sum(x['sent'] for x in results))}"
        )
        if label == bare_label:
            lines.append(
                f"| {label} | {_range(p50s)} | {_range(p99s)} | 1.00× | 1.00× | {errors} |"
            )
            continue
        r50, r99 = ratios[label]["p50"], ratios[label]["p99"]
        lines.append(
            f"| {label} | {_range(p50s)} | {_range(p99s)} | "
            f"{_range(r50)}× {_mark(statistics.median(r50), P50_GOAL)} | "
            f"{_range(r99)}× {_mark(statistics.median(r99), P99_GOAL)} | {errors} |"
        )
    ratio = statistics.median(mw["ratio"])
    lines += [
        "",
        "| aiogram dispatch (no-op handler) | µs per update | ratio to `feed_update` alone (≤ 1.2×) |",
        "|---|---|---|",
        f"| `Dispatcher.feed_update` alone | {_range(mw['base'], 1)} | 1.00× |",
        f"| with a pass-through outer middleware (aiogram's cost of one more middleware) | "
        f"{_range(mw['pass'], 1)} | {_range(mw['pass_ratio'])}× (not judged) |",
        f"| with `IdempotencyMiddleware` (memory store) | {_range(mw['ours'], 1)} | "
        f"{_range(mw['ratio'])}× {_mark(ratio, MIDDLEWARE_GOAL)} |",
        "",
        "Where the time goes (µs per update, measured in the same run, no aiogram): the "
        f"memory store's `claim` + `complete` alone {_range(mw['store'], 1)}; "
        "`Idem.admit` + `Admitted.run` around a no-op (the claim, its decision event, the "
        "update bound, the heartbeat registered, the completion) "
        f"{_range(mw['guard'], 1)}; aiogram's own cost of one more outer middleware is the "
        "pass-through row. The middleware adds about the guard's figure plus the "
        "pass-through's to `feed_update`; on a no-op handler the 1.2× goal leaves the "
        f"guard about {statistics.median(mw['base']) * 0.2:.0f} µs per update, against "
        "the figures above.",
        "",
        f"Median of {args.rounds} rounds for the servers and of {len(mw['ratio'])} for "
        "dispatch (min–max in brackets); each round runs every row once, in an order that "
        "alternates, and its ratios are against the baseline of the same round.",
        "",
        chart_link("ingress", "Ingress latency and dispatch ratios, drawn from the tables above"),
    ]
    table = "\n".join(lines)
    print(table)
    chart = Chart(
        "Ingress: the webhook vs a bare server, the middleware vs aiogram alone",
        [
            Panel(
                "p50 POST → 200 latency / bare aiohttp (no worker draining)",
                [
                    Bar(label, statistics.median(v["p50"]), min(v["p50"]), max(v["p50"]))
                    for label, v in ratios.items()
                ],
                goal=P50_GOAL,
            ),
            Panel(
                "p99 POST → 200 latency / bare aiohttp (no worker draining)",
                [
                    Bar(label, statistics.median(v["p99"]), min(v["p99"]), max(v["p99"]))
                    for label, v in ratios.items()
                ],
                goal=P99_GOAL,
            ),
            Panel(
                "aiogram dispatch / feed_update alone",
                [
                    Bar(
                        "pass-through middleware",
                        statistics.median(mw["pass_ratio"]),
                        min(mw["pass_ratio"]),
                        max(mw["pass_ratio"]),
                        judged=False,
                    ),
                    Bar(
                        "with `IdempotencyMiddleware` (memory store)",
                        ratio,
                        min(mw["ratio"]),
                        max(mw["ratio"]),
                    ),
                ],
                goal=MIDDLEWARE_GOAL,
            ),
        ],
    )
    write_section("ingress", "## Ingress\n\n" + table, chart)


if __name__ == "__main__":
    main()
