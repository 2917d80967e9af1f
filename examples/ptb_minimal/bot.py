"""A minimal python-telegram-bot 22 bot on long polling, made duplicate-safe with telegram-idem.

``/start`` answers with an [Approve] button. A tap approves the order once, however many
times the button is tapped, and every tap is answered:

- the **update guard** (``IdempotentUpdateProcessor``, PTB's update processor) drops an
  update delivered again (the same ``update_id``) before any handler sees it, and runs
  the updates of one chat in order;
- the **action guard** (``telegram_idem.adapters.ptb.idempotent``) runs ``approve`` once
  per message, so a double tap — two updates with two ``update_id`` values — approves once.

Run it with a real bot token (from @BotFather)::

    BOT_TOKEN=123456:ABC... python -m examples.ptb_minimal

``--api-url`` (or ``TELEGRAM_API_URL``) points it at another Bot API server, ``--store``
(or ``IDEM_STORE_URL``) at another store (default ``sqlite:///ptb_minimal.db``). It polls
until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Update
from telegram.ext import (
    Application,
    ApplicationBuilder,
    CallbackQueryHandler,
    CommandHandler,
    ContextTypes,
)

from telegram_idem import Idem
from telegram_idem.adapters.ptb import IdempotentUpdateProcessor, idempotent

PROMPT = "Approve the order?"
APPROVED = "Order approved ✅"
BUTTON = InlineKeyboardMarkup([[InlineKeyboardButton("Approve", callback_data="approve")]])

App = Application[Any, Any, Any, Any, Any, Any]
"""PTB's ``Application``, generic in six types (bot, context, user/chat/bot data, job queue)."""


async def on_start(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    # Runs once per update: a second delivery of this /start never reaches it.
    assert update.effective_message is not None
    await update.effective_message.reply_text(PROMPT, reply_markup=BUTTON)


# PTB callbacks take telegram_idem.adapters.ptb.idempotent (it binds the callback's update).
@idempotent(key="approve:{callback_query.message.message_id}", in_progress="wait")
async def approve(update: Update, context: ContextTypes.DEFAULT_TYPE) -> str:
    # The action, once per message carrying the button. A second tap waits for it and
    # gets the stored result back without running.
    assert update.effective_chat is not None
    await context.bot.send_message(update.effective_chat.id, APPROVED)
    return "Approved"


async def on_approve(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    assert update.callback_query is not None
    text = await approve(update, context)
    # Outside the guarded action: every tap is answered, or its client keeps spinning.
    await update.callback_query.answer(text)


def build_application(token: str, api_url: str, idem: Idem) -> App:
    """The PTB application with the update guard as its update processor.

    Args:
        token: the bot token, ``<bot id>:<secret>``.
        api_url: the Bot API server, e.g. ``https://api.telegram.org``.
        idem: the guard; closed by the application's ``post_shutdown``.
    """

    async def close_idem(application: App) -> None:
        await idem.close()  # the guard is ours: close it after PTB stopped

    app = (
        ApplicationBuilder()
        .token(token)
        .base_url(f"{api_url}/bot")
        .concurrent_updates(IdempotentUpdateProcessor(idem, 8))  # 8 updates at once
        .post_shutdown(close_idem)
        .build()
    )
    app.add_handler(CommandHandler("start", on_start))
    app.add_handler(CallbackQueryHandler(on_approve, pattern="^approve$"))
    return app


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module doc); returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.ptb_minimal",
        description="A duplicate-safe PTB bot on long polling. BOT_TOKEN: the bot token.",
    )
    parser.add_argument(
        "--api-url",
        default=os.environ.get("TELEGRAM_API_URL", "https://api.telegram.org"),
        help="Bot API server (env TELEGRAM_API_URL; default Telegram's)",
    )
    parser.add_argument(
        "--store",
        default=os.environ.get("IDEM_STORE_URL", "sqlite:///ptb_minimal.db"),
        help="store URL (env IDEM_STORE_URL; default sqlite:///ptb_minimal.db)",
    )
    args = parser.parse_args(argv)
    token = os.environ.get("BOT_TOKEN")
    if not token:
        parser.error("set BOT_TOKEN to the bot's token (from @BotFather)")
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    app = build_application(token, args.api_url, Idem(args.store))
    # Deletes a webhook first (Telegram refuses getUpdates while one is set), polls until
    # SIGINT/SIGTERM, lets running updates finish, then runs post_shutdown.
    app.run_polling()
    return 0
