"""The flood budget of :class:`~telegram_idem.backends.redis.RedisStore`: GCRA in Lua.

Each budget is one string, its ``tat`` in integer **microseconds** since the epoch, at
:meth:`KeyLayout.flood <telegram_idem.backends.redis._keys.KeyLayout.flood>`: a key of
the shape ``<prefix>:<bot_id>:f:<scope>`` (:meth:`telegram_idem._keys.KeyBuilder.flood`)
is stored under the hash tag ``{<prefix>:<bot_id>}``, so every budget of a bot is in one
slot and a reservation over several of them is ONE script, all or nothing
(:func:`telegram_idem.flood.decide`, computed inside Redis on its own clock: ``TIME``, or
the injected clock in tests). Every write sets ``PX`` to a minute after the new ``tat``,
so Redis forgets a budget that went unused (a forgotten budget is a full bucket, what
its ``tat`` said anyway).

On a cluster, one reservation must stay in one slot: buckets of different bots (or keys
of another shape) in one :meth:`RedisFloodBudget.reserve` are a
:class:`~telegram_idem.errors.ConfigurationError`. Round trips: every call is one
``EVALSHA``.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.crc import key_slot

from telegram_idem.backends.redis._connection import RedisConnection
from telegram_idem.backends.redis._scripts import SCRIPTS, Script
from telegram_idem.errors import ConfigurationError
from telegram_idem.flood import Bucket, FloodBudget

__all__ = ["RedisFloodBudget"]

_RESERVE = SCRIPTS["flood_reserve"]
_GATE = SCRIPTS["flood_gate"]


def _us(seconds: float, what: str) -> int:
    """Seconds → whole microseconds (rounded to the nearest).

    Raises:
        ConfigurationError: not a finite number ≥ 0.
    """
    if not (seconds >= 0 and seconds != float("inf")):
        raise ConfigurationError(f"{what} must be a finite number of seconds >= 0, got {seconds}")
    return round(seconds * 1_000_000)


class RedisFloodBudget(FloodBudget):
    """GCRA budgets in the store's Redis (see the module docstring).

    Made by :meth:`RedisStore.flood_budget()
    <telegram_idem.backends.redis.RedisStore.flood_budget>`.

    Args:
        connection: the store's connection (client, keys, clock, gate, errors).
    """

    def __init__(self, connection: RedisConnection) -> None:
        self.connection = connection

    def __repr__(self) -> str:
        return f"RedisFloodBudget({self.connection.label})"

    def redis_key(self, key: str) -> str:
        """The Redis key of budget ``key`` (see the module docstring).

        Args:
            key: the budget's key (a bucket's ``key``).
        """
        return self.connection.keys.flood(key)

    def _now_arg(self) -> str:
        clock = self.connection.clock
        return "" if clock is None else str(round(clock() * 1_000_000))

    async def _script(self, op: str, script: Script, keys: list[bytes], args: list[str]) -> str:
        connection = self.connection
        argv = [self._now_arg(), *args]
        answer = await connection.call(f"flood.{op}", lambda: connection.run(script, keys, argv))
        return answer.decode() if isinstance(answer, bytes) else str(answer)

    async def reserve(self, buckets: Sequence[Bucket]) -> float:
        """See :meth:`FloodBudget.reserve`.

        Raises:
            ConfigurationError: on a cluster, buckets in more than one slot; an interval
                or burst that is not a finite number ≥ 0.
            StoreError: Redis cannot answer now.
        """
        if not buckets:
            return 0.0
        keys = [self.redis_key(b.key).encode() for b in buckets]
        if self.connection.cluster and len({key_slot(k) for k in keys}) > 1:
            raise ConfigurationError(
                "on a Redis Cluster one reservation must stay in one slot: the buckets "
                "<prefix>:<bot_id>:f:<scope> of one bot, got "
                f"{[b.key for b in buckets]!r}"
            )
        args: list[str] = []
        for b in buckets:
            if not (b.burst >= 0 and b.burst != float("inf")):
                raise ConfigurationError(f"a bucket's burst must be finite and >= 0: {b!r}")
            args += [str(_us(b.interval, "interval")), repr(float(b.burst))]
        wait = int(await self._script("reserve", _RESERVE, keys, args))
        return wait / 1_000_000

    async def pause(self, key: str, seconds: float) -> None:
        """See :meth:`FloodBudget.pause`.

        Raises:
            ConfigurationError: ``seconds`` is not a finite number ≥ 0.
            StoreError: Redis cannot answer now.
        """
        us = _us(max(seconds, 0.0), "seconds")  # a pause into the past changes nothing
        await self._script("pause", _GATE, [self.redis_key(key).encode()], ["pause", str(us)])

    async def paused_for(self, key: str) -> float:
        """See :meth:`FloodBudget.paused_for`.

        Raises:
            StoreError: Redis cannot answer now.
        """
        keys = [self.redis_key(key).encode()]
        return int(await self._script("paused_for", _GATE, keys, ["paused_for"])) / 1_000_000
