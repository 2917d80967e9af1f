"""The inbox of :class:`~telegram_idem.backends.redis.RedisStore`, split into shards by
ordering key (``inbox_shards``; docs/store-redis.md#inbox).

Layout. An entry's shard is :meth:`KeyLayout.inbox_shard
<telegram_idem.backends.redis.KeyLayout.inbox_shard>` of its ordering unit (CRC-32 mod
``N``), so a chat's entries all live in one shard and keep their order. Each shard lives
under ONE hash tag, so every shard script touches one slot: with one shard (``N = 1``,
the default on a single node and the layout of earlier versions)
``T = <key_prefix>:{<key_prefix>:inbox}``; with ``N > 1`` (the default on a cluster,
16) shard ``i`` is ``T = <key_prefix>:{<key_prefix>:inbox:<i>}``. In each:

================  ===============================================================
``T:seq``         string: the admission counter (``INCR``); an entry's ``seq``. With
                  ``N > 1`` the highest seq of the shard; the store-wide counter is
                  ``<key_prefix>:{<key_prefix>:inbox}:seq`` (``inbox_seq.lua``)
``T:e:<id>``      hash, one per entry: ``seq``, ``okey`` (ordering key),
                  ``payload``, ``status`` (pending | in_flight | dead),
                  ``attempts``, ``token``, ``avail`` and ``lease`` (integer ms since
                  the epoch), ``err`` (absent = none), ``adm`` (admitted_at,
                  integer ms since the epoch; absent = 0: admitted before it
                  was recorded); with ``N > 1`` also ``gtok`` and ``gexp``: the
                  update guard's token and retention end (ms) of its admission
``T:k:<okey>``    zset: the live (non-dead) entry ids of one ordering key, by seq;
                  its head (``ZRANGE 0 0``) is the only entry of the key a worker
                  may take
``T:ready``       zset: ordering keys whose head is takeable, scored by the head's
                  seq (take pops the lowest)
``T:wait``        zset: ordering keys whose head is not takeable yet, scored by
                  when it will be (ms): a retry's ``avail``, an in-flight lease end
``T:live``        zset: live entry ids by seq (``depth`` is its ``ZCARD``)
``T:dead``        zset: dead-letter ids by seq (``dead_letters`` reads it in order)
``T:a:<status>``  zset per status (pending, in_flight, dead): its entry ids by
                  ``adm``, so ``stats`` counts and dates each status in O(1)
``T:g:<id>``      ``N > 1`` only: string, the ``gtok`` of an entry acked or dropped,
                  kept (``PX``) until its guard's retention ends: the "done" marker
                  admission step 2 looks for
================  ===============================================================

Every ordering key with live entries is in exactly one of ``T:ready`` / ``T:wait``; each
script that changes a key's head re-places the key (the Lua ``place``). Inbox keys have
**no TTL** (but ``T:g:…``): an entry stays until it is acked, however long its retries
or its dead letter last; only the update guard record expires (``PEXPIRE``, as every
record).

One shard: every call is ONE script. Scripts (``redis/lua/inbox*.lua``; they reuse the
record scripts' helpers, ``record.lua``, and the claim decision, ``decide_claim.lua``):

- **admit** (one or many entries, ``inbox_admit.lua``): per entry, the claim decision
  on the update guard record with ``lease = retention``; if it acquires, the record is
  written completed with result ``null`` (exactly
  :func:`telegram_idem._inbox_logic.admitted_record`) and the entry is written pending,
  takeable now. A duplicate writes nothing. An entry that outlived its guard record
  (retention over while it waited or lay dead) is replaced by the new admission, as in
  the memory and SQLite inboxes, but keeps its token, so a worker still holding the old
  entry stays fenced. On a cluster the guard records of update keys live in the inbox's
  slot for this (:meth:`KeyLayout.record <telegram_idem.backends.redis.KeyLayout.record>`),
  so only update keys can be admitted there (anything else raises
  :class:`~telegram_idem.errors.ConfigurationError`) and the inbox and every update
  guard of a store sit on ONE master.
- **take**: moves the keys of ``T:wait`` that are due into ``T:ready``, then leases the
  head of the lowest ``T:ready`` key: token + 1, attempts + 1, lease end = now + lease.
- **held** (ack / retry / bury / extend): only with the entry's current token while it
  is in flight; ack deletes it, bury moves it to ``T:dead`` (it stops blocking its key).
- **redrive**, **dead letters**; ``depth`` is a plain ``ZCARD``.
- **drop**: deletes a dead letter's hash and its ``T:dead`` member; the update guard
  record stays.
- **read** (the operator's reads, ``inbox_read.lua``): ``get`` one hash; ``entries``
  merges ``T:live`` (or one ``T:k:<okey>``) and ``T:dead`` by seq from a cursor, each call
  reading at most :data:`ENTRIES_BUDGET` members of each, so a listing is a few bounded
  scripts (read on from the cursor), never a scan of the keyspace; in-flight entries
  (at most one per ordering key) are read from ``T:a:in_flight``. ``stats`` is O(1):
  the size and first score of each ``T:a:<status>``. Entries written by a version
  before those sets are not in them: ``stats`` then rebuilds the sets once from
  ``T:live`` and ``T:dead`` (one walk of every entry: about 0.8 s of Redis time for
  100,000 entries). ``backlog`` is one script over the ordering keys of ``T:ready`` and
  ``T:wait`` and their ``T:k:…``, about 3.5 µs of Redis time per live entry (0.36 s for
  100,000 in 1,000 chats).

``N > 1`` shards: the update guard records stay at their own slot,
``<key_prefix>:{<key>}`` (other shapes sharing the store — ``FastAckWebhook``, the PTB
processor, a plain ``store.claim(update_key)`` — find a guard from the update key alone,
while the entry's shard comes from its ordering key), so guard and entry are in
different slots and admission (``admit_many``) is three steps, each ONE pipeline of one
script per slot touched (the masters in parallel):

1. **claim** (``inbox_guard.lua`` ``claim``): the claim decision on each guard with the
   short lease :data:`ADMISSION_LEASE` (a duplicate, a "not yet" and a takeover are
   decided here, exactly as in one-shard admission); alongside, ``inbox_seq.lua``
   reserves one seq per entry from the store-wide counter;
2. **write** (``inbox_write.lua``, per shard): each acquired entry, with its reserved
   seq (at least; after every seq of its shard, so a chat's new entry goes to its
   tail), ``gtok`` (the guard token this admission holds) and ``gexp``; it answers
   *written*, *kept* or *superseded* (below);
3. **complete** (``inbox_guard.lua`` ``admitted``): each guard whose entry is in, while
   it still holds that token, as :func:`telegram_idem._inbox_logic.admitted_record`
   (completed, result ``null``, lease and retention from now). An entry is admitted
   (``True``) exactly when this step completes its guard.

Crash windows (a crash: the admitting process dies; every later step is skipped):

- after 1: a guard in progress whose lease ends :data:`ADMISSION_LEASE` later, nothing
  written. Telegram's redelivery is answered "not yet" (``False``) until then, then
  takes it over: nothing lost, nothing doubled.
- after 2: the entry is in its shard (workers may take it, even ack it) and the guard in
  progress. The redelivery takes the guard over with token ``t + 1``, remembering the
  ``t`` it replaced; step 2 finds the entry with ``gtok = t`` — or, once acked, its
  marker ``T:g:<id> = t`` — so it is the same admission: *kept* (``gtok`` moves to
  ``t + 1``, nothing enqueued), and step 3 completes the guard. Without the marker an
  acked entry would be enqueued again.
- between 1 and 2, too slow (its lease ended and a redelivery took over and admitted):
  step 2 finds an entry or marker with a later ``gtok`` of a guard still within its
  retention: *superseded*, nothing written; step 3 is skipped; ``False``.
- after 3: admitted; only the answer is lost (a redelivery is a duplicate).
- an entry whose guard's retention is over (``gexp`` passed, or a fresh acquire that
  took nothing over) is replaced as in one-shard admission, keeping its token.

``take`` gives the oldest takeable head store-wide, as the contract (and every other
store) does: one pipeline asks every shard for the seq of its lowest ``T:ready`` key
(``inbox_take.lua`` ``peek``, which first moves the due ``T:wait`` keys), then the
shard with the lowest is taken from (``inbox_take.lua``), the next lowest if another
worker emptied it meanwhile. No shard starves: seqs grow with admission store-wide, so
a quiet shard's entry is taken before anything admitted after it. ``ack``, ``retry``,
``bury``, ``extend`` run in the entry's shard (its ordering key names it). ``get``,
``drop`` and ``redrive`` (an id does not name its shard) run on every shard in one
pipeline; ``redrive`` reserves a store-wide seq first (the letter goes to the tail).
``dead_letters``, ``depth``, ``stats`` and ``backlog`` run on every shard and merge;
``entries`` merges the shards' listings by seq, reading a shard on from its own cursor
whenever its buffer runs dry (so a page is exact), one shard only for one ordering key.

The one-shard inbox of an earlier layout (``{<key_prefix>:inbox}``) is read too when
``N > 1``: ``take``, the held operations (tried there when the entry's shard does not
hold it) and every operator read include it; nothing is admitted there. Its ``seq``
counter is the store-wide one, so its entries come first. Moving from one layout to the
other is documented in docs/store-redis.md (drain first, or accept that a chat's old and
new entries may run at once, and that on a cluster update guards written in the
inbox's slot are no longer found).

Cost. One shard: ``take`` is O(log n) for the pick plus the keys whose head became due
since the last take (each key is moved from ``T:wait`` to ``T:ready`` once per state
change): it never scans chats that are busy or waiting for a retry. ``admit`` is
O(log n) per entry. With ``N`` shards a ``take`` is ``N`` small scripts (one round trip
per master) plus one, and an admission three steps of round trips: the client does
several times the work of one shard (benchmarks/cluster_ingress.py), in exchange for
spreading the Redis work over the masters.
A script blocks Redis while it runs: a getUpdates batch of 100 runs about 4 ms inside
Redis (2-CPU test host), so a very large ``admit_many`` batch (thousands of entries)
delays every other client of that Redis for its duration. Memory: about 550 bytes per
entry with a 340-byte update, plus the zset members.

Scripts build the names of ``T:e:…``, ``T:k:…`` and ``T:g:…`` keys themselves (they
cannot be known before the script runs); they are declared in no ``KEYS``, which Redis
allows for keys of the declared keys' slot (Redis 7; a script without flags). While a
shard's slot migrates (resharding), such a script may be refused with an error that is
not a :class:`~telegram_idem.errors.StoreError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.crc import key_slot

from telegram_idem import _inbox_logic as logic
from telegram_idem._text import storable_text
from telegram_idem.backends.redis._connection import RedisConnection
from telegram_idem.backends.redis._keys import UPDATE_KEY
from telegram_idem.backends.redis._scripts import SCRIPTS, Script, absent, ms, text
from telegram_idem.backends.redis._url import RedisClient
from telegram_idem.errors import ConfigurationError
from telegram_idem.inbox import EntryStatus, Inbox, InboxEntry, InboxStats, NewEntry, UnitBacklog
from telegram_idem.ledger import check_limit

__all__ = ["ADMISSION_LEASE", "ENTRIES_BUDGET", "RedisInbox"]

ADMISSION_LEASE = 10.0
"""Seconds: the lease a sharded inbox's admission claims the update guard with (step 1),
at most the retention. An admission that dies before completing the guard leaves a claim
whose lease ends this long after; Telegram's redelivery is answered "not yet" until
then, and taken over after."""

ENTRIES_BUDGET = 500
"""Most members of each sorted set one ``entries`` script reads (a listing is several
scripts when the entries it wants are sparse)."""

_FIXED = ("seq", "live", "ready", "wait", "dead")
"""The inbox keys every script declares, in ``KEYS[1..5]`` order."""

_ADMIT = SCRIPTS["inbox_admit"]
_TAKE = SCRIPTS["inbox_take"]
_HELD = SCRIPTS["inbox_held"]
_REDRIVE = SCRIPTS["inbox_redrive"]
_DEAD_LETTERS = SCRIPTS["inbox_dead_letters"]
_DROP = SCRIPTS["inbox_drop"]
_READ = SCRIPTS["inbox_read"]
_GUARD = SCRIPTS["inbox_guard"]
_SEQ = SCRIPTS["inbox_seq"]
_WRITE = SCRIPTS["inbox_write"]

_SEPARATE = 3
"""Up to this many scripts of one step are sent as separate commands, concurrently; more
go in one pipeline."""

Call = tuple[Script, list[bytes], list[Any]]
"""One script run in a pipeline: ``(script, KEYS, ARGV)``."""


@dataclass(frozen=True, slots=True)
class _Shard:
    """One shard of the inbox: its key base and the keys every script declares."""

    base: str
    keys: list[bytes]

    @classmethod
    def at(cls, base: str) -> _Shard:
        return cls(base, [f"{base}{name}".encode() for name in _FIXED])


def _by_seq(rows: Sequence[InboxEntry]) -> list[InboxEntry]:
    return sorted(rows, key=lambda e: e.seq)


def _entry(row: Sequence[Any]) -> InboxEntry:
    eid, seq, okey, payload, status, attempts, token, avail, lease, err, adm = row
    return InboxEntry(
        id=text(eid),
        seq=int(seq),
        ordering_key=text(okey),
        payload=bytes(payload),
        status=EntryStatus(text(status)),
        attempts=int(attempts),
        token=int(token),
        available_at=int(avail) / 1000,
        lease_expires_at=int(lease) / 1000,
        last_error=None if absent(err) else text(err),
        admitted_at=int(adm) / 1000,
    )


class RedisInbox(Inbox):
    """Durable inbox in the store's Redis (layout and scripts: module docstring).

    Made by :meth:`RedisStore.inbox() <telegram_idem.backends.redis.RedisStore.inbox>`.

    Args:
        connection: the connection of the records store whose update guard records
            admission writes (``RedisStore.connection``): its client, keys (and so the
            number of shards, ``connection.keys.inbox_shards``), clock, gate and error
            translation.
    """

    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        layout = connection.keys
        self.base = layout.inbox_prefix
        """The start of the one-shard inbox's keys, ``<key_prefix>:{<key_prefix>:inbox}:``
        (a sharded inbox keeps its store-wide ``seq`` there)."""
        self.shards = layout.inbox_shards
        """How many shards admission spreads entries over (1: the one-slot layout)."""
        self._keys = [self.key(name).encode() for name in _FIXED]
        self._legacy = _Shard.at(self.base)
        self._shards = [_Shard.at(layout.inbox_shard_prefix(i)) for i in range(self.shards)]
        # Every place entries may be: the shards, and for a sharded inbox the one-slot
        # inbox of an earlier layout last (read and drained, never admitted to).
        self._places = self._shards + ([self._legacy] if layout.sharded else [])
        self._seq_key = [self.key("seq").encode()]

    def __repr__(self) -> str:
        return f"RedisInbox({self.connection.label}, shards={self.shards})"

    def key(self, name: str) -> str:
        """The Redis key ``T:<name>`` of the one-shard layout (``seq``, ``live``,
        ``e:<id>``, ``k:<okey>``…).

        Args:
            name: the key's name inside the inbox (``seq``, ``live``, ``e:<id>``…).
        """
        return f"{self.base}{name}"

    def shard_key(self, shard: int, name: str) -> str:
        """The Redis key ``<name>`` of shard ``shard`` (with one shard: :meth:`key`).

        Args:
            shard: from 0 to ``shards - 1``.
            name: the key's name inside the shard (``live``, ``e:<id>``…).
        """
        return f"{self._shards[shard].base}{name}"

    def shard_of(self, ordering_key: str) -> int:
        """The shard of an ordering key (:meth:`KeyLayout.inbox_shard
        <telegram_idem.backends.redis.KeyLayout.inbox_shard>`).

        Args:
            ordering_key: the entry's ordering unit.
        """
        return self.connection.keys.inbox_shard(ordering_key)

    def _call(self, place: _Shard, script: Script, args: Sequence[Any]) -> Call:
        return (script, place.keys, [self.connection.now_arg(), place.base, *args])

    async def _script(
        self, op: str, script: Script, args: Sequence[Any], extra_keys: Sequence[bytes] = ()
    ) -> Any:
        connection = self.connection
        keys = [*self._keys, *extra_keys]
        argv = [connection.now_arg(), self.base, *args]
        return await connection.call(f"inbox.{op}", lambda: connection.run(script, keys, argv))

    async def _one(self, op: str, place: _Shard, script: Script, args: Sequence[Any]) -> Any:
        connection = self.connection
        s, keys, argv = self._call(place, script, args)
        return await connection.call(f"inbox.{op}", lambda: connection.run(s, keys, argv))

    async def _each(self, op: str, calls: Sequence[Call]) -> list[Any]:
        """``calls`` at once: a few as separate ``EVALSHA`` (cheaper for the client than a
        cluster pipeline), more in one pipeline (:meth:`RedisConnection.run_each`)."""
        connection = self.connection
        if len(calls) > _SEPARATE:
            return await connection.call(f"inbox.{op}", lambda: connection.run_each(calls))

        async def one(call: Call) -> Any:
            script, keys, args = call
            return await connection.run(script, keys, args)

        async def gathered() -> list[Any]:
            answers = await asyncio.gather(*(one(c) for c in calls), return_exceptions=True)
            errors = [a for a in answers if isinstance(a, BaseException)]
            if errors:  # an outage before a bug, as run_each
                outages = [
                    e for e in errors if isinstance(e, Exception) and connection.is_outage(e)
                ]
                raise (outages or errors)[0]
            return list(answers)

        return await connection.call(f"inbox.{op}", gathered)

    async def _everywhere(self, op: str, script: Script, args: Sequence[Any]) -> list[Any]:
        """``script`` on every place entries may be, in one pipeline: answers in order."""
        return await self._each(op, [self._call(p, script, args) for p in self._places])

    # ----------------------------------------------------------------- admission

    async def admit(self, entry: NewEntry, *, retention: float) -> bool:
        [admitted] = await self.admit_many([entry], retention=retention)
        return admitted

    async def admit_many(self, entries: Sequence[NewEntry], *, retention: float) -> list[bool]:
        if not entries:
            return []
        if self.connection.keys.sharded:
            return await self._admit_sharded(entries, ms(retention, "retention"))
        guards: list[bytes] = []
        args: list[Any] = [str(ms(retention, "retention"))]
        layout = self.connection.keys
        for e in entries:
            if layout.cluster and not UPDATE_KEY.fullmatch(e.update_key):
                raise ConfigurationError(
                    "on a Redis Cluster the inbox admits update guard keys "
                    "'<prefix>:<bot_id>:u:<update_id>' only (their records live in the "
                    f"inbox's slot), got {e.update_key!r}"
                )
            guards.append(layout.record(e.update_key).encode())
            args += [e.update_key.encode(), logic.ordering_unit(e).encode(), e.payload]
        answers = await self._script("admit", _ADMIT, args, guards)
        return [bool(a) for a in answers]

    def _guard_groups(self, guards: Sequence[bytes], wanted: Sequence[int]) -> list[list[int]]:
        """The indexes ``wanted`` of ``guards`` by slot on a cluster (one script each),
        all in one group on a single node."""
        if not self.connection.cluster:
            return [list(wanted)] if wanted else []
        groups: dict[int, list[int]] = {}
        for i in wanted:
            groups.setdefault(key_slot(guards[i]), []).append(i)
        return list(groups.values())

    async def _admit_sharded(self, entries: Sequence[NewEntry], retention_ms: int) -> list[bool]:
        """Admission in three steps (the crash windows: module docstring): claim each
        guard with a short lease, reserving seqs store-wide alongside; write the entries
        in their shards; complete the guards whose entry is in."""
        connection = self.connection
        layout = connection.keys
        now = connection.now_arg()
        guards = [layout.record(e.update_key).encode() for e in entries]
        lease_ms = min(ms(ADMISSION_LEASE, "lease"), retention_ms)
        groups = self._guard_groups(guards, range(len(entries)))
        claim_args = [now, "claim", str(lease_ms), str(retention_ms)]
        calls: list[Call] = [(_GUARD, [guards[i] for i in g], claim_args) for g in groups]
        calls.append((_SEQ, self._seq_key, [str(len(entries))]))
        *claimed, last_seq = await self._each("admit", calls)
        first_seq = int(last_seq) - len(entries) + 1
        held: dict[int, tuple[int, int, int, int]] = {}  # i -> token, prev, takeover, exp
        for group, rows in zip(groups, claimed, strict=True):
            for i, (acquired, token, prev, takeover, exp) in zip(group, rows, strict=True):
                if int(acquired):
                    held[i] = (int(token), int(prev), int(takeover), int(exp))
        answers = [False] * len(entries)
        if not held:
            return answers
        by_shard: dict[int, list[int]] = {}
        for i in held:
            by_shard.setdefault(self.shard_of(logic.ordering_unit(entries[i])), []).append(i)
        writes: list[Call] = []
        for shard, idx in by_shard.items():
            args: list[Any] = []
            for i in idx:
                e, (token, prev, takeover, exp) = entries[i], held[i]
                args += [
                    e.update_key.encode(),
                    logic.ordering_unit(e).encode(),
                    e.payload,
                    str(first_seq + i),
                    str(token),
                    str(prev if takeover else -1),
                    str(exp),
                ]
            writes.append(self._call(self._shards[shard], _WRITE, args))
        written = await self._each("admit", writes)
        done = [
            i
            for idx, rows in zip(by_shard.values(), written, strict=True)
            for i, answer in zip(idx, rows, strict=True)
            if int(answer)
        ]
        finish = self._guard_groups(guards, sorted(done))
        completes: list[Call] = [
            (
                _GUARD,
                [guards[i] for i in g],
                [
                    connection.now_arg(),
                    "admitted",
                    str(retention_ms),
                    *(str(held[i][0]) for i in g),
                ],
            )
            for g in finish
        ]
        for group, rows in zip(finish, await self._each("admit", completes), strict=True):
            for i, answer in zip(group, rows, strict=True):
                answers[i] = bool(int(answer))
        return answers

    # ----------------------------------------------------------------- workers

    async def take(self, *, lease: float) -> InboxEntry | None:
        lease_arg = str(ms(lease, "lease"))
        if not self.connection.keys.sharded:
            row = await self._script("take", _TAKE, [lease_arg])
            return None if absent(row) else _entry(row)
        # The oldest takeable head store-wide: each place's oldest, then take from them
        # oldest first (another worker may empty a place between the two).
        heads = await self._everywhere("take", _TAKE, [lease_arg, "peek"])
        ready = sorted((int(h), n) for n, h in enumerate(heads) if not absent(h))
        for _, n in ready:
            row = await self._one("take", self._places[n], _TAKE, [lease_arg])
            if not absent(row):
                return _entry(row)
        return None

    async def _held_op(
        self, op: str, entry: InboxEntry, *, millis: int = 0, error: str = "", refund: bool = False
    ) -> bool:
        args = [
            op,
            entry.id.encode(),
            str(entry.token),
            str(millis),
            storable_text(error).encode(),
            "1" if refund else "0",
        ]
        if not self.connection.keys.sharded:
            return bool(await self._script(op, _HELD, args))
        shard = self._shards[self.shard_of(entry.ordering_key)]
        if await self._one(op, shard, _HELD, args):
            return True
        # an entry of the one-slot layout, taken before the store was sharded
        return bool(await self._one(op, self._legacy, _HELD, args))

    async def ack(self, entry: InboxEntry) -> bool:
        return await self._held_op("ack", entry)

    async def retry(
        self, entry: InboxEntry, *, delay: float, error: str, refund: bool = False
    ) -> bool:
        millis = ms(delay, "delay")
        return await self._held_op("retry", entry, millis=millis, error=error, refund=refund)

    async def bury(self, entry: InboxEntry, *, error: str) -> bool:
        return await self._held_op("bury", entry, error=error)

    async def extend(self, entry: InboxEntry, *, lease: float) -> bool:
        return await self._held_op("extend", entry, millis=ms(lease, "lease"))

    # ----------------------------------------------------------------- operators

    async def dead_letters(self, *, limit: int = 100) -> list[InboxEntry]:
        if limit <= 0:
            return []
        if not self.connection.keys.sharded:
            rows = await self._script("dead_letters", _DEAD_LETTERS, [str(limit)])
            return [_entry(r) for r in rows]
        answers = await self._everywhere("dead_letters", _DEAD_LETTERS, [str(limit)])
        return _by_seq([_entry(r) for rows in answers for r in rows])[:limit]

    async def redrive(self, entry_id: str) -> bool:
        if not self.connection.keys.sharded:
            return bool(await self._script("redrive", _REDRIVE, [entry_id.encode()]))
        connection = self.connection
        seq = await connection.call(
            "inbox.redrive", lambda: connection.run(_SEQ, self._seq_key, ["1"])
        )
        answers = await self._everywhere("redrive", _REDRIVE, [entry_id.encode(), str(seq)])
        return any(int(a) for a in answers)

    async def depth(self) -> int:
        connection = self.connection
        if connection.keys.sharded:
            return sum(int(n) for n in await self._everywhere("depth", _READ, ["depth"]))
        live = self._keys[1]

        async def count(client: RedisClient) -> int:
            return int(await client.zcard(live))

        return await connection.call("inbox.depth", lambda: connection.execute(count))

    async def get(self, entry_id: str) -> InboxEntry | None:
        if not self.connection.keys.sharded:
            row = await self._script("get", _READ, ["get", entry_id.encode()])
            return None if absent(row) else _entry(row)
        rows = await self._everywhere("get", _READ, ["get", entry_id.encode()])
        found = [_entry(r) for r in rows if not absent(r)]
        return found[0] if found else None

    async def entries(
        self,
        *,
        status: EntryStatus | None = None,
        ordering_key: str | None = None,
        limit: int = 100,
    ) -> list[InboxEntry]:
        check_limit(limit)
        wanted = "" if status is None else EntryStatus(status).value
        okey = b"" if ordering_key is None else ordering_key.encode()
        places = self._places
        if ordering_key is not None and self.connection.keys.sharded:
            # a unit's entries are in its shard (or in the one-slot inbox of before)
            places = [self._shards[self.shard_of(ordering_key)], self._legacy]
        # A merge by seq of each place's listing: a place is read on (from its cursor)
        # whenever its buffer is empty, so the smallest buffered seq is the next one.
        buffers: list[list[InboxEntry]] = [[] for _ in places]
        cursors = ["0"] * len(places)
        done = [False] * len(places)
        out: list[InboxEntry] = []
        while len(out) < limit:
            need = [n for n in range(len(places)) if not done[n] and not buffers[n]]
            if need:
                want = str(min(limit - len(out), ENTRIES_BUDGET))
                calls = [
                    self._call(
                        places[n],
                        _READ,
                        ["entries", wanted, okey, cursors[n], want, str(ENTRIES_BUDGET)],
                    )
                    for n in need
                ]
                for n, (cursor, finished, *rows) in zip(
                    need, await self._each("entries", calls), strict=True
                ):
                    buffers[n] += [_entry(r) for r in rows]
                    cursors[n] = text(cursor)
                    done[n] = bool(int(finished))
                continue
            full = [n for n in range(len(places)) if buffers[n]]
            if not full:
                break
            n = min(full, key=lambda n: buffers[n][0].seq)
            out.append(buffers[n].pop(0))
        return out

    async def drop(self, entry_id: str) -> bool:
        if not self.connection.keys.sharded:
            return bool(await self._script("drop", _DROP, [entry_id.encode()]))
        answers = await self._everywhere("drop", _DROP, [entry_id.encode()])
        return any(int(a) for a in answers)

    async def stats(self) -> InboxStats:
        if self.connection.keys.sharded:
            answers = await self._everywhere("stats", _READ, ["stats"])
        else:
            answers = [await self._script("stats", _READ, ["stats"])]
        counts = dict.fromkeys(EntryStatus, 0)
        oldest: dict[EntryStatus, float] = {}
        latest = 0
        for now, *flat in answers:
            latest = max(latest, int(now))
            for i in range(0, len(flat), 3):
                status = EntryStatus(text(flat[i]))
                counts[status] += int(flat[i + 1])
                at = int(flat[i + 2]) / 1000
                oldest[status] = min(oldest.get(status, at), at)
        return InboxStats(counts=counts, oldest_admitted_at=oldest, now=latest / 1000)

    async def backlog(self, *, limit: int = 100) -> list[UnitBacklog]:
        check_limit(limit)
        if self.connection.keys.sharded:
            answers = await self._everywhere("backlog", _READ, ["backlog", str(limit)])
        else:
            answers = [await self._script("backlog", _READ, ["backlog", str(limit)])]
        units: dict[str, UnitBacklog] = {}
        for rows in answers:
            for k, p, f, adm in rows:
                key = text(k)
                u = units.get(key) or UnitBacklog(key, 0, 0, int(adm) / 1000)
                units[key] = UnitBacklog(
                    key,
                    u.pending + int(p),
                    u.in_flight + int(f),
                    min(u.oldest_admitted_at, int(adm) / 1000),
                )
        ranked = sorted(
            units.values(),
            key=lambda u: (-(u.pending + u.in_flight), u.oldest_admitted_at, u.ordering_key),
        )
        return ranked[:limit]
