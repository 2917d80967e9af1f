#!/usr/bin/env python3
"""Render the Grafana dashboard's picture (docs/img/grafana-dashboard.png) from a real run.

Grafana cannot be installed here (it is in no registry this project may use), so the
picture is drawn the way Grafana would draw it, from the same data:

1. a real bot runs on loopback for ``--seconds``: the library's ``WebhookIngress`` into
   the inbox of a real store (SQLite by default), an ``InboxWorker`` whose handler
   answers through ``Outbound`` (the outbox, its relay and ``FloodControl``) to a
   ``FakeBotAPI``, and :class:`~telegram_idem.prometheus.PrometheusMetrics` on
   ``GET /metrics`` of the same aiohttp app;
2. ``telegram_idem.testing.Replayer`` delivers updates to the webhook, each several
   times at once (replayed duplicates); the run goes through phases: plain traffic,
   injected 429s (``Fault.retry_after``), a burst into one chat (flood-control waits),
   poison updates (inbox dead letters), dropped answers / a 400 / a blocked chat
   (outbox unknown / dead / parked), a duplicate storm, and the worker stopped (pending
   entries pile up and age);
3. a real Prometheus (the Debian package's binary, ``--prometheus``) scrapes
   ``/metrics`` every ``--scrape`` seconds into a temporary TSDB;
4. each panel of docs/grafana/telegram-idem.json is drawn with matplotlib from its own
   PromQL, evaluated by that Prometheus (``/api/v1/query_range``; ``$job`` → ``.*``,
   ``$__rate_interval`` → four scrape intervals), at the panel's place in the
   dashboard's grid.

Usage::

    apt-get install prometheus        # or: apt-get download prometheus; dpkg-deb -x ...
    python scripts/dashboard_snapshot.py [--prometheus PATH] [--seconds 150] [--out PNG]

Needs the extras ``prometheus``, ``outbox``, ``testing`` and matplotlib (``benchmarks``).
Exit status 0, or 2 when no Prometheus binary is found.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from telegram_idem import Idem, SendError, UnknownOutcomeError
from telegram_idem.flood import FloodControl
from telegram_idem.inbox import Inbox, InboxWorker
from telegram_idem.ingress import WebhookIngress
from telegram_idem.outbox import HttpBotAPI, Outbound
from telegram_idem.prometheus import PrometheusMetrics
from telegram_idem.testing import Replayer, UpdateFactory
from telegram_idem.testing.bot_api import FakeBotAPI, Fault

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "docs" / "grafana" / "telegram-idem.json"
TOKEN = "7000000001:AAsnapshot"
BOT = 7000000001
SECRET = "snapshot-secret"

log = logging.getLogger("dashboard_snapshot")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# ---------------------------------------------------------------- the bot under load


class Bot:
    """The bot of the run: webhook → inbox → worker → outbox → fake Bot API."""

    def __init__(self, idem: Idem, inbox: Inbox, api: FakeBotAPI) -> None:
        self.idem = idem
        self.api = api
        self.outbound = Outbound(
            idem.store.outbox(),
            HttpBotAPI(TOKEN, base_url=api.url, timeout=2.0),
            bot_id=BOT,
            flood=FloodControl.for_store(idem.store, bot_id=BOT, keys=idem.keys),
            keys=idem.keys,
            lease=5.0,
            owns_api=True,
        )
        self.worker = self._worker(inbox)
        self.ingress = WebhookIngress(
            idem, bot_id=BOT, secret_token=SECRET, on_admitted=self._notify
        )

    def _worker(self, inbox: Inbox) -> InboxWorker:
        return InboxWorker(
            inbox,
            self.handle,
            concurrency=16,
            max_attempts=3,
            backoff_base=0.5,
            backoff_max=2.0,
            poll_interval=0.1,
        )

    def _notify(self) -> None:
        self.worker.notify()

    async def handle(self, update: dict[str, Any]) -> None:
        message = update.get("message") or {}
        text = str(message.get("text", ""))
        if text.startswith("poison"):
            raise ValueError("this update can never be processed")
        try:
            await self.outbound.call(
                "sendMessage",
                {"chat_id": message["chat"]["id"], "text": f"echo: {text}"},
                key=f"reply:{update['update_id']}",
                wait=10.0,
            )
        except (SendError, UnknownOutcomeError) as exc:  # the outbox keeps it; operators see it
            log.debug("reply to %s: %s", update["update_id"], exc)


PHASES: list[tuple[float, str]] = []
"""(seconds since the epoch, short label) of each phase's start: drawn as annotations."""


async def drive(bot: Bot, url: str, seconds: float, echo: Callable[[str], None]) -> None:
    """Deliver updates to ``url`` through the phases of the module docstring."""
    rng = random.Random(12)
    factory = UpdateFactory()
    chats = [factory.private_chat(factory.new_user()) for _ in range(24)]
    burst_chat = chats[0]
    started = time.monotonic()

    def phase() -> float:
        return (time.monotonic() - started) / seconds

    async with Replayer(url, secret_token=SECRET, timeout=10.0) as replayer:

        async def deliver(text: str, chat: dict[str, Any], copies: int) -> None:
            update = factory.message(text, chat=chat, user=None)
            await replayer.concurrent(update, copies)

        tasks: set[asyncio.Task[None]] = set()

        def spawn(job: Awaitable[None]) -> None:
            task = asyncio.ensure_future(job)
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        said: set[str] = set()

        def once(name: str, text: str) -> bool:
            if name in said:
                return False
            said.add(name)
            PHASES.append((time.time(), name))
            echo(f"{time.monotonic() - started:6.1f} s  {text}")
            return True

        n = 0
        while phase() < 1.0:
            p = phase()
            n += 1
            copies = 1 + (rng.random() < 0.3) + (rng.random() < 0.1)
            if p < 0.2:
                once("traffic", "plain traffic, some updates re-sent")
            if 0.2 <= p < 0.35:
                once("429s", "429s: Telegram answers Too Many Requests now and then")
                if n % 8 == 0:
                    bot.api.inject(Fault.retry_after(1, method="sendMessage"))
            if 0.35 <= p < 0.5:
                if once(
                    "burst+poison", "a burst into one chat (flood-control waits), poison updates"
                ):
                    for i in range(16):
                        spawn(deliver(f"burst {i}", burst_chat, 1))
                if n % 10 == 0:
                    spawn(deliver(f"poison {n}", rng.choice(chats[3:]), 1))
            if 0.5 <= p < 0.6:
                if once(
                    "outbox faults",
                    "dropped answers, a 400, a blocked chat (outbox unknown/dead/parked)",
                ):
                    bot.api.inject(
                        Fault.error(
                            400, "Bad Request: chat not found", chat_id=chats[1]["id"], times=None
                        )
                    )
                    bot.api.inject(Fault.blocked(chats[2]["id"]))
                if n % 10 == 0:
                    bot.api.inject(Fault.drop(method="sendMessage", times=1))
                if n % 17 == 0:
                    spawn(deliver(f"to a missing chat {n}", chats[1], 1))
                if n % 29 == 0:
                    spawn(deliver(f"to a blocked chat {n}", chats[2], 1))
            if 0.6 <= p < 0.8:
                once("dup storm", "a duplicate storm: every update delivered 6 times at once")
                copies = 6
            if p >= 0.8 and once(
                "worker stopped", "the worker stops: entries pile up in the inbox"
            ):
                await bot.worker.stop(grace=5.0)
            spawn(deliver(f"hello {n}", rng.choice(chats[3:]), copies))
            await asyncio.sleep(0.12)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


async def run(store_url: str, seconds: float, scrape: float, port: int) -> tuple[float, float, str]:
    """Run the bot, serving ``/metrics`` (and the webhook) on ``port``; returns (start,
    end) in seconds since the epoch and the store's name."""
    idem = Idem(store_url, lease=10.0)
    inbox = idem.store.inbox()
    registry = CollectorRegistry()
    async with FakeBotAPI() as api:
        bot = Bot(idem, inbox, api)
        metrics = PrometheusMetrics(registry, inbox=inbox, outbox=idem.store.outbox(), bot_id=BOT)
        app = web.Application()
        app.router.add_post("/webhook", bot.ingress.handle)
        metrics.add_route(app)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            with metrics:
                bot.worker.start()
                async with bot.outbound:
                    begin = time.time()
                    await drive(bot, f"http://127.0.0.1:{port}/webhook", seconds, print)
                    # A few more scrapes of the final state (worker stopped, entries aging).
                    await asyncio.sleep(scrape * 4)
                    end = time.time()
                with contextlib.suppress(Exception):
                    await bot.worker.stop(grace=1.0)
        finally:
            await runner.cleanup()
            name = type(idem.store).__name__
            await idem.close()
    return begin, end, name


def start_prometheus(
    binary: str, work: Path, scrape: float, target: int
) -> tuple[subprocess.Popen[bytes], str]:
    """A Prometheus scraping ``127.0.0.1:target/metrics`` every ``scrape`` seconds into a
    TSDB under ``work``, on a free port; returns the process and its URL, once ready."""
    port = free_port()
    config = work / "prometheus.yml"
    config.write_text(
        "scrape_configs:\n"
        "  - job_name: bot\n"
        f"    scrape_interval: {scrape:g}s\n"
        f"    scrape_timeout: {min(scrape, 5.0):g}s\n"
        "    static_configs:\n"
        f"      - targets: ['127.0.0.1:{target}']\n"
    )
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(work / "prometheus.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url)
    except BaseException:
        process.terminate()
        process.wait(timeout=30)
        raise
    return process, url


def wait_ready(prom: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{prom}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


# ---------------------------------------------------------------- drawing the panels


def query_range(
    prom: str, expr: str, start: float, end: float, step: float
) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{query}", timeout=30) as response:
        body = json.load(response)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def legend(template: str, labels: dict[str, str]) -> str:
    text = template
    for name, value in labels.items():
        text = text.replace("{{" + name + "}}", value)
    return text.replace("{{", "").replace("}}", "").strip() or "value"


def fmt(value: float, unit: str) -> str:
    if unit == "percentunit":
        return f"{value * 100:.0f}%"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if 0 < abs(value) < 1 else f"{value:.1f} s"
    if unit == "reqps":
        return f"{value:.2f}/s" if abs(value) < 10 else f"{value:.0f}/s"
    return f"{value:.3g}"


def draw(prom: str, begin: float, end: float, scrape: float, out: Path, store: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    panels = board["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit_w, unit_h = 0.72, 0.33  # inches per grid column, per grid row
    header = 0.7
    fig = plt.figure(figsize=(24 * unit_w, rows * unit_h + header), facecolor="#111217")
    total_h = rows * unit_h + header
    rate = f"{max(4 * scrape, 2 * scrape):g}s"
    step = scrape
    colors = [
        "#73BF69",
        "#F2CC0C",
        "#8AB8FF",
        "#FF780A",
        "#F2495C",
        "#5794F2",
        "#B877D9",
        "#FF9830",
        "#1F60C4",
        "#96D98D",
    ]
    fig.text(
        0.01,
        1 - 0.35 / total_h,
        f"{board['title']}  ·  drawn by scripts/dashboard_snapshot.py from the dashboard's own "
        f"PromQL, evaluated by a real Prometheus scraping a real run every {scrape:g} s "
        f"(store: {store}; Grafana itself not used)",
        color="#ccccdc",
        fontsize=11,
        va="center",
    )
    for panel in panels:
        pos = panel["gridPos"]
        pad_x, pad_y = 0.06, 0.1
        left = (pos["x"] * unit_w + pad_x) / (24 * unit_w)
        width = (pos["w"] * unit_w - 2 * pad_x) / (24 * unit_w)
        top = (header + pos["y"] * unit_h + pad_y) / total_h
        height = (pos["h"] * unit_h - 2 * pad_y) / total_h
        frame = fig.add_axes((left, 1 - top - height, width, height))
        frame.set_facecolor("#181b1f")
        frame.set_xticks([])
        frame.set_yticks([])
        for spine in frame.spines.values():
            spine.set_color("#2c3235")
        frame.text(
            0.015,
            0.95,
            panel["title"],
            transform=frame.transAxes,
            color="#ccccdc",
            fontsize=10,
            va="top",
            weight="bold",
        )
        unit = panel["fieldConfig"]["defaults"].get("unit", "short")
        series = []
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", rate).replace("$job", ".*")
            for result in query_range(prom, expr, begin, end, step):
                points = [
                    (float(t), float(v))
                    for t, v in result["values"]
                    if v not in ("NaN", "+Inf", "-Inf")
                ]
                if points:
                    series.append(
                        (legend(target.get("legendFormat", ""), result["metric"]), points)
                    )
        if panel["type"] == "stat":
            n = max(len(series), 1)
            for i, (name, points) in enumerate(sorted(series)):
                value = points[-1][1]
                box = fig.add_axes(
                    (
                        left + 0.01 * width,
                        1 - top - height + (0.08 + 0.8 * i / n) * height,
                        0.98 * width,
                        0.8 * height / n - 0.01,
                    )
                )
                box.set_xticks([])
                box.set_yticks([])
                box.set_facecolor("#37872D" if value >= 1 else "#C4162A")
                box.text(
                    0.03,
                    0.5,
                    name,
                    color="white",
                    fontsize=13,
                    va="center",
                    transform=box.transAxes,
                )
                box.text(
                    0.97,
                    0.5,
                    "UP" if value >= 1 else "DOWN",
                    color="white",
                    fontsize=20,
                    va="center",
                    ha="right",
                    weight="bold",
                    transform=box.transAxes,
                )
            if not series:
                frame.text(
                    0.5, 0.5, "No data", color="#8e8e8e", ha="center", transform=frame.transAxes
                )
            continue
        plot = fig.add_axes(
            (left + 0.07 * width, 1 - top - height + 0.22 * height, 0.9 * width, 0.6 * height)
        )
        plot.set_facecolor("#181b1f")
        for spine in plot.spines.values():
            spine.set_visible(False)
        plot.tick_params(colors="#9fa7b3", labelsize=7)
        plot.grid(color="#2c3235", linewidth=0.6)
        for i, (name, points) in enumerate(sorted(series)):
            times = [mdates.date2num(datetime.fromtimestamp(t)) for t, _ in points]
            plot.plot(
                times,
                [v for _, v in points],
                color=colors[i % len(colors)],
                linewidth=1.3,
                label=name,
            )
            plot.fill_between(
                times, [v for _, v in points], color=colors[i % len(colors)], alpha=0.08
            )
        plot.set_xlim(
            mdates.date2num(datetime.fromtimestamp(begin)),
            mdates.date2num(datetime.fromtimestamp(end)),
        )
        plot.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
        plot.xaxis.set_major_locator(mdates.SecondLocator(bysecond=[0, 30]))
        plot.yaxis.set_major_formatter(FuncFormatter(lambda v, _p, u=unit: fmt(v, u)))
        plot.set_ylim(bottom=0)
        for at, label in PHASES:
            x = mdates.date2num(datetime.fromtimestamp(at))
            plot.axvline(x, color="#5c6b7a", linewidth=0.7, linestyle="--")
            if panel is panels[0]:
                plot.text(
                    x,
                    1.0,
                    f" {label}",
                    color="#9fa7b3",
                    fontsize=6.5,
                    va="bottom",
                    transform=plot.get_xaxis_transform(),
                )
        if series:
            plot.legend(
                loc="upper center",
                bbox_to_anchor=(0.5, -0.13),
                ncol=min(len(series), max(2, pos["w"] // 2)),
                fontsize=7,
                frameon=False,
                labelcolor="#ccccdc",
                handlelength=1.2,
            )
        else:
            plot.text(0.5, 0.5, "No data", color="#8e8e8e", ha="center", transform=plot.transAxes)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90, facecolor=fig.get_facecolor())
    plt.close(fig)


def store_for(kind: str, work: Path) -> str:
    """The run's store URL: a SQLite file in ``work``, or ``memory://``."""
    return f"sqlite:///{work / 'bot.db'}" if kind == "sqlite" else "memory://"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--prometheus", default=shutil.which("prometheus"), help="the prometheus binary"
    )
    parser.add_argument("--seconds", type=float, default=150.0, help="length of the run")
    parser.add_argument(
        "--scrape", type=float, default=2.0, help="Prometheus scrape interval, seconds"
    )
    parser.add_argument("--store", choices=["sqlite", "memory"], default="sqlite")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "grafana-dashboard.png")
    args = parser.parse_args()
    if not args.prometheus:
        print(
            "no prometheus binary: apt-get install prometheus, or give --prometheus",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="idem-dashboard-") as tmp:
        work = Path(tmp)
        port = free_port()
        prometheus, prom = start_prometheus(args.prometheus, work, args.scrape, port)
        try:
            url = store_for(args.store, work)
            begin, end, store = asyncio.run(run(url, args.seconds, args.scrape, port))
            draw(prom, begin, end, args.scrape, args.out, store)
        finally:
            prometheus.terminate()
            prometheus.wait(timeout=30)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
