"""Helpers of the outbound tests: a scripted Bot API server on loopback (answers the
fake Bot API cannot give: a migration, a connection dropped after the request was read,
an answer that never comes), a flood budget over the store's clock, and a free port
nothing listens on."""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from telegram_idem.flood import Bucket, FloodBudget, decide
from telegram_idem.testing import LoopbackServer

TOKEN = "123456:SECRET-token_value-xyz"
BOT_ID = 123456


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted behaviour: answer ``body`` with ``status``; or ``drop`` the connection
    after reading the request; or ``hang`` for that many seconds first."""

    status: int = 200
    body: Any = None
    drop: bool = False
    hang: float = 0.0


class ScriptedAPI(LoopbackServer):
    """A Bot API on loopback that answers each method from a script, then ``ok``.

    Unscripted calls answer a Message for ``send*`` methods (one message id counter) and
    ``true`` for the rest. Every request is recorded as ``(method, params)``, and when it
    arrived (``time.time()``, the clock a ``ClockBudget(time.time)`` keeps) in ``arrived``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.arrived: list[float] = []
        self.tokens: list[str] = []
        self._script: dict[str, deque[Reply]] = {}
        self._next_id = 1

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/bot{token}/{method}", self._handle)
        return app

    def script(self, method: str, *replies: Reply) -> None:
        self._script.setdefault(method, deque()).extend(replies)

    def calls_of(self, method: str) -> list[dict[str, Any]]:
        return [p for m, p in self.calls if m == method]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        self.tokens.append(request.match_info["token"])
        params = await request.json() if request.can_read_body else {}
        self.calls.append((method, params))
        self.arrived.append(time.time())
        queue = self._script.get(method)
        reply = queue.popleft() if queue else None
        if reply is not None and reply.hang:
            await asyncio.sleep(reply.hang)
        if reply is not None and reply.drop:
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if reply is not None:
            return web.json_response(reply.body, status=reply.status)
        result: Any = True
        if method.startswith("send"):
            result = {
                "message_id": self._next_id,
                "chat": {"id": params.get("chat_id")},
                "text": params.get("text"),
            }
            self._next_id += 1
        return web.json_response({"ok": True, "result": result})


def error(code: int, description: str, **parameters: Any) -> Reply:
    """A Bot API error answer (Bot API "Making requests")."""
    body: dict[str, Any] = {"ok": False, "error_code": code, "description": description}
    if parameters:
        body["parameters"] = parameters
    return Reply(status=code, body=body)


class ClockBudget(FloodBudget):
    """A flood budget kept in a dict over a manual clock, by the contract's rule."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.tats: dict[str, float] = {}
        self.reservations = 0
        self.pauses = 0

    async def reserve(self, buckets: Sequence[Bucket]) -> float:
        now = self.clock()
        wait, new = decide([self.tats.get(b.key) for b in buckets], buckets, now)
        if wait == 0.0:
            self.reservations += 1
            for b, tat in zip(buckets, new, strict=True):
                self.tats[b.key] = tat
        return wait

    async def pause(self, key: str, seconds: float) -> None:
        self.pauses += 1
        self.tats[key] = max(self.tats.get(key, 0.0), self.clock() + seconds)

    async def paused_for(self, key: str) -> float:
        return max(self.tats.get(key, 0.0) - self.clock(), 0.0)


def body_of(params: dict[str, Any]) -> bytes:
    return json.dumps(params, separators=(",", ":"), sort_keys=True).encode()
