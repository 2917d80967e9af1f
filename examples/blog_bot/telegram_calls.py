"""Bot API calls the blog bot makes, made safe to repeat.

- ``editMessageText`` with unchanged content fails with "message is not modified"
  (Bot API, "Updating messages"): for a replayed progress edit that is success.
- 429 answers carry ``retry_after`` seconds (Bot API, ``ResponseParameters``): waited out
  and retried with tenacity, a few times at most.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiogram import Bot
from aiogram.exceptions import TelegramBadRequest, TelegramRetryAfter
from aiogram.types import InlineKeyboardMarkup
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt
from tenacity.wait import wait_base

__all__ = ["edit_text", "with_retry_after"]

T = TypeVar("T")


class _WaitRetryAfter(wait_base):
    def __call__(self, retry_state: Any) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        return float(exc.retry_after) if isinstance(exc, TelegramRetryAfter) else 1.0


async def with_retry_after(call: Callable[[], Awaitable[T]], *, attempts: int = 4) -> T:
    """Run a Bot API call, waiting out 429 ``retry_after`` up to ``attempts`` times.

    Raises:
        TelegramRetryAfter: still rate-limited after ``attempts`` tries.
        TelegramAPIError: any other Bot API error, at once.
    """
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(TelegramRetryAfter),
        wait=_WaitRetryAfter(),
        stop=stop_after_attempt(attempts),
        reraise=True,
    ):
        with attempt:
            return await call()
    raise AssertionError("unreachable")  # pragma: no cover


async def edit_text(
    bot: Bot,
    chat_id: int,
    message_id: int,
    text: str,
    markup: InlineKeyboardMarkup | None = None,
) -> None:
    """Edit a message's text; "message is not modified" counts as done.

    Raises:
        TelegramBadRequest: any other refusal (message gone, bad markup…).
    """
    try:
        await with_retry_after(
            lambda: bot.edit_message_text(
                text=text, chat_id=chat_id, message_id=message_id, reply_markup=markup
            )
        )
    except TelegramBadRequest as exc:
        if "message is not modified" not in exc.message:
            raise
