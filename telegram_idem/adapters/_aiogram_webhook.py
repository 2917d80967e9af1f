"""Fast-ack webhook for aiogram: admit the update, answer, process in the background.

Telegram waits about 60 s for a 2xx and re-sends the same update otherwise (Bot API,
``setWebhook``; docs/design/failures.md). This handler decides *before* it answers: it checks the
request as every webhook shell does (:mod:`telegram_idem.ingress._reading`, the request core
:mod:`telegram_idem.webhook_request`), admits the update (:meth:`telegram_idem.Idem.admit`),
answers by the outcome (:mod:`telegram_idem._admission`), then runs the admitted update
(:meth:`~telegram_idem._admitted.Admitted.run`: the dispatcher's ``feed_update`` in a
background task, the update bound as admitted), so the
:class:`~telegram_idem.adapters.aiogram.IdempotencyMiddleware` does not admit it again.

Two ways to mount it, both with the same verb: :class:`FastAckWebhook`
(``hook.register(app, path)``) or :class:`IdempotentRequestHandler`, a drop-in for aiogram's
``SimpleRequestHandler`` (``.register(app, path=...)``). aiogram's own ``SimpleRequestHandler`` with its default
``handle_in_background=True`` answers 200 *before* the guard runs, so a store outage or an
update in progress elsewhere is lost; the middleware warns when it finds itself behind it.

| situation                                      | answer                               |
|------------------------------------------------|--------------------------------------|
| not a webhook update (method, secret, size,    | 405, 401, 413, 408 or 400, as every  |
| JSON, ``update_id``)                           | webhook shell (``docs/answers.md``)  |
| new update                                     | 200, processed in background         |
| duplicate of a completed (or failed) update    | 200, not processed                   |
| in progress elsewhere (holder's lease alive)   | 503: Telegram re-sends later         |
| unknown update type                            | as any update; fed to aiogram untouched |
| store outage, ``fail_closed`` (default)        | 503: Telegram re-sends later         |
| store outage, ``fail_open``                    | 200, processed unguarded             |
| JSON with an integer ``update_id`` that        | 200; the claim is stored as a failure|
| aiogram cannot parse                           | with the parse error, logged ERROR   |
|                                                | (503 during a store outage, either   |
|                                                | policy, so it is recorded later)     |
| ``background=False`` and processing fails      | 500: Telegram re-sends               |

The background task lives in this process: a crash after the 200 loses the update until
the durable inbox lands; the update guard's lease then expires so a re-delivery would run.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiogram import Bot, Dispatcher
from aiogram.methods import TelegramMethod
from aiogram.types import Update
from aiogram.webhook.aiohttp_server import SimpleRequestHandler
from aiohttp import web
from pydantic import ValidationError

from telegram_idem._admission import Admission, StorePolicy, StorePolicyLike
from telegram_idem._admitted import Admitted
from telegram_idem._guard import Idem
from telegram_idem._webhook_secret import SecretTokens, secret_check
from telegram_idem.errors import StoreError
from telegram_idem.ingress import read_update, register
from telegram_idem.webhook_request import DEFAULT_MAX_BODY, DEFAULT_READ_TIMEOUT

__all__ = ["FastAckWebhook", "IdempotentRequestHandler"]

log = logging.getLogger("telegram_idem.webhook")


class FastAckWebhook:
    """An aiohttp webhook: ``FastAckWebhook(...).register(app, "/webhook")``.

    Args:
        dispatcher: the aiogram dispatcher (with ``IdempotencyMiddleware`` registered).
        bot: the bot the updates are for.
        idem: the guard (the same object the middleware uses).
        secret_token: the ``secret_token`` given to ``setWebhook`` (required), or a sequence
            of secrets all accepted while rotating (:mod:`telegram_idem._webhook_secret`).
        allow_unauthenticated: with ``secret_token=None``, accept requests without a
            secret (a WARNING is logged at construction).
        max_body: largest body accepted, bytes.
        read_timeout: seconds the request body may take to arrive (then 408).
        on_store_error: a :class:`~telegram_idem._admission.StorePolicy` (or its string
            value): ``"fail_closed"`` answers 503; ``"fail_open"`` processes unguarded.
        background: ``False`` processes before answering (the slow shape of docs/design/incident.md;
            only for demonstrations — Telegram re-sends after ~60 s).
        data: extra keyword data for every ``feed_update`` (like ``SimpleRequestHandler``'s
            ``**data``).
        where: the name its messages give it (:class:`IdempotentRequestHandler` passes
            its own, so an error names the class the user built).

    Raises:
        ConfigurationError: no ``secret_token`` without ``allow_unauthenticated=True``, a
            malformed one, or an unknown ``on_store_error``.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        bot: Bot,
        idem: Idem,
        *,
        secret_token: SecretTokens = None,
        allow_unauthenticated: bool = False,
        max_body: int = DEFAULT_MAX_BODY,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        on_store_error: StorePolicyLike = StorePolicy.FAIL_CLOSED,
        background: bool = True,
        data: dict[str, Any] | None = None,
        where: str = "FastAckWebhook",
    ) -> None:
        self.dispatcher = dispatcher
        self.bot = bot
        self.idem = idem
        self.secret = secret_check(
            secret_token, allow_unauthenticated=allow_unauthenticated, where=where
        )
        self.max_body = max_body
        self.read_timeout = read_timeout
        self.on_store_error = StorePolicy.of(on_store_error)
        self.background = background
        self.data: dict[str, Any] = dict(data or {})
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def in_flight(self) -> int:
        """Updates being processed in the background now."""
        return len(self._tasks)

    def register(self, app: web.Application, path: str, *, grace: float = 30.0) -> None:
        """Serve :meth:`handle` at ``POST path`` of ``app``
        (:func:`telegram_idem.ingress.register`), and on the application's shutdown wait
        up to ``grace`` seconds for the background work (:meth:`drain`).

        The bot session is yours to close (after this shutdown step, e.g. in
        ``app.on_cleanup``); :class:`IdempotentRequestHandler` closes it itself.

        Args:
            app: the aiohttp application (not yet frozen).
            path: the URL path served (POST only).
            grace: seconds the shutdown waits for the background work.

        Raises:
            RuntimeError: the application is already frozen (started).
        """
        register(app, path, self.handle)

        async def drain(_app: web.Application) -> None:
            await self.drain(grace)

        app.on_shutdown.append(drain)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Answer one webhook POST (see the module's table).

        Args:
            request: the POST Telegram made to the webhook URL.

        Raises:
            aiohttp.web.HTTPException: 401, 413, 408, 400, 503 or 500 as in the table
                (``HTTPServiceUnavailable``: not admitted; ``HTTPInternalServerError``: the
                update failed before the answer).
        """
        raw = await read_update(
            request, secret=self.secret, max_body=self.max_body, read_timeout=self.read_timeout
        )
        try:
            update: Update | None = Update.model_validate(raw, context={"bot": self.bot})
            problem: ValidationError | None = None
        except ValidationError as exc:
            update, problem = None, exc
        # An update aiogram cannot parse cannot run unguarded either: it is recorded.
        policy = self.on_store_error if update is not None else StorePolicy.FAIL_CLOSED
        admitted = await self.idem.admit(raw, bot_id=self.bot.id, store_policy=policy)
        if not admitted.acknowledged:  # NOT_YET, UNAVAILABLE: Telegram re-sends
            raise web.HTTPServiceUnavailable(text=_REFUSED[admitted.outcome])
        if admitted.outcome is Admission.DUPLICATE:
            return web.Response(text="duplicate")
        if update is None:
            assert problem is not None  # only an update that did not parse comes here
            await admitted.fail(problem, source="aiogram")
            return web.Response(text="update does not parse; recorded as failed")
        task = asyncio.create_task(self._run(admitted, update))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if not self.background:
            try:
                await asyncio.shield(task)
            except Exception:
                raise web.HTTPInternalServerError(text="update failed") from None
        return web.Response(text="ok")

    async def _run(self, admitted: Admitted, update: Update) -> None:
        try:
            await admitted.run(lambda: self._feed(update))
        except Exception:
            if not self.background:
                log.exception(
                    "update %s failed: answered 500 so Telegram re-sends", update.update_id
                )
                raise
            log.exception(
                "update %s failed after its 200 (Telegram does not re-send it); %s",
                update.update_id,
                await self._claim_after_failure(admitted),
            )

    async def _feed(self, update: Update) -> None:
        result = await self.dispatcher.feed_update(self.bot, update, **self.data)
        if isinstance(result, TelegramMethod):  # a handler answered with a method
            await self.dispatcher.silent_call_request(bot=self.bot, result=result)

    async def _claim_after_failure(self, admitted: Admitted) -> str:
        """What became of a failed update's claim, as the store says now.

        :meth:`Admitted.run` released the claim when the handler raised, or logged that
        it could not; releasing again with the same token is harmless and tells which.
        """
        if admitted.claim is None:
            return "it was processed without a claim (unguarded), so nothing holds it"
        try:
            released = await self.idem.store.release(admitted.key, admitted.claim.token)
        except StoreError:
            return (
                "its claim could not be released (store unavailable): it frees when its "
                "lease ends, and only a re-delivery after that runs it again"
            )
        if not released:
            return "its claim is no longer this delivery's (taken over, or completed)"
        return "its claim is released, so only a re-delivery runs it again"

    async def drain(self, limit: float | None = None) -> None:
        """Wait for background work to finish (graceful shutdown), at most ``limit`` s.

        Args:
            limit: seconds to wait at most.
        """
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=limit)


_REFUSED = {
    Admission.NOT_YET: "in progress elsewhere",
    Admission.UNAVAILABLE: "store unavailable",
}


class IdempotentRequestHandler(SimpleRequestHandler):
    """aiogram's ``SimpleRequestHandler`` that decides before it answers (a
    :class:`FastAckWebhook` inside)::

        IdempotentRequestHandler(dispatcher=dp, bot=bot, idem=idem,
                                 secret_token=SECRET).register(app, path="/webhook")
        setup_application(app, dp, bot=bot)

    Answers as the module's table says; on shutdown it waits up to ``shutdown_grace``
    seconds for background work, then closes the bot session (as aiogram's does).

    Args:
        dispatcher: the aiogram dispatcher (with ``IdempotencyMiddleware`` registered).
        bot: the bot the updates are for.
        idem: the guard (the same object the middleware uses).
        secret_token: as :class:`FastAckWebhook` (required unless
            ``allow_unauthenticated=True``; a sequence while rotating).
        allow_unauthenticated: as :class:`FastAckWebhook`.
        max_body: largest body accepted, bytes.
        read_timeout: seconds the request body may take to arrive (then 408).
        on_store_error: as :class:`FastAckWebhook`.
        shutdown_grace: seconds :meth:`close` waits for background work.
        data: extra keyword data for every ``feed_update``.

    Raises:
        ConfigurationError: as :class:`FastAckWebhook`.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        bot: Bot,
        idem: Idem,
        *,
        secret_token: SecretTokens = None,
        allow_unauthenticated: bool = False,
        max_body: int = DEFAULT_MAX_BODY,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        on_store_error: StorePolicyLike = StorePolicy.FAIL_CLOSED,
        shutdown_grace: float = 30.0,
        **data: Any,
    ) -> None:
        super().__init__(dispatcher=dispatcher, bot=bot, handle_in_background=True, **data)
        self.webhook = FastAckWebhook(
            dispatcher,
            bot,
            idem,
            secret_token=secret_token,
            allow_unauthenticated=allow_unauthenticated,
            max_body=max_body,
            read_timeout=read_timeout,
            on_store_error=on_store_error,
            data=data,
            where="IdempotentRequestHandler",
        )
        self.shutdown_grace = shutdown_grace

    def verify_secret(self, telegram_secret_token: str, bot: Bot) -> bool:
        """The secret rule of :mod:`telegram_idem._webhook_secret` (constant time).

        Args:
            telegram_secret_token: the request's ``X-Telegram-Bot-Api-Secret-Token`` header.
            bot: the bot the request is for (aiogram's signature; unused).
        """
        return self.webhook.secret.accepts(telegram_secret_token)

    async def handle(self, request: web.Request) -> web.StreamResponse:  # type: ignore[override]
        """Answer one webhook POST (see the module's table).

        Args:
            request: the POST Telegram made to the webhook URL.

        Raises:
            aiohttp.web.HTTPException: as :meth:`FastAckWebhook.handle`.
        """
        return await self.webhook.handle(request)

    __call__ = handle  # type: ignore[assignment]

    async def close(self) -> None:
        """Wait for background work (at most ``shutdown_grace`` s), then close the bot
        session."""
        await self.webhook.drain(self.shutdown_grace)
        await super().close()
