"""Wiring: one SQLite file for the guard, the inbox, the outbox and the shop's tables;
long polling into the durable inbox (``PollingIngress``), the pre-checkout answered at
ingress, an ``InboxWorker`` running the dispatcher.

Why not aiogram's own ``dp.start_polling``: it confirms each update to Telegram at the
next ``getUpdates`` (a higher ``offset``) while the handler may still be running, so a
process killed inside the credit loses a paid payment: Telegram never sends it again.
``PollingIngress`` moves the offset only after the batch is written to the inbox, and an
entry leaves the inbox only when its handler returned; a worker that died leaves it
there, and after its lease another worker runs it.

Run it with a real bot token (from @BotFather; Stars payments need no provider)::

    BOT_TOKEN=123456:ABC... python -m examples.stars_shop

``--api-url`` (``TELEGRAM_API_URL``) points it at another Bot API server, ``--db``
(``SHOP_DB``, default ``shop.db``) at another file, ``--admins`` (``SHOP_ADMINS``,
comma-separated user ids) names who may use ``/unresolved`` and ``/resolve``, and
``--lease`` (``SHOP_LEASE``, seconds, default 60) how long a dead process's claims and
sends stay held. It polls until SIGINT or SIGTERM, then lets the
entries in flight finish (30 s; the rest stay in the inbox for the next start).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from aiogram import Bot, Dispatcher
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer

from examples.stars_shop.handlers import PreCheckoutAnswers, build_router
from examples.stars_shop.models import open_database
from examples.stars_shop.shop import Shop
from telegram_idem import Idem
from telegram_idem.adapters.aiogram import (
    IdempotencyMiddleware,
    aiogram_get_updates,
    inbox_dispatch,
)
from telegram_idem.inbox import InboxWorker
from telegram_idem.ingress import PollingIngress
from telegram_idem.outbox import Outbound

__all__ = ["Polling", "build_dispatcher", "build_polling", "connected", "main", "run"]

log = logging.getLogger("examples.stars_shop")

ERROR_DELAY_MAX = 1.0
"""Seconds, the longest wait between polls while the store refuses a batch (locked):
new pre-checkout queries are fetched, and answered, at least this often."""


def build_dispatcher(shop: Shop) -> Dispatcher:
    """The dispatcher: the update guard, then the shop (pre-checkout queries are answered
    at ingress, :class:`~examples.stars_shop.handlers.PreCheckoutAnswers`)."""
    dp = Dispatcher(shop=shop)  # handlers get ``shop`` from the dispatcher's data
    IdempotencyMiddleware(shop.idem).setup(dp)  # the update guard; wiring checked at start-up
    dp.include_router(build_router())
    return dp


@dataclass(frozen=True)
class Polling:
    """The shop's ingress: ``await ingress.run(stop)`` polls into the inbox, ``worker``
    drains it through the dispatcher (``async with worker:``), ``answers`` answers the
    pre-checkout queries as they are fetched."""

    ingress: PollingIngress
    worker: InboxWorker
    answers: PreCheckoutAnswers


def build_polling(bot: Bot, dp: Dispatcher, shop: Shop, *, lease: float = 60.0) -> Polling:
    """Long polling into the durable inbox, and the worker that runs what it admitted.

    An update is confirmed to Telegram (the offset moves past it) only once its inbox
    entry is written; the entry is removed only when the handler returned.

    Args:
        bot: the bot polled and answering.
        dp: the dispatcher of :func:`build_dispatcher`.
        shop: the shop (its ``idem`` holds the inbox).
        lease: seconds a dead worker's entry stays held before another worker runs it.
    """
    answers = PreCheckoutAnswers(aiogram_get_updates(bot), bot, shop)
    worker = InboxWorker(shop.idem.store.inbox(), inbox_dispatch(dp, bot), lease=lease)
    ingress = PollingIngress(
        shop.idem,
        answers,
        bot_id=bot.id,
        on_admitted=worker.notify,
        error_delay=min(0.5, ERROR_DELAY_MAX),
        error_delay_max=ERROR_DELAY_MAX,
    )
    return Polling(ingress=ingress, worker=worker, answers=answers)


@asynccontextmanager
async def connected(
    token: str,
    api_url: str,
    db: str | Path,
    *,
    admins: frozenset[int] = frozenset(),
    lease: float = 60.0,
) -> AsyncIterator[tuple[Bot, Dispatcher, Shop]]:
    """The bot, its dispatcher and the shop, with the outbox's relay running (it sends
    the receipts, and what a crash left behind); everything is closed on leaving.

    Args:
        token: the bot token, ``<bot id>:<secret>``.
        api_url: the Bot API server, e.g. ``https://api.telegram.org``.
        db: the SQLite file of the shop (created if missing; relative to the working
            directory).
        admins: user ids allowed the operator's commands.
        lease: seconds a claim or a send of a process that died stays held.

    Raises:
        ConfigurationError: a token without a bot id.
        sqlalchemy.exc.SQLAlchemyError: the database cannot be opened.
    """
    path = str(db)  # one file: the store (sqlite://) and SQLAlchemy (sqlite+aiosqlite://)
    idem = Idem(f"sqlite:///{path}", lease=lease)
    try:
        outbound = Outbound.for_store(
            idem.store, token=token, base_url=api_url, keys=idem.keys, lease=lease
        )
        engine, sessions = await open_database(f"sqlite+aiosqlite:///{path}")
        shop = Shop(idem=idem, outbound=outbound, db=sessions, admins=admins)
        bot = Bot(token, session=AiohttpSession(api=TelegramAPIServer.from_base(api_url)))
        try:
            async with outbound:
                yield bot, build_dispatcher(shop), shop
        finally:
            await bot.session.close()
            await engine.dispose()
    finally:
        await idem.close()


async def run(
    token: str, api_url: str, db: str | Path, *, admins: frozenset[int], lease: float
) -> None:
    """Poll ``getUpdates`` into the inbox until SIGINT or SIGTERM (arguments as
    :func:`connected`)."""
    async with connected(token, api_url, db, admins=admins, lease=lease) as (bot, dp, shop):
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await bot.delete_webhook(drop_pending_updates=False)  # getUpdates fails while one is set
        polling = build_polling(bot, dp, shop, lease=lease)
        await dp.emit_startup(bot=bot)  # a wiring mistake raises here, before any update
        try:
            async with polling.worker:  # stopped on leaving: in-flight entries finish first
                log.info("Start polling getUpdates into the inbox (bot %s)", bot.id)
                await polling.ingress.run(stop)
            await polling.answers.settle()
        finally:
            await dp.emit_shutdown(bot=bot)


def _admins(text: str) -> frozenset[int]:
    return frozenset(int(part) for part in text.replace(" ", "").split(",") if part)


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module doc); returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.stars_shop",
        description="A Telegram Stars shop that never charges or credits twice. "
        "BOT_TOKEN: the bot token.",
    )
    parser.add_argument(
        "--api-url",
        default=os.environ.get("TELEGRAM_API_URL", "https://api.telegram.org"),
        help="Bot API server (env TELEGRAM_API_URL; default Telegram's)",
    )
    parser.add_argument(
        "--db", default=os.environ.get("SHOP_DB", "shop.db"), help="SQLite file (env SHOP_DB)"
    )
    parser.add_argument(
        "--admins",
        default=os.environ.get("SHOP_ADMINS", ""),
        help="operators' user ids, comma-separated (env SHOP_ADMINS)",
    )
    parser.add_argument(
        "--lease",
        type=float,
        default=float(os.environ.get("SHOP_LEASE", "60")),
        help="seconds a dead process's claims stay held (env SHOP_LEASE; default 60)",
    )
    args = parser.parse_args(argv)
    token = os.environ.get("BOT_TOKEN")
    if not token:
        parser.error("set BOT_TOKEN to the bot's token (from @BotFather)")
    try:
        admins = _admins(args.admins)
    except ValueError:
        parser.error(f"--admins must be user ids separated by commas, not {args.admins!r}")
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    asyncio.run(run(token, args.api_url, args.db, admins=admins, lease=args.lease))
    return 0
