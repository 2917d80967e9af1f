"""The effect ledger of :class:`~telegram_idem.backends.redis.RedisStore`: one Lua script
per call.

Layout. The whole ledger of a ``key_prefix`` lives under ONE hash tag, so every script
touches one slot (one node) on a Redis Cluster, listing included. With
``L = <key_prefix>:{<key_prefix>:ledger}:``
(:attr:`KeyLayout.ledger_base <telegram_idem.backends.redis._keys.KeyLayout.ledger_base>`):

=============  ==================================================================
``L:r:<key>``  hash, one per row (``key`` is the :func:`~telegram_idem._keys.bounded_key`):
               ``st`` (the :class:`~telegram_idem.ledger.LedgerState` value), ``tok``,
               ``sat`` (``started_at``), ``hol``, ``att``, ``uat`` (``updated_at``),
               ``det``, ``res`` (absent = ``None``; bytes kept exactly), ``na``
               (``0``/``1``); times are integer **microseconds** since the epoch
``L:i``        sorted set: every row's key, scored by its ``started_at`` (µs)
=============  ==================================================================

Rows have no TTL: they never expire (an unknown outcome stays until settled). Every call
is ONE ``EVALSHA`` (``ledger_*`` in :data:`~telegram_idem.backends.redis.SCRIPTS`) that
reads, decides by the rules of :mod:`telegram_idem.ledger` and writes atomically,
so racing :meth:`RedisLedger.start` calls write one row. Time is the store's clock:
``TIME`` inside the script, or the injected clock passed as ``ARGV[1]``.

:meth:`RedisLedger.entries` walks ``L:i`` in order (equal scores are ordered by key, as
bytes, which for UTF-8 is the keys' code-point order), in chunks, keeping the rows whose
key starts with the prefix (a byte comparison: ``%``, ``_``, ``*`` are characters) and
whose state is asked for, until ``limit``: no ``SCAN``. Its cost grows with the rows
older than the last one answered; the ledger holds only effects in flight, unknown or
settled-but-not-yet-applied, so it stays small.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from telegram_idem._keys import bounded_key
from telegram_idem.backends.redis._connection import RedisConnection
from telegram_idem.backends.redis._scripts import SCRIPTS, Script, absent, text
from telegram_idem.ledger import (
    Ledger,
    LedgerEntry,
    LedgerState,
    check_limit,
    check_settle,
    storable_text,
)

__all__ = ["RedisLedger"]

_START = SCRIPTS["ledger_start"]
_MARK_UNKNOWN = SCRIPTS["ledger_mark_unknown"]
_SETTLE = SCRIPTS["ledger_settle"]
_FINISH = SCRIPTS["ledger_finish"]
_GET = SCRIPTS["ledger_get"]
_ENTRIES = SCRIPTS["ledger_entries"]


def _entry(row: Sequence[Any]) -> LedgerEntry:
    key, state, token, sat, holder, attempts, uat, detail, result, not_applied = row
    return LedgerEntry(
        key=text(key),
        state=LedgerState(text(state)),
        token=int(token),
        started_at=int(sat) / 1_000_000,
        holder=text(holder),
        attempts=int(attempts),
        updated_at=int(uat) / 1_000_000,
        detail=text(detail),
        result=None if absent(result) else bytes(result),
        not_applied=text(not_applied) == "1",
    )


class RedisLedger(Ledger):
    """:class:`~telegram_idem.ledger.Ledger` in the store's Redis (layout: the module
    docstring).

    Made by :meth:`RedisStore.ledger() <telegram_idem.backends.redis.RedisStore.ledger>`.
    Every method raises :class:`~telegram_idem.errors.StoreError` when Redis cannot answer
    now and :class:`~telegram_idem.errors.ConfigurationError` for what no retry can fix
    (as the store does).

    Args:
        connection: the store's connection (client, keys, clock, gate, errors).
    """

    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection
        self.base = connection.keys.ledger_base
        """The start of every ledger key: ``<key_prefix>:{<key_prefix>:ledger}:``."""
        self._index = f"{self.base}i".encode()
        self._rows = f"{self.base}r:"

    def __repr__(self) -> str:
        return f"RedisLedger({self.connection.label})"

    def redis_key(self, key: str) -> str:
        """The Redis key of the row of ``key``: ``<base>r:<bounded key>``.

        Args:
            key: the effect's key.
        """
        return f"{self._rows}{bounded_key(key)}"

    def _now_arg(self) -> str:
        clock = self.connection.clock
        return "" if clock is None else str(round(clock() * 1_000_000))

    async def _row_script(self, op: str, script: Script, key: str, args: Sequence[Any]) -> Any:
        """``script`` on the row of ``key`` (already bounded): one round trip."""
        connection = self.connection
        keys = [self._index, f"{self._rows}{key}".encode()]
        argv = [self._now_arg(), key.encode(), *args]
        return await connection.call(f"ledger.{op}", lambda: connection.run(script, keys, argv))

    async def start(self, key: str, *, token: int, holder: str) -> LedgerEntry | None:
        key = bounded_key(key)
        args = [str(int(token)), storable_text(holder).encode()]
        row = await self._row_script("start", _START, key, args)
        return None if absent(row) else _entry(row)

    async def mark_unknown(self, key: str, *, token: int, detail: str) -> LedgerEntry | None:
        key = bounded_key(key)
        args = [str(int(token)), storable_text(detail).encode()]
        row = await self._row_script("mark_unknown", _MARK_UNKNOWN, key, args)
        return None if absent(row) else _entry(row)

    async def settle(
        self, key: str, *, token: int, result: bytes | None, not_applied: bool
    ) -> bool:
        check_settle(result, not_applied)
        key = bounded_key(key)
        args = [
            str(int(token)),
            b"" if result is None else bytes(result),
            "1" if not_applied else "0",
        ]
        return bool(await self._row_script("settle", _SETTLE, key, args))

    async def finish(self, key: str, *, token: int) -> bool:
        key = bounded_key(key)
        return bool(await self._row_script("finish", _FINISH, key, [str(int(token))]))

    async def get(self, key: str) -> LedgerEntry | None:
        row = await self._row_script("get", _GET, bounded_key(key), [])
        return None if absent(row) else _entry(row)

    async def entries(
        self,
        *,
        states: Sequence[LedgerState] = (LedgerState.STARTED, LedgerState.UNKNOWN),
        prefix: str = "",
        limit: int = 100,
    ) -> list[LedgerEntry]:
        check_limit(limit)
        wanted = [LedgerState(s).value for s in states]
        if not wanted:
            return []
        connection = self.connection
        keys = [self._index, self._rows.encode()]
        # A prefix is compared as UTF-8 bytes; one with a lone surrogate starts no stored
        # key (stored keys are strict UTF-8), so it is sent in a spelling that matches none.
        raw = prefix.encode("utf-8", "surrogatepass")
        argv = [self._now_arg(), raw, str(limit), *wanted]
        rows = await connection.call("ledger.entries", lambda: connection.run(_ENTRIES, keys, argv))
        return [_entry(r) for r in rows]
