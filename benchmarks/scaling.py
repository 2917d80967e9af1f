"""Scaling benchmark: processed updates/s end to end, 1, 2 and 4 worker processes, per
inbox shape, against aiogram's own webhook handler with no guard.

    .venv/bin/python benchmarks/scaling.py [--quick] [--procs 1,2,4] [--runs 3]
        [--updates 1500] [--shapes postgres,redis-cluster,jetstream] [--note TEXT]
        [--profile DIR] [--no-write]

Ours, per shape (``benchmarks/_scaling_shapes.py``: PostgreSQL; Redis Cluster, 3
masters started by the run on free ports; JetStream when ``telegram_idem.backends.nats``
is installed): ``WebhookIngress`` in its own process → the shape's durable inbox →
``n`` ``InboxWorker`` processes → an aiogram handler whose effect (one ``INCR`` of a
Redis counter) is an ``@idempotent`` action recorded in the shape's store.
Baseline: aiogram's ``SimpleRequestHandler`` (``aiogram.webhook.aiohttp_server``, its
default ``handle_in_background=True``) in ``n`` processes on ``n`` ports, the same
handler with no guard (the bare ``INCR``). A separate load process sends the same stream
of Telegram-shaped updates from many chats over loopback HTTP (closed loop, ``--in-flight``
requests at once, split evenly over the ports); the throughput is counted at the handler
(the shared counter), from 10 % to 90 % of each burst processed.

Every group is started once (for the largest process count) and warmed up; then
``--runs`` rounds, each one burst per process count and group, the groups in an order
that rotates; a process not being measured is paused (SIGSTOP), so its idle polling
takes no CPU. Reports, per shape and
process count, ours / unguarded throughput per run (median, min–max; goal ≥ 0.8) and
the updates per CPU-second of each side's own processes (store servers and the load not
counted). Writes the section ``scaling`` of docs/performance.md and its chart.

On a 2-core machine, 4 processes (plus the ingress, the load and the store servers)
measure contention, not scale-out: the output says so.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import secrets
import shlex
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from _report import Bar, Chart, Panel, chart_link, write_section
from _scaling_groups import Burst, Group, burst, start_baseline, start_ours
from _scaling_shapes import SHAPES, Spec, open_store
from redis import Redis

from telegram_idem.backends import Store

GOAL = 0.8
REDIS_URL = os.environ.get("IDEM_REDIS_URL", "redis://127.0.0.1:6379/0")
CORES = os.cpu_count() or 1
TAG = secrets.token_hex(4)


@dataclass(frozen=True)
class Row:
    """Figures of one (side, process count) over the runs."""

    rates: list[float]
    cpu: list[float]  # CPU seconds per update
    answered: list[float]  # updates/s the ingress answered 200
    processed_ok: bool
    errors: int
    resent: int


def _median_range(values: list[float], fmt: str, unit: str = "") -> str:
    """``median`` + ``unit``, then ``(min–max)`` when there are several values."""
    med = statistics.median(values)
    if len(values) == 1:
        return format(med, fmt) + unit
    return f"{format(med, fmt)}{unit} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def _load_average() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def _inbox_empty(
    spec: Spec, loop: asyncio.AbstractEventLoop, stack: list[Store]
) -> Callable[[], bool]:
    """``() -> bool``: whether the shape's inbox has no live entry (one store, kept open
    in ``loop``; closed by :func:`run_all`)."""
    store = open_store(spec)
    stack.append(store)
    inbox = store.inbox()
    return lambda: loop.run_until_complete(inbox.depth()) == 0


def run_all(
    counts: list[int],
    specs: dict[str, Spec],
    args: argparse.Namespace,
    redis: Redis,
) -> dict[int, dict[str, list[Burst]]]:
    """Every group started once for ``max(counts)`` processes and warmed up, then
    ``args.runs`` rounds; a round measures every (process count, group) once, the groups
    of each count in an order that rotates from round to round."""
    most = max(counts)
    groups: list[Group] = []
    stores: list[Store] = []
    loop = asyncio.new_event_loop()
    next_id = 1
    try:
        groups.append(start_baseline(most, f"scaling-{TAG}:count:baseline", REDIS_URL))
        for name, spec in specs.items():
            counter = f"scaling-{TAG}:count:{name}"
            group = start_ours(name, spec, most, counter, REDIS_URL, args.worker_concurrency)
            group.settled = _inbox_empty(spec, loop, stores)
            groups.append(group)
        for group in groups:
            group.wait_ready()
        print(f"{len(groups)} groups started ({sum(len(g.children) for g in groups)} processes)")
        for group in groups:  # every process: connections opened, scripts loaded, caches warm
            burst(group, most, redis, first_id=next_id, count=args.warmup,
                  concurrency=args.in_flight, chats=args.chats)  # fmt: skip
            next_id += args.warmup
        results: dict[int, dict[str, list[Burst]]] = {n: defaultdict(list) for n in counts}
        for run in range(args.runs):
            for n in counts:
                order = groups[run % len(groups) :] + groups[: run % len(groups)]
                if run % 2:
                    order.reverse()
                for group in order:
                    measured = burst(
                        group, n, redis, first_id=next_id, count=args.updates,
                        concurrency=args.in_flight, chats=args.chats,
                    )  # fmt: skip
                    next_id += args.updates
                    results[n][group.name].append(measured)
                    print(
                        f"  run {run + 1}, {n} × {group.name:<14} {measured.rate:6.0f} updates/s, "
                        f"{measured.cpu_per_update * 1e3:.2f} CPU ms/update, "
                        f"processed {measured.processed}/{args.updates}, "
                        f"answered {measured.ingress_rate:.0f}/s",
                        flush=True,
                    )
        return results
    finally:
        for group in groups:
            group.stop()
        for store in stores:
            loop.run_until_complete(store.close())
        loop.close()


def rows_of(bursts: list[Burst], count: int) -> Row:
    return Row(
        rates=[b.rate for b in bursts],
        cpu=[b.cpu_per_update for b in bursts],
        answered=[b.ingress_rate for b in bursts],
        processed_ok=all(b.processed == count for b in bursts),
        errors=sum(b.errors for b in bursts),
        resent=sum(b.resent for b in bursts),
    )


def report(
    results: dict[int, dict[str, list[Burst]]],
    labels: dict[str, str],
    skipped: list[str],
    notes: list[str],
    args: argparse.Namespace,
    seconds: float,
    load: tuple[str, str],
) -> str:
    # The command as it was run, so the section names what produced its figures.
    command = "`.venv/bin/python benchmarks/scaling.py " + shlex.join(sys.argv[1:])
    command = command.rstrip() + "`"
    lines = [
        "## Scaling: worker processes",
        "",
        f"Command: {command}",
        "",
        f"Machine: {CORES} cores, Python {platform.python_version()}, load average "
        f"{load[0]} at the start and {load[1]} at the end; {seconds:.0f} s."
        + (f" While it ran: {args.note}" if args.note else ""),
        "",
        f"**This machine has {CORES} cores.** The load generator, the store servers, the "
        "ingress and the workers share them: at 2 processes and above this measures "
        "contention for the same cores, and 4 processes on 2 cores measures contention, "
        "not scale-out. The ratio at the same process count still compares like with like.",
        "",
    ]
    if skipped:
        lines += [f"- skipped: {note}" for note in skipped] + [""]
    lines += [
        f"| inbox shape | processes | ours updates/s | unguarded updates/s | ours / unguarded (≥ {GOAL}) "
        "| ours updates per CPU-s | unguarded updates per CPU-s | ours answered/s | exactly once |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    bars: list[Bar] = []
    cpu_bars: list[Bar] = []
    for n, by_side in results.items():
        base = rows_of(by_side["baseline"], args.updates)
        for name, label in labels.items():
            if name not in by_side:
                continue
            ours = rows_of(by_side[name], args.updates)
            ratios = [o / b for o, b in zip(ours.rates, base.rates, strict=True)]
            cpu_ratios = [b / o for o, b in zip(ours.cpu, base.cpu, strict=True)]
            med = statistics.median(ratios)
            mark = "✔" if med >= GOAL else "✘"
            once = "yes" if ours.processed_ok and ours.errors == 0 else "**no**"
            if ours.resent:
                once += f" ({ours.resent} re-sent)"
            lines.append(
                f"| {label} | {n} | {_median_range(ours.rates, '.0f')} "
                f"| {_median_range(base.rates, '.0f')} "
                f"| {_median_range(ratios, '.2f', '×')} {mark} "
                f"| {_median_range([1 / c for c in ours.cpu], '.0f')} "
                f"| {_median_range([1 / c for c in base.cpu], '.0f')} "
                f"| {_median_range(ours.answered, '.0f')} | {once} |"
            )
            label_n = f"{label}, {n} proc."
            bars.append(Bar(label_n, med, min(ratios), max(ratios)))
            cpu_bars.append(
                Bar(label_n, statistics.median(cpu_ratios), min(cpu_ratios), max(cpu_ratios))
            )
    lines += [
        "",
        chart_link(
            "scaling", "Ours / unguarded throughput and CPU efficiency, drawn from the table above"
        ),
        "",
        f"Median of {args.runs} runs (min–max in brackets) of {args.updates} updates each, after "
        f"a warm-up burst of {args.warmup}; each run measures every process count of every "
        "group once, the groups in an order that rotates, every other process paused "
        "(SIGSTOP; each group's processes are started once, for the largest count). Throughput is counted at the handler (a "
        "shared Redis counter the handler increments) from 10 % to 90 % of the burst "
        f"processed. Load: one process, {args.in_flight} requests in flight (closed loop), "
        f"updates from {args.chats} private chats, re-sent after any non-200 answer as "
        "Telegram does.",
        "",
        f"- **ours**: one `WebhookIngress` process → the shape's inbox → *processes* "
        f"`InboxWorker` processes ({args.worker_concurrency} tasks each) → an aiogram "
        "`Dispatcher` with `IdempotencyMiddleware` (`inbox_dispatch`), whose handler's "
        "effect (one `INCR`) is an `@idempotent` action recorded in the shape's store. "
        "*Exactly once*: the counter rose by exactly the updates sent in every run.",
        "- **unguarded**: aiogram's `SimpleRequestHandler` (`handle_in_background=True`, "
        "its default) in *processes* processes on as many ports, the load split evenly; "
        "the same handler, the bare `INCR`, no guard, no inbox, no per-chat order.",
        "- *updates per CPU-s*: the updates divided by the CPU seconds (user + system, "
        "`/proc/<pid>/stat`) of that side's own processes during the burst (ours: the "
        "ingress and the workers); the store servers' and the load's CPU are not counted.",
        "- *ours answered/s*: the burst's updates over the time the load took to have them "
        "all answered 200 (the ingress's pace); above *ours updates/s* when the workers, not "
        "the ingress, set the pace (the inbox holds the backlog).",
    ]
    if notes:
        lines += ["", "What the store servers did (whole run, warm-ups included):", ""]
        lines += [f"- {note}" for note in notes]
    chart = Chart(
        "Scaling: ours / unguarded aiogram at the same process count",
        [
            Panel("throughput: ours / unguarded", bars, goal=GOAL, better="higher"),
            Panel(
                "updates per CPU-second of the bot's processes: ours / unguarded",
                [Bar(b.label, b.value, b.low, b.high, judged=False) for b in cpu_bars],
            ),
        ],
    )
    table = "\n".join(lines)
    if not args.no_write and bars:
        write_section("scaling", table, chart)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 and 2 processes, 1 short run")
    parser.add_argument("--procs", help="worker process counts (default 1,2,4; quick 1,2)")
    parser.add_argument("--runs", type=int, help="rounds (default 3; quick 1)")
    parser.add_argument("--updates", type=int, help="updates per burst (default 1500; quick 800)")
    parser.add_argument("--warmup", type=int, help="updates of the warm-up burst (200; quick 150)")
    parser.add_argument("--in-flight", type=int, default=64, help="requests the load keeps open")
    parser.add_argument("--chats", type=int, default=1000, help="chats the updates come from")
    parser.add_argument("--worker-concurrency", type=int, default=16, help="tasks per worker")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="inbox shapes to measure")
    parser.add_argument("--note", default="", help="what else ran meanwhile (printed)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="run every bot process under cProfile, statistics into DIR/<role>-<pid>.prof "
        "(implies --no-write: profiled figures are not the product's)",
    )
    args = parser.parse_args()
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        os.environ["SCALING_PROFILE"] = os.path.abspath(args.profile)
        args.no_write = True
    defaults = ("1,2", 1, 800, 150) if args.quick else ("1,2,4", 3, 1500, 200)
    for option, default in zip(("procs", "runs", "updates", "warmup"), defaults, strict=True):
        if getattr(args, option) is None:
            setattr(args, option, default)
    counts = [int(n) for n in args.procs.split(",")]
    started = time.monotonic()
    load_start = _load_average()
    print(
        f"{CORES} cores: the load, the store servers and every process share them; "
        f"{max(counts)} processes on {CORES} cores measure contention, not scale-out.",
        flush=True,
    )
    redis = Redis.from_url(REDIS_URL)
    redis.ping()
    specs: dict[str, Spec] = {}
    labels: dict[str, str] = {}
    skipped: list[str] = []
    notes: list[str] = []
    try:
        for name in args.shapes.split(","):
            shape = SHAPES[name]
            missing = shape.missing()
            if missing is not None:
                print(f"{shape.label}: skipped: {missing}", flush=True)
                # the page names the module without its package: docs/performance.md
                # links the reference of every telegram_idem module it names
                skipped.append(f"{shape.label}: {missing.replace('telegram_idem.', '')}")
                continue
            specs[name] = shape.setup(TAG)
            labels[name] = shape.label
        results = run_all(counts, specs, args, redis)
        per_shape = args.warmup + args.runs * len(counts) * args.updates
        for name, spec in specs.items():
            note = SHAPES[name].server(spec, per_shape)
            if note:
                notes.append(f"{labels[name]}: {note}")
    finally:
        for name, spec in specs.items():
            SHAPES[name].teardown(spec)
        keys = list(redis.scan_iter(match=f"scaling-{TAG}:*", count=1000))
        if keys:
            redis.delete(*keys)
        redis.close()
    table = report(
        results,
        labels,
        skipped,
        notes,
        args,
        time.monotonic() - started,
        (load_start, _load_average()),
    )
    print(table)


if __name__ == "__main__":
    main()
