"""Where a replay delivers updates: an aiogram dispatcher, a PTB application, a webhook
URL, or a plain async callable.

Each target takes a Bot API update (a JSON-shaped dict) and hands it to the bot the way
the bot receives it in production, *including* the bot's own guards:

| target | how an update goes in | "failed answer" (re-sent in telegram mode) |
|---|---|---|
| :class:`AiogramTarget` ``(dispatcher, bot)`` | ``dispatcher.feed_raw_update(bot, update)`` (register ``IdempotencyMiddleware`` as in production) | the feed raised |
| :class:`PTBTarget` ``application`` | ``application.update_processor.process_update(u, application.process_update(u))``, what PTB's update fetcher does, so an ``IdempotentUpdateProcessor`` runs | a handler raised (seen by an error handler the target adds) |
| :class:`WebhookTarget` ``"http://…"`` | a POST like Telegram's (:class:`~telegram_idem.testing.TelegramDelivery`) | a non-2xx answer, no answer in time, or no connection |
| :class:`CallableTarget` ``fn(update)`` | ``await fn(update)``; with ``guard=`` admitted by :meth:`Idem.admit` and run by ``Admitted.run``, so ``@idempotent`` and steps work | ``fn`` raised |

:func:`as_target` picks the target from what it is given. aiogram, python-telegram-bot
and aiohttp are imported only by the targets that need them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from telegram_idem._admission import Admission
from telegram_idem.errors import ConfigurationError
from telegram_idem.testing._factories import DEFAULT_BOT_ID, DEFAULT_TOKEN

if TYPE_CHECKING:
    from aiogram import Bot, Dispatcher
    from telegram.ext import Application

    from telegram_idem._guard import Idem
    from telegram_idem.testing._delivery import Attempt, DeliveryReport, TelegramDelivery
    from telegram_idem.testing.bot_api import FakeBotAPI

__all__ = [
    "DROPPED",
    "AiogramTarget",
    "CallableTarget",
    "PTBTarget",
    "ReplayTarget",
    "WebhookAnswerError",
    "WebhookTarget",
    "aiogram_bot",
    "as_target",
]

UpdateCallable = Callable[[dict[str, Any]], Awaitable[Any]]
"""A plain async callable that processes one update dict."""


class _Dropped:
    def __repr__(self) -> str:
        return "DROPPED"


DROPPED: Any = _Dropped()
"""What :class:`CallableTarget` returns for an update its guard dropped as a duplicate."""


@runtime_checkable
class ReplayTarget(Protocol):
    """What a :class:`~telegram_idem.testing.Replayer` delivers to."""

    name: str
    """Short description for messages (``"aiogram"``, ``"ptb"``, the URL, …)."""

    async def send(self, update: dict[str, Any]) -> Any:
        """Deliver ``update`` once; return what the bot answered; raise if it failed.

        Args:
            update: the Bot API update.
        """
        ...

    async def close(self) -> None:
        """Release what the target opened (sessions, handlers it added). Idempotent."""
        ...


class WebhookAnswerError(Exception):
    """A webhook POST was not answered with a 2xx: ``attempt`` tells what happened
    (``status`` is ``None`` for a timeout or a connection error).

    Args:
        attempt: the failed attempt, kept as ``attempt``.
    """

    def __init__(self, attempt: Attempt) -> None:
        what = f"HTTP {attempt.status}" if attempt.status is not None else attempt.error
        super().__init__(f"webhook answered {what}")
        self.attempt = attempt


class AiogramTarget:
    """An aiogram ``Dispatcher`` and the ``Bot`` the updates are for.

    Register the update guard as in production
    (``IdempotencyMiddleware(idem).setup(dp)``); the target adds none.
    ``send`` returns the handler's result, or aiogram's ``UNHANDLED`` (a duplicate the
    middleware dropped, or no handler matched).

    Args:
        dispatcher: the aiogram ``Dispatcher``, wired as in production.
        bot: the aiogram ``Bot`` the updates are for.
    """

    name = "aiogram"

    def __init__(self, dispatcher: Dispatcher, bot: Bot) -> None:
        self.dispatcher = dispatcher
        self.bot = bot

    async def send(self, update: dict[str, Any]) -> Any:
        """``feed_raw_update``; raises what the handler raised.

        Args:
            update: the Bot API update.
        """
        return await self.dispatcher.feed_raw_update(self.bot, update)

    async def close(self) -> None:
        """Nothing to release (the dispatcher and bot stay the caller's)."""


class PTBTarget:
    """A python-telegram-bot ``Application`` (initialized on first use if it is not).

    Install the guard as in production (``IdempotentUpdateProcessor`` via
    ``ApplicationBuilder().concurrent_updates(...)``). PTB
    gives handler exceptions to error handlers instead of raising them, so the target adds
    one that notes them; ``send`` then raises the first error of that update.
    ``close`` removes that handler and shuts the application down if the target
    initialized it.

    Args:
        application: the PTB ``Application``, initialised, built with its update processor.
    """

    name = "ptb"

    def __init__(self, application: Application[Any, Any, Any, Any, Any, Any]) -> None:
        self.application = application
        self._errors: dict[int, list[BaseException]] = {}
        self._started = False
        self._initialized_here = False
        self._lock: asyncio.Lock | None = None

    async def _record_error(self, update: object, context: Any) -> None:
        error = getattr(context, "error", None)
        pending = self._errors.get(id(update))  # only updates this target is sending
        if pending is not None and isinstance(error, BaseException):
            pending.append(error)

    async def _start(self) -> None:
        if self._started:
            return
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:  # concurrent first sends: initialise once
            if self._started:
                return
            if not getattr(self.application, "_initialized", False):
                await self.application.initialize()
                self._initialized_here = True
            self.application.add_error_handler(self._record_error)
            self._started = True

    async def send(self, update: dict[str, Any]) -> Any:
        """Process the update through the application's update processor.

        Args:
            update: the Bot API update.

        Raises:
            Exception: the first exception a handler raised for this update.
        """
        from telegram import Update

        await self._start()
        app = self.application
        obj = Update.de_json(update, app.bot)
        self._errors[id(obj)] = []
        try:
            await app.update_processor.process_update(obj, app.process_update(obj))
        finally:
            errors = self._errors.pop(id(obj))
        if errors:
            raise errors[0]
        return None

    async def close(self) -> None:
        """Remove the error handler; shut the application down if initialized here."""
        if not self._started:
            return
        self._started = False
        with contextlib.suppress(KeyError):
            self.application.remove_error_handler(self._record_error)
        if self._initialized_here:
            self._initialized_here = False
            await self.application.shutdown()


class WebhookTarget:
    """A webhook URL, POSTed to as Telegram does (JSON body, secret token header).

    ``send`` makes one attempt; :meth:`telegram` re-sends like Telegram. Background
    processing after the answer (a fast-ack webhook) is invisible to HTTP: give the
    :class:`~telegram_idem.testing.Replayer` a ``settle`` callable (e.g.
    ``FastAckWebhook.drain``) so counts include it.

    Args:
        url: the webhook URL.
        secret_token: sent as ``X-Telegram-Bot-Api-Secret-Token``.
        timeout: seconds to wait for an answer before the attempt counts as failed.
    """

    def __init__(self, url: str, *, secret_token: str | None = None, timeout: float = 10.0) -> None:
        self.url = url
        self.name = url
        self.secret_token = secret_token
        self.timeout = timeout
        self._senders: list[TelegramDelivery] = []
        self._single: TelegramDelivery | None = None

    def _sender(self, **options: Any) -> TelegramDelivery:
        from telegram_idem.testing._delivery import TelegramDelivery

        sender = TelegramDelivery(self.url, secret_token=self.secret_token, **options)
        self._senders.append(sender)
        return sender

    async def send(self, update: dict[str, Any]) -> Any:
        """One POST; returns the answer's body text.

        Args:
            update: the Bot API update.

        Raises:
            WebhookAnswerError: not a 2xx answer (or none, or no connection).
        """
        if self._single is None:
            self._single = self._sender(timeout=self.timeout, max_attempts=1)
        report = await self._single.deliver(update)
        attempt = report.attempts[-1]
        if not attempt.ok:
            raise WebhookAnswerError(attempt)
        return attempt.body

    async def telegram(
        self,
        update: Mapping[str, Any],
        *,
        answer_timeout: float,
        retry_delay: float,
        max_attempts: int,
        sleep: Callable[[float], Awaitable[None]],
    ) -> DeliveryReport:
        """Deliver like Telegram: re-send after a non-2xx, no answer within
        ``answer_timeout`` seconds, or a connection error, ``retry_delay`` seconds apart, at most
        ``max_attempts`` attempts.

        Args:
            update: the Bot API update.
            answer_timeout: seconds an attempt waits for an answer.
            retry_delay: seconds between a failed attempt and the re-send.
            max_attempts: the most attempts.
            sleep: awaited for ``retry_delay`` (tests inject one).
        """
        sender = self._sender(
            timeout=answer_timeout, retry_delay=retry_delay, max_attempts=max_attempts, sleep=sleep
        )
        return await sender.deliver(update)

    async def close(self) -> None:
        """Close the HTTP sessions."""
        senders, self._senders, self._single = self._senders, [], None
        for sender in senders:
            await sender.close()


class CallableTarget:
    """A plain async callable ``fn(update: dict) -> Any``.

    Args:
        fn: processes one update.
        guard: admit each update with :meth:`Idem.admit` and run ``fn`` by
            ``Admitted.run`` (the update guard, with the update bound, so
            ``@idempotent`` handlers and steps inside ``fn`` work); a duplicate returns
            :data:`DROPPED` without calling ``fn``; an update in progress elsewhere
            raises :class:`~telegram_idem.errors.UpdateInProgressError`.
        bot_id: the receiving bot's id for the guard's keys.
    """

    name = "callable"

    def __init__(
        self, fn: UpdateCallable, *, guard: Idem | None = None, bot_id: int = DEFAULT_BOT_ID
    ) -> None:
        self.fn = fn
        self.guard = guard
        self.bot_id = bot_id

    async def send(self, update: dict[str, Any]) -> Any:
        """Call ``fn`` (under the guard if given); raises what ``fn`` raised.

        Args:
            update: the Bot API update.
        """
        if self.guard is None:
            return await self.fn(update)
        admitted = await self.guard.admit(update, bot_id=self.bot_id)
        if admitted.outcome is Admission.DUPLICATE:
            return DROPPED
        return await admitted.run(lambda: self.fn(update))

    async def close(self) -> None:
        """Nothing to release."""


def _is_ptb_application(obj: object) -> bool:
    return all(hasattr(obj, a) for a in ("process_update", "update_processor", "bot"))


def as_target(
    target: object,
    *,
    guard: Idem | None = None,
    bot_id: int | None = None,
    secret_token: str | None = None,
) -> ReplayTarget:
    """The :class:`ReplayTarget` for ``target``.

    Args:
        target: a :class:`ReplayTarget`; ``(dispatcher, bot)`` (aiogram); a PTB
            ``Application``; a webhook URL (``"http://…"``); or an async callable
            ``(update: dict) -> Any``.
        guard: for a callable only: the :class:`Idem` whose update guard wraps it.
        bot_id: for a callable with a guard: the bot's id (default the factories' bot).
        secret_token: for a URL: the webhook's secret token.

    Raises:
        ConfigurationError: ``guard`` given for a framework or URL target (they carry
            their own guard: passing one would claim each update twice).
        TypeError: ``target`` is none of the above.
    """
    if isinstance(target, ReplayTarget):
        return target
    if isinstance(target, str):
        if guard is not None:
            raise ConfigurationError("a webhook guards its own updates; do not pass guard=")
        return WebhookTarget(target, secret_token=secret_token)
    if isinstance(target, tuple) and len(target) == 2 and hasattr(target[0], "feed_raw_update"):
        if guard is not None:
            raise ConfigurationError(
                "an aiogram dispatcher guards updates with IdempotencyMiddleware; "
                "do not pass guard= (each update would be claimed twice)"
            )
        return AiogramTarget(target[0], target[1])
    if _is_ptb_application(target):
        if guard is not None:
            raise ConfigurationError(
                "a PTB application guards updates with its IdempotentUpdateProcessor "
                "(ApplicationBuilder().concurrent_updates(IdempotentUpdateProcessor(idem, "
                "n))); do not pass guard="
            )
        return PTBTarget(target)  # type: ignore[arg-type]
    if callable(target):
        return CallableTarget(target, guard=guard, bot_id=bot_id or DEFAULT_BOT_ID)
    raise TypeError(
        "a replay target is (dispatcher, bot), a PTB Application, a webhook URL, an async "
        f"callable (update: dict) -> Any, or a ReplayTarget; got {target!r}"
    )


def aiogram_bot(api: FakeBotAPI, token: str = DEFAULT_TOKEN) -> Bot:
    """An aiogram ``Bot`` whose requests go to ``api`` (a started FakeBotAPI).

    Close it with ``await bot.session.close()`` (or ``async with bot:``).

    Args:
        api: a started :class:`~telegram_idem.testing.bot_api.FakeBotAPI`.
        token: the bot token (its id is the bot's).
    """
    from aiogram import Bot
    from aiogram.client.session.aiohttp import AiohttpSession
    from aiogram.client.telegram import TelegramAPIServer

    session = AiohttpSession(api=TelegramAPIServer.from_base(api.url))
    return Bot(token, session=session)
