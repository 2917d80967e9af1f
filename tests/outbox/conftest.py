"""Fixtures of the outbound tests (helpers in outbox_support.py)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest
from outbox.outbox_support import ScriptedAPI

from telegram_idem.testing.bot_api import FakeBotAPI


@pytest.fixture
async def fake_api() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI() as api:
        yield api


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedAPI]:
    async with ScriptedAPI() as api:
        yield api


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
