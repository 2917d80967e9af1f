"""The fake Bot API of benchmarks/outbound.py, in a process of its own (run by it).

Usage: python benchmarks/_outbound_fake.py [--no-limits]

Serves a :class:`~telegram_idem.testing.bot_api.FakeBotAPI` enforcing Telegram's default
limits (``Limits()``: 30 messages/s in all, about 1/s per private chat; it answers 429 like
Telegram) on a free loopback port, prints its base URL on one line, and serves until its
stdin closes. Then it prints one JSON line about ``sendMessage``:
``{"ok_at": [seconds since the first request, of each accepted call], "throttled": n,
"other": n, "limit_429s": n}`` (429 answers; any other failure; every call the enforced
limits answered 429, whatever its method) and exits.

Its own process, so the senders under test never share its event loop.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from telegram_idem.flood import Limits
from telegram_idem.testing.bot_api import FakeBotAPI

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class CountingBotAPI(FakeBotAPI):
    """The fake, counting each ``sendMessage`` answer by its status as it leaves."""

    def __init__(self, *, limits: Limits | None) -> None:
        super().__init__(limits=limits)
        self.ok_at: list[float] = []
        self.throttled = 0
        self.other = 0
        self.first: float | None = None

    def make_app(self) -> web.Application:
        app = super().make_app()
        app.middlewares.append(self._count)
        return app

    @web.middleware
    async def _count(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        response = await handler(request)
        if request.match_info.get("method", "").lower() == "sendmessage":
            if response.status == 200:
                self.ok_at.append(time.monotonic() - self.first)
            elif response.status == 429:
                self.throttled += 1
            else:
                self.other += 1
        return response


async def serve(limits: Limits | None) -> None:
    api = CountingBotAPI(limits=limits)
    await api.start()
    try:
        print(api.url, flush=True)
        await asyncio.to_thread(sys.stdin.read)  # until the parent closes our stdin
    finally:
        await api.close()
    print(
        json.dumps(
            {
                "ok_at": api.ok_at,
                "throttled": api.throttled,
                "other": api.other,
                "limit_429s": api.limit_429s,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(serve(None if "--no-limits" in sys.argv[1:] else Limits()))
