"""Assembling the blog bot: store, guards, writer, publisher, aiogram, inbox, outbox.

Webhook → :class:`~telegram_idem.ingress.WebhookIngress` (claim + inbox entry in one
transaction, 200 in milliseconds) → :class:`~telegram_idem.inbox.InboxWorker` (per-chat
order, retries, dead letters) → aiogram ``Dispatcher`` → handlers behind the action
guard, the chat lock and steps. ``poll`` uses getUpdates batches instead.

Every Bot API call the handlers make goes through the outbox in the same store
(:class:`~telegram_idem.outbox.Outbound`, installed as the aiogram session middleware):
inside an action it is sent once per effect key, paced by flood control shared by every
process; its relay runs for the app's life (started before the inbox workers, stopped
after them), and sends what a crashed process left behind.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from aiogram import Bot, Dispatcher
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiohttp import web

from examples.blog_bot import deleting, misc, posting
from examples.blog_bot.config import Settings
from examples.blog_bot.publisher import Publisher, publisher_from_env
from examples.blog_bot.writer import OfflineWriter, Writer
from telegram_idem import CallbackTokens, Idem
from telegram_idem.adapters.aiogram import (
    FastAckWebhook,
    IdempotencyMiddleware,
    OutboxSessionMiddleware,
    aiogram_get_updates,
    inbox_dispatch,
)
from telegram_idem.inbox import InboxWorker
from telegram_idem.ingress import LeaderLease, PollingIngress, WebhookIngress
from telegram_idem.outbox import Outbound

__all__ = ["BlogBot", "build_blog_bot"]

log = logging.getLogger("blog_bot")


@dataclass
class BlogBot:
    """One blog bot: everything a webhook server or a polling loop needs."""

    settings: Settings
    idem: Idem
    tokens: CallbackTokens
    writer: Writer
    publisher: Publisher
    bot: Bot
    dispatcher: Dispatcher
    ingress: WebhookIngress
    worker: InboxWorker
    outbound: Outbound

    def web_app(self, *, path: str = "/webhook", workers: bool = True) -> web.Application:
        """An aiohttp app serving ``POST <path>`` and ``GET /healthz``.

        ``workers=True``: the inbox workers and the outbox relay run in this process while
        the app runs, and finish (or return) their entries at shutdown. ``workers=False``:
        the app only admits updates into the inbox; :meth:`work` (``python -m
        examples.blog_bot work``, which ``serve`` starts by default) processes them in
        another process, so the webhook's answers never wait behind the handlers' work on
        this event loop."""
        app = web.Application()
        app.router.add_post(path, self.ingress.handle)
        app.router.add_get("/healthz", _healthz)
        if workers:
            app.on_startup.append(self._on_startup)
            app.on_shutdown.append(self._on_shutdown)
        return app

    async def work(self, stop: asyncio.Event) -> None:
        """Process the inbox (the workers and the outbox relay, no webhook) until ``stop``
        is set; in-flight entries then finish (30 s grace) or go back to the inbox."""
        self._start()
        try:
            await stop.wait()
        finally:
            await self._stop()

    async def _on_startup(self, _app: web.Application) -> None:
        self._start()

    async def _on_shutdown(self, _app: web.Application) -> None:
        await self._stop()

    def _start(self) -> None:
        if not self.outbound.relay.running:
            self.outbound.relay.start()  # before the workers: their calls need it
        self.worker.start()

    async def _stop(self) -> None:
        await self.worker.stop(grace=30)
        await self.outbound.relay.stop()  # after the workers: their last calls go out

    def inline_webhook(self) -> FastAckWebhook:
        """A webhook that processes *before* answering, as the bot of docs/design/incident.md did (only
        for demonstrating why not to: Telegram re-sends after its timeout)."""
        return FastAckWebhook(
            self.dispatcher,
            self.bot,
            self.idem,
            secret_token=self.settings.webhook_secret_token(),
            background=False,
        )

    async def settle(self, *, limit: float = 120.0) -> None:
        """Wait until the inbox has nothing left to process (tests and the demo)."""
        await self.worker.drain(limit=limit)

    async def poll(self, stop: asyncio.Event) -> None:
        """Long-poll getUpdates into the inbox and process it until ``stop`` is set.

        Several ``poll`` processes may run on one store: with ``poll_leader_lease``
        (the default) only the holder of the leader lease calls getUpdates; the others
        process the inbox and stand by to take over (docs/deploy-polling.md).
        """
        await self.bot.delete_webhook(drop_pending_updates=False)
        lease = self.settings.poll_leader_lease
        polling = PollingIngress(
            self.idem,
            aiogram_get_updates(self.bot),
            bot_id=self.bot.id,
            on_admitted=self.worker.notify,
            poll_timeout=min(25.0, lease * 0.6) if lease > 0 else 25.0,
            leader=LeaderLease(lease=lease) if lease > 0 else None,
        )
        self._start()
        try:
            await polling.run(stop)
        finally:
            await self._stop()

    async def close(self) -> None:
        """Stop the workers (30 s grace) and the relay, close the Bot session, the
        outbound's transport and the store."""
        await self._stop()
        await self.outbound.close()
        await self.bot.session.close()
        await self.idem.close()


async def _healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def build_blog_bot(
    settings: Settings,
    *,
    writer: Writer | None = None,
    publisher: Publisher | None = None,
    idem: Idem | None = None,
) -> BlogBot:
    """Wire the bot from ``settings``; ``writer``/``publisher``/``idem`` override them.

    Raises:
        ConfigurationError: a bad store URL or webhook secret, or a store without inbox,
            outbox or flood budget.
    """
    idem = idem or Idem(settings.store_url, lease=settings.lease)
    tokens = CallbackTokens(idem, settings.callback_secret)
    writer = writer or OfflineWriter(delay_scale=settings.writer_delay_scale)
    publisher = publisher or publisher_from_env(settings.publisher_env())
    # A call taken by a process that died is decided after the lease (policy hold:
    # unknown, never sent again): the same lease as the bot's claims.
    outbound = Outbound.for_store(
        idem.store,
        token=settings.bot_token,
        base_url=settings.api_url,
        keys=idem.keys,
        lease=settings.lease,
    )
    session = AiohttpSession(api=TelegramAPIServer.from_base(settings.api_url))
    session.middleware(OutboxSessionMiddleware(outbound))
    bot = Bot(settings.bot_token, session=session)
    dp = Dispatcher(
        writer=writer, publisher=publisher, lock_ttl=settings.lock_ttl, settings=settings
    )
    IdempotencyMiddleware(idem, tokens=tokens).setup(dp)
    dp.include_routers(posting.make_router(), deleting.make_router(), misc.make_router())
    worker = InboxWorker(
        idem.store.inbox(),
        inbox_dispatch(dp, bot),
        concurrency=settings.worker_concurrency,
        lease=settings.lease,
        backoff_base=settings.retry_backoff,
        poll_interval=0.2,
    )
    ingress = WebhookIngress(
        idem,
        bot_id=bot.id,
        secret_token=settings.webhook_secret_token(),
        on_admitted=worker.notify,
    )
    return BlogBot(settings, idem, tokens, writer, publisher, bot, dp, ingress, worker, outbound)
