"""Fixtures of the aiogram tests: the fake Bot API on loopback and a real aiogram ``Bot``
talking to it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer

from telegram_idem.testing.bot_api import FakeBotAPI

TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"


@pytest.fixture
async def api() -> AsyncIterator[FakeBotAPI]:
    """The fake Bot API; a short long-poll cap so polling tests stop promptly."""
    async with FakeBotAPI(long_poll_cap=0.05) as fake:
        yield fake


@pytest.fixture
async def bot(api: FakeBotAPI) -> AsyncIterator[Bot]:
    """An aiogram ``Bot`` whose session talks to :func:`api`."""
    session = AiohttpSession(api=TelegramAPIServer.from_base(api.url))
    async with Bot(token=TOKEN, session=session) as client:
        yield client
