"""The outbox of :class:`~telegram_idem.backends.redis.RedisStore`: one Lua script per call.

Layout. Each bot's outbox lives under its own hash tag, so every outbox script touches
one slot (one node) on a Redis Cluster and bots spread over the cluster. With
``B = <key_prefix>:{<key_prefix>:outbox:<bot_id>}:`` and the store-wide directory
``D = <key_prefix>:{<key_prefix>:outbox}:``:

=================  ==============================================================
``B:e:<key>``      hash, one per entry: ``seq``, ``method``, ``params``, ``okey``
                   (the unit), ``ckey`` (collapse key, absent = none), ``policy``,
                   ``prio``, ``ret`` (retention, ms), ``status``, ``att``, ``tok``,
                   ``cat``, ``avail``, ``lease``, ``sat``, ``exp`` (integer ms since
                   the epoch; ``exp`` 0 = never), ``res``, ``err`` (absent = none)
``B:k:<unit>``     zset: the chat's live (pending, in-flight) entry keys by seq; its
                   head (``ZRANGE 0 0``) is the only entry of the chat a relay may take
``B:r:<prio>``     zset: chats whose head is takeable now and has priority ``prio``,
                   by the head's seq
``B:prios``        zset: the priorities with a non-empty ``B:r:<prio>`` (score = prio)
``B:rp``           hash: chat → the priority it is ready under
``B:wait``         zset: chats whose head is not takeable yet, by when it will be (ms):
                   a retry's ``avail``, an in-flight lease end
``B:c:<ckey>``     set: live entry keys with that collapse key (latest wins)
``B:s:<status>``   zset: entry keys in that status by seq (``entries``, ``counts``)
``B:x``            zset: delivered and superseded keys by retention end (ms)
``B:parked``       set: the parked chats; ``B:p:<unit>`` zset: their parked entries
``D:bots``         set: the bots with an outbox (``bot_id=None`` reads, ``get``)
``D:seq``          string: the store-wide ``seq`` counter. On a single node the scripts
                   count it; on a cluster (another slot) an enqueue or redrive first
                   increments it and passes the value as the script's floor; the bot's
                   ``B:seq`` keeps its last seq, and a floor not above it (two enqueues
                   raced) is answered ``stale`` and drawn again, so seqs stay unique and
                   increasing store-wide (one more round trip on a cluster). An unpark or
                   a migration into a chat with live entries numbers behind the bot's
                   last seq
=================  ==============================================================

Every chat with live entries is in exactly one of the ``B:r:<prio>`` / ``B:wait`` (the
Lua ``place``). Cost: ``take`` is O(log n) for the pick, plus the chats whose head became
due since the last take (each moves from ``B:wait`` once per state change); it never
scans a chat's entries, nor chats that are busy. ``enqueue`` is O(log n) plus the
pending entries it supersedes. A settled (delivered, superseded) entry gets a
``PEXPIRE`` of its retention and leaves the indexes lazily (``B:x``: up to 100 per
enqueue or take, all of them before ``counts`` or a listing of a settled status); live,
unknown, dead and parked entries have no TTL. With an injected clock (tests) an entry
past its ``exp`` counts as absent, as the records do.

``get``, ``redrive`` and ``resolve`` are given a key only: the bot is read from the key
when it has the shape of an effect key (``<prefix>:<bot_id>:o:…`` or an action's
``…:<bot_id>:a:…:o:…``), one script; otherwise (or when that bot does not hold it)
every bot in ``D:bots`` is asked in one pipeline. ``D:bots`` gets the bot (``SADD``) with
every enqueue: in the enqueue script on a single node, with the ``INCR`` of ``D:seq``
just before it on a cluster. It may name a bot whose enqueue failed, never miss one that
has entries, and a set lost with Redis's data (a restart without persistence) is whole
again with each bot's next enqueue, no process restart needed.

Scripts build the names of ``B:…`` keys themselves; they declare ``B`` itself and the
seq counter as ``KEYS[1..2]`` (the same slot on a cluster), as the inbox does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from telegram_idem._outbox_logic import superseded_result
from telegram_idem._text import storable_text
from telegram_idem.backends.redis._connection import RedisConnection
from telegram_idem.backends.redis._scripts import SCRIPTS, Script, absent, ms, text
from telegram_idem.backends.redis._url import RedisClient
from telegram_idem.errors import ConfigurationError
from telegram_idem.outbox import AmbiguousPolicy, CallStatus, NewCall, Outbox, OutboxEntry

__all__ = ["BOT_OF_KEY", "RedisOutbox"]

_ENQUEUE = SCRIPTS["outbox_enqueue"]
_TAKE = SCRIPTS["outbox_take"]
_HELD = SCRIPTS["outbox_held"]
_ADMIN = SCRIPTS["outbox_admin"]
_READ = SCRIPTS["outbox_read"]
_STALE = b"stale"
"""A script's answer when its seq floor is stale (a cluster's racing enqueues)."""

BOT_OF_KEY = re.compile(r"(?s).*?:(-?[0-9]+):[ao]:")
"""Where an effect key names its bot (:meth:`telegram_idem._keys.KeyBuilder.effect` and
``call``): the first ``:<bot_id>:o:`` or ``:<bot_id>:a:``. Only a hint: a key it reads
wrong is still found through ``D:bots``."""


def _entry(bot_id: int, row: Sequence[Any]) -> OutboxEntry:
    (key, seq, method, params, okey, ckey, policy, prio, ret, status, att, tok, cat, avail,
     lease, sat, res, err) = row  # fmt: skip
    return OutboxEntry(
        key=text(key),
        bot_id=bot_id,
        seq=int(seq),
        method=text(method),
        params=bytes(params),
        ordering_key=text(okey),
        collapse_key=None if absent(ckey) else text(ckey),
        policy=AmbiguousPolicy(text(policy)),
        priority=int(prio),
        retention=int(ret) / 1000,
        status=CallStatus(text(status)),
        attempts=int(att),
        token=int(tok),
        created_at=int(cat) / 1000,
        available_at=int(avail) / 1000,
        lease_expires_at=int(lease) / 1000,
        settled_at=int(sat) / 1000,
        result=None if absent(res) else bytes(res),
        last_error=None if absent(err) else text(err),
    )


class RedisOutbox(Outbox):
    """Durable outbox in the store's Redis (layout and scripts: module docstring).

    Made by :meth:`RedisStore.outbox() <telegram_idem.backends.redis.RedisStore.outbox>`.

    Args:
        connection: the store's connection (client, keys, clock, gate, errors).
    """

    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self.directory = connection.keys.outbox_directory
        """The store-wide outbox keys' start: ``<key_prefix>:{<key_prefix>:outbox}:``."""
        self._bots_key = f"{self.directory}bots".encode()

    def __repr__(self) -> str:
        return f"RedisOutbox({self.connection.label})"

    def base(self, bot_id: int) -> str:
        """The start of every outbox key of ``bot_id`` (``B`` of the module docstring).

        Args:
            bot_id: the bot.
        """
        return self.connection.keys.outbox_base(bot_id)

    def _keys(self, bot_id: int) -> list[bytes]:
        layout = self.connection.keys
        return [layout.outbox_base(bot_id).encode(), layout.outbox_seq(bot_id).encode()]

    async def _script(
        self,
        op: str,
        script: Script,
        bot_id: int,
        args: Sequence[Any],
        floor: int = 0,
        more_keys: Sequence[bytes] = (),
    ) -> Any:
        connection = self.connection
        keys = [*self._keys(bot_id), *more_keys]
        argv = [connection.now_arg(), *args, str(floor)]
        return await connection.call(f"outbox.{op}", lambda: connection.run(script, keys, argv))

    async def _each_bot(
        self, op: str, script: Script, bots: Sequence[int], args: Sequence[Any], floor: int = 0
    ) -> list[Any]:
        """``script`` once per bot in one pipeline; answers in ``bots`` order."""
        if not bots:
            return []
        connection = self.connection
        batches = [self._keys(b) for b in bots]
        argv = [connection.now_arg(), *args, str(floor)]
        return await connection.call(
            f"outbox.{op}", lambda: connection.run_pipelined(script, batches, argv)
        )

    async def _bots(self) -> list[int]:
        connection = self.connection
        key = self._bots_key

        async def members(client: RedisClient) -> set[bytes | str]:
            return set(await client.smembers(key))

        found = await connection.call("outbox.bots", lambda: connection.execute(members))
        return sorted(int(m) for m in found)

    async def _floor(self, bot_id: int | None = None) -> int:
        """The seq floor of a script that takes a new seq: 0 on a single node (the script
        counts store-wide itself); on a cluster a fresh ``INCR`` of ``D:seq``, with
        ``bot_id`` (an enqueue's) added to ``D:bots`` in the same round trip (one slot)."""
        if not self.connection.cluster:
            return 0
        connection = self.connection
        key = f"{self.directory}seq".encode()
        bots = self._bots_key

        async def incr(client: RedisClient) -> int:
            if bot_id is None:
                return int(await client.incr(key))
            async with client.pipeline(transaction=False) as pipe:
                pipe.sadd(bots, str(bot_id))
                pipe.incr(key)
                _, value = await pipe.execute()
            return int(value)

        return await connection.call("outbox.seq", lambda: connection.execute(incr))

    async def _locate(
        self, op: str, key: str, args: Sequence[Any], floor: int = 0
    ) -> tuple[int, Any] | None:
        """Run the read or admin ``args`` for ``key`` on the bot that holds it: ``(bot,
        answer)`` of the first bot whose answer is not absent/0, or ``None``."""
        script = _READ if op == "get" else _ADMIN
        hint = BOT_OF_KEY.match(key)
        tried: int | None = None
        if hint is not None:
            tried = int(hint.group(1))
            answer = await self._script(op, script, tried, args, floor)
            if not absent(answer) and answer != 0:
                return tried, answer
        others = [b for b in await self._bots() if b != tried]
        answers = await self._each_bot(op, script, others, args, floor)
        for bot, answer in zip(others, answers, strict=True):
            if not absent(answer) and answer != 0:
                return bot, answer
        return None

    # ----------------------------------------------------------------- the contract

    async def enqueue(self, call: NewCall) -> tuple[OutboxEntry, bool]:
        # on a single node the script re-adds the bot to D:bots; on a cluster _floor does
        more_keys = [] if self.connection.cluster else [self._bots_key]
        args = [
            call.key.encode(),
            call.method.encode(),
            call.params,
            call.unit.encode(),
            (call.collapse_key or "").encode(),
            "0" if call.collapse_key is None else "1",
            call.policy.value,
            str(int(call.priority)),
            str(ms(call.retention, "retention")),
            superseded_result(call.key),
            str(call.bot_id),
        ]
        while True:
            floor = await self._floor(call.bot_id)
            answer = await self._script("enqueue", _ENQUEUE, call.bot_id, args, floor, more_keys)
            if answer != _STALE:
                stored, row = answer
                return _entry(call.bot_id, row), bool(stored)

    async def take(
        self, *, bot_id: int, lease: float, ordering_key: str | None = None
    ) -> OutboxEntry | None:
        rows = await self._take(bot_id, lease, 1, ordering_key)
        return rows[0] if rows else None

    async def take_many(self, *, bot_id: int, lease: float, limit: int) -> Sequence[OutboxEntry]:
        if limit <= 0:
            return []
        return await self._take(bot_id, lease, limit, None)

    async def _take(
        self, bot_id: int, lease: float, limit: int, ordering_key: str | None
    ) -> list[OutboxEntry]:
        args = [str(ms(lease, "lease")), str(limit), (ordering_key or "").encode()]
        rows = await self._script("take", _TAKE, bot_id, args)
        return [_entry(bot_id, r) for r in rows]

    async def _held(
        self,
        op: str,
        entry: OutboxEntry,
        *,
        millis: int = 0,
        data: bytes = b"",
        status: str = "",
        params: bytes | None = None,
        ordering_key: str | None = None,
    ) -> bool:
        args = [
            op,
            entry.key.encode(),
            str(entry.token),
            str(millis),
            data,
            status,
            "0" if params is None else "1",
            params or b"",
            "0" if ordering_key is None else "1",
            (ordering_key or "").encode(),
        ]
        return bool(await self._script(op, _HELD, entry.bot_id, args))

    async def deliver(self, entry: OutboxEntry, *, result: bytes) -> bool:
        return await self._held("deliver", entry, data=result)

    async def retry(
        self,
        entry: OutboxEntry,
        *,
        delay: float,
        error: str,
        params: bytes | None = None,
        ordering_key: str | None = None,
    ) -> bool:
        return await self._held(
            "retry",
            entry,
            millis=ms(max(delay, 0.0), "delay"),
            data=storable_text(error).encode(),
            params=params,
            ordering_key=ordering_key,
        )

    async def settle(
        self,
        entry: OutboxEntry,
        *,
        status: Literal[CallStatus.DEAD, CallStatus.UNKNOWN],
        error: str,
    ) -> bool:
        if status not in (CallStatus.DEAD, CallStatus.UNKNOWN):
            raise ConfigurationError(f"settle takes DEAD or UNKNOWN, got {status!r}")
        data = storable_text(error).encode()
        return await self._held("settle", entry, data=data, status=CallStatus(status).value)

    async def park(self, entry: OutboxEntry, *, error: str) -> bool:
        return await self._held("park", entry, data=storable_text(error).encode())

    async def extend(self, entry: OutboxEntry, *, lease: float) -> bool:
        return await self._held("extend", entry, millis=ms(lease, "lease"))

    async def get(self, key: str) -> OutboxEntry | None:
        found = await self._locate("get", key, ["get", key.encode()])
        return None if found is None else _entry(found[0], found[1])

    async def entries(
        self, *, status: CallStatus, bot_id: int | None = None, limit: int = 100
    ) -> list[OutboxEntry]:
        if limit <= 0:
            return []
        args = ["entries", CallStatus(status).value, str(limit)]
        bots = [bot_id] if bot_id is not None else await self._bots()
        answers = await self._each_bot("entries", _READ, bots, args)
        found = [_entry(b, r) for b, rows in zip(bots, answers, strict=True) for r in rows]
        found.sort(key=lambda e: (e.seq, e.bot_id))
        return found[:limit]

    async def redrive(self, key: str) -> bool:
        while True:
            found = await self._locate(
                "redrive", key, ["redrive", key.encode()], await self._floor()
            )
            if found is None or found[1] != _STALE:
                return found is not None

    async def resolve(self, key: str, *, result: bytes) -> bool:
        args = ["resolve", key.encode(), result]
        return await self._locate("resolve", key, args) is not None

    async def unpark(self, *, bot_id: int, ordering_key: str) -> int:
        args = ["unpark", ordering_key.encode()]
        return int(await self._script("unpark", _ADMIN, bot_id, args))

    async def parked_units(self, *, bot_id: int | None = None) -> list[tuple[int, str]]:
        bots = [bot_id] if bot_id is not None else await self._bots()
        answers = await self._each_bot("parked_units", _READ, bots, ["parked"])
        return sorted((b, text(u)) for b, units in zip(bots, answers, strict=True) for u in units)

    async def counts(self, *, bot_id: int | None = None) -> dict[CallStatus, int]:
        bots = [bot_id] if bot_id is not None else await self._bots()
        answers = await self._each_bot("counts", _READ, bots, ["counts"])
        out: dict[CallStatus, int] = {}
        for flat in answers:
            for name, n in zip(flat[::2], flat[1::2], strict=True):
                if int(n):
                    status = CallStatus(text(name))
                    out[status] = out.get(status, 0) + int(n)
        return out
