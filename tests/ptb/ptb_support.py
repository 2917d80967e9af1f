"""Shared by the PTB tests: a real ``Application`` against FakeBotAPI, fed as PTB's
updater feeds it (through ``update_queue``, so the update processor runs)."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from telegram import Update
from telegram.ext import Application, ApplicationBuilder

from telegram_idem import Idem
from telegram_idem.adapters.ptb import IdempotentUpdateProcessor
from telegram_idem.testing.bot_api import FakeBotAPI

TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"
BOT = 7000000001

App = Application[Any, Any, Any, Any, Any, Any]


def build(api: FakeBotAPI, idem: Idem, *, concurrency: int = 1, **options: Any) -> App:
    """An application against FakeBotAPI guarded by an ``IdempotentUpdateProcessor``."""
    app: App = (
        ApplicationBuilder()
        .token(TOKEN)
        .base_url(api.ptb_base_url)
        .base_file_url(f"{api.url}/file/bot")
        .concurrent_updates(IdempotentUpdateProcessor(idem, concurrency, **options))
        .build()
    )
    return app


@asynccontextmanager
async def running(app: App) -> AsyncIterator[App]:
    """Initialised (getMe on FakeBotAPI) and started (the update fetcher runs)."""
    await app.initialize()
    await app.start()
    try:
        yield app
    finally:
        await app.stop()
        await app.shutdown()


async def feed(app: App, *payloads: dict[str, Any]) -> None:
    """Queue the updates as the PTB updater does and wait until all are processed."""
    for payload in payloads:
        await app.update_queue.put(Update.de_json(copy.deepcopy(payload), app.bot))
    await app.update_queue.join()


def in_chat(update: dict[str, Any], update_id: int, chat_id: int) -> dict[str, Any]:
    """The same message under another ``update_id``, sent in chat ``chat_id``."""
    copied = copy.deepcopy(update)
    copied["update_id"] = update_id
    copied["message"]["chat"]["id"] = chat_id
    copied["message"]["message_id"] = update_id % 100_000
    return copied
