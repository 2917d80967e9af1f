"""The worker's lifecycle cannot be wired wrong: ``async with worker:``, and
``register(app, path, ingress, worker=...)`` that runs the worker for the application's
life. Real SQLite inboxes, real aiohttp on loopback, real HTTP POSTs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiogram import Bot, Dispatcher
from aiogram.types import Message
from aiohttp import web

from telegram_idem import Idem
from telegram_idem.adapters._aiogram_webhook import FastAckWebhook
from telegram_idem.adapters.aiogram import IdempotencyMiddleware
from telegram_idem.inbox._base import Inbox, NewEntry
from telegram_idem.inbox._worker import InboxWorker
from telegram_idem.ingress import WebhookIngress, register
from telegram_idem.testing._delivery import TelegramDelivery, load_fixture
from telegram_idem.testing._loopback import serve_app

RETENTION = 3600.0
SECRET = "lifecycle-secret"
TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"


def entry(update_id: int, chat: str = "chat:1") -> NewEntry:
    payload = json.dumps({"update_id": update_id}).encode()
    return NewEntry(f"idem:7:u:{update_id}", chat, payload)


@pytest.fixture
async def idem(tmp_path: Path) -> AsyncIterator[Idem]:
    guard = Idem(f"sqlite:///{tmp_path / 'bot.db'}")
    yield guard
    await guard.close()


@pytest.fixture
def inbox(idem: Idem) -> Inbox:
    return idem.store.inbox()


class Recorder:
    """A dispatch that records update ids; ``started`` is set when one begins, and each
    run waits for ``release`` (set by default) before it finishes."""

    def __init__(self, *, delay: float = 0.0) -> None:
        self.seen: list[int] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()
        self.delay = delay

    async def __call__(self, update: dict[str, Any]) -> None:
        self.started.set()
        await self.release.wait()
        await asyncio.sleep(self.delay)
        self.seen.append(update["update_id"])


async def until(predicate: Callable[[], Awaitable[bool] | bool], limit: float = 5.0) -> None:
    async with asyncio.timeout(limit):
        while True:
            result = predicate()
            if result if isinstance(result, bool) else await result:
                return
            await asyncio.sleep(0.01)


# ---------------------------------------------------------- async with worker


async def test_async_with_starts_the_worker_and_lets_in_flight_entries_finish(
    inbox: Inbox,
) -> None:
    dispatch = Recorder(delay=0.3)
    worker = InboxWorker(inbox, dispatch, poll_interval=0.01, shutdown_grace=5)
    assert not worker.running
    async with worker as same:
        assert same is worker and worker.running
        await inbox.admit(entry(1), retention=RETENTION)
        worker.notify()
        await asyncio.wait_for(dispatch.started.wait(), 5)
    assert not worker.running
    assert dispatch.seen == [1]  # the exit waited for it (grace 5 s)
    assert await inbox.depth() == 0


async def test_an_exit_past_the_grace_returns_the_entry_to_the_inbox(inbox: Inbox) -> None:
    dispatch = Recorder()
    dispatch.release.clear()  # the run never finishes on its own
    worker = InboxWorker(inbox, dispatch, poll_interval=0.01, shutdown_grace=0.1)
    async with worker:
        await inbox.admit(entry(1), retention=RETENTION)
        worker.notify()
        await asyncio.wait_for(dispatch.started.wait(), 5)
    assert dispatch.seen == []
    assert await inbox.depth() == 1  # back in the inbox, takeable at once
    assert await inbox.dead_letters() == []


async def test_an_exception_in_the_block_still_stops_the_worker(inbox: Inbox) -> None:
    worker = InboxWorker(inbox, Recorder(), poll_interval=0.01)
    with pytest.raises(KeyError):
        async with worker:
            raise KeyError("the bot's own error")
    assert not worker.running


async def test_a_second_start_is_refused_and_leaks_no_second_pool(inbox: Inbox) -> None:
    """Started twice, the worker used to run two pools and stop only the second: the
    first kept taking entries after ``stop``."""
    dispatch = Recorder()
    worker = InboxWorker(inbox, dispatch, poll_interval=0.01, concurrency=2)
    worker.start()
    try:
        with pytest.raises(RuntimeError, match="running already"):
            worker.start()
        with pytest.raises(RuntimeError, match="running already"):
            async with worker:
                pass  # pragma: no cover - not reached
        assert worker.running  # the failed second start left the first one as it was
        await inbox.admit(entry(1), retention=RETENTION)
        await until(lambda: dispatch.seen == [1])
    finally:
        await worker.stop(grace=1)
    assert not worker.running
    await inbox.admit(entry(2), retention=RETENTION)
    await asyncio.sleep(0.2)  # nothing of the worker is left to take it
    assert dispatch.seen == [1]
    assert await inbox.depth() == 1


async def test_stopping_a_worker_that_is_not_running_does_nothing(inbox: Inbox) -> None:
    dispatch = Recorder()
    worker = InboxWorker(inbox, dispatch, poll_interval=0.01)
    await inbox.admit(entry(1), retention=RETENTION)
    await worker.stop()  # never started
    assert not worker.running
    assert await inbox.depth() == 1 and dispatch.seen == []
    async with worker:
        await until(lambda: dispatch.seen == [1])
    await worker.stop()  # stopped already
    assert not worker.running


async def test_a_stopped_worker_starts_again(inbox: Inbox) -> None:
    dispatch = Recorder()
    worker = InboxWorker(inbox, dispatch, poll_interval=0.01)
    for update_id in (1, 2):
        async with worker:
            await inbox.admit(entry(update_id), retention=RETENTION)

            def dispatched(n: int = update_id) -> bool:
                return len(dispatch.seen) == n

            await until(dispatched)
    assert dispatch.seen == [1, 2]


def test_a_negative_shutdown_grace_is_refused(inbox: Inbox) -> None:
    with pytest.raises(ValueError, match="shutdown_grace"):
        InboxWorker(inbox, Recorder(), shutdown_grace=-1)


# ------------------------------------------------------------------ register


async def test_register_runs_the_worker_while_the_app_runs_and_a_post_is_processed(
    idem: Idem,
) -> None:
    dispatch = Recorder()
    worker = InboxWorker(idem.store.inbox(), dispatch, poll_interval=0.05)
    ingress = WebhookIngress(idem, bot_id=7, secret_token=SECRET)
    app = web.Application()
    register(app, "/webhook", ingress, worker=worker)
    assert ingress.on_admitted == worker.notify
    assert not worker.running  # nothing runs before the application starts
    runner, base = await serve_app(app)
    try:
        assert worker.running
        update = load_fixture("techpost_command")
        async with TelegramDelivery(f"{base}/webhook", secret_token=SECRET) as tg:
            report = await tg.deliver(update)
        assert report.statuses == [200]
        await until(lambda: dispatch.seen == [update["update_id"]], limit=5)
    finally:
        await runner.cleanup()
    assert not worker.running
    assert await idem.store.inbox().depth() == 0


async def test_the_apps_cleanup_lets_the_entry_in_flight_finish(idem: Idem) -> None:
    dispatch = Recorder(delay=0.3)
    worker = InboxWorker(idem.store.inbox(), dispatch, poll_interval=0.01, shutdown_grace=5)
    app = web.Application()
    register(app, "/webhook", WebhookIngress(idem, bot_id=7, secret_token=SECRET), worker=worker)
    runner, base = await serve_app(app)
    try:
        async with TelegramDelivery(f"{base}/webhook", secret_token=SECRET) as tg:
            report = await tg.deliver(load_fixture("techpost_command"))
        assert report.statuses == [200]
        await asyncio.wait_for(dispatch.started.wait(), 5)
    finally:
        await runner.cleanup()
    assert dispatch.seen == [734519001]  # finished within the grace, not cut off
    assert not worker.running
    assert await idem.store.inbox().depth() == 0


async def test_what_is_set_up_before_register_outlives_the_worker(idem: Idem) -> None:
    worker = InboxWorker(idem.store.inbox(), Recorder(), poll_interval=0.01)
    events: list[tuple[str, bool]] = []

    async def bot_session(_app: web.Application) -> AsyncIterator[None]:
        events.append(("bot up", worker.running))
        yield
        events.append(("bot down", worker.running))

    app = web.Application()
    app.cleanup_ctx.append(bot_session)
    register(app, "/webhook", WebhookIngress(idem, bot_id=7, secret_token=SECRET), worker=worker)
    runner, _ = await serve_app(app)
    events.append(("serving", worker.running))
    await runner.cleanup()
    assert events == [("bot up", False), ("serving", True), ("bot down", False)]


async def test_one_worker_behind_two_routes_is_started_once(idem: Idem) -> None:
    dispatch = Recorder()
    worker = InboxWorker(idem.store.inbox(), dispatch, poll_interval=0.01)
    app = web.Application()
    for path in ("/webhook", "/webhook-old-secret"):
        register(app, path, WebhookIngress(idem, bot_id=7, secret_token=SECRET), worker=worker)
    assert len(app.cleanup_ctx) == 1
    runner, base = await serve_app(app)
    try:
        for update_id, path in ((1, "/webhook"), (2, "/webhook-old-secret")):
            async with TelegramDelivery(f"{base}{path}", secret_token=SECRET) as tg:
                report = await tg.deliver({"update_id": update_id, "message": {}})
            assert report.statuses == [200]
        await until(lambda: sorted(dispatch.seen) == [1, 2])
    finally:
        await runner.cleanup()
    assert not worker.running


async def test_a_worker_also_started_by_hand_fails_the_apps_start(idem: Idem) -> None:
    worker = InboxWorker(idem.store.inbox(), Recorder(), poll_interval=0.01)
    app = web.Application()
    register(app, "/webhook", WebhookIngress(idem, bot_id=7, secret_token=SECRET), worker=worker)
    worker.start()
    runner = web.AppRunner(app)
    try:
        with pytest.raises(RuntimeError, match="running already"):
            await runner.setup()
    finally:
        await runner.cleanup()
        await worker.stop()
    assert not worker.running


async def test_register_keeps_an_on_admitted_of_the_bots_own(idem: Idem) -> None:
    calls: list[str] = []
    ingress = WebhookIngress(
        idem, bot_id=7, secret_token=SECRET, on_admitted=lambda: calls.append("mine")
    )
    worker = InboxWorker(idem.store.inbox(), Recorder())
    register(web.Application(), "/webhook", ingress, worker=worker)
    assert ingress.on_admitted is not None and ingress.on_admitted != worker.notify
    ingress.on_admitted()
    assert calls == ["mine"]


async def test_register_after_the_app_started_is_refused(idem: Idem) -> None:
    app = web.Application()
    runner, _ = await serve_app(app)
    try:
        with pytest.raises(RuntimeError):
            register(app, "/webhook", WebhookIngress(idem, bot_id=7, secret_token=SECRET))
    finally:
        await runner.cleanup()


# ----------------------------------------------- the aiogram shape, same verb


async def test_fast_ack_webhook_register_waits_for_background_work_at_shutdown(
    idem: Idem,
) -> None:
    seen: list[int] = []
    dp = Dispatcher()
    dp.update.outer_middleware(IdempotencyMiddleware(idem))

    @dp.message()
    async def slow(message: Message) -> None:
        await asyncio.sleep(0.3)
        seen.append(message.message_id)

    bot = Bot(TOKEN)
    hook = FastAckWebhook(dp, bot, idem, secret_token=SECRET)
    app = web.Application()
    hook.register(app, "/webhook", grace=5)
    runner, base = await serve_app(app)
    try:
        async with TelegramDelivery(f"{base}/webhook", secret_token=SECRET) as tg:
            report = await tg.deliver(load_fixture("techpost_command"))
        assert report.statuses == [200] and hook.in_flight == 1
    finally:
        await runner.cleanup()
        await bot.session.close()
    assert seen == [4121] and hook.in_flight == 0
