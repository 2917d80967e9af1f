"""A webhook bot that answers Telegram in milliseconds and never loses an update: the
fast-ack ``WebhookIngress`` writes each update to the durable inbox (SQLite here) and an
``InboxWorker`` runs it through an aiogram 3 dispatcher.

``/start`` answers with an [Approve] button; a tap approves the order once, however many
times the button is tapped, and every tap is answered.

- ``WebhookIngress`` (no bot framework) checks the secret header, claims the update
  guard and writes the inbox entry in one transaction, then answers 200. A re-sent
  update (same ``update_id``) is answered 200 and not stored again.
- ``InboxWorker`` takes entries with a lease, one at a time per chat, in order; a failed
  handler is retried with backoff, then dead-lettered. A process killed mid-handler
  leaves its entry in the inbox: after the lease another worker runs it.
- ``@idempotent`` makes a double tap (two updates, two ``update_id`` values) approve once.

Run it with a real bot token and a public HTTPS URL forwarding to it::

    BOT_TOKEN=123456:ABC... WEBHOOK_SECRET=some-random-secret \\
        python -m examples.webhook_inbox --port 8080 --webhook-url https://bot.example.com/webhook

``--webhook-url`` (or ``WEBHOOK_URL``) calls ``setWebhook`` with the secret at start-up;
``--api-url`` (or ``TELEGRAM_API_URL``) points the bot at another Bot API server,
``--store`` (or ``IDEM_STORE_URL``) at another store with an inbox (default
``sqlite:///webhook_inbox.db``; PostgreSQL and Redis have one too). It serves
``POST /webhook`` until SIGINT or SIGTERM, then lets in-flight entries finish.
"""

from __future__ import annotations

import argparse
import logging
import os

from aiogram import Bot, Dispatcher, F, Router
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.filters import CommandStart
from aiogram.types import CallbackQuery, InlineKeyboardButton, InlineKeyboardMarkup, Message
from aiohttp import web

from telegram_idem import Idem, idempotent
from telegram_idem.adapters.aiogram import IdempotencyMiddleware, inbox_dispatch
from telegram_idem.inbox import InboxWorker
from telegram_idem.ingress import WebhookIngress, register

PROMPT = "Approve the order?"
APPROVED = "Order approved ✅"
BUTTON = InlineKeyboardMarkup(
    inline_keyboard=[[InlineKeyboardButton(text="Approve", callback_data="approve")]]
)

router = Router()


@router.message(CommandStart())
async def on_start(message: Message) -> None:
    # Runs once per update: the ingress stores an update_id once, however often it arrives.
    await message.answer(PROMPT, reply_markup=BUTTON)


# Behind the inbox, "wait" (not "drop"): a worker that retakes an entry after a crash may
# meet the dead holder's lease, and must take the action over rather than skip it.
@idempotent(key="approve:{callback_query.message.message_id}", in_progress="wait")
async def approve(bot: Bot, chat_id: int) -> str:
    # The action, once per message carrying the button.
    await bot.send_message(chat_id, APPROVED)
    return "Approved"


@router.callback_query(F.data == "approve")
async def on_approve(query: CallbackQuery, bot: Bot) -> None:
    assert query.message is not None  # the button sits on a message this bot sent
    text = await approve(bot, query.message.chat.id)
    # Outside the guarded action: every tap is answered, or its client keeps spinning.
    await query.answer(text)


def build_app(
    *, token: str, secret: str, api_url: str, store_url: str, webhook_url: str | None = None
) -> web.Application:
    """The aiohttp application: ``POST /webhook`` feeds the inbox, a worker drains it.

    Call once per process (aiogram attaches ``router`` to one dispatcher only).

    Args:
        token: the bot token, ``<bot id>:<secret>``.
        secret: the ``secret_token`` Telegram sends in ``X-Telegram-Bot-Api-Secret-Token``
            (1–256 characters of ``A-Z a-z 0-9 _ -``).
        api_url: the Bot API server, e.g. ``https://api.telegram.org``.
        store_url: a store with an inbox: ``sqlite:///…``, ``postgresql://…``, ``redis://…``.
        webhook_url: if given, ``setWebhook`` to it (with ``secret``) at start-up.

    Raises:
        ConfigurationError: a malformed secret, or a store without an inbox.
    """
    idem = Idem(store_url)
    bot = Bot(token, session=AiohttpSession(api=TelegramAPIServer.from_base(api_url)))
    dp = Dispatcher()
    IdempotencyMiddleware(idem).setup(dp)  # binds each update for @idempotent
    dp.include_router(router)

    worker = InboxWorker(idem.store.inbox(), inbox_dispatch(dp, bot), concurrency=8, lease=60)
    ingress = WebhookIngress(idem, bot_id=bot.id, secret_token=secret)

    async def on_startup(_app: web.Application) -> None:
        await dp.emit_startup(bot=bot)  # a wiring mistake raises here, before any update
        if webhook_url:
            await bot.set_webhook(webhook_url, secret_token=secret)

    async def on_cleanup(_app: web.Application) -> None:
        await dp.emit_shutdown(bot=bot)
        await bot.session.close()
        await idem.close()

    app = web.Application()
    # POST /webhook feeds the inbox; the worker starts with the app and stops with it
    # (in-flight entries finish within its grace, the rest go back to the inbox), and
    # wakes as soon as an update is admitted.
    register(app, "/webhook", ingress, worker=worker)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module doc); returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.webhook_inbox",
        description="A fast-ack webhook bot on the durable inbox. "
        "BOT_TOKEN: the bot token; WEBHOOK_SECRET: the webhook's secret_token.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get("PORT", "8080")), help="env PORT"
    )
    parser.add_argument(
        "--api-url",
        default=os.environ.get("TELEGRAM_API_URL", "https://api.telegram.org"),
        help="Bot API server (env TELEGRAM_API_URL; default Telegram's)",
    )
    parser.add_argument(
        "--store",
        default=os.environ.get("IDEM_STORE_URL", "sqlite:///webhook_inbox.db"),
        help="store URL with an inbox (env IDEM_STORE_URL; default sqlite:///webhook_inbox.db)",
    )
    parser.add_argument(
        "--webhook-url",
        default=os.environ.get("WEBHOOK_URL"),
        help="public URL of POST /webhook to give setWebhook at start-up (env WEBHOOK_URL)",
    )
    args = parser.parse_args(argv)
    token = os.environ.get("BOT_TOKEN")
    secret = os.environ.get("WEBHOOK_SECRET")
    if not token or not secret:
        parser.error(
            "set BOT_TOKEN (from @BotFather) and WEBHOOK_SECRET (1-256 of A-Z a-z 0-9 _ -)"
        )
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    app = build_app(
        token=token,
        secret=secret,
        api_url=args.api_url,
        store_url=args.store,
        webhook_url=args.webhook_url,
    )
    web.run_app(app, host=args.host, port=args.port)  # until SIGINT/SIGTERM
    return 0
