"""Which budgets a Bot API call spends, and how large they are.

The defaults are Telegram's published guidance (Bots FAQ, "My bot is hitting limits, how
do I avoid this?"; not contractual, Telegram adjusts them per bot):

- about one message per second in one chat, short bursts allowed;
- no more than 20 messages per minute in one group (edits count too);
- about 30 messages per second overall for bulk notifications;
- with ``allow_paid_broadcast`` (Bot API ``sendMessage`` and the other send methods) up
  to 1000 messages per second, for 0.1 Star per message beyond the free amount.

A 429 answer ("Too Many Requests: retry after N", ``parameters.retry_after``) applies to
the whole bot: every call of the bot waits behind the ``pause`` gate, whatever its chat.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from telegram_idem.flood._base import Bucket

__all__ = [
    "BULK",
    "HEADROOM_JITTER",
    "REPLY",
    "Limits",
    "Rate",
    "buckets_for",
    "is_group_chat",
    "is_message",
]

REPLY = 0
"""Priority of a reply to a user (the default)."""

BULK = 10
"""Priority of a bulk send (a broadcast): it only spends what replies leave."""

HEADROOM_JITTER = 0.2
"""Seconds of spread in request delays the default limits tolerate
(:meth:`Limits.with_headroom`). Measured on loopback to ``FakeBotAPI(limits=Limits())``,
2–3 processes on one budget, 2 cores loaded by other work, once the relay readies its
transport before its first reservation (``HttpBotAPI.warm``): the first half-second's
reservation-to-arrival delays spread by up to 135 ms (one 429 in 101 runs with 0.1 s of
room), and by 284 ms once with a type check starting on the same cores (one 429 in 70
runs with 0.2 s); by up to ~650 ms before the relay warmed its transport."""


@dataclass(frozen=True, slots=True)
class Rate:
    """``calls`` per ``per`` seconds, ``burst`` of them at once.

    Attributes:
        calls: calls per period (> 0).
        per: the period, seconds (> 0).
        burst: calls allowed at once (≥ 1).
    """

    calls: float
    per: float
    burst: float = 1.0

    def __post_init__(self) -> None:
        if not (self.calls > 0 and self.per > 0 and self.burst >= 1):
            raise ValueError(f"a rate needs calls > 0, per > 0 and burst >= 1, got {self}")

    @property
    def interval(self) -> float:
        """Seconds per call once the burst is spent."""
        return self.per / self.calls

    def bucket(self, key: str) -> Bucket:
        """This rate as the budget ``key``.

        Args:
            key: the budget's store key.
        """
        return Bucket(key, self.interval, self.burst)

    def scaled(self, factor: float) -> Rate:
        """This rate times ``factor`` (0 < factor), the burst kept (at least 1).

        Args:
            factor: the multiplier (> 0).
        """
        return replace(self, calls=self.calls * factor)


def _default_global() -> Rate:
    return Rate(30, 1.0, burst=30)


@dataclass(frozen=True, slots=True)
class Limits:
    """The budgets of one bot (defaults: the module docstring).

    Attributes:
        global_: every message the bot sends, over all chats.
        chat: messages to one private chat.
        group: messages *and edits* to one group, supergroup or channel (default 3 at
            once, then 18 a minute: never more than 20 in any minute).
        paid: messages sent with ``allow_paid_broadcast`` (their own budget, not the
            global one).
        bulk_share: the part of the global and group bursts a :data:`BULK` call may use
            (0 < bulk_share ≤ 1): bulk sends stop while replies still have
            ``1 - bulk_share`` of the burst, so a reply to a user goes first.
    """

    global_: Rate = field(default_factory=_default_global)
    chat: Rate = field(default_factory=lambda: Rate(1, 1.0, burst=3))
    group: Rate = field(default_factory=lambda: Rate(18, 60.0, burst=3))
    # 18 a minute after a burst of 3, not 20: a GCRA budget lets ``burst - 1 + 60 /
    # interval`` calls into a minute, and Telegram's group limit is 20 in any minute
    # (Rate(20, 60.0, burst=3) let a 21st through 54 s after the first).
    paid: Rate = field(default_factory=lambda: Rate(1000, 1.0, burst=1000))
    bulk_share: float = 0.5

    def with_headroom(self, jitter: float = HEADROOM_JITTER) -> Limits:
        """Every burst made smaller by what its rate spends in ``jitter`` seconds
        (``ceil(calls / per * jitter)`` calls, at least one, the burst never below one).

        A call is reserved at ``t`` and reaches Telegram at ``t + d``; ``d`` varies (the
        request's own latency, an event loop busy elsewhere, another process's). Calls
        that conform to a budget at their reservation still conform at their arrival if
        their delays differ by at most ``jitter`` seconds from each other: in any window
        the arrivals are those of a window ``jitter`` longer, which a burst smaller by
        ``rate × jitter`` pays for. Delays that differ by more can bring calls to
        Telegram closer together than its limits allow: the call over them is answered
        429, which pauses every relay of the bot for ``retry_after`` (a second or more);
        the call is retried after it, nothing is lost or sent twice.

        What :class:`~telegram_idem.flood._control.FloodControl` uses by default
        (``Limits().with_headroom()``, :data:`HEADROOM_JITTER` = 0.2 s: bursts 24 global,
        2 per chat, 2 per group, 800 paid; the rates kept).

        Args:
            jitter: the spread of request delays tolerated, seconds (≥ 0; ``0`` keeps the
                bursts).

        Raises:
            ValueError: ``jitter`` < 0.
        """
        if not jitter >= 0:
            raise ValueError(f"headroom jitter must be >= 0 seconds, got {jitter}")

        def less(rate: Rate) -> Rate:
            if rate.burst <= 1 or jitter == 0:
                return rate
            calls = max(1.0, math.ceil(rate.calls / rate.per * jitter - 1e-9))
            return replace(rate, burst=max(1.0, rate.burst - calls))

        return replace(
            self,
            global_=less(self.global_),
            chat=less(self.chat),
            group=less(self.group),
            paid=less(self.paid),
        )

    def scaled(self, factor: float) -> Limits:
        """Every rate times ``factor`` (a safety margin below the real limits: 0.95).

        Args:
            factor: the multiplier of every rate (> 0).
        """
        return replace(
            self,
            global_=self.global_.scaled(factor),
            chat=self.chat.scaled(factor),
            group=self.group.scaled(factor),
            paid=self.paid.scaled(factor),
        )


_MESSAGE_METHODS = frozenset(
    {
        "sendMessage",
        "sendPhoto",
        "sendAudio",
        "sendDocument",
        "sendVideo",
        "sendAnimation",
        "sendVoice",
        "sendVideoNote",
        "sendPaidMedia",
        "sendMediaGroup",
        "sendLocation",
        "sendVenue",
        "sendContact",
        "sendPoll",
        "sendChecklist",
        "sendDice",
        "sendSticker",
        "sendInvoice",
        "sendGame",
        "copyMessage",
        "copyMessages",
        "forwardMessage",
        "forwardMessages",
    }
)

_EDIT_METHODS = frozenset(
    {
        "editMessageText",
        "editMessageCaption",
        "editMessageMedia",
        "editMessageReplyMarkup",
        "editMessageLiveLocation",
        "editMessageChecklist",
    }
)


def is_message(method: str) -> bool:
    """Whether ``method`` sends a new message (it spends the chat and global budgets).

    Args:
        method: the Bot API method.
    """
    return method in _MESSAGE_METHODS


def is_group_chat(chat_id: object) -> bool:
    """A group, supergroup or channel: a negative id or an ``@username`` (Bot API: private
    chats have positive ids).

    Args:
        chat_id: a Bot API ``chat_id`` (an integer or ``@username``).
    """
    if isinstance(chat_id, bool):
        return False
    if isinstance(chat_id, int):
        return chat_id < 0
    if isinstance(chat_id, str):
        return chat_id.startswith("@") or (
            chat_id.lstrip("-").isdigit() and chat_id.startswith("-")
        )
    return False


def buckets_for(
    method: str,
    params: Mapping[str, Any],
    *,
    limits: Limits,
    key: Callable[[str], str],
    priority: int = REPLY,
) -> list[Bucket]:
    """The budgets one call spends, the bot's pause gate first.

    - every call waits at the gate ``key("pause")`` (a 429 closes it for the whole bot);
    - a new message spends ``key("global")`` (or ``key("paid")`` with
      ``allow_paid_broadcast``) and its chat's budget (``key("chat:<id>")``, the group
      rate for groups and channels);
    - an edit spends its group's budget (edits count in groups), nothing in a private chat;
    - everything else (answers, getters, setters, deletes) only waits at the gate.

    A :data:`BULK` call (``priority >= BULK``) sees global and group bursts shrunk to
    ``limits.bulk_share``.

    Args:
        method: the Bot API method.
        params: its parameters (``chat_id``, ``allow_paid_broadcast`` are read).
        limits: the budgets.
        key: the store key of a scope (``KeyBuilder.flood`` bound to the bot).
        priority: :data:`REPLY` (0) … :data:`BULK` (10).
    """
    out = [Bucket.gate(key("pause"))]
    bulk = priority >= BULK
    chat = params.get("chat_id")
    group = is_group_chat(chat)

    def share(rate: Rate) -> Rate:
        return replace(rate, burst=max(1.0, rate.burst * limits.bulk_share)) if bulk else rate

    if is_message(method):
        if params.get("allow_paid_broadcast") is True:
            out.append(limits.paid.bucket(key("paid")))
        else:
            out.append(share(limits.global_).bucket(key("global")))
        if chat is not None:
            rate = share(limits.group) if group else limits.chat
            out.append(rate.bucket(key(f"chat:{chat}")))
    elif method in _EDIT_METHODS and chat is not None and group:
        out.append(share(limits.group).bucket(key(f"chat:{chat}")))
    return out
