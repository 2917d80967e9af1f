"""The flood-control budget contract: token buckets shared by every process of a bot.

A :class:`Bucket` is a GCRA (generic cell rate algorithm) budget kept as one number per
key, its *theoretical arrival time* ``tat`` (seconds on the store's clock). Reserving a
set of buckets is one atomic step (:func:`decide`):

- for each bucket ``b``: ``new_tat = max(tat, now) + b.interval`` and
  ``allow_at = new_tat - b.burst * b.interval``;
- if every ``allow_at <= now``, every bucket's ``tat`` becomes its ``new_tat`` and the
  answer is ``0.0`` (reserved);
- otherwise nothing changes and the answer is ``max(allow_at) - now``: the seconds to wait
  before asking again.

So a bucket lets ``burst`` calls through at once and then one per ``interval`` seconds:
in any window of ``T`` seconds at most ``burst + T / interval`` calls pass. A bucket with
``interval = 0`` and ``burst = 0`` is a **gate**: it passes while ``tat <= now`` and
:meth:`FloodBudget.pause` closes it until a given time (a 429's ``retry_after``, which
applies to the whole bot). A key no store holds counts as ``tat = now``. Stores may
forget a key once its ``tat`` is in the past by more than a minute (a forgotten key is a
full bucket, which is what its ``tat`` said anyway).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Bucket", "FloodBudget", "decide"]


@dataclass(frozen=True, slots=True)
class Bucket:
    """One budget.

    Attributes:
        key: the store key (``<prefix>:<bot_id>:f:<scope>``).
        interval: seconds per call once the burst is spent (``period / rate``); ``0`` for a
            gate.
        burst: calls allowed at once (≥ 1; ``0`` for a gate).
    """

    key: str
    interval: float
    burst: float

    @classmethod
    def gate(cls, key: str) -> Bucket:
        """A gate: passes unless paused (see the module docstring).

        Args:
            key: the gate's store key (one per bot: its 429 pause).
        """
        return cls(key, 0.0, 0.0)


def decide(
    tats: Sequence[float | None], buckets: Sequence[Bucket], now: float
) -> tuple[float, list[float]]:
    """The reservation rule, for stores that compute it in Python.

    Args:
        tats: each bucket's stored ``tat`` (``None``: not stored).
        buckets: the buckets, in the same order.
        now: the store's clock, seconds.

    Returns:
        ``(wait, new_tats)``: ``wait == 0.0`` means reserved and ``new_tats`` are to be
        written; otherwise ``wait`` seconds to wait and nothing is to be written.
    """
    wait = 0.0
    new: list[float] = []
    for tat, b in zip(tats, buckets, strict=True):
        nt = max(tat if tat is not None else now, now) + b.interval
        new.append(nt)
        wait = max(wait, nt - b.burst * b.interval - now)
    return (wait, []) if wait > 0 else (0.0, new)


class FloodBudget(abc.ABC):
    """Atomic GCRA reservations over shared keys (see the module docstring).

    Every method raises :class:`~telegram_idem.errors.StoreError` when the store cannot
    answer.
    """

    @abc.abstractmethod
    async def reserve(self, buckets: Sequence[Bucket]) -> float:
        """Reserve one call in every bucket at once, or none.

        Args:
            buckets: the buckets the call spends (:func:`buckets_for`).

        Returns:
            ``0.0`` when reserved; else the seconds to wait before asking again (nothing
            was reserved).
        """

    @abc.abstractmethod
    async def pause(self, key: str, seconds: float) -> None:
        """Close the gate ``key`` for ``seconds`` from now (a later ``tat`` already stored
        is kept: pauses never shorten each other).

        Args:
            key: the gate's key (:meth:`Bucket.gate`).
            seconds: how long the gate stays closed, from now.
        """

    @abc.abstractmethod
    async def paused_for(self, key: str) -> float:
        """Seconds the gate ``key`` stays closed (``0.0`` when open).

        Args:
            key: the gate's key.
        """
