"""The inbox of :class:`~telegram_idem.backends.postgres.PostgresStore`:
:class:`PostgresInbox`, one statement per call over the store's connection.

The statements, and why admission, take and redrive keep every chat in order under
concurrency, are in :mod:`telegram_idem.backends.postgres._inbox_sql`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from telegram_idem import _inbox_logic as logic
from telegram_idem._text import storable_text
from telegram_idem.backends.postgres._connection import PostgresConnection
from telegram_idem.backends.postgres._inbox_sql import build_inbox_sql
from telegram_idem.inbox import EntryStatus, Inbox, InboxEntry, InboxStats, NewEntry, UnitBacklog
from telegram_idem.ledger import check_limit

__all__ = ["PostgresInbox"]


def _entry(row: Any) -> InboxEntry:
    return InboxEntry(
        id=row["id"],
        seq=row["seq"],
        ordering_key=row["ordering_key"],
        payload=bytes(row["payload"]),
        status=EntryStatus(row["status"]),
        attempts=row["attempts"],
        token=row["token"],
        available_at=row["available_at"],
        lease_expires_at=row["lease_expires_at"],
        last_error=row["last_error"],
        admitted_at=row["admitted_at"],
    )


class PostgresInbox(Inbox):
    """Durable inbox in ``<table_prefix>_inbox``, over the store's connection (its pool,
    clock, error translation and purge bookkeeping).

    Args:
        connection: the connection of the records store whose update guard records
            admission writes (``PostgresStore.connection``).

    Every call is one statement (one round trip on a connection that has prepared it).
    Errors are the store's: :class:`~telegram_idem.errors.StoreError` when the server
    cannot answer, :class:`~telegram_idem.errors.ConfigurationError` when the table is
    missing, or made by an older version without a column this one reads (run
    ``telegram-idem migrate URL``: it creates the tables and upgrades older ones).

    The operator's reads (:meth:`entries`, :meth:`backlog`) are read through indexes:
    one status in ``seq`` order through ``…_inbox_status_idx``, one ordering key's live
    entries through ``…_inbox_heads_idx``, each cut by its ``LIMIT``; :meth:`stats` is one
    statement (one snapshot, with the clock it was read at).
    """

    def __init__(self, connection: PostgresConnection) -> None:
        self.connection = connection
        self.table = connection.inbox_table
        self._sql = build_inbox_sql(
            connection.records_table, self.table, server_clock=connection.server_clock
        )

    def __repr__(self) -> str:
        return f"PostgresInbox({self.connection.label}, table={self.table!r})"

    async def _fetch(self, op: str, name: str, *args: Any, now: bool = False) -> list[Any]:
        sql = self._sql[name]
        params = (*args, *self.connection.now_args()) if now else args

        async def run(conn: Any) -> list[Any]:
            rows: list[Any] = await conn.fetch(sql, *params)
            return rows

        return await self.connection.call(op, run)

    async def admit(self, entry: NewEntry, *, retention: float) -> bool:
        rows = await self._fetch(
            "admit",
            "admit",
            entry.update_key,
            logic.ordering_unit(entry),
            entry.payload,
            float(retention),
            now=True,
        )
        if rows:
            self.connection.wrote()
        return bool(rows)

    async def admit_many(self, entries: Sequence[NewEntry], *, retention: float) -> list[bool]:
        # One statement for the batch. An id repeated within the batch is sent once (an
        # upsert cannot touch one row twice); its later copies are duplicates, as they
        # would be if admitted one after the other.
        first: dict[str, NewEntry] = {}
        for e in entries:
            first.setdefault(e.update_key, e)
        if not first:
            return []
        batch = list(first.values())
        rows = await self._fetch(
            "admit_many",
            "admit_many",
            [e.update_key for e in batch],
            [logic.ordering_unit(e) for e in batch],
            [e.payload for e in batch],
            float(retention),
            now=True,
        )
        written = {row["id"] for row in rows}
        if written:
            self.connection.wrote()
        answers: list[bool] = []
        for e in entries:
            answers.append(e.update_key in written)
            written.discard(e.update_key)  # a repeated id is a duplicate
        return answers

    async def take(self, *, lease: float) -> InboxEntry | None:
        rows = await self._fetch("take", "take", float(lease), now=True)
        return _entry(rows[0]) if rows else None

    async def ack(self, entry: InboxEntry) -> bool:
        return bool(await self._fetch("ack", "ack", entry.id, entry.token))

    async def retry(
        self, entry: InboxEntry, *, delay: float, error: str, refund: bool = False
    ) -> bool:
        rows = await self._fetch(
            "retry",
            "retry",
            entry.id,
            entry.token,
            float(delay),
            storable_text(error),
            bool(refund),
            now=True,
        )
        return bool(rows)

    async def bury(self, entry: InboxEntry, *, error: str) -> bool:
        return bool(await self._fetch("bury", "bury", entry.id, entry.token, storable_text(error)))

    async def extend(self, entry: InboxEntry, *, lease: float) -> bool:
        rows = await self._fetch("extend", "extend", entry.id, entry.token, float(lease), now=True)
        return bool(rows)

    async def dead_letters(self, *, limit: int = 100) -> list[InboxEntry]:
        rows = await self._fetch("dead_letters", "dead_letters", int(limit))
        return [_entry(r) for r in rows]

    async def redrive(self, entry_id: str) -> bool:
        return bool(await self._fetch("redrive", "redrive", entry_id, now=True))

    async def depth(self) -> int:
        rows = await self._fetch("depth", "depth")
        return int(rows[0][0])

    async def get(self, entry_id: str) -> InboxEntry | None:
        rows = await self._fetch("get", "get", entry_id)
        return _entry(rows[0]) if rows else None

    async def entries(
        self,
        *,
        status: EntryStatus | None = None,
        ordering_key: str | None = None,
        limit: int = 100,
    ) -> list[InboxEntry]:
        check_limit(limit)
        n = int(limit)
        if ordering_key is None:
            if status is None:
                rows = await self._fetch("entries", "entries_all", n)
            else:
                rows = await self._fetch("entries", "entries_status", n, EntryStatus(status).value)
        elif status is None:
            rows = await self._fetch("entries", "entries_key", n, ordering_key)
        elif EntryStatus(status) is EntryStatus.DEAD:
            rows = await self._fetch("entries", "entries_dead_key", n, ordering_key)
        else:
            rows = await self._fetch(
                "entries", "entries_live_key", n, ordering_key, EntryStatus(status).value
            )
        return [_entry(r) for r in rows]

    async def drop(self, entry_id: str) -> bool:
        return bool(await self._fetch("drop", "drop", entry_id))

    async def stats(self) -> InboxStats:
        rows = await self._fetch("stats", "stats", now=True)
        counts = dict.fromkeys(EntryStatus, 0)
        oldest: dict[EntryStatus, float] = {}
        now = 0.0
        for row in rows:
            now = float(row["now"])
            if row["status"] is not None:
                status = EntryStatus(row["status"])
                counts[status] = int(row["n"])
                oldest[status] = float(row["oldest"])
        return InboxStats(counts=counts, oldest_admitted_at=oldest, now=now)

    async def backlog(self, *, limit: int = 100) -> list[UnitBacklog]:
        check_limit(limit)
        rows = await self._fetch("backlog", "backlog", int(limit))
        return [
            UnitBacklog(
                r["ordering_key"], int(r["pending"]), int(r["in_flight"]), float(r["oldest"])
            )
            for r in rows
        ]
