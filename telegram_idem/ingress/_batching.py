"""Group commit for webhook admissions: deliveries that arrive while one admission is
being written go to the store together in the next write.

A webhook POST waits for its admission (the update guard claim and the inbox entry) to be
stored before it answers. Written one by one, N concurrent POSTs make N store writes in a
row, and the last answer waits for all of them: on SQLite each write is a transaction on
the store's one connection (behind whatever the workers queued there), and across
processes each takes the file's write lock. :class:`AdmissionBatches` writes the first
delivery at once and collects the ones that arrive meanwhile; when the write returns, the
next write takes all of them (up to ``max_batch``), in one ``Inbox.admit_many`` call —
one transaction or round trip whatever the batch's size. Every delivery gets its own
:class:`~telegram_idem._admitted.Admitted`, the same as admitted alone; a failure of a
write (what :meth:`telegram_idem.Idem.admit_to_inbox` raises) is raised to every delivery
of that batch.

Two deliveries of one update in the same window go to consecutive writes, so the second
is decided against the first (a duplicate), as when they arrive one after the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from telegram_idem._admitted import Admitted
from telegram_idem.inbox import NewEntry

__all__ = ["AdmissionBatches", "AdmitBatch"]

AdmitBatch = Callable[[Sequence[NewEntry], Sequence[Mapping[str, Any]]], Awaitable[list[Admitted]]]
"""Admits a batch: ``(entries, updates) -> one Admitted per entry``, in order."""

_Waiting = tuple[NewEntry, Mapping[str, Any], "asyncio.Future[Admitted]"]


class AdmissionBatches:
    """Admit deliveries through ``admit_batch``, batching the ones that arrive while a
    write is in flight.

    Args:
        admit_batch: writes one batch (:data:`AdmitBatch`).
        max_batch: most deliveries per write (≥ 1).

    Raises:
        ValueError: ``max_batch`` < 1.
    """

    def __init__(self, admit_batch: AdmitBatch, *, max_batch: int = 100) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._admit_batch = admit_batch
        self.max_batch = max_batch
        self._waiting: list[_Waiting] = []
        self._writer: asyncio.Task[None] | None = None
        self.writes = 0
        """Batches written so far (a delivery alone counts as one)."""

    async def admit(self, entry: NewEntry, update: Mapping[str, Any]) -> Admitted:
        """Admit one delivery: written at once, or with the next batch if a write is in
        flight. Returns its :class:`~telegram_idem._admitted.Admitted`.

        Args:
            entry: the inbox entry of the delivery.
            update: the update it carries.

        Raises:
            Exception: what the batch's write raised (for every delivery of that batch).
        """
        future: asyncio.Future[Admitted] = asyncio.get_running_loop().create_future()
        self._waiting.append((entry, update, future))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_all())
        # Shielded: a POST cancelled (its client went away) does not cancel the write
        # the other deliveries of its batch wait for.
        return await asyncio.shield(future)

    async def _write_all(self) -> None:
        try:
            while self._waiting:
                batch = self._take()
                self.writes += 1
                try:
                    results = await self._admit_batch(
                        [entry for entry, _, _ in batch], [update for _, update, _ in batch]
                    )
                except Exception as exc:
                    for _, _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                except BaseException as exc:  # cancelled: so is every delivery waiting
                    for _, _, future in (*batch, *self._waiting):
                        if not future.done():
                            future.cancel()
                    self._waiting.clear()
                    raise exc
                for (_, _, future), admitted in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(admitted)
        finally:
            self._writer = None

    def _take(self) -> list[_Waiting]:
        """The next batch: up to ``max_batch`` waiting deliveries of distinct updates, in
        arrival order (a second delivery of an update waits for the next write)."""
        batch: list[_Waiting] = []
        rest: list[_Waiting] = []
        keys: set[str] = set()
        for waiting in self._waiting:
            key = waiting[0].update_key
            if len(batch) < self.max_batch and key not in keys:
                keys.add(key)
                batch.append(waiting)
            else:
                rest.append(waiting)
        self._waiting = rest
        return batch
