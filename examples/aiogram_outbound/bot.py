"""An aiogram 3 bot whose replies are sent once, with telegram-idem's outbox.

Every text message gets one reply, ``Noted: <text>``. The reply is a plain
``message.answer(...)``; what makes it safe is the wiring:

- the **update guard** (``IdempotencyMiddleware``) drops an update delivered again once
  it was handled;
- the **action guard** (``@idempotent``) on the handler gives the reply an *effect key*;
- the **outbox** (``OutboxSessionMiddleware`` on the bot's session, ``Outbound.for_store``
  on the guard's store) records Telegram's answer under that key the moment it arrives.
  A handler that dies after its reply went out and runs again gets the first answer back:
  nothing is sent twice. A reply whose answer was lost (the connection dropped after the
  request was written) may or may not have been delivered: it is held as *unknown*
  (``UnknownOutcomeError``), never sent again by itself; :func:`on_unknown` logs it;
- **flood control** (part of ``Outbound.for_store``) paces every call by budgets kept in
  the store, so every process of the bot stays inside Telegram's limits together, and a
  429 pauses all of them.

Run it with a real bot token (from @BotFather)::

    BOT_TOKEN=123456:ABC... python -m examples.aiogram_outbound

``--api-url`` (or ``TELEGRAM_API_URL``) points it at another Bot API server, ``--store``
(or ``IDEM_STORE_URL``) at another store with an outbox (default
``sqlite:///aiogram_outbound.db``). It polls until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiogram import Bot, Dispatcher, F
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.filters import ExceptionTypeFilter
from aiogram.types import ErrorEvent, Message

from telegram_idem import Idem, UnknownOutcomeError, idempotent
from telegram_idem.adapters.aiogram import IdempotencyMiddleware, OutboxSessionMiddleware
from telegram_idem.outbox import Outbound

log = logging.getLogger("examples.aiogram_outbound")


def reply_to(text: str) -> str:
    """The bot's reply to ``text``."""
    return f"Noted: {text}"


@idempotent(key="reply:{message.chat.id}:{message.message_id}")
async def on_text(message: Message) -> None:
    # Inside the action, this call is durable: a second run of the action for this
    # message gets the first run's answer (the same Message) and sends nothing.
    assert message.text is not None
    await message.answer(reply_to(message.text))


async def on_unknown(event: ErrorEvent) -> bool:
    # The reply may or may not have reached the chat: it is never re-sent by itself.
    # A person (or the bot) settles it: outbox.resolve(key, ...) or outbox.redrive(key).
    assert isinstance(event.exception, UnknownOutcomeError)
    log.warning("reply held as unknown, not sent again: %s", event.exception.key)
    return True  # handled: aiogram logs no traceback


def build_dispatcher(idem: Idem) -> Dispatcher:
    """The dispatcher with the update guard and this module's handlers."""
    dp = Dispatcher()
    IdempotencyMiddleware(idem).setup(dp)  # the update guard; wiring checked at start-up
    dp.message.register(on_text, F.text)
    dp.errors.register(on_unknown, ExceptionTypeFilter(UnknownOutcomeError))
    return dp


@asynccontextmanager
async def connected(
    token: str, api_url: str, store_url: str
) -> AsyncIterator[tuple[Bot, Dispatcher]]:
    """The bot (its calls through the outbox) and its dispatcher, with the outbox's relay
    running; everything is closed on leaving.

    Args:
        token: the bot token, ``<bot id>:<secret>``.
        api_url: the Bot API server, e.g. ``https://api.telegram.org``.
        store_url: a store with an outbox, e.g. ``sqlite:///bot.db``.

    Raises:
        ConfigurationError: a bad store URL, or a store without an outbox.
    """
    idem = Idem(store_url)
    try:
        # Calls kept in the guard's store, paced by its flood budgets (Telegram's limits).
        outbound = Outbound.for_store(idem.store, token=token, base_url=api_url, keys=idem.keys)
        bot = Bot(token, session=AiohttpSession(api=TelegramAPIServer.from_base(api_url)))
        bot.session.middleware(OutboxSessionMiddleware(outbound))
        async with outbound:  # its relay sends retries and what a crash left behind
            try:
                yield bot, build_dispatcher(idem)
            finally:
                await bot.session.close()
    finally:
        await idem.close()


async def run(token: str, api_url: str, store_url: str) -> None:
    """Poll ``getUpdates`` at ``api_url`` until SIGINT or SIGTERM (arguments as
    :func:`connected`).

    Raises:
        ConfigurationError: a bad store URL, a store without an outbox, or a wiring
            mistake found at start-up.
        aiogram.exceptions.TelegramAPIError: the Bot API refused ``deleteWebhook``.
    """
    async with connected(token, api_url, store_url) as (bot, dp):
        await bot.delete_webhook(drop_pending_updates=False)  # getUpdates fails while one is set
        await dp.start_polling(bot)  # stops on SIGINT/SIGTERM


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module doc); returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.aiogram_outbound",
        description="An aiogram bot whose replies are sent once. BOT_TOKEN: the bot token.",
    )
    parser.add_argument(
        "--api-url",
        default=os.environ.get("TELEGRAM_API_URL", "https://api.telegram.org"),
        help="Bot API server (env TELEGRAM_API_URL; default Telegram's)",
    )
    parser.add_argument(
        "--store",
        default=os.environ.get("IDEM_STORE_URL", "sqlite:///aiogram_outbound.db"),
        help="store URL (env IDEM_STORE_URL; default sqlite:///aiogram_outbound.db)",
    )
    args = parser.parse_args(argv)
    token = os.environ.get("BOT_TOKEN")
    if not token:
        parser.error("set BOT_TOKEN to the bot's token (from @BotFather)")
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    asyncio.run(run(token, args.api_url, args.store))
    return 0
