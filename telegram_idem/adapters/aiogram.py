"""aiogram 3 adapter: the update guard as an outer middleware on ``dp.update``.

::

    idem = Idem("sqlite:///bot.db")
    dp = Dispatcher()
    dp.update.outer_middleware(IdempotencyMiddleware(idem))

A duplicate update (same ``(bot.id, update_id)``) never reaches a handler: the middleware
returns ``UNHANDLED`` and, on a webhook, aiogram answers 200 so Telegram stops re-sending.
Handlers get ``idem`` (the :class:`~telegram_idem.Idem`) and ``idem_tokens`` (the
:class:`~telegram_idem.CallbackTokens`, if given) in their data, and ``@idempotent`` works
on them with templates rooted at the update. Updates of a type this version does not
know (Bot API "Update" section) are passed to aiogram untouched and unguarded.

Works with ``feed_update``, ``feed_raw_update``, ``feed_webhook_update``, polling and
aiogram's ``SimpleRequestHandler``. A webhook that claimed the update before answering
passes the claim as ``feed_update(bot, update, idem_update_claim=claim)``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, Literal

from aiogram import BaseMiddleware, Bot, Dispatcher
from aiogram.dispatcher.event.bases import UNHANDLED
from aiogram.types import TelegramObject, Update
from aiogram.types.update import UpdateTypeLookupError

from telegram_idem.adapters._aiogram_wiring import check_event, check_handlers
from telegram_idem.callbacks import CallbackTokens
from telegram_idem.context import bind_update
from telegram_idem.errors import StoreError
from telegram_idem.guard import Idem
from telegram_idem.records import Claim

__all__ = [
    "CLAIM",
    "UNGUARDED",
    "IdempotencyMiddleware",
    "LazyUpdate",
    "aiogram_get_updates",
    "inbox_dispatch",
    "update_to_dict",
]

CLAIM = "idem_update_claim"
"""``feed_update`` keyword: the update guard was already claimed by the webhook."""
_GUARDED = "idem_guarded"
UNGUARDED = "idem_unguarded"
"""``feed_update`` keyword: do not claim the update guard (the inbox admitted the update
already, or a webhook failed open on a store outage); the update is still bound."""

log = logging.getLogger("telegram_idem.aiogram")

StorePolicy = Literal["fail_closed", "fail_open"]


def update_to_dict(update: Update) -> dict[str, Any]:
    """The update as Bot API JSON (``from``, not ``from_user``), fields as received."""
    return update.model_dump(mode="json", exclude_unset=True, exclude_none=True, by_alias=True)


class LazyUpdate(Mapping[str, Any]):
    """An aiogram ``Update`` seen as its Bot API dict, converted only when a field other
    than ``update_id`` is read (a key template, a fingerprint, the decision log), so the
    update guard alone never pays for the conversion."""

    __slots__ = ("_data", "_event")

    def __init__(self, event: Update) -> None:
        self._event = event
        self._data: dict[str, Any] | None = None

    def _full(self) -> dict[str, Any]:
        if self._data is None:
            self._data = update_to_dict(self._event)
        return self._data

    def __getitem__(self, key: str) -> Any:
        if key == "update_id":
            return self._event.update_id
        return self._full()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._full())

    def __len__(self) -> int:
        return len(self._full())


class IdempotencyMiddleware(BaseMiddleware):
    """The update guard for an aiogram ``Dispatcher`` (register with
    ``dp.update.outer_middleware``).

    Args:
        idem: the guard.
        tokens: callback tokens to inject as ``idem_tokens``.
        on_store_error: ``"fail_closed"`` (default) re-raises
            :class:`~telegram_idem.errors.StoreError`, so the update is not processed
            unguarded (a webhook answering from the result gets a 5xx and Telegram
            re-sends); ``"fail_open"`` processes the update without the guard and logs
            an error.
    """

    def __init__(
        self,
        idem: Idem,
        *,
        tokens: CallbackTokens | None = None,
        on_store_error: StorePolicy = "fail_closed",
    ) -> None:
        self.idem = idem
        self.tokens = tokens
        self.on_store_error = on_store_error

    async def __call__(
        self,
        handler: Callable[[TelegramObject, dict[str, Any]], Awaitable[Any]],
        event: TelegramObject,
        data: dict[str, Any],
    ) -> Any:
        if data.get(_GUARDED):  # registered twice: the outer one already guards this update
            return await handler(event, data)
        data[_GUARDED] = True
        data["idem"] = self.idem
        if self.tokens is not None:
            data["idem_tokens"] = self.tokens
        check_event(event)  # wiring mistakes raise instead of guarding nothing
        check_handlers(data.get("dispatcher"))
        assert isinstance(event, Update)
        try:
            event.event_type  # noqa: B018  (raises for update types aiogram does not know)
        except UpdateTypeLookupError:
            return await handler(event, data)
        update = LazyUpdate(event)
        bot_id: int = data["bot"].id
        if data.pop(UNGUARDED, False):
            with bind_update(update, bot_id=bot_id, idem=self.idem):
                return await handler(event, data)
        claim: Claim | None = data.pop(CLAIM, None)
        if claim is None:
            try:
                claim = await self.idem.claim_update(update, bot_id=bot_id)
            except StoreError:
                if self.on_store_error == "fail_closed":
                    raise
                log.error(
                    "store outage: update %s processed unguarded (fail_open)", event.update_id
                )
                return await handler(event, data)
        ran, result = await self.idem.process_update(
            update, lambda: handler(event, data), bot_id=bot_id, claim=claim
        )
        return result if ran else UNHANDLED


def inbox_dispatch(dispatcher: Dispatcher, bot: Bot) -> Callable[[dict[str, Any]], Awaitable[Any]]:
    """The :class:`~telegram_idem.inbox.worker.InboxWorker` dispatch for aiogram: feeds
    the update with the update guard skipped (the inbox admitted it) and the update bound.
    Handler exceptions propagate, so the worker retries."""

    async def dispatch(update: dict[str, Any]) -> Any:
        return await dispatcher.feed_raw_update(bot, update, **{UNGUARDED: True})

    return dispatch


def aiogram_get_updates(
    bot: Bot,
) -> Callable[[int | None, int, float], Awaitable[list[dict[str, Any]]]]:
    """``getUpdates`` through an aiogram ``Bot``, as Bot API dicts (for
    :class:`~telegram_idem.ingress.polling.PollingIngress`)."""

    async def get_updates(offset: int | None, limit: int, wait: float) -> list[dict[str, Any]]:
        updates = await bot.get_updates(
            offset=offset, limit=limit, timeout=int(wait), request_timeout=int(wait) + 10
        )
        return [update_to_dict(u) for u in updates]

    return get_updates
