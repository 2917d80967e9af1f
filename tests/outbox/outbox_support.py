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
from dataclasses import dataclass, replace
from typing import Any, Literal

from aiohttp import web

from telegram_idem.flood import Bucket, FloodBudget, decide
from telegram_idem.outbox import CallStatus, NewCall, Outbox, OutboxEntry
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
    ``true`` for the rest. Every request is recorded as ``(method, params)``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, dict[str, Any]]] = []
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


class DictOutbox(Outbox):
    """The outbox contract over dicts and a manual clock (the tests' store until the
    memory store's outbox lands); one object shared by several relays is one store."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.rows: dict[str, OutboxEntry] = {}
        self.parked: set[tuple[int, str]] = set()
        self._seq = 0
        self.takes = 0

    def _put(self, entry: OutboxEntry, **changes: Any) -> OutboxEntry:
        new = replace(entry, **changes)
        self.rows[entry.key] = new
        return new

    async def enqueue(self, call: NewCall) -> tuple[OutboxEntry, bool]:
        if call.key in self.rows:
            return self.rows[call.key], False
        now = self.clock()
        self._seq += 1
        unit = call.unit
        parked = (call.bot_id, unit) in self.parked
        if call.collapse_key is not None:
            for old in list(self.rows.values()):
                if (
                    old.bot_id == call.bot_id
                    and old.collapse_key == call.collapse_key
                    and old.status is CallStatus.PENDING
                ):
                    self._put(
                        old,
                        status=CallStatus.SUPERSEDED,
                        settled_at=now,
                        result=json.dumps({"superseded_by": call.key}).encode(),
                    )
        entry = OutboxEntry(
            key=call.key,
            bot_id=call.bot_id,
            seq=self._seq,
            method=call.method,
            params=call.params,
            ordering_key=unit,
            collapse_key=call.collapse_key,
            policy=call.policy,
            priority=call.priority,
            retention=call.retention,
            status=CallStatus.PARKED if parked else CallStatus.PENDING,
            attempts=0,
            token=0,
            created_at=now,
            available_at=now,
            lease_expires_at=0.0,
            settled_at=now if parked else 0.0,
        )
        self.rows[call.key] = entry
        return entry, True

    def _live(self, e: OutboxEntry) -> bool:
        return e.status in (CallStatus.PENDING, CallStatus.IN_FLIGHT)

    async def take(
        self, *, bot_id: int, lease: float, ordering_key: str | None = None
    ) -> OutboxEntry | None:
        now = self.clock()
        heads: dict[str, OutboxEntry] = {}
        for e in sorted(self.rows.values(), key=lambda e: e.seq):
            if e.bot_id == bot_id and self._live(e) and e.ordering_key not in heads:
                heads[e.ordering_key] = e
        ready = [
            e
            for e in heads.values()
            if (ordering_key is None or e.ordering_key == ordering_key)
            and (
                (e.status is CallStatus.PENDING and e.available_at <= now)
                or (e.status is CallStatus.IN_FLIGHT and e.lease_expires_at <= now)
            )
        ]
        if not ready:
            return None
        best = min(ready, key=lambda e: (e.priority, e.seq))
        self.takes += 1
        return self._put(
            best,
            status=CallStatus.IN_FLIGHT,
            attempts=best.attempts + 1,
            token=best.token + 1 + self.takes,
            lease_expires_at=now + lease,
        )

    def _held(self, entry: OutboxEntry) -> bool:
        row = self.rows.get(entry.key)
        return row is not None and row.status is CallStatus.IN_FLIGHT and row.token == entry.token

    async def deliver(self, entry: OutboxEntry, *, result: bytes) -> bool:
        if not self._held(entry):
            return False
        self._put(
            self.rows[entry.key],
            status=CallStatus.DELIVERED,
            result=result,
            settled_at=self.clock(),
            lease_expires_at=0.0,
        )
        return True

    async def retry(
        self,
        entry: OutboxEntry,
        *,
        delay: float,
        error: str,
        params: bytes | None = None,
        ordering_key: str | None = None,
    ) -> bool:
        if not self._held(entry):
            return False
        row = self.rows[entry.key]
        self._put(
            row,
            status=CallStatus.PENDING,
            available_at=self.clock() + delay,
            lease_expires_at=0.0,
            last_error=error,
            params=params if params is not None else row.params,
            ordering_key=ordering_key if ordering_key is not None else row.ordering_key,
        )
        return True

    async def settle(
        self,
        entry: OutboxEntry,
        *,
        status: Literal[CallStatus.DEAD, CallStatus.UNKNOWN],
        error: str,
    ) -> bool:
        if not self._held(entry):
            return False
        self._put(self.rows[entry.key], status=status, last_error=error, settled_at=self.clock())
        return True

    async def park(self, entry: OutboxEntry, *, error: str) -> bool:
        if not self._held(entry):
            return False
        unit = (entry.bot_id, entry.ordering_key)
        self.parked.add(unit)
        for e in list(self.rows.values()):
            if (e.bot_id, e.ordering_key) == unit and (
                e.key == entry.key or e.status is CallStatus.PENDING
            ):
                self._put(
                    e,
                    status=CallStatus.PARKED,
                    settled_at=self.clock(),
                    last_error=error if e.key == entry.key else e.last_error,
                )
        return True

    async def extend(self, entry: OutboxEntry, *, lease: float) -> bool:
        if not self._held(entry):
            return False
        self._put(self.rows[entry.key], lease_expires_at=self.clock() + lease)
        return True

    async def get(self, key: str) -> OutboxEntry | None:
        return self.rows.get(key)

    async def entries(
        self, *, status: CallStatus, bot_id: int | None = None, limit: int = 100
    ) -> list[OutboxEntry]:
        found = [
            e
            for e in self.rows.values()
            if e.status is status and (bot_id is None or e.bot_id == bot_id)
        ]
        return sorted(found, key=lambda e: e.seq)[:limit]

    async def redrive(self, key: str) -> bool:
        row = self.rows.get(key)
        if row is None or row.status not in (
            CallStatus.DEAD,
            CallStatus.UNKNOWN,
            CallStatus.PARKED,
        ):
            return False
        self._seq += 1
        self._put(
            row, status=CallStatus.PENDING, seq=self._seq, attempts=0, available_at=self.clock()
        )
        return True

    async def resolve(self, key: str, *, result: bytes) -> bool:
        row = self.rows.get(key)
        if row is None or row.status is not CallStatus.UNKNOWN:
            return False
        self._put(row, status=CallStatus.DELIVERED, result=result)
        return True

    async def unpark(self, *, bot_id: int, ordering_key: str) -> int:
        self.parked.discard((bot_id, ordering_key))
        n = 0
        for e in sorted(self.rows.values(), key=lambda e: e.seq):
            if (e.bot_id, e.ordering_key) == (bot_id, ordering_key) and (
                e.status is CallStatus.PARKED
            ):
                self._put(e, status=CallStatus.PENDING, available_at=self.clock())
                n += 1
        return n

    async def parked_units(self, *, bot_id: int | None = None) -> list[tuple[int, str]]:
        return sorted(u for u in self.parked if bot_id is None or u[0] == bot_id)

    async def counts(self, *, bot_id: int | None = None) -> dict[CallStatus, int]:
        out: dict[CallStatus, int] = {}
        for e in self.rows.values():
            if bot_id is None or e.bot_id == bot_id:
                out[e.status] = out.get(e.status, 0) + 1
        return out
