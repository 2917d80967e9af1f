"""A minimal aiogram 3 bot on long polling, made duplicate-safe with telegram-idem.

``/start`` answers with an [Approve] button. A tap approves the order once, however many
times the button is tapped, and every tap is answered:

- the **update guard** (``IdempotencyMiddleware``) drops an update delivered again (the
  same ``update_id``: a poller re-reading a batch, two pollers by mistake) before any
  handler sees it;
- the **action guard** (``@idempotent``) runs ``approve`` once per message, so a double
  tap — two updates with two ``update_id`` values — approves once.

Run it with a real bot token (from @BotFather)::

    BOT_TOKEN=123456:ABC... python -m examples.aiogram_minimal

``--api-url`` (or ``TELEGRAM_API_URL``) points it at another Bot API server, ``--store``
(or ``IDEM_STORE_URL``) at another store (default ``sqlite:///aiogram_minimal.db``). It
polls until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from aiogram import Bot, Dispatcher, F, Router
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.filters import CommandStart
from aiogram.types import CallbackQuery, InlineKeyboardButton, InlineKeyboardMarkup, Message

from telegram_idem import Idem, idempotent
from telegram_idem.adapters.aiogram import IdempotencyMiddleware

PROMPT = "Approve the order?"
APPROVED = "Order approved ✅"
BUTTON = InlineKeyboardMarkup(
    inline_keyboard=[[InlineKeyboardButton(text="Approve", callback_data="approve")]]
)

router = Router()


@router.message(CommandStart())
async def on_start(message: Message) -> None:
    # Runs once per update: a second delivery of this /start never reaches it.
    await message.answer(PROMPT, reply_markup=BUTTON)


@idempotent(key="approve:{callback_query.message.message_id}", in_progress="wait")
async def approve(bot: Bot, chat_id: int) -> str:
    # The action, once per message carrying the button. A second tap while this runs
    # waits for it (in_progress="wait") and gets the stored result back without running.
    await bot.send_message(chat_id, APPROVED)
    return "Approved"


@router.callback_query(F.data == "approve")
async def on_approve(query: CallbackQuery, bot: Bot) -> None:
    assert query.message is not None  # the button sits on a message this bot sent
    text = await approve(bot, query.message.chat.id)
    # Outside the guarded action: every tap is answered, or its client keeps spinning.
    await query.answer(text)


def build_dispatcher(idem: Idem) -> Dispatcher:
    """The dispatcher with the update guard and this module's handlers.

    Call once per process (aiogram attaches ``router`` to one dispatcher only).
    """
    dp = Dispatcher()
    IdempotencyMiddleware(idem).setup(dp)  # the update guard; wiring checked at start-up
    dp.include_router(router)
    return dp


async def run(token: str, api_url: str, store_url: str) -> None:
    """Poll ``getUpdates`` at ``api_url`` until SIGINT or SIGTERM.

    Args:
        token: the bot token, ``<bot id>:<secret>``.
        api_url: the Bot API server, e.g. ``https://api.telegram.org``.
        store_url: where the guards keep their records, e.g. ``sqlite:///bot.db``.

    Raises:
        ConfigurationError: a bad store URL, or a wiring mistake found at start-up.
        aiogram.exceptions.TelegramAPIError: the Bot API refused ``deleteWebhook``.
    """
    idem = Idem(store_url)
    bot = Bot(token, session=AiohttpSession(api=TelegramAPIServer.from_base(api_url)))
    dp = build_dispatcher(idem)
    try:
        await bot.delete_webhook(drop_pending_updates=False)  # getUpdates fails while one is set
        await dp.start_polling(bot)  # stops on SIGINT/SIGTERM, closing the bot's session
    finally:
        await bot.session.close()
        await idem.close()


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module doc); returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.aiogram_minimal",
        description="A duplicate-safe aiogram bot on long polling. BOT_TOKEN: the bot token.",
    )
    parser.add_argument(
        "--api-url",
        default=os.environ.get("TELEGRAM_API_URL", "https://api.telegram.org"),
        help="Bot API server (env TELEGRAM_API_URL; default Telegram's)",
    )
    parser.add_argument(
        "--store",
        default=os.environ.get("IDEM_STORE_URL", "sqlite:///aiogram_minimal.db"),
        help="store URL (env IDEM_STORE_URL; default sqlite:///aiogram_minimal.db)",
    )
    args = parser.parse_args(argv)
    token = os.environ.get("BOT_TOKEN")
    if not token:
        parser.error("set BOT_TOKEN to the bot's token (from @BotFather)")
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    asyncio.run(run(token, args.api_url, args.store))
    return 0
