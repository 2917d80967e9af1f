"""Fast-ack webhook for aiogram: claim the update, answer 200, process in the background.

Telegram waits about 60 s for a 2xx and re-sends the same update otherwise (Bot API,
``setWebhook``; design.md §1). This handler answers in milliseconds: it checks the request
(:mod:`~telegram_idem.adapters.webhook_checks`), claims the update guard, answers, then
feeds the update to the dispatcher in a background task with the claim attached, so the
:class:`~telegram_idem.adapters.aiogram.IdempotencyMiddleware` does not claim again.

| situation                                   | answer                        |
|---------------------------------------------|-------------------------------|
| new update                                  | 200, processed in background  |
| duplicate (in progress or done)             | 200, not processed            |
| unknown update type                         | 200, fed to aiogram untouched |
| store outage, ``fail_closed`` (default)     | 503: Telegram re-sends later  |
| store outage, ``fail_open``                 | 200, processed unguarded      |
| aiogram cannot parse a known update type    | 400                           |
| ``background=False`` and processing fails   | 500: Telegram re-sends        |

The background task lives in this process: a crash after the 200 loses the update until
the durable inbox lands; the update guard's lease then expires so a re-delivery would run.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

from aiogram import Bot, Dispatcher
from aiogram.types import Update
from aiohttp import web
from pydantic import ValidationError

from telegram_idem.adapters.aiogram import CLAIM, UNGUARDED
from telegram_idem.adapters.webhook_checks import DEFAULT_MAX_BODY, check_secret_token, read_update
from telegram_idem.errors import StoreError
from telegram_idem.guard import Idem
from telegram_idem.records import Outcome
from telegram_idem.updates import KNOWN_UPDATE_TYPES

__all__ = ["FastAckWebhook"]

log = logging.getLogger("telegram_idem.webhook")


class FastAckWebhook:
    """An aiohttp request handler: ``app.router.add_post(path, FastAckWebhook(...).handle)``.

    Args:
        dispatcher: the aiogram dispatcher (with ``IdempotencyMiddleware`` registered).
        bot: the bot the updates are for.
        idem: the guard (the same object the middleware uses).
        secret_token: the ``secret_token`` given to ``setWebhook``, or ``None``.
        max_body: largest body accepted, bytes.
        on_store_error: ``"fail_closed"`` answers 503; ``"fail_open"`` processes unguarded.
        background: ``False`` processes before answering (the slow shape of seeds/000;
            only for demonstrations — Telegram re-sends after ~60 s).

    Raises:
        ConfigurationError: a malformed ``secret_token``.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        bot: Bot,
        idem: Idem,
        *,
        secret_token: str | None = None,
        max_body: int = DEFAULT_MAX_BODY,
        on_store_error: Literal["fail_closed", "fail_open"] = "fail_closed",
        background: bool = True,
    ) -> None:
        self.dispatcher = dispatcher
        self.bot = bot
        self.idem = idem
        self.secret_token = check_secret_token(secret_token)
        self.max_body = max_body
        self.on_store_error = on_store_error
        self.background = background
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def in_flight(self) -> int:
        """Updates being processed in the background now."""
        return len(self._tasks)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Answer one webhook POST (see the module's table).

        Raises:
            aiohttp.web.HTTPException: 401, 413, 400 or 503 as in the table.
        """
        raw = await read_update(request, secret=self.secret_token, max_body=self.max_body)
        try:
            update = Update.model_validate(raw, context={"bot": self.bot})
        except ValidationError as exc:
            log.error("update %s does not parse: %s", raw.get("update_id"), exc)
            raise web.HTTPBadRequest(text="update does not parse") from None
        if any(kind in raw for kind in KNOWN_UPDATE_TYPES):
            try:
                claim = await self.idem.claim_update(raw, bot_id=self.bot.id)
            except StoreError:
                if self.on_store_error == "fail_closed":
                    log.warning("store outage: update %s refused with 503", raw["update_id"])
                    raise web.HTTPServiceUnavailable(text="store unavailable") from None
                log.error("store outage: update %s processed unguarded", raw["update_id"])
                extra: dict[str, Any] = {UNGUARDED: True}
            else:
                if claim.outcome is not Outcome.ACQUIRED:
                    return web.Response(text="duplicate")
                extra = {CLAIM: claim}
        else:
            extra = {}
        task = asyncio.create_task(self._feed(update, extra))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if not self.background:
            try:
                await asyncio.shield(task)
            except Exception:
                raise web.HTTPInternalServerError(text="update failed") from None
        return web.Response(text="ok")

    async def _feed(self, update: Update, extra: dict[str, Any]) -> None:
        try:
            await self.dispatcher.feed_update(self.bot, update, **extra)
        except Exception:
            if not self.background:
                log.exception(
                    "update %s failed: answered 500 so Telegram re-sends", update.update_id
                )
                raise
            log.exception(
                "update %s failed after its 200; its claim was released, so only a "
                "re-delivery runs it again",
                update.update_id,
            )

    async def drain(self, limit: float | None = None) -> None:
        """Wait for background work to finish (graceful shutdown), at most ``limit`` s."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=limit)
