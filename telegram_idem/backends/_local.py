"""The in-process decision loop, written once for the memory and SQLite stores.

A local store decides in Python: inside one atomic unit it reads the record, decides
with :mod:`telegram_idem.machine` and writes what the decision returns (read → decide →
write). :class:`LocalStore` is that loop; a store gives only its primitives:

- :meth:`LocalStore._transaction`: run a body atomically (memory: no ``await`` inside;
  SQLite: one ``BEGIN IMMEDIATE`` transaction on the store's thread), handing it the
  records (:class:`RecordAccess`) and the store's time;
- :meth:`LocalStore._read`: one record as stored, outside any write lock (``get``).

Each primitive of the store contract is one call of :meth:`~LocalStore._transaction`
(one round trip), ``claim_many`` included (one transaction for the whole batch).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import ClassVar, Protocol, TypeVar

from telegram_idem import machine
from telegram_idem._clock import Clock
from telegram_idem._records import Claim, Record
from telegram_idem.backends._base import Store

__all__ = ["LocalStore", "RecordAccess"]

T = TypeVar("T")


class RecordAccess(Protocol):
    """The records as a transaction body sees them (valid only inside the body)."""

    def read(self, key: str) -> Record | None:
        """The stored record of ``key``, expired or not, or ``None``."""
        ...

    def write(self, record: Record) -> None:
        """Store ``record`` as is (insert or replace ``record.key``)."""
        ...


Step = Callable[[Record | None, float], Record | None]
"""A token-checked transition of :mod:`telegram_idem.machine`: (stored record, now) →
the record to write, or ``None`` (refused: nothing is written)."""


class LocalStore(Store):
    """A store that decides in process with :mod:`telegram_idem.machine`.

    Args:
        clock: seconds since the epoch; decides leases and expiry (the store's clock).
    """

    def __init__(self, *, clock: Clock) -> None:
        self._local_clock = clock

    @property
    def clock(self) -> Clock:
        """The clock deciding leases and expiry."""
        return self._local_clock

    @abc.abstractmethod
    async def _transaction(self, body: Callable[[RecordAccess, float], T]) -> T:
        """Run ``body(records, now)`` atomically and return what it returns.

        No other decision of this store (nor, for a file shared by processes, of any
        process) interleaves with it; ``now`` is the store's clock read once the unit
        holds its lock. An exception from ``body`` undoes its writes and propagates.
        """

    @abc.abstractmethod
    async def _read(self, key: str) -> Record | None:
        """The stored record of ``key`` (expired or not), read without the write lock."""

    in_loop: ClassVar[bool] = False
    """``True`` when a body run over :meth:`_records_now` without awaiting is atomic (the
    records live in this event loop's thread: memory). The loop then skips one
    coroutine per primitive; the decision is the same."""

    def _records_now(self) -> tuple[RecordAccess, float]:
        """The records and the store's time, for an ``in_loop`` store: a body that does
        not await is atomic over them."""
        raise NotImplementedError

    async def _claim(
        self, key: str, fingerprint: str | None, lease: float, retention: float
    ) -> Claim:
        if self.in_loop:
            records, now = self._records_now()
            return _claim_in(records, key, fingerprint, lease, retention, now)
        return await self._transaction(
            lambda records, now: _claim_in(records, key, fingerprint, lease, retention, now)
        )

    async def _claim_many(self, keys: Sequence[str], lease: float, retention: float) -> list[Claim]:
        def body(records: RecordAccess, now: float) -> list[Claim]:
            return [_claim_in(records, k, None, lease, retention, now) for k in keys]

        if self.in_loop:
            return body(*self._records_now())
        return await self._transaction(body)

    async def _update(self, key: str, step: Step) -> bool:
        def body(records: RecordAccess, now: float) -> bool:
            new = step(records.read(key), now)
            if new is None:
                return False
            records.write(new)
            return True

        if self.in_loop:
            return body(*self._records_now())
        return await self._transaction(body)

    async def _complete(self, key: str, token: int, result: bytes, retention: float) -> bool:
        if self.in_loop:  # every update completes: the one step without its closures
            records, now = self._records_now()
            new = machine.do_complete(
                records.read(key), token=token, result=result, now=now, retention=retention
            )
            if new is not None:
                records.write(new)
            return new is not None
        return await self._update(
            key,
            lambda r, now: machine.do_complete(
                r, token=token, result=result, now=now, retention=retention
            ),
        )

    async def _fail(self, key: str, token: int, error: bytes, retention: float) -> bool:
        return await self._update(
            key,
            lambda r, now: machine.do_fail(
                r, token=token, error=error, now=now, retention=retention
            ),
        )

    async def _release(self, key: str, token: int) -> bool:
        return await self._update(key, lambda r, now: machine.do_release(r, token=token, now=now))

    async def _extend(self, key: str, token: int, lease: float) -> bool:
        return await self._update(
            key, lambda r, now: machine.do_extend(r, token=token, now=now, lease=lease)
        )

    async def _get(self, key: str) -> Record | None:
        record = await self._read(key)
        return record if machine.is_live(record, self._local_clock()) else None

    async def _now(self) -> float:
        return self._local_clock()


def _claim_in(
    records: RecordAccess,
    key: str,
    fingerprint: str | None,
    lease: float,
    retention: float,
    now: float,
) -> Claim:
    claim, new = machine.decide_claim(
        records.read(key),
        key=key,
        fingerprint=fingerprint,
        now=now,
        lease=lease,
        retention=retention,
    )
    if new is not None:
        records.write(new)
    return claim
