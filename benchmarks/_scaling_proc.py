"""One process of the scaling benchmark (run by ``benchmarks/scaling.py``, one role each).

Usage: python benchmarks/_scaling_proc.py ROLE CONFIG_JSON

ROLE:

- ``baseline``: aiogram's own ``SimpleRequestHandler`` (its default,
  ``handle_in_background=True``) on ``port``, feeding a plain ``Dispatcher``: no guard.
- ``ingress``: ``WebhookIngress`` on ``port``, on the store of ``spec`` (no worker).
- ``worker``: an ``InboxWorker`` (``concurrency`` tasks) draining that store's inbox
  through a ``Dispatcher`` with ``IdempotencyMiddleware`` (``inbox_dispatch``).

Every role runs the same handler work: one ``INCR`` of ``counter`` on the Redis at
``redis`` (the effect, and the count the benchmark reads). In ``worker`` the effect is an
``@idempotent`` action (claim + completion in the shape's store), so a re-run of an update
never counts twice. A process prints ``ready`` on stdout when it serves (or takes), and
stops on SIGTERM; with ``SCALING_PROFILE=DIR`` it runs under cProfile
(``benchmarks/scaling.py --profile DIR``).
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import logging
import os
import signal
import sys
from typing import Any

from _scaling_shapes import open_store
from aiogram import Bot, Dispatcher, Router
from aiogram.types import Message
from aiogram.webhook.aiohttp_server import SimpleRequestHandler
from aiohttp import web
from redis.asyncio import BlockingConnectionPool, Redis

BOT_TOKEN = "7000000001:AAscaling-benchmark-token"
BOT_ID = 7000000001


def _counter(url: str) -> Redis:
    """The counter's client: at most 32 connections, callers wait for one (aiogram's
    background tasks are unbounded, as many as the updates in flight)."""
    return Redis(connection_pool=BlockingConnectionPool.from_url(url, max_connections=32))


def _ready() -> None:
    print("ready", flush=True)


async def _serve(app: web.Application, port: int) -> None:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=1024)
    await site.start()
    _ready()
    try:
        await _until_term()
    finally:
        await runner.cleanup()


async def _until_term() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def baseline(config: dict[str, Any]) -> None:
    counter = _counter(config["redis"])
    key = config["counter"]
    router = Router()

    @router.message()
    async def on_message(message: Message) -> None:
        await counter.incr(key)

    bot = Bot(BOT_TOKEN)
    dp = Dispatcher()
    dp.include_router(router)
    app = web.Application()
    SimpleRequestHandler(dp, bot, secret_token=config["secret"]).register(app, path="/webhook")
    try:
        await _serve(app, config["port"])
    finally:
        await bot.session.close()
        await counter.aclose()


async def ingress(config: dict[str, Any]) -> None:
    from telegram_idem import Idem
    from telegram_idem.ingress import WebhookIngress

    idem = Idem(open_store(config["spec"]))
    webhook = WebhookIngress(idem, bot_id=BOT_ID, secret_token=config["secret"])
    app = web.Application()
    app.router.add_post("/webhook", webhook.handle)
    try:
        await _serve(app, config["port"])
    finally:
        await idem.close()


async def worker(config: dict[str, Any]) -> None:
    from telegram_idem import Idem, idempotent
    from telegram_idem.adapters.aiogram import IdempotencyMiddleware, inbox_dispatch
    from telegram_idem.inbox import InboxWorker

    counter = _counter(config["redis"])
    key = config["counter"]
    idem = Idem(open_store(config["spec"]))

    # "wait", as behind every inbox (docs/deploy-webhook.md): a retaken entry waits out
    # a dead holder's claim instead of dropping the update.
    @idempotent(key="scaling:{update_id}", in_progress="wait")
    async def count() -> int:
        return int(await counter.incr(key))

    router = Router()

    @router.message()
    async def on_message(message: Message) -> None:
        await count()

    bot = Bot(BOT_TOKEN)
    dp = Dispatcher()
    IdempotencyMiddleware(idem).setup(dp)
    dp.include_router(router)
    pool = InboxWorker(
        idem.store.inbox(),
        inbox_dispatch(dp, bot),
        concurrency=config["concurrency"],
        lease=60.0,
        poll_interval=0.05,
        shutdown_grace=5.0,
    )
    try:
        async with pool:
            _ready()
            await _until_term()
    finally:
        await bot.session.close()
        await idem.close()
        await counter.aclose()


ROLES = {"baseline": baseline, "ingress": ingress, "worker": worker}


def main() -> None:
    """Run the role; with ``SCALING_PROFILE=DIR`` under cProfile, the statistics written
    to ``DIR/<role>-<pid>.prof`` when the process stops."""
    role, config = sys.argv[1], json.loads(sys.argv[2])
    logging.basicConfig(level=logging.WARNING, format=f"{role} %(name)s %(levelname)s %(message)s")
    profile_dir = os.environ.get("SCALING_PROFILE")
    if not profile_dir:
        asyncio.run(ROLES[role](config))
        return
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        asyncio.run(ROLES[role](config))
    finally:
        profiler.disable()
        profiler.dump_stats(os.path.join(profile_dir, f"{role}-{os.getpid()}.prof"))


if __name__ == "__main__":
    main()
