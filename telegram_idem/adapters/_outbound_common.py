"""What the aiogram and PTB outbound hooks share, framework-free: flood control as they
call it, which methods bypass the outbox, and the pace-and-retry loop of a flood-only
hook."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "DIRECT_METHODS",
    "Pacer",
    "goes_direct",
    "paced",
]

T = TypeVar("T")

DEFAULT_MAX_RETRIES = 3
"""How many times a flood-only hook sends a call again after a 429 before it lets the
framework's own error through."""

DIRECT_METHODS = frozenset(
    {
        "getUpdates",
        "setWebhook",
        "deleteWebhook",
        "getWebhookInfo",
        "logOut",
        "close",
        "getFile",
    }
)
"""Methods the outbox hooks never route through the outbox: polling, the webhook
settings, the bot's own session (Bot API "Getting updates", "logOut", "close"), and
file downloads. Every other ``get*`` method also goes direct (see :func:`goes_direct`):
a read changes nothing, so there is nothing to send once."""


def goes_direct(method: str) -> bool:
    """Whether an outbox hook passes ``method`` to the framework's own sender: the
    :data:`DIRECT_METHODS` and every read (``get*``, Bot API method names are
    case-insensitive)."""
    return method in DIRECT_METHODS or method[:3].lower() == "get"


class Pacer(Protocol):
    """Flood control as the hooks call it: ``telegram_idem.flood.FloodControl``."""

    async def wait_turn(
        self, method: str, params: Mapping[str, Any], *, priority: int | None = None
    ) -> float:
        """Wait until the call may go out; the seconds waited."""
        ...

    async def retry_after(self, seconds: float, *, method: str | None = None) -> None:
        """A 429 to ``method`` said to pause the whole bot for ``seconds``."""
        ...


async def paced(
    flood: Pacer,
    method: str,
    params: Mapping[str, Any],
    send: Callable[[], Awaitable[T]],
    retry_after_of: Callable[[Exception], float | None],
    *,
    priority: int | None = None,
    max_retries: int = DEFAULT_MAX_RETRIES,
) -> T:
    """Send once the call's turn comes; on a 429 pause the bot for every process
    (``flood.retry_after``) and send again, at most ``max_retries`` more times.

    Args:
        flood: the shared flood control.
        method, params: the call, as flood control reads it (``chat_id``,
            ``allow_paid_broadcast``).
        send: makes the request (the framework's own sender).
        retry_after_of: the ``retry_after`` seconds of a framework 429 error, else ``None``.
        priority: 0 (a reply) … 10 (bulk); ``None``: the enclosing
            ``telegram_idem.flood.priority(...)`` block's, else 0.
        max_retries: sends after the first one that a 429 may cause.

    Raises:
        Exception: what ``send`` raised, when it is no 429 or the retries are spent;
            :class:`~telegram_idem.errors.StoreError` from flood control.
    """
    attempt = 0
    while True:
        await flood.wait_turn(method, params, priority=priority)
        try:
            return await send()
        except Exception as exc:
            pause = retry_after_of(exc)
            if pause is None or attempt >= max_retries:
                raise
            attempt += 1
            await flood.retry_after(pause, method=method)
