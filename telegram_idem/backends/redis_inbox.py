"""The inbox of :class:`~telegram_idem.backends.redis.RedisStore`: one Lua script per call.

Layout. The whole inbox of a store lives under ONE hash tag, ``{<key_prefix>:inbox}``,
so every inbox script touches one slot (one node) on a Redis Cluster. With
``T = <key_prefix>:{<key_prefix>:inbox}``:

================  ===============================================================
``T:seq``         string: the admission counter (``INCR``); an entry's ``seq``
``T:e:<id>``      hash, one per entry: ``seq``, ``okey`` (ordering key),
                  ``payload``, ``status`` (pending | in_flight | dead),
                  ``attempts``, ``token``, ``avail`` and ``lease`` (integer ms since
                  the epoch), ``err`` (absent = none)
``T:k:<okey>``    zset: the live (non-dead) entry ids of one ordering key, by seq;
                  its head (``ZRANGE 0 0``) is the only entry of the key a worker
                  may take
``T:ready``       zset: ordering keys whose head is takeable, scored by the head's
                  seq (take pops the lowest)
``T:wait``        zset: ordering keys whose head is not takeable yet, scored by
                  when it will be (ms): a retry's ``avail``, an in-flight lease end
``T:live``        zset: live entry ids by seq (``depth`` is its ``ZCARD``)
``T:dead``        zset: dead-letter ids by seq (``dead_letters`` reads it in order)
================  ===============================================================

Every ordering key with live entries is in exactly one of ``T:ready`` / ``T:wait``; each
script that changes a key's head re-places the key (the Lua ``place``). Inbox keys have
**no TTL**: an entry stays until it is acked, however long its retries or its dead
letter last; only the update guard record expires (``PEXPIRE``, as every record).

Scripts (all in this module; they reuse the record scripts' prelude and the claim
decision of :data:`telegram_idem.backends.redis_scripts.CLAIM_FUNCTION`):

- **admit** (one or many entries): per entry, the claim decision on the update guard
  record with ``lease = retention``; if it acquires, the record is written completed
  with result ``null`` (exactly :func:`telegram_idem.inbox.logic.admitted_record`) and
  the entry is written pending, takeable now. A duplicate writes nothing. An entry that
  outlived its guard record (retention over while it waited or lay dead) is replaced
  by the new admission, as in the memory and SQLite inboxes, but keeps its token, so
  a worker still holding the old entry stays fenced.
- **take**: moves the keys of ``T:wait`` that are due into ``T:ready``, then leases the
  head of the lowest ``T:ready`` key: token + 1, attempts + 1, lease end = now + lease.
- **held** (ack / retry / bury / extend): only with the entry's current token while it
  is in flight; ack deletes it, bury moves it to ``T:dead`` (it stops blocking its key).
- **redrive**, **dead letters**; ``depth`` is a plain ``ZCARD``.

Round trips: every call is ONE ``EVALSHA`` (``depth``: one ``ZCARD``), on a single node
and on a cluster alike; ``admit_many`` admits the whole batch in one script.

Cost. ``take`` is O(log n) for the pick plus the keys whose head became due since the
last take (each key is moved from ``T:wait`` to ``T:ready`` once per state change): it
never scans chats that are busy or waiting for a retry (after a mass lease expiry,
e.g. every worker died, the next take pays for moving all of those keys at once).
``admit`` is O(log n) per entry.
A script blocks Redis while it runs: a getUpdates batch of 100 runs about 4 ms inside
Redis (2-CPU test host), so a very large ``admit_many`` batch (thousands of entries)
delays every other client of that Redis for its duration. Memory: about 550 bytes per
entry with a 340-byte update, plus the zset members.

Cluster trade-off. Admission must claim the update guard and write the entry in one
script, so on a cluster the update guard records have to live in the inbox's slot too:
a :class:`~telegram_idem.backends.redis.RedisStore` on a cluster stores every record
whose key has the shape of an update guard key (``<prefix>:<bot_id>:u:<update_id>``,
:meth:`telegram_idem.keys.KeyBuilder.update`) at ``T:r:<key>`` instead of
``<key_prefix>:{<key>}`` (see :meth:`~telegram_idem.backends.redis.RedisStore.redis_key`),
whether the inbox is used or not, so ``store.get`` / ``store.claim`` of an update key
find the record admission wrote. Consequences: the inbox and all update guards of a
store sit on ONE cluster node (the one owning the tag's slot) — fine for a bot's update
rate, but they do not spread over the cluster (action, step, lock and callback records
still do); a ``claim_many`` of a getUpdates batch becomes one script on that node. On a
single node the layout of records is unchanged (``<key_prefix>:{<key>}``); the inbox
keys are the same as on a cluster.

Scripts build the names of ``T:e:…`` and ``T:k:…`` keys themselves (they cannot be
known before ``take`` runs); they are declared in no ``KEYS``, which Redis allows for
keys of the declared keys' slot (Redis 7; a script without flags). While the inbox's
slot migrates (resharding), such a script may be refused with an error that is not a
:class:`~telegram_idem.errors.StoreError`. On a cluster, only update keys of the shape
above can be admitted (anything else raises
:class:`~telegram_idem.errors.ConfigurationError`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from telegram_idem.backends import redis_scripts
from telegram_idem.backends.redis import UPDATE_KEY, RedisStore, _ms, _Script
from telegram_idem.backends.text import storable_text
from telegram_idem.errors import ConfigurationError
from telegram_idem.inbox import logic
from telegram_idem.inbox.base import EntryStatus, Inbox, InboxEntry, NewEntry

__all__ = ["ADMIT", "DEAD_LETTERS", "HELD", "REDRIVE", "TAKE", "RedisInbox"]

_FIXED = ("seq", "live", "ready", "wait", "dead")
"""The inbox keys every script declares, in ``KEYS[1..5]`` order."""


_INBOX_PRELUDE = (
    redis_scripts.PRELUDE
    + r"""
-- KEYS[1..5]: T:seq, T:live, T:ready, T:wait, T:dead (one slot).
-- ARGV[1]: now_ms|''; ARGV[2]: T: (the inbox key base, with the trailing colon).
local K_SEQ, K_LIVE, K_READY, K_WAIT, K_DEAD = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local BASE = ARGV[2]
local now = now_ms(ARGV[1])

local function ekey(id)
  return BASE .. 'e:' .. id
end

local function kkey(okey)
  return BASE .. 'k:' .. okey
end

local function load_entry(id)
  local v = redis.call('HMGET', ekey(id), 'seq', 'okey', 'status', 'attempts', 'token',
                       'avail', 'lease')
  if not v[1] then
    return nil
  end
  return {id = id, seq = tonumber(v[1]), okey = v[2], status = v[3],
          attempts = tonumber(v[4]), token = tonumber(v[5]), avail = tonumber(v[6]),
          lease = tonumber(v[7])}
end

-- When a live entry becomes takeable: a pending one when due, an in-flight one when its
-- lease ends (its worker died).
local function due_at(e)
  if e.status == 'in_flight' then
    return e.lease
  end
  return e.avail
end

-- Put ordering key okey where take finds it: in READY (by its head's seq) when its head
-- is takeable now, else in WAIT (by when it will be); in neither without live entries.
local function place(okey)
  while true do
    local head = redis.call('ZRANGE', kkey(okey), 0, 0)
    if not head[1] then
      redis.call('ZREM', K_READY, okey)
      redis.call('ZREM', K_WAIT, okey)
      return
    end
    local e = load_entry(head[1])
    if e then
      local at = due_at(e)
      if at <= now then
        redis.call('ZADD', K_READY, fmt(e.seq), okey)
        redis.call('ZREM', K_WAIT, okey)
      else
        redis.call('ZADD', K_WAIT, fmt(at), okey)
        redis.call('ZREM', K_READY, okey)
      end
      return
    end
    -- an id whose entry hash is gone (deleted by hand): forget it
    redis.call('ZREM', kkey(okey), head[1])
    redis.call('ZREM', K_LIVE, head[1])
  end
end

local function entry_reply(e)
  local v = redis.call('HMGET', ekey(e.id), 'payload', 'err')
  return {e.id, e.seq, e.okey, v[1], e.status, e.attempts, e.token, e.avail, e.lease,
          v[2] or false}
end
"""
)

ADMIT = (
    _INBOX_PRELUDE
    + redis_scripts.CLAIM_FUNCTION
    + r"""
-- KEYS[6..]: the update guard record of each entry.
-- ARGV[3]: retention_ms; then id, ordering key, payload for each entry, in KEYS order.
-- Reply: 1 (admitted) or 0 (duplicate: nothing written) per entry.
local retention = tonumber(ARGV[3])
local out = {}
for i = 6, #KEYS do
  local j = 4 + (i - 6) * 3
  local gkey, id, okey, payload = KEYS[i], ARGV[j], ARGV[j + 1], ARGV[j + 2]
  local outcome, r = decide_claim(gkey, now, retention, retention, false)
  if outcome == 'acquired' then
    -- logic.admitted_record: acquired with lease = retention, then completed with null
    r.status = 'completed'
    r.result = 'null'
    r.exp = now + retention
    save(gkey, r, now)
    -- An entry still here under this id outlived its guard record (retention over):
    -- the new admission replaces it, keeping its token so an old taker stays fenced.
    local token = 0
    local old = load_entry(id)
    if old then
      token = old.token
      redis.call('DEL', ekey(id))
      redis.call('ZREM', kkey(old.okey), id)
      redis.call('ZREM', K_LIVE, id)
      redis.call('ZREM', K_DEAD, id)
      place(old.okey)
    end
    local seq = redis.call('INCR', K_SEQ)
    redis.call('HSET', ekey(id), 'seq', fmt(seq), 'okey', okey, 'payload', payload,
               'status', 'pending', 'attempts', '0', 'token', fmt(token),
               'avail', fmt(now), 'lease', '0')
    redis.call('ZADD', kkey(okey), fmt(seq), id)
    redis.call('ZADD', K_LIVE, fmt(seq), id)
    place(okey)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"""
)

TAKE = (
    _INBOX_PRELUDE
    + r"""
-- ARGV[3]: lease_ms. Reply: the leased entry, or nil.
local lease = tonumber(ARGV[3])
for _, okey in ipairs(redis.call('ZRANGEBYSCORE', K_WAIT, '-inf', fmt(now))) do
  place(okey)
end
while true do
  local first = redis.call('ZRANGE', K_READY, 0, 0)
  if not first[1] then
    return false
  end
  local okey = first[1]
  local head = redis.call('ZRANGE', kkey(okey), 0, 0)
  local e = nil
  if head[1] then
    e = load_entry(head[1])
  end
  if e and due_at(e) <= now then
    e.status = 'in_flight'
    e.attempts = e.attempts + 1
    e.token = e.token + 1
    e.lease = now + lease
    redis.call('HSET', ekey(e.id), 'status', e.status, 'attempts', fmt(e.attempts),
               'token', fmt(e.token), 'lease', fmt(e.lease))
    place(okey)
    return entry_reply(e)
  end
  -- not takeable after all (the clock went back, or a dangling id): re-place, go on
  place(okey)
end
"""
)

HELD = (
    _INBOX_PRELUDE
    + r"""
-- ARGV[3]: ack | retry | bury | extend; ARGV[4]: id; ARGV[5]: token;
-- ARGV[6]: delay_ms (retry) or lease_ms (extend); ARGV[7]: error (retry, bury).
-- Reply: 1, or 0 when the entry is not in flight with this token.
local op, id = ARGV[3], ARGV[4]
local e = load_entry(id)
if e == nil or e.status ~= 'in_flight' or e.token ~= tonumber(ARGV[5]) then
  return 0
end
if op == 'ack' then
  redis.call('DEL', ekey(id))
  redis.call('ZREM', kkey(e.okey), id)
  redis.call('ZREM', K_LIVE, id)
elseif op == 'retry' then
  redis.call('HSET', ekey(id), 'status', 'pending', 'avail', fmt(now + tonumber(ARGV[6])),
             'lease', '0', 'err', ARGV[7])
elseif op == 'bury' then
  redis.call('HSET', ekey(id), 'status', 'dead', 'err', ARGV[7])
  redis.call('ZREM', kkey(e.okey), id)
  redis.call('ZREM', K_LIVE, id)
  redis.call('ZADD', K_DEAD, fmt(e.seq), id)
elseif op == 'extend' then
  redis.call('HSET', ekey(id), 'lease', fmt(now + tonumber(ARGV[6])))
else
  return redis.error_reply('unknown inbox operation ' .. op)
end
place(e.okey)
return 1
"""
)

REDRIVE = (
    _INBOX_PRELUDE
    + r"""
-- ARGV[3]: id. Reply: 1, or 0 when it is not a dead letter.
local id = ARGV[3]
local e = load_entry(id)
if e == nil or e.status ~= 'dead' then
  return 0
end
-- Back of its chat (a new seq): a later entry of the chat may be in flight already.
local seq = redis.call('INCR', K_SEQ)
redis.call('HSET', ekey(id), 'status', 'pending', 'attempts', '0', 'avail', fmt(now), 'seq', seq)
redis.call('ZREM', K_DEAD, id)
redis.call('ZADD', kkey(e.okey), seq, id)
redis.call('ZADD', K_LIVE, seq, id)
place(e.okey)
return 1
"""
)

DEAD_LETTERS = (
    _INBOX_PRELUDE
    + r"""
-- ARGV[3]: limit (>= 1). Reply: the oldest dead letters. Writes nothing.
local out = {}
for _, id in ipairs(redis.call('ZRANGE', K_DEAD, 0, tonumber(ARGV[3]) - 1)) do
  local e = load_entry(id)
  if e then
    out[#out + 1] = entry_reply(e)
  end
end
return out
"""
)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _entry(row: Sequence[Any]) -> InboxEntry:
    eid, seq, okey, payload, status, attempts, token, avail, lease, err = row
    return InboxEntry(
        id=_text(eid),
        seq=int(seq),
        ordering_key=_text(okey),
        payload=bytes(payload),
        status=EntryStatus(_text(status)),
        attempts=int(attempts),
        token=int(token),
        available_at=int(avail) / 1000,
        lease_expires_at=int(lease) / 1000,
        last_error=None if err is None or err is False else _text(err),
    )


class RedisInbox(Inbox):
    """Durable inbox in the store's Redis (layout and scripts: module docstring).

    Made by :meth:`RedisStore.inbox() <telegram_idem.backends.redis.RedisStore.inbox>`;
    it talks through the store's client, gate and error mapping.
    """

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self.base = store.inbox_prefix
        """The start of every inbox key: ``<key_prefix>:{<key_prefix>:inbox}:``."""
        self._keys = [self.key(name).encode() for name in _FIXED]

    def key(self, name: str) -> str:
        """The Redis key ``T:<name>`` (``seq``, ``live``, ``e:<id>``, ``k:<okey>``…)."""
        return f"{self.base}{name}"

    async def _script(
        self, op: str, script: _Script, args: Sequence[Any], extra_keys: Sequence[bytes] = ()
    ) -> Any:
        store = self._store
        keys = [*self._keys, *extra_keys]
        argv = [store._now_arg(), self.base, *args]
        return await store._call(f"inbox.{op}", lambda: store._run(script, keys, argv))

    async def admit(self, entry: NewEntry, *, retention: float) -> bool:
        [admitted] = await self.admit_many([entry], retention=retention)
        return admitted

    async def admit_many(self, entries: Sequence[NewEntry], *, retention: float) -> list[bool]:
        if not entries:
            return []
        guards: list[bytes] = []
        args: list[Any] = [str(_ms(retention, "retention"))]
        for e in entries:
            if self._store.is_cluster and not UPDATE_KEY.fullmatch(e.update_key):
                raise ConfigurationError(
                    "on a Redis Cluster the inbox admits update guard keys "
                    "'<prefix>:<bot_id>:u:<update_id>' only (their records live in the "
                    f"inbox's slot), got {e.update_key!r}"
                )
            guards.append(self._store.redis_key(e.update_key).encode())
            args += [e.update_key.encode(), logic.ordering_unit(e).encode(), e.payload]
        answers = await self._script("admit", _ADMIT, args, guards)
        return [bool(a) for a in answers]

    async def take(self, *, lease: float) -> InboxEntry | None:
        row = await self._script("take", _TAKE, [str(_ms(lease, "lease"))])
        return None if row is None or row is False else _entry(row)

    async def _held_op(self, op: str, entry: InboxEntry, *, ms: int = 0, error: str = "") -> bool:
        args = [op, entry.id.encode(), str(entry.token), str(ms), storable_text(error).encode()]
        return bool(await self._script(op, _HELD, args))

    async def ack(self, entry: InboxEntry) -> bool:
        return await self._held_op("ack", entry)

    async def retry(self, entry: InboxEntry, *, delay: float, error: str) -> bool:
        return await self._held_op("retry", entry, ms=_ms(delay, "delay"), error=error)

    async def bury(self, entry: InboxEntry, *, error: str) -> bool:
        return await self._held_op("bury", entry, error=error)

    async def extend(self, entry: InboxEntry, *, lease: float) -> bool:
        return await self._held_op("extend", entry, ms=_ms(lease, "lease"))

    async def dead_letters(self, *, limit: int = 100) -> list[InboxEntry]:
        if limit <= 0:
            return []
        rows = await self._script("dead_letters", _DEAD_LETTERS, [str(limit)])
        return [_entry(r) for r in rows]

    async def redrive(self, entry_id: str) -> bool:
        return bool(await self._script("redrive", _REDRIVE, [entry_id.encode()]))

    async def depth(self) -> int:
        store = self._store
        live = self._keys[1]

        async def count() -> int:
            await store._ready()
            try:
                async with store._gate:
                    return int(await store.client.zcard(live))
            except Exception as exc:
                failure = store._failure(exc)
                if failure is exc:
                    raise
                raise failure from exc

        return await store._call("inbox.depth", count)


_ADMIT = _Script(ADMIT)
_TAKE = _Script(TAKE)
_HELD = _Script(HELD)
_REDRIVE = _Script(REDRIVE)
_DEAD_LETTERS = _Script(DEAD_LETTERS)
