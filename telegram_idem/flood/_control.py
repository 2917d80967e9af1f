"""Flood control for one bot: reserve a call's budgets before sending it, and pause the
whole bot on a 429.

Every process that sends for a bot shares its store's
:class:`~telegram_idem.flood._base.FloodBudget`, so the budgets of
:func:`~telegram_idem.flood._limits.buckets_for` hold across processes: a call waits
until every budget it spends has room, and a 429 answer (Bot API "Making requests":
``parameters.retry_after``, which applies to the whole bot) closes the bot's pause gate
for every process at once.

Both are decision events (:mod:`telegram_idem.events`, boundary ``"flood"``, ``handler``
the Bot API method): ``"retry_after"`` for a 429 given to :meth:`FloodControl.retry_after`
(``seconds``: the pause asked for), ``"wait"`` for a call that waited for its budgets in
:meth:`FloodControl.wait_turn` or :meth:`FloodControl.note_wait` (``seconds``: the time
waited). When nobody listens, each costs one check.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from telegram_idem._keys import KeyBuilder
from telegram_idem.errors import ConfigurationError
from telegram_idem.events import emit_decision, listening
from telegram_idem.flood._base import Bucket, FloodBudget
from telegram_idem.flood._limits import Limits, buckets_for
from telegram_idem.flood._priority import current_priority

__all__ = ["FloodControl"]

Sleep = Callable[[float], Awaitable[None]]


class FloodControl:
    """Paces one bot's calls through a shared :class:`FloodBudget`.

    Args:
        budget: the store's budget (``store.flood_budget()``; see :meth:`for_store`).
        bot_id: the bot whose budgets these are.
        limits: the budgets' sizes (default ``Limits().with_headroom()``: Telegram's
            published guidance with each burst smaller by what its rate spends in
            ``HEADROOM_JITTER`` = 0.2 s, so calls whose delays to Telegram differ by up
            to 0.2 s still arrive inside its limits; beyond, a 429 pauses the bot for its
            ``retry_after`` and the call is retried).
        keys: the key layout (``KeyBuilder()`` by default; give the one your ``Idem``
            uses, so tenants with their own prefix do not share budgets).
        sleep: how to wait (tests inject one).
    """

    def __init__(
        self,
        budget: FloodBudget,
        *,
        bot_id: int,
        limits: Limits | None = None,
        keys: KeyBuilder | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.budget = budget
        self.bot_id = bot_id
        self.limits = limits if limits is not None else Limits().with_headroom()
        self.keys = keys if keys is not None else KeyBuilder()
        self.sleep = sleep

    @classmethod
    def for_store(
        cls,
        store: object,
        *,
        bot_id: int,
        limits: Limits | None = None,
        keys: KeyBuilder | None = None,
    ) -> FloodControl:
        """Flood control over ``store``'s own budget (``store.flood_budget()``).

        Args:
            store: the store (one with the flood-budget ability).
            bot_id: the bot whose calls are paced.
            limits: the limits; ``None``: Telegram's, with headroom.
            keys: the key builder; ``None``: ``KeyBuilder()``.

        Raises:
            ConfigurationError: ``store`` keeps no flood budget.
        """
        return cls(budget_of(store), bot_id=bot_id, limits=limits, keys=keys)

    def key(self, scope: str) -> str:
        """The store key of one of this bot's budgets (``"pause"``, ``"global"``,
        ``"chat:<id>"``).

        Args:
            scope: the budget's scope: ``"pause"``, ``"global"``, ``"chat:<id>"``.
        """
        return self.keys.flood(self.bot_id, scope)

    async def wait_turn(
        self,
        method: str,
        params: Mapping[str, Any],
        *,
        priority: int | None = None,
        deadline: float | None = None,
    ) -> float:
        """Wait until the call may be sent, and reserve it in every budget it spends.

        Args:
            method: the Bot API method.
            params: its parameters (``chat_id``, ``allow_paid_broadcast`` are read).
            priority: ``REPLY`` (0) … ``BULK`` (10): bulk calls use only part of the
                shared bursts; ``None``: the enclosing :func:`~telegram_idem.flood.priority`
                block's, else ``REPLY``.
            deadline: a ``time.monotonic()`` reading: give up rather than wait past it.

        Returns:
            The seconds waited (0.0 when the budgets had room).

        Raises:
            TimeoutError: the budgets have no room before ``deadline`` (nothing reserved).
            StoreError: the store could not answer.
        """
        buckets = self._buckets(method, params, priority)
        waited = 0.0
        while True:
            wait = await self.budget.reserve(buckets)
            if wait <= 0:
                if waited > 0:
                    self.note_wait(method, params, waited)
                return waited
            if deadline is not None and time.monotonic() + wait > deadline:
                raise TimeoutError(
                    f"{method}: flood control has no room for {wait:.2f} s, past the deadline"
                )
            await self.sleep(wait)
            waited += wait

    async def try_turn(
        self, method: str, params: Mapping[str, Any], *, priority: int | None = None
    ) -> float:
        """Reserve the call in every budget it spends if they have room now, else nothing.

        Args:
            method: as :meth:`wait_turn`.
            params: as :meth:`wait_turn`.
            priority: as :meth:`wait_turn`.

        Returns:
            ``0.0`` when reserved; else the seconds to wait before asking again (nothing
            was reserved).

        Raises:
            StoreError: the store could not answer.
        """
        buckets = self._buckets(method, params, priority)
        return await self.budget.reserve(buckets)

    def _buckets(
        self, method: str, params: Mapping[str, Any], priority: int | None
    ) -> list[Bucket]:
        """The budgets the call spends, at its priority (given, else the enclosing
        ``priority(...)`` block's)."""
        return buckets_for(
            method, params, limits=self.limits, key=self.key, priority=current_priority(priority)
        )

    def note_wait(self, method: str, params: Mapping[str, Any], seconds: float) -> None:
        """Emit the ``"wait"`` decision event of a call that waited ``seconds`` for its
        budgets (:meth:`wait_turn` does it itself; a caller that waits on its own after
        :meth:`try_turn` calls this). Never raises; costs one check when nobody listens.

        Args:
            method: the Bot API method.
            params: its parameters (``chat_id`` names the budget in the event's key).
            seconds: how long it waited.
        """
        if not listening():
            return
        chat = params.get("chat_id")
        scope = f"chat:{chat}" if isinstance(chat, int | str) else "global"
        emit_decision(
            boundary="flood",
            key=self.key(scope),
            decision="wait",
            update=None,
            handler=method,
            bot_id=self.bot_id,
            seconds=round(seconds, 6),
        )

    async def retry_after(self, seconds: float, *, method: str | None = None) -> None:
        """A 429 said to wait ``seconds``: close the bot's pause gate for that long, for
        every process sharing the store (a longer pause already set is kept), after
        emitting the ``"retry_after"`` decision event.

        Args:
            seconds: the answer's ``parameters.retry_after``.
            method: the Bot API method that was answered 429 (the event's ``handler``).

        Raises:
            StoreError: the store could not answer.
        """
        pause = max(float(seconds), 0.0)
        emit_decision(
            boundary="flood",
            key=self.key("pause"),
            decision="retry_after",
            update=None,
            handler=method,
            bot_id=self.bot_id,
            seconds=pause,
        )
        await self.budget.pause(self.key("pause"), pause)

    async def paused_for(self) -> float:
        """Seconds the bot's pause gate stays closed (0.0 when open).

        Raises:
            StoreError: the store could not answer.
        """
        return await self.budget.paused_for(self.key("pause"))


def budget_of(store: object) -> FloodBudget:
    """``store.flood_budget()``.

    Asked by duck typing, not through ``telegram_idem.backends.flood_budget_of``: the
    stores import this package for the contract, so importing them back would make a
    cycle. The base ``Store.flood_budget`` raises the same error ``flood_budget_of`` does.

    Raises:
        ConfigurationError: ``store`` keeps no flood budget.
    """
    getter = getattr(store, "flood_budget", None)
    if not callable(getter):
        raise ConfigurationError(f"{store!r} has no flood budget (no flood_budget() method)")
    budget = getter()
    if not isinstance(budget, FloodBudget):
        raise ConfigurationError(f"{store!r}.flood_budget() did not return a FloodBudget")
    return budget
