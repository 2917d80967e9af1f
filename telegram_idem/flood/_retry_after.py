"""The ``retry_after`` of a framework's flood-control error (an HTTP 429), read one way
for every caller: the inbox worker (a handler that failed with it) and the aiogram and
PTB flood-control hooks (a call that was answered with it)."""

from __future__ import annotations

import warnings
from datetime import timedelta

__all__ = ["retry_after_of"]


def retry_after_of(exc: BaseException) -> float | None:
    """Seconds Telegram asked to wait before the next call, if ``exc`` (or an exception it
    was raised from) is a flood-control answer: an HTTP 429 whose
    ``parameters.retry_after`` the framework exposes as ``retry_after`` (aiogram's
    ``TelegramRetryAfter``: int seconds; python-telegram-bot's ``RetryAfter``: int
    seconds or a ``timedelta``). Bot API, "Making requests": ``ResponseParameters``.

    Args:
        exc: what a Bot API call raised.

    Returns:
        The seconds to wait (≥ 0), or ``None`` if no flood-control answer is found.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        # PTB 22.2+ keeps the period as a timedelta in ``_retry_after`` and warns when the
        # ``retry_after`` property answers with the deprecated int form: read it first.
        value = getattr(current, "_retry_after", None)
        if not isinstance(value, timedelta):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                value = getattr(current, "retry_after", None)
        if isinstance(value, timedelta):
            return max(value.total_seconds(), 0.0)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return max(float(value), 0.0)
        current = current.__cause__ or current.__context__
    return None
