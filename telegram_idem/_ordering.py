"""One ordering rule for every ingress shape: which updates run one at a time.

Updates of one *unit* run one at a time, in the order they arrived; different units run
in parallel. The inbox ingresses (``WebhookIngress``, ``PollingIngress``, the framework
adapters) and the PTB ``IdempotentUpdateProcessor`` all key their ordering with
:meth:`Ordering.key`, so a bot behaves the same whichever shape it is deployed in.

- the unit is :func:`telegram_idem._updates.ordering_key` (the chat, split by business
  connection and forum topic; else the user) or the bot author's own rule;
- callback queries get a lane of their own (``<unit>:cbq``) so a button tap is never
  answered late because a long job of its chat is running (Telegram shows an error when
  ``answerCallbackQuery`` does not come within about 15 s — Bot API,
  "answerCallbackQuery"). Taps stay in order among themselves.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from telegram_idem._keys import render_template
from telegram_idem._updates import ordering_key, update_type
from telegram_idem.errors import ConfigurationError, KeyTemplateError

__all__ = ["CALLBACK_LANE", "DEFAULT_ORDERING", "Ordering", "OrderingUnit"]

OrderingUnit = str | Callable[[Mapping[str, Any]], "str | None"]
"""A key template over the update (``"chat:{chat_id}"``, the shorthands and dotted paths of
:mod:`telegram_idem._keys`), or a callable ``(update dict) -> str | None``."""

CALLBACK_LANE = ":cbq"
"""The suffix of the callback-query lane of a unit (``chat:42`` → ``chat:42:cbq``)."""


@dataclass(frozen=True, slots=True)
class Ordering:
    """How updates are ordered: updates of one unit run one at a time, in arrival order;
    different units run in parallel.

    Args:
        unit: the rule; ``None`` is :func:`telegram_idem._updates.ordering_key`. A template
            that names a field the update lacks, or a callable that returns ``None``,
            makes the update a unit of its own (not ordered with anything).
        callback_lane: put callback queries in the lane ``<unit>:cbq`` (default), so they
            never wait behind a long message job of their unit; ``False`` orders them with
            the messages of their unit (then a tap during a job longer than ~15 s is
            answered too late for Telegram — Bot API, "answerCallbackQuery").

    Raises:
        KeyTemplateError: ``unit`` is a malformed template, or names no field.
    """

    unit: OrderingUnit | None = None
    callback_lane: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.unit, str):
            try:
                fields = [f for _, f, _, _ in string.Formatter().parse(self.unit) if f]
            except ValueError as exc:
                raise KeyTemplateError(
                    f"ordering template {self.unit!r}: {exc}", template=self.unit
                ) from None
            if not fields:
                raise KeyTemplateError(
                    f"ordering template {self.unit!r} names no field: every update would "
                    "share one unit",
                    template=self.unit,
                )

    def key(self, update: Mapping[str, Any]) -> str | None:
        """The ordering key of ``update`` (a Bot API ``Update`` as a dict; ``None``: a unit
        of its own).

        Args:
            update: the Bot API update.

        Raises:
            ConfigurationError: a callable ``unit`` returned something other than a
                non-empty string or ``None``.
            Exception: whatever a callable ``unit`` raised.
        """
        base = self._unit(update)
        if base is not None and self.callback_lane and update_type(update) == "callback_query":
            return f"{base}{CALLBACK_LANE}"
        return base

    def _unit(self, update: Mapping[str, Any]) -> str | None:
        rule = self.unit
        if rule is None:
            return ordering_key(update)
        if isinstance(rule, str):
            try:
                return render_template(rule, update, bot_id=None)
            except KeyTemplateError:
                return None
        value = rule(update)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise ConfigurationError(
                f"the ordering rule {rule!r} returned {value!r}; it must return a non-empty "
                "string or None"
            )
        return value


DEFAULT_ORDERING = Ordering()
"""Chat (split by business connection and forum topic), callback queries in their own lane."""
