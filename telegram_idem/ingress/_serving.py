"""Serving a webhook on an aiohttp application: the POST route and the life of the inbox
worker behind it, wired in one call so neither can be forgotten.

The model is aiogram's ``SimpleRequestHandler(...).register(app, path)`` with
``setup_application(app, dp)``::

    worker = InboxWorker(idem.store.inbox(), inbox_dispatch(dp, bot))
    ingress = WebhookIngress(idem, bot_id=bot.id, secret_token=SECRET)
    register(app, "/webhook", ingress, worker=worker)

:func:`register` adds ``POST path`` and appends one ``app.cleanup_ctx`` entry that runs
``async with worker:``: the worker starts when the application starts and stops
gracefully (``worker.stop(grace=worker.shutdown_grace)``: in-flight entries finish, the
rest go back to the inbox) when it cleans up, after the server stopped taking requests.
aiohttp enters cleanup contexts in the order they were appended and leaves them in
reverse: append what the worker's dispatch needs (the bot session, the dispatcher's
start-up, the store) to ``app.cleanup_ctx`` *before* calling :func:`register`, and it is
set up before the worker starts and torn down after the worker stopped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, runtime_checkable

from aiohttp import web

from telegram_idem.inbox import InboxWorker
from telegram_idem.ingress._webhook import WebhookIngress

__all__ = ["Handler", "Handles", "register"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
"""An aiohttp request handler."""


@runtime_checkable
class Handles(Protocol):
    """A webhook object whose ``handle`` method is its aiohttp request handler."""

    def handle(self, request: web.Request, /) -> Awaitable[web.StreamResponse]:
        """Answer one webhook POST.

        Args:
            request: the POST Telegram made to the webhook URL.
        """
        ...


_WORKERS: web.AppKey[list[InboxWorker]] = web.AppKey("telegram_idem.ingress.workers")
"""The workers whose lifecycle :func:`register` wired to an application already."""


def register(
    app: web.Application,
    path: str,
    webhook: Handles | Handler,
    *,
    worker: InboxWorker | None = None,
) -> None:
    """Serve ``webhook`` at ``POST path`` of ``app``, and run ``worker`` while ``app`` runs.

    Args:
        app: the aiohttp application (not yet started).
        path: the URL path, e.g. ``"/webhook"``.
        webhook: a :class:`~telegram_idem.ingress._webhook.WebhookIngress`, or any webhook
            with a ``handle(request)`` method, or an aiohttp request handler (e.g.
            :func:`~telegram_idem.adapters._ptb_webhook.ptb_webhook`'s). aiogram's
            ``FastAckWebhook`` and ``IdempotentRequestHandler`` have a ``register(app,
            path)`` of their own that also waits for their background work at shutdown.
        worker: the inbox worker that processes what ``webhook`` admits. It is started
            on the application's start-up and stopped, gracefully, on its clean-up (an
            ``app.cleanup_ctx`` entry, once per worker and application however many
            routes share it). A ``WebhookIngress`` without ``on_admitted`` gets
            ``worker.notify``, so the worker wakes as soon as an update is admitted.

    Raises:
        RuntimeError: the application is already frozen (started); at start-up, the
            worker was started by hand as well (:meth:`InboxWorker.start` refuses a
            second start).
    """
    handler: Handler = webhook.handle if isinstance(webhook, Handles) else webhook
    app.router.add_post(path, handler)
    if worker is None:
        return
    if isinstance(webhook, WebhookIngress) and webhook.on_admitted is None:
        webhook.on_admitted = worker.notify
    wired = app.get(_WORKERS)
    if wired is None:
        wired = app[_WORKERS] = []
    if any(known is worker for known in wired):
        return
    wired.append(worker)

    async def run_worker(_app: web.Application) -> AsyncIterator[None]:
        async with worker:
            yield

    app.cleanup_ctx.append(run_worker)
