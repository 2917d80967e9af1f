"""Assembling the blog bot: store, guards, writer, publisher, aiogram, webhook or polling."""

from __future__ import annotations

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
from telegram_idem.adapters.aiogram import IdempotencyMiddleware
from telegram_idem.adapters.aiogram_webhook import FastAckWebhook

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
    webhook: FastAckWebhook

    def web_app(self, *, path: str = "/webhook") -> web.Application:
        """An aiohttp app serving ``POST <path>`` (fast-ack) and ``GET /healthz``."""
        app = web.Application()
        app.router.add_post(path, self.webhook.handle)
        app.router.add_get("/healthz", _healthz)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_shutdown(self, _app: web.Application) -> None:
        await self.webhook.drain(limit=30)

    async def close(self) -> None:
        """Finish background work (30 s at most), close the Bot session and the store."""
        await self.webhook.drain(limit=30)
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
    background: bool = True,
) -> BlogBot:
    """Wire the bot from ``settings``; ``writer``/``publisher``/``idem`` override them.

    Raises:
        ConfigurationError: a bad store URL or webhook secret.
    """
    idem = idem or Idem(settings.store_url)
    tokens = CallbackTokens(idem, settings.callback_secret)
    writer = writer or OfflineWriter(delay_scale=settings.writer_delay_scale)
    publisher = publisher or publisher_from_env(settings.publisher_env())
    session = AiohttpSession(api=TelegramAPIServer.from_base(settings.api_url))
    bot = Bot(settings.bot_token, session=session)
    dp = Dispatcher(
        writer=writer, publisher=publisher, lock_ttl=settings.lock_ttl, settings=settings
    )
    dp.update.outer_middleware(IdempotencyMiddleware(idem, tokens=tokens))
    dp.include_routers(posting.make_router(), deleting.make_router(), misc.make_router())
    webhook = FastAckWebhook(
        dp, bot, idem, secret_token=settings.webhook_secret, background=background
    )
    return BlogBot(settings, idem, tokens, writer, publisher, bot, dp, webhook)
