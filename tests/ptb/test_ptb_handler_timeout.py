"""Item: a hung handler no longer freezes its chat under ``IdempotentUpdateProcessor``.

With ``ordered=True`` the next update of a chat waits for the one before it; a handler
that awaits forever kept the whole chat (and ``app.stop()``) waiting for good. Past
``handler_timeout`` seconds the run is cancelled, its claim released, the TimeoutError
handed to PTB's error handlers, and the chat moves on. Real ``Application``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from ptb_support import BOT, App, build, in_chat, running
from telegram import Update
from telegram.ext import ContextTypes, MessageHandler, filters

from telegram_idem import Idem
from telegram_idem._records import Outcome
from telegram_idem.adapters.ptb import IdempotentUpdateProcessor
from telegram_idem.testing._delivery import load_fixture
from telegram_idem.testing.bot_api import FakeBotAPI

Ctx = ContextTypes.DEFAULT_TYPE
CHAT = 5550001001
GUARD = 10.0  # seconds: only to turn a hang into a failure, never a speed bound


@pytest.fixture
async def api() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI() as fake:
        yield fake


@pytest.fixture
async def idem() -> AsyncIterator[Idem]:
    guard = Idem("memory://")
    yield guard
    await guard.close()


def message(app: App, update_id: int) -> Update:
    return Update.de_json(in_chat(load_fixture("techpost_command"), update_id, CHAT), app.bot)


async def test_a_hung_handler_is_cancelled_and_its_chat_moves_on(
    api: FakeBotAPI, idem: Idem
) -> None:
    ran: list[int] = []
    errors: list[BaseException | None] = []
    next_ran = asyncio.Event()

    async def on_message(update: Update, context: Ctx) -> None:
        ran.append(update.update_id)
        if update.update_id == 1:
            await asyncio.Event().wait()  # hangs forever
        next_ran.set()

    async def on_error(update: object, context: Ctx) -> None:
        errors.append(context.error)

    app = build(api, idem, concurrency=4, handler_timeout=0.5)
    app.add_handler(MessageHandler(filters.ALL, on_message))
    app.add_error_handler(on_error)
    async with asyncio.timeout(GUARD):  # app.stop() did not return either
        async with running(app):
            await app.update_queue.put(message(app, 1))
            await app.update_queue.put(message(app, 2))
            await next_ran.wait()
    assert ran == [1, 2]
    assert len(errors) == 1 and isinstance(errors[0], TimeoutError)
    # The claim was released: a re-delivery (or a takeover) may run it again.
    again = await idem.claim_update(in_chat(load_fixture("techpost_command"), 1, CHAT), bot_id=BOT)
    assert again.outcome is Outcome.ACQUIRED


def test_handler_timeout_must_be_positive_or_none(idem: Idem) -> None:
    with pytest.raises(ValueError, match="handler_timeout"):
        IdempotentUpdateProcessor(idem, handler_timeout=0)
    assert IdempotentUpdateProcessor(idem, handler_timeout=None).handler_timeout is None
    assert IdempotentUpdateProcessor(idem).handler_timeout == 900.0
