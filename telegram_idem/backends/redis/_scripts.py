"""The Lua scripts of the Redis store, shipped as package data (``redis/lua/*.lua``).

Each record script is the record state machine of :mod:`telegram_idem.machine`
(docs/design/record.md#the-record-and-its-state-machine) run atomically inside Redis, so
one ``EVALSHA`` both reads and decides; each inbox script is one inbox call. A script is
the concatenation of a few ``.lua`` files (helpers first, then its body: each file's
first line says which), read once with :mod:`importlib.resources` at import; its
``EVALSHA`` falls back to ``EVAL`` once on ``NOSCRIPT`` (:meth:`Script.run`).

Record layout: one hash per key with the fields

=========  ===================================================================
status     ``in_progress`` | ``completed`` | ``failed``
token      fencing token (decimal integer)
lease      lease end, integer **milliseconds** since the epoch
exp        retention end, integer **milliseconds** since the epoch
fp         payload fingerprint (absent = none)
result     result or failure bytes (absent = none)
attempts   how many times the key was acquired
=========  ===================================================================

and a ``PEXPIRE`` of ``exp - now`` (at least 1 ms) set by every write (a write also
deletes the absent fields with ``HDEL``, unless no hash was there), so Redis forgets
the record when its retention ends; a record whose ``exp`` has passed but which Redis
still holds counts as absent, except that its token still fences (new token = old + 1).

Common arguments: ``ARGV[1]`` is *now* in integer milliseconds since the epoch, or the
empty string to read the server's clock with ``TIME`` (allowed: Redis ≥ 5 replicates a
script's effects, not the script). Every duration argument is integer milliseconds.

Replies: a record is the array ``{outcome, status, token, lease_ms, exp_ms, fp|nil,
result|nil, attempts}``; token-checked writes answer ``1`` (done) or ``0`` (not held).

Scripts (:data:`SCRIPTS`, by name): ``claim``, ``complete``, ``fail``, ``release``,
``extend``, ``get``, ``now`` (the records) and ``inbox_admit``, ``inbox_take``,
``inbox_held``, ``inbox_redrive``, ``inbox_dead_letters``, ``inbox_drop``,
``inbox_read``, ``inbox_guard``, ``inbox_seq``, ``inbox_write`` (the inbox, see
:mod:`telegram_idem.backends.redis._inbox`), ``outbox_enqueue``, ``outbox_take``,
``outbox_held``, ``outbox_admin``, ``outbox_read`` (the outbox, see
:mod:`telegram_idem.backends.redis._outbox`) and ``flood_reserve``, ``flood_gate`` (the
flood budget, see :mod:`telegram_idem.backends.redis._flood`; its times are integer
**microseconds**), ``ledger_start``, ``ledger_mark_unknown``, ``ledger_settle``,
``ledger_finish``, ``ledger_get``, ``ledger_entries`` (the effect ledger, see
:mod:`telegram_idem.backends.redis._ledger`; microseconds too).

Arguments and replies cross as text or bytes: :func:`ms` turns seconds into the
milliseconds a script takes, :func:`text` and :func:`absent` read what one answers.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from importlib.resources import files
from types import MappingProxyType
from typing import Any

import redis.exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from telegram_idem._records import Record, Status
from telegram_idem.errors import ConfigurationError

__all__ = ["SCRIPTS", "Script", "absent", "lua_source", "ms", "record_of", "text"]

_LUA = files("telegram_idem.backends.redis").joinpath("lua")


def lua_source(*names: str) -> str:
    """The Lua files ``names`` (in ``redis/lua/``) joined in order: one script's source.

    Raises:
        FileNotFoundError: a file the package does not ship.
    """
    return "".join(_LUA.joinpath(name).read_text(encoding="utf-8") for name in names)


class Script:
    """One Lua source: ``EVALSHA`` first, ``EVAL`` once on ``NOSCRIPT``.

    Attributes:
        name: the script's name in :data:`SCRIPTS`.
        source: the Lua source (what ``SCRIPT LOAD`` takes).
        sha: its SHA1, hex (what ``EVALSHA`` takes).
    """

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"Script({self.name!r}, sha={self.sha[:12]!r})"

    async def run(
        self, client: Redis | RedisCluster, keys: Sequence[bytes], args: Sequence[Any]
    ) -> Any:
        """``EVALSHA`` with ``keys`` and ``args``; on ``NOSCRIPT`` (a restart, a failover,
        ``SCRIPT FLUSH``) the same call once as ``EVAL``, which caches the script again.

        Args:
            client: the redis-py client (single node or cluster).
            keys: the script's ``KEYS``.
            args: its ``ARGV``.

        Raises:
            redis.exceptions.RedisError: untranslated (the connection translates).
        """
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except rexc.NoScriptError:
            return await client.eval(self.source, len(keys), *keys, *args)


_RECORD = ("record.lua",)
_INBOX = ("record.lua", "inbox.lua")
_OUTBOX = ("record.lua", "outbox.lua")
_LEDGER = ("ledger_row.lua",)
_PARTS: dict[str, tuple[str, ...]] = {
    "claim": (*_RECORD, "decide_claim.lua", "claim.lua"),
    "complete": (*_RECORD, "finish.lua", "complete.lua"),
    "fail": (*_RECORD, "finish.lua", "fail.lua"),
    "release": (*_RECORD, "release.lua"),
    "extend": (*_RECORD, "extend.lua"),
    "get": (*_RECORD, "get.lua"),
    "now": ("now.lua",),
    "inbox_admit": (*_INBOX, "decide_claim.lua", "inbox_admit.lua"),
    "inbox_take": (*_INBOX, "inbox_take.lua"),
    "inbox_held": (*_INBOX, "inbox_held.lua"),
    "inbox_redrive": (*_INBOX, "inbox_redrive.lua"),
    "inbox_dead_letters": (*_INBOX, "inbox_dead_letters.lua"),
    "inbox_drop": (*_INBOX, "inbox_drop.lua"),
    "inbox_read": (*_INBOX, "inbox_read.lua"),
    "inbox_guard": (*_RECORD, "decide_claim.lua", "inbox_guard.lua"),
    "inbox_seq": ("inbox_seq.lua",),
    "inbox_write": (*_INBOX, "inbox_write.lua"),
    "outbox_enqueue": (*_OUTBOX, "outbox_enqueue.lua"),
    "outbox_take": (*_OUTBOX, "outbox_take.lua"),
    "outbox_held": (*_OUTBOX, "outbox_held.lua"),
    "outbox_admin": (*_OUTBOX, "outbox_admin.lua"),
    "outbox_read": (*_OUTBOX, "outbox_read.lua"),
    "flood_reserve": ("flood.lua", "flood_reserve.lua"),
    "flood_gate": ("flood.lua", "flood_gate.lua"),
    "ledger_start": (*_LEDGER, "ledger_start.lua"),
    "ledger_mark_unknown": (*_LEDGER, "ledger_mark_unknown.lua"),
    "ledger_settle": (*_LEDGER, "ledger_settle.lua"),
    "ledger_finish": (*_LEDGER, "ledger_finish.lua"),
    "ledger_get": (*_LEDGER, "ledger_get.lua"),
    "ledger_entries": (*_LEDGER, "ledger_entries.lua"),
}

SCRIPTS: Mapping[str, Script] = MappingProxyType(
    {name: Script(name, lua_source(*parts)) for name, parts in _PARTS.items()}
)
"""Every script of the store by name (read-only), e.g. to ``SCRIPT LOAD`` them ahead."""


def ms(seconds: float, what: str) -> int:
    """Seconds → whole milliseconds, rounded up (a positive lease never becomes 0 ms).

    Raises:
        ConfigurationError: ``seconds`` is not finite (``what`` names it).
    """
    if not math.isfinite(seconds):
        raise ConfigurationError(f"{what} must be a finite number of seconds, got {seconds}")
    return math.ceil(seconds * 1000)


def absent(value: object) -> bool:
    """A missing hash field: Lua ``false`` arrives as nil (RESP2), or as ``False`` from a
    server that maps it to a RESP3 boolean."""
    return value is None or value is False


def text(value: bytes | str) -> str:
    """A reply field as text (bytes are UTF-8)."""
    return value.decode() if isinstance(value, bytes) else value


_STATUS: Mapping[bytes | str, Status] = {
    **{status.value.encode(): status for status in Status},
    **{status.value: status for status in Status},
}
"""A reply's status bytes (or text, from a decoding server) → :class:`Status`: a dict
lookup instead of decoding and calling the enum (~1 µs each, on every record)."""


def record_of(key: str, row: Sequence[Any]) -> Record:
    """The :class:`~telegram_idem._records.Record` of ``key`` from the reply of the
    records scripts: ``[outcome, status, token, lease_ms, exp_ms, fingerprint, result,
    attempts]``."""
    _outcome, status, token, lease_ms, exp_ms, fp, result, attempts = row
    return Record(
        key,
        _STATUS[status],
        int(token),
        int(lease_ms) / 1000,
        int(exp_ms) / 1000,
        None if fp is None or fp is False else text(fp),
        None if result is None or result is False else bytes(result),
        int(attempts),
    )
