"""One sending process of benchmarks/outbound.py's flood measure (run by it, two at once).

Usage: python benchmarks/_outbound_sender.py KIND API_URL INDEX PROCESSES MESSAGES CHATS [STORE_URL [LIMITS]]

KIND:

- ``aiogram``: aiogram 3's ``bot.send_message`` with its default session, no limiter; a
  429 (``TelegramRetryAfter``) waits its ``retry_after`` and sends that message again;
- ``ptb``: python-telegram-bot's ``ExtBot`` with ``AIORateLimiter`` (its defaults: 30/s
  overall, per process; ``max_retries=5``), a ``RetryAfter`` that still escapes waits and
  sends again;
- ``relay``: our relay delivering the outbox of STORE_URL (the parent enqueued every
  message beforehand), paced by ``FloodControl`` on the same store with the limits LIMITS
  names (:func:`limits_of`; default FloodControl's own, ``Limits().with_headroom()``); it stops when the outbox has nothing
  live left.

``aiogram`` and ``ptb`` send message ``j`` (of ``MESSAGES``, to chat ``j % CHATS``) when
``(j // CHATS) % PROCESSES == INDEX``, so every chat gets messages from every process, one
task per chat sending its messages in order. Prints ``ready`` once set up, waits for a
line on stdin, sends, then prints one JSON line ``{"elapsed": s, "sent": n,
"retry_after_seen": n}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
import time
import warnings
from collections.abc import Awaitable, Callable

from telegram_idem.flood import Limits, Rate

TOKEN = "7000000001:AAbenchOutboundFloodControl0000000"
BOT_ID = 7000000001
CHAT_BASE = 5550000000
"""Private chats (positive ids): the global budget binds, not a group's."""


def chat_of(j: int, chats: int) -> int:
    """The chat of message ``j``."""
    return CHAT_BASE + j % chats


def text_of(j: int) -> str:
    """A typical reply of about 100 characters."""
    head = f"Message {j:05d}: your order was received and will be processed shortly. "
    return (head + "Thank you for your patience!")[:100]


def share(index: int, processes: int, messages: int, chats: int) -> dict[int, list[int]]:
    """This process's messages, by chat, in order."""
    mine: dict[int, list[int]] = {}
    for j in range(messages):
        if (j // chats) % processes == index:
            mine.setdefault(chat_of(j, chats), []).append(j)
    return mine


Send = Callable[[int, int], Awaitable[None]]


async def per_chat(work: dict[int, list[int]], send: Send) -> int:
    """One task per chat, each sending its messages in order; how many were sent."""

    async def chat(chat_id: int, js: list[int]) -> int:
        for j in js:
            await send(chat_id, j)
        return len(js)

    return sum(await asyncio.gather(*(chat(c, js) for c, js in work.items())))


async def go() -> None:
    """Wait for the parent's start line (the other process is ready too)."""
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)


async def run_aiogram(url: str, work: dict[int, list[int]]) -> dict[str, float]:
    from aiogram import Bot
    from aiogram.client.session.aiohttp import AiohttpSession
    from aiogram.client.telegram import TelegramAPIServer
    from aiogram.exceptions import TelegramRetryAfter

    bot = Bot(TOKEN, session=AiohttpSession(api=TelegramAPIServer.from_base(url)))
    seen = 0

    async def send(chat_id: int, j: int) -> None:
        nonlocal seen
        while True:
            try:
                await bot.send_message(chat_id, text_of(j))
                return
            except TelegramRetryAfter as exc:
                seen += 1
                await asyncio.sleep(exc.retry_after)

    try:
        await bot.get_me()  # the connection pool warm, outside the timing
        await go()
        start = time.monotonic()
        sent = await per_chat(work, send)
        elapsed = time.monotonic() - start
    finally:
        await bot.session.close()
    return {"elapsed": elapsed, "sent": sent, "retry_after_seen": seen}


async def run_ptb(url: str, work: dict[int, list[int]]) -> dict[str, float]:
    from telegram.error import RetryAfter
    from telegram.ext import AIORateLimiter, ExtBot
    from telegram.request import HTTPXRequest

    warnings.simplefilter("ignore")  # PTB 22.2+ deprecates RetryAfter.retry_after as int
    bot: ExtBot[int] = ExtBot(
        TOKEN,
        base_url=f"{url}/bot",
        request=HTTPXRequest(connection_pool_size=128),
        rate_limiter=AIORateLimiter(max_retries=5),
    )
    seen = 0

    async def send(chat_id: int, j: int) -> None:
        nonlocal seen
        while True:
            try:
                await bot.send_message(chat_id, text_of(j))
                return
            except RetryAfter as exc:
                seen += 1
                wait = exc.retry_after
                await asyncio.sleep(wait if isinstance(wait, int | float) else wait.total_seconds())

    await bot.initialize()  # getMe, the rate limiter started
    try:
        await go()
        start = time.monotonic()
        sent = await per_chat(work, send)
        elapsed = time.monotonic() - start
    finally:
        await bot.shutdown()
    return {"elapsed": elapsed, "sent": sent, "retry_after_seen": seen}


def limits_of(spec: str) -> Limits | None:
    """``default`` (``None``: FloodControl's default, ``Limits().with_headroom()``),
    ``exact`` (``Limits()``, exactly the fake's), ``scaled:F`` (``Limits().scaled(F)``) or
    ``headroom:N`` (``Limits()`` with the global burst ``N`` calls smaller, its rate kept) or
    ``jitter:J`` (``Limits().with_headroom(J)``: room for J seconds of delay spread)."""
    kind, _, value = spec.partition(":")
    if kind == "jitter":
        return Limits().with_headroom(float(value))
    if kind == "scaled":
        return Limits().scaled(float(value))
    if kind == "headroom":
        g = Limits().global_
        return dataclasses.replace(Limits(), global_=Rate(g.calls, g.per, g.burst - int(value)))
    if kind == "exact":
        return Limits()
    return None


async def run_relay(url: str, store_url: str, spec: str) -> dict[str, float]:
    from telegram_idem.backends import store_from_url
    from telegram_idem.backends._abilities import outbox_of
    from telegram_idem.flood import FloodControl
    from telegram_idem.outbox import CallStatus, HttpBotAPI, Relay

    store = store_from_url(store_url)
    outbox = outbox_of(store)
    api = HttpBotAPI(TOKEN, base_url=url)
    flood = FloodControl.for_store(store, bot_id=BOT_ID, limits=limits_of(spec))
    relay = Relay(outbox, api, bot_id=BOT_ID, flood=flood)
    try:
        await outbox.counts(bot_id=BOT_ID)  # connected, outside the timing
        await api.call("getMe", b"{}")
        await go()
        start = time.monotonic()
        task = asyncio.create_task(relay.run())
        while not task.done():
            counts = await outbox.counts(bot_id=BOT_ID)
            if not counts.get(CallStatus.PENDING) and not counts.get(CallStatus.IN_FLIGHT):
                break
            await asyncio.sleep(0.05)
        elapsed = time.monotonic() - start
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await api.close()
        await store.close()
    return {"elapsed": elapsed, "sent": 0, "retry_after_seen": 0}


async def main(argv: list[str]) -> None:
    kind, url = argv[0], argv[1]
    index, processes, messages, chats = (int(a) for a in argv[2:6])
    work = share(index, processes, messages, chats)
    if kind == "aiogram":
        out = await run_aiogram(url, work)
    elif kind == "ptb":
        out = await run_ptb(url, work)
    elif kind == "relay":
        out = await run_relay(url, argv[6], argv[7] if len(argv) > 7 else "default")
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
