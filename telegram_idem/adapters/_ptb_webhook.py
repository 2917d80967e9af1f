"""A webhook for python-telegram-bot 22 that decides before it answers (aiohttp).

PTB's own webhook server (``run_webhook``) puts each update in the update queue and
answers ``200`` at once, so nothing that happens after (a store outage, an update still
in progress elsewhere) can make Telegram re-send it. This request handler admits the
update first (:meth:`telegram_idem.Idem.admit`) and answers by the outcome
(:mod:`telegram_idem._admission`); then the application's
:class:`~telegram_idem.adapters.ptb.IdempotentUpdateProcessor` runs the update under that
admission (:meth:`~telegram_idem.adapters.ptb.IdempotentUpdateProcessor.hand_over`).

The request is read and checked as by every webhook shell
(:mod:`telegram_idem.ingress._reading`, :mod:`telegram_idem.webhook_request`):

| request                                           | answer                              |
|---------------------------------------------------|-------------------------------------|
| not ``POST``                                      | 405                                 |
| secret header missing or wrong                    | 401                                 |
| body over ``max_body`` bytes                      | 413                                 |
| body not complete within ``read_timeout`` seconds | 408                                 |
| not JSON, or no integer ``update_id``             | 400: not an update, nothing recorded |
| integer ``update_id``, PTB cannot parse it        | 200; the claim stored as a failure with the parse error, logged ERROR on ``telegram_idem.webhook`` (503 during a store outage, so it is recorded later) |
| the application is not running                    | 503 (re-sent later)                 |
| update of a type this version does not know       | as any update; queued untouched     |
| new update (``RUN``)                              | 200 once claimed; processed from the queue |
| completed before (``DUPLICATE``)                  | 200, not processed                  |
| in progress elsewhere (``NOT_YET``)               | 503: re-sent, run by takeover after the holder's lease |
| store outage, processor ``fail_closed`` (default) | 503: Telegram re-sends later        |
| store outage, processor ``fail_open``             | 200, queued (processed unguarded)   |

A 200 means the update was claimed and queued in this process: a crash after it leaves
the claim to expire, and Telegram does not re-send. For updates that must survive a
crash, admit them to the durable inbox instead
(:class:`~telegram_idem.ingress._webhook.WebhookIngress` with
:func:`~telegram_idem.adapters.ptb.inbox_dispatch`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from aiohttp import web
from telegram import Update

from telegram_idem._admission import Admission, StorePolicy
from telegram_idem._guard import Idem
from telegram_idem._updates import bot_id_from_token
from telegram_idem._webhook_secret import SecretTokens, secret_check
from telegram_idem.adapters._ptb_common import AnyApplication
from telegram_idem.adapters._ptb_processor import IdempotentUpdateProcessor
from telegram_idem.errors import ConfigurationError
from telegram_idem.ingress import Handler, read_update, register
from telegram_idem.webhook_request import DEFAULT_MAX_BODY, DEFAULT_READ_TIMEOUT

__all__ = ["Handler", "ptb_webhook", "ptb_webhook_app"]

log = logging.getLogger("telegram_idem.webhook")


_REFUSED = {
    Admission.NOT_YET: "in progress elsewhere; re-send",
    Admission.UNAVAILABLE: "store unavailable",
}


def _processor(application: AnyApplication, idem: Idem) -> IdempotentUpdateProcessor:
    processor = application.update_processor
    if not isinstance(processor, IdempotentUpdateProcessor):
        raise ConfigurationError(
            "ptb_webhook needs the application built with "
            "ApplicationBuilder().concurrent_updates(IdempotentUpdateProcessor(idem, n)): "
            "the processor runs the updates the webhook claimed"
        )
    if processor.idem is not idem:
        raise ConfigurationError(
            "ptb_webhook got another Idem than the application's IdempotentUpdateProcessor"
        )
    return processor


def _bot_id(
    processor: IdempotentUpdateProcessor, application: AnyApplication, given: int | None
) -> int:
    """The bot id the processor keys its updates by; the webhook must claim the same keys
    (it hands its claims over to the processor by ``(bot_id, update_id)``)."""
    own = (
        processor.bot_id
        if processor.bot_id is not None
        else bot_id_from_token(application.bot.token)
    )
    if given is not None and given != own:
        raise ConfigurationError(
            f"ptb_webhook got bot_id={given}, but the application's IdempotentUpdateProcessor "
            f"keys its updates by bot id {own}: pass bot_id= to the processor (the webhook "
            "then takes it from there)"
        )
    return own


def ptb_webhook(
    application: AnyApplication,
    idem: Idem,
    *,
    secret_token: SecretTokens,
    allow_unauthenticated: bool = False,
    max_body: int = DEFAULT_MAX_BODY,
    read_timeout: float = DEFAULT_READ_TIMEOUT,
    bot_id: int | None = None,
) -> Handler:
    """The aiohttp request handler for Telegram's webhook POSTs (see the module's table):
    ``register(web_app, "/webhook", ptb_webhook(application, idem, secret_token=S))``
    (:func:`telegram_idem.ingress.register`).

    The application must be running (``await application.initialize()`` and
    ``await application.start()``; :func:`ptb_webhook_app` does both) and must not run
    PTB's own updater as well.

    Args:
        application: the PTB application, built with ``IdempotentUpdateProcessor(idem, n)``
            (its ``on_store_error`` applies to the answer too).
        idem: the processor's guard.
        secret_token: the ``secret_token`` given to ``setWebhook`` (Bot API, ``setWebhook``:
            sent back in ``X-Telegram-Bot-Api-Secret-Token``), several while rotating, or
            ``None`` with ``allow_unauthenticated=True``.
        allow_unauthenticated: with ``secret_token=None``, accept any POST; a WARNING is
            logged now (anyone who finds the URL can then forge updates).
        max_body: largest body accepted, bytes.
        read_timeout: seconds a request body may take to arrive (then 408).
        bot_id: the bot's id; it must be the processor's (default: the processor's
            ``bot_id``, else the number before ``:`` in the application's token).

    Returns:
        The request handler; it raises ``aiohttp.web.HTTPException`` for the non-200 rows.

    Raises:
        ConfigurationError: the application has no ``IdempotentUpdateProcessor`` over
            ``idem``; ``bot_id`` differs from the processor's; ``secret_token`` is
            malformed (1–256 chars of ``A-Z a-z 0-9 _ -``); ``secret_token=None``
            without ``allow_unauthenticated=True``, or both given.
    """
    processor = _processor(application, idem)
    secret = secret_check(
        secret_token, allow_unauthenticated=allow_unauthenticated, where="ptb_webhook"
    )
    bot = _bot_id(processor, application, bot_id)
    processor.attach(application)

    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await read_update(
            request, secret=secret, max_body=max_body, read_timeout=read_timeout
        )
        try:
            update: Update | None = Update.de_json(raw, application.bot)
            problem: Exception | None = None
        except Exception as exc:  # admitted below, then recorded as failed
            update, problem = None, exc
        if update is not None and not application.running:
            raise web.HTTPServiceUnavailable(text="application not running")
        # An update PTB cannot parse cannot be processed unguarded either: it is recorded.
        policy = processor.on_store_error if update is not None else StorePolicy.FAIL_CLOSED
        admitted = await idem.admit(raw, bot_id=bot, store_policy=policy)
        if not admitted.acknowledged:  # NOT_YET, UNAVAILABLE: Telegram re-sends
            return web.Response(status=admitted.webhook_status, text=_REFUSED[admitted.outcome])
        if admitted.outcome is Admission.DUPLICATE:
            return web.Response(text="duplicate")
        if update is None:
            # Acknowledged (a re-send could never parse either) and recorded as failed.
            assert problem is not None
            await admitted.fail(problem, source="python-telegram-bot")
            return web.Response(text="update does not parse; recorded as failed")
        processor.hand_over(admitted)
        await application.update_queue.put(update)
        return web.Response(text="ok")

    return handle


def ptb_webhook_app(
    application: AnyApplication,
    idem: Idem,
    *,
    secret_token: SecretTokens,
    allow_unauthenticated: bool = False,
    path: str = "/webhook",
    max_body: int = DEFAULT_MAX_BODY,
    read_timeout: float = DEFAULT_READ_TIMEOUT,
    bot_id: int | None = None,
) -> web.Application:
    """An aiohttp application serving :func:`ptb_webhook` at ``path`` that initialises and
    starts ``application`` on start-up (then its ``post_init``), and stops and shuts it down
    on clean-up (after the queued updates were processed; then ``post_stop`` and
    ``post_shutdown``). Serve it with ``aiohttp.web.run_app(web_app, port=8443)``; call
    ``setWebhook`` yourself (e.g. in the application's ``post_init``).

    Args:
        application: passed to :func:`ptb_webhook`.
        idem: passed to :func:`ptb_webhook`.
        secret_token: passed to :func:`ptb_webhook`.
        allow_unauthenticated: passed to :func:`ptb_webhook`.
        max_body: largest body accepted, bytes (passed to :func:`ptb_webhook`).
        read_timeout: seconds a request body may take to arrive (passed to
            :func:`ptb_webhook`).
        bot_id: passed to :func:`ptb_webhook`.
        path: the URL path served (POST only).

    Returns:
        The aiohttp application.

    Raises:
        ConfigurationError: as :func:`ptb_webhook`.
    """
    handler = ptb_webhook(
        application,
        idem,
        secret_token=secret_token,
        allow_unauthenticated=allow_unauthenticated,
        max_body=max_body,
        read_timeout=read_timeout,
        bot_id=bot_id,
    )
    web_app = web.Application()
    register(web_app, path, handler)

    async def lifecycle(_: web.Application) -> AsyncIterator[None]:
        await application.initialize()
        if application.post_init is not None:
            await application.post_init(application)
        await application.start()
        try:
            yield
        finally:
            await application.stop()
            if application.post_stop is not None:
                await application.post_stop(application)
            await application.shutdown()
            if application.post_shutdown is not None:
                await application.post_shutdown(application)

    web_app.cleanup_ctx.append(lifecycle)
    return web_app
