"""A python-telegram-bot 22 bot whose replies are sent once, with telegram-idem's outbox.

Every text message gets one reply, ``Noted: <text>``. The reply is a plain
``update.message.reply_text(...)``; what makes it safe is the wiring:

- the **update guard** (``IdempotentUpdateProcessor``) drops an update delivered again
  once it was handled;
- the **action guard** (``telegram_idem.adapters.ptb.idempotent``) on the callback gives
  the reply an *effect key*;
- the **outbox** (``OutboxRateLimiter``, ``Outbound.for_store`` on the guard's store)
  records Telegram's answer under that key the moment it arrives. A callback that dies
  after its reply went out and runs again gets the first answer back: nothing is sent
  twice. A reply whose answer was lost (the connection dropped after the request was
  written) may or may not have been delivered: it is held as *unknown*
  (``UnknownOutcomeError``), never sent again by itself; :func:`on_error` logs it;
- **flood control** (part of ``Outbound.for_store``) paces every call by budgets kept in
  the store, so every process of the bot stays inside Telegram's limits together, and a
  429 pauses all of them.

Run it with a real bot token (from @BotFather)::

    BOT_TOKEN=123456:ABC... python -m examples.ptb_outbound

``--api-url`` (or ``TELEGRAM_API_URL``) points it at another Bot API server, ``--store``
(or ``IDEM_STORE_URL``) at another store with an outbox (default
``sqlite:///ptb_outbound.db``). It polls until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import os
from contextlib import AsyncExitStack
from typing import Any

from telegram import Update
from telegram.ext import Application, ApplicationBuilder, ContextTypes, MessageHandler, filters

from telegram_idem import Idem, UnknownOutcomeError
from telegram_idem.adapters.ptb import IdempotentUpdateProcessor, OutboxRateLimiter, idempotent
from telegram_idem.outbox import Outbound

log = logging.getLogger("examples.ptb_outbound")

App = Application[Any, Any, Any, Any, Any, Any]
"""PTB's ``Application``, generic in six types (bot, context, user/chat/bot data, job queue)."""


def reply_to(text: str) -> str:
    """The bot's reply to ``text``."""
    return f"Noted: {text}"


@idempotent(key="reply:{message.chat.id}:{message.message_id}")
async def on_text(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
    # Inside the action, this call is durable: a second run of the action for this
    # message gets the first run's answer (the same Message) and sends nothing.
    assert update.message is not None and update.message.text is not None
    await update.message.reply_text(reply_to(update.message.text))


async def on_error(update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
    error = context.error
    if isinstance(error, UnknownOutcomeError):
        # The reply may or may not have reached the chat: it is never re-sent by itself.
        # A person (or the bot) settles it: outbox.resolve(key, ...) or outbox.redrive(key).
        log.warning("reply held as unknown, not sent again: %s", error.key)
        return
    log.error("an update failed", exc_info=error)


def build_application(token: str, api_url: str, idem: Idem, outbound: Outbound) -> App:
    """The PTB application: the update guard as its update processor, every Bot API call
    through ``outbound``.

    Under ``run_polling`` the application starts ``outbound``'s relay (``post_init``) and
    closes it and ``idem`` (``post_shutdown``); otherwise the caller runs
    ``async with outbound`` and closes ``idem``.

    Args:
        token: the bot token, ``<bot id>:<secret>``.
        api_url: the Bot API server, e.g. ``https://api.telegram.org``.
        idem: the guard.
        outbound: the outbox's sender on ``idem``'s store.
    """
    running = AsyncExitStack()

    async def start(application: App) -> None:
        await running.enter_async_context(outbound)  # its relay sends retries and leftovers

    async def close(application: App) -> None:
        await running.aclose()
        await idem.close()

    app: App = (
        ApplicationBuilder()
        .token(token)
        .base_url(f"{api_url}/bot")
        .concurrent_updates(IdempotentUpdateProcessor(idem, 8))
        .rate_limiter(OutboxRateLimiter(outbound))  # every call through the outbox
        .post_init(start)
        .post_shutdown(close)
        .build()
    )
    app.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, on_text))
    app.add_error_handler(on_error)
    return app


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module doc); returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.ptb_outbound",
        description="A PTB bot whose replies are sent once. BOT_TOKEN: the bot token.",
    )
    parser.add_argument(
        "--api-url",
        default=os.environ.get("TELEGRAM_API_URL", "https://api.telegram.org"),
        help="Bot API server (env TELEGRAM_API_URL; default Telegram's)",
    )
    parser.add_argument(
        "--store",
        default=os.environ.get("IDEM_STORE_URL", "sqlite:///ptb_outbound.db"),
        help="store URL (env IDEM_STORE_URL; default sqlite:///ptb_outbound.db)",
    )
    args = parser.parse_args(argv)
    token = os.environ.get("BOT_TOKEN")
    if not token:
        parser.error("set BOT_TOKEN to the bot's token (from @BotFather)")
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    idem = Idem(args.store)
    # Calls kept in the guard's store, paced by its flood budgets (Telegram's limits).
    outbound = Outbound.for_store(idem.store, token=token, base_url=args.api_url, keys=idem.keys)
    # Deletes a webhook first (Telegram refuses getUpdates while one is set), polls until
    # SIGINT/SIGTERM, lets running updates finish, then runs post_shutdown.
    build_application(token, args.api_url, idem, outbound).run_polling()
    return 0
