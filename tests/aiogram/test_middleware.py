"""The aiogram adapter with a real ``Dispatcher`` and a real ``Bot`` talking to FakeBotAPI.

Updates are the shipped payloads, fed the ways aiogram receives them: ``feed_raw_update``,
``feed_update`` and a webhook through aiogram's ``SimpleRequestHandler`` on loopback.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import warnings
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiogram import Bot, Dispatcher, F, Router
from aiogram.dispatcher.event.bases import UNHANDLED
from aiogram.filters import Command
from aiogram.types import CallbackQuery, Message, Update
from aiogram.webhook.aiohttp_server import SimpleRequestHandler
from aiohttp import web

from telegram_idem import (
    CallbackTokens,
    Idem,
    ManualClock,
    Status,
    Store,
    StoreError,
    UpdateInProgressError,
    current_update,
    idempotent,
)
from telegram_idem.adapters.aiogram import IdempotencyMiddleware, update_to_dict
from telegram_idem.backends.sqlite import SQLiteStore
from telegram_idem.testing._delivery import TelegramDelivery, load_fixture, make_double_tap
from telegram_idem.testing._loopback import serve_app
from telegram_idem.testing.bot_api import FakeBotAPI

TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"
BOT = 7000000001
CHAT = 5550001001


@pytest.fixture
def idem(store: Store, clock: ManualClock) -> Idem:
    return Idem(store, clock=clock, heartbeat=False)


def dispatcher(idem: Idem, *routers: Router, **options: Any) -> Dispatcher:
    dp = Dispatcher()
    dp.update.outer_middleware(IdempotencyMiddleware(idem, **options))
    dp.include_routers(*routers)
    return dp


def another_update(update: dict[str, Any], update_id: int) -> dict[str, Any]:
    """The same payload under another update_id (e.g. a copy from another path)."""
    copied = copy.deepcopy(update)
    copied["update_id"] = update_id
    return copied


# ----------------------------------------------------------------- update guard


async def test_duplicate_update_never_reaches_a_handler(idem: Idem, bot: Bot) -> None:
    router = Router()
    seen: list[int] = []

    @router.message(Command("techpost"))
    async def techpost(message: Message) -> str:
        seen.append(message.message_id)
        return "handled"

    dp = dispatcher(idem, router)
    update = load_fixture("techpost_command")
    assert await dp.feed_raw_update(bot, update) == "handled"
    assert await dp.feed_raw_update(bot, update) is UNHANDLED
    assert seen == [4121]
    record = await idem.store.get(idem.keys.update(BOT, update["update_id"]))
    assert record is not None and record.status is Status.COMPLETED


async def test_twenty_concurrent_deliveries_run_the_handler_once(idem: Idem, bot: Bot) -> None:
    router = Router()
    runs: list[int] = []
    others_done = asyncio.Event()
    finished = 0

    @router.callback_query()
    async def on_tap(query: CallbackQuery) -> None:
        runs.append(1)
        # hold the claim until the other 19 deliveries have had their answer, so they
        # all meet it in progress (a fast store once let the first complete before the
        # others claimed: then they were duplicates, and the in-progress path untested)
        await asyncio.wait_for(others_done.wait(), timeout=30)

    async def deliver() -> Any:
        nonlocal finished
        try:
            return await dp.feed_raw_update(bot, update)
        finally:
            finished += 1
            if finished == 19:
                others_done.set()

    dp = dispatcher(idem, router)
    update = load_fixture("callback_delete")
    results = await asyncio.gather(*(deliver() for _ in range(20)), return_exceptions=True)
    assert len(runs) == 1
    # In progress elsewhere is not a duplicate: not acknowledged (a webhook answers 5xx),
    # so Telegram re-sends; the re-send finds it completed.
    assert sum(isinstance(r, UpdateInProgressError) for r in results) == 19
    assert await dp.feed_raw_update(bot, update) is UNHANDLED
    assert len(runs) == 1


async def test_concurrent_deliveries_with_a_wait_are_duplicates_once_completed(
    idem: Idem, bot: Bot
) -> None:
    router = Router()
    runs: list[int] = []

    @router.callback_query()
    async def on_tap(query: CallbackQuery) -> None:
        runs.append(1)
        await asyncio.sleep(0.05)

    dp = dispatcher(idem, router, in_progress_wait=5.0)
    update = load_fixture("callback_delete")
    results = await asyncio.gather(*(dp.feed_raw_update(bot, update) for _ in range(5)))
    assert len(runs) == 1
    assert sum(r is UNHANDLED for r in results) == 4


async def test_feed_update_with_an_unmounted_update_object(idem: Idem, bot: Bot) -> None:
    """aiogram re-creates an Update not mounted on this bot; keys must still resolve."""
    router = Router()
    got: list[str] = []

    @router.callback_query()
    @idempotent(key="del:{chat_id}:{message_id}:{callback_data}")
    async def on_tap(query: CallbackQuery) -> str:
        got.append(query.id)
        return "deleted"

    dp = dispatcher(idem, router)
    update = Update.model_validate(load_fixture("callback_delete"))  # no bot context
    assert await dp.feed_update(bot, update) == "deleted"
    assert await dp.feed_update(bot, update) is UNHANDLED
    assert got == ["4382910027364512345"]
    key = idem.keys.action(BOT, "del:5550001001:4130:del:8f3a1b2c9d")
    assert (await idem.store.get(key)) is not None


async def test_failing_handler_lets_a_redelivery_run_it(idem: Idem, bot: Bot) -> None:
    router = Router()
    attempts: list[int] = []

    @router.message()
    async def flaky(message: Message) -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("github 502")
        return "ok"

    dp = dispatcher(idem, router)
    update = load_fixture("techpost_no_title")
    with pytest.raises(ConnectionError):
        await dp.feed_raw_update(bot, update)
    assert await dp.feed_raw_update(bot, update) == "ok"
    assert await dp.feed_raw_update(bot, update) is UNHANDLED
    assert len(attempts) == 2


async def test_update_not_handled_by_any_router_is_still_recorded(idem: Idem, bot: Bot) -> None:
    dp = dispatcher(idem, Router())
    update = load_fixture("my_chat_member")
    assert await dp.feed_raw_update(bot, update) is UNHANDLED
    record = await idem.store.get(idem.keys.update(BOT, update["update_id"]))
    assert record is not None and record.status is Status.COMPLETED


async def test_idem_is_injected_into_handler_data(idem: Idem, bot: Bot) -> None:
    router = Router()
    tokens = CallbackTokens(idem, "secret-for-tests-0123456789")
    got: dict[str, Any] = {}

    @router.message()
    async def handler(message: Message, idem: Idem, idem_tokens: CallbackTokens) -> None:
        got["idem"], got["tokens"] = idem, idem_tokens
        got["bound"] = current_update().update["update_id"]
        got["bot_id"] = current_update().bot_id

    dp = dispatcher(idem, router, tokens=tokens)
    await dp.feed_raw_update(bot, load_fixture("group_command_with_botname"))
    assert got == {"idem": idem, "tokens": tokens, "bound": 734519020, "bot_id": BOT}


async def test_unknown_update_type_is_guarded_and_passed_through_untouched(
    idem: Idem, bot: Bot
) -> None:
    router = Router()
    seen: list[Any] = []

    @router.message()
    async def handler(message: Message) -> None:
        seen.append(message)

    dp = dispatcher(idem, router)
    update = {"update_id": 1, "future_thing": {"id": "abc", "from": {"id": 5550001001}}}
    with pytest.warns(RuntimeWarning, match="unknown update type"):  # aiogram saw it
        assert await dp.feed_raw_update(bot, update) is UNHANDLED
    # a re-delivery is a duplicate: it never reaches aiogram (no second warning)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert await dp.feed_raw_update(bot, update) is UNHANDLED
    assert seen == []
    record = await idem.store.get(idem.keys.update(BOT, 1))
    assert record is not None and record.status is Status.COMPLETED


def test_update_to_dict_is_the_bot_api_json() -> None:
    for name in ("callback_delete", "techpost_command", "channel_post", "poll_answer"):
        raw = load_fixture(name)
        assert update_to_dict(Update.model_validate(raw)) == raw
        remounted = Update.model_validate(Update.model_validate(raw).model_dump())
        assert update_to_dict(remounted) == raw


# ----------------------------------------------------------------- action guard


async def test_idempotent_message_handler_runs_once_per_action(
    idem: Idem, bot: Bot, api: FakeBotAPI
) -> None:
    router = Router()
    runs: list[int] = []

    @router.message(Command("techpost"))
    @idempotent(key="techpost:{chat_id}:{message_id}")
    async def techpost(message: Message, bot: Bot) -> dict[str, Any]:
        runs.append(message.message_id)
        sent = await bot.send_message(message.chat.id, "1/3 drafting")
        return {"status_message": sent.message_id, "title": "웹훅 재시도와 멱등성"}

    dp = dispatcher(idem, router)
    update = load_fixture("techpost_command")
    first = await dp.feed_raw_update(bot, update)
    # the same message reaching the bot as another update (e.g. re-sent after a restart)
    second = await dp.feed_raw_update(bot, another_update(update, 734519100))
    assert first == second
    assert first["title"] == "웹훅 재시도와 멱등성"
    assert runs == [4121]
    assert len(api.calls_of("sendMessage")) == 1
    key = idem.keys.action(BOT, f"techpost:{CHAT}:4121")
    record = await idem.store.get(key)
    assert record is not None and record.status is Status.COMPLETED


async def test_idempotent_callback_handler_with_template_rooted_at_the_update(
    idem: Idem, bot: Bot
) -> None:
    router = Router()
    runs: list[str] = []

    @router.callback_query(F.data.startswith("del:"))
    @idempotent(key="approve:{callback_query.message.message_id}:{callback_query.from.id}")
    async def approve(query: CallbackQuery) -> str:
        runs.append(query.id)
        return f"approved {query.data}"

    dp = dispatcher(idem, router)
    first = load_fixture("callback_delete")
    second = make_double_tap(first)
    assert await dp.feed_raw_update(bot, first) == "approved del:8f3a1b2c9d"
    assert await dp.feed_raw_update(bot, second) == "approved del:8f3a1b2c9d"
    assert runs == ["4382910027364512345"]
    key = idem.keys.action(BOT, "approve:4130:5550001001")
    assert await idem.store.get(key) is not None


def delete_router(deletes: list[str], **options: Any) -> Router:
    """The blog bot's [🗑️ Delete Post] button: every tap is answered, the delete runs once."""
    router = Router()

    @idempotent(
        key="delete:{callback_query.message.message_id}:{callback_query.from.id}:{callback_data}",
        **options,
    )
    async def delete_post(slug: str) -> dict[str, Any]:
        deletes.append(slug)
        await asyncio.sleep(0)
        return {"deleted": slug, "files": 3}

    @router.callback_query(F.data.startswith("del:"))
    async def on_delete(query: CallbackQuery) -> dict[str, Any]:
        await query.answer("🗑️ Deleting…")
        assert query.data is not None
        return await delete_post(query.data.removeprefix("del:"))

    return router


async def test_double_tap_runs_the_action_once_and_answers_both(
    idem: Idem, bot: Bot, api: FakeBotAPI
) -> None:
    deletes: list[str] = []
    dp = dispatcher(idem, delete_router(deletes))
    first = load_fixture("callback_delete")
    second = make_double_tap(first, 734519011, new_callback_query_id="4382910027364599999")
    one = await dp.feed_raw_update(bot, first)
    two = await dp.feed_raw_update(bot, second)
    assert one == two == {"deleted": "8f3a1b2c9d", "files": 3}
    assert deletes == ["8f3a1b2c9d"]
    assert api.answered_callback_ids() == ["4382910027364512345", "4382910027364599999"]
    assert len(api.calls_of("answerCallbackQuery")) == 2


async def test_concurrent_double_tap_with_wait(idem: Idem, bot: Bot, api: FakeBotAPI) -> None:
    deletes: list[str] = []
    dp = dispatcher(idem, delete_router(deletes, in_progress="wait", wait_timeout=10.0))
    first = load_fixture("callback_delete")
    second = make_double_tap(first)
    one, two = await asyncio.gather(dp.feed_raw_update(bot, first), dp.feed_raw_update(bot, second))
    assert one == two == {"deleted": "8f3a1b2c9d", "files": 3}
    assert deletes == ["8f3a1b2c9d"]
    assert sorted(api.answered_callback_ids()) == sorted(
        [first["callback_query"]["id"], second["callback_query"]["id"]]
    )


def techpost_router(runs: list[str], counter: Callable[[], int]) -> Router:
    """``/techpost`` without a title: the title is generated once per action key."""
    router = Router()

    @router.message(Command("techpost"))
    @idempotent(key="techpost:{chat_id}:{message_id}", in_progress="wait", wait_timeout=10.0)
    async def techpost(message: Message, bot: Bot) -> str:
        assert message.text is not None
        title = message.text.removeprefix("/techpost").strip() or f"generated-title-{counter()}"
        runs.append(title)
        await asyncio.sleep(0)
        await bot.send_message(message.chat.id, f"1/3 {title}")
        return title

    return router


async def test_techpost_without_title_delivered_five_times(
    idem: Idem, bot: Bot, api: FakeBotAPI
) -> None:
    runs: list[str] = []
    dp = dispatcher(idem, techpost_router(runs, itertools.count(1).__next__))
    update = load_fixture("techpost_no_title")
    results = [await dp.feed_raw_update(bot, update) for _ in range(5)]
    assert results[0] == "generated-title-1"
    assert results[1:] == [UNHANDLED] * 4
    # the same message as five other updates: the action guard replays the one title
    copies = [another_update(update, 734519100 + i) for i in range(5)]
    assert [await dp.feed_raw_update(bot, u) for u in copies] == ["generated-title-1"] * 5
    assert runs == ["generated-title-1"]
    assert [c.params["text"] for c in api.calls_of("sendMessage")] == ["1/3 generated-title-1"]


async def test_techpost_without_title_delivered_five_times_concurrently(
    idem: Idem, bot: Bot, api: FakeBotAPI
) -> None:
    runs: list[str] = []
    dp = dispatcher(idem, techpost_router(runs, itertools.count(1).__next__), in_progress_wait=10.0)
    update = load_fixture("techpost_no_title")
    same = await asyncio.gather(*(dp.feed_raw_update(bot, update) for _ in range(5)))
    assert sorted(same, key=str) == sorted(["generated-title-1", *[UNHANDLED] * 4], key=str)
    copies = [another_update(update, 734519200 + i) for i in range(5)]
    results = await asyncio.gather(*(dp.feed_raw_update(bot, u) for u in copies))
    assert results == ["generated-title-1"] * 5
    assert runs == ["generated-title-1"]
    assert len(api.calls_of("sendMessage")) == 1


# ----------------------------------------------------------------- store outage


@pytest.fixture(params=["directory", "closed"])
async def broken_store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[SQLiteStore]:
    if request.param == "directory":
        store = SQLiteStore(tmp_path, clock=clock)  # a directory is no database file
    else:
        store = SQLiteStore(tmp_path / "closed.db", clock=clock)
        await store.close()
    yield store
    await store.close()


def counting_router(runs: list[int]) -> Router:
    router = Router()

    @router.message()
    async def handler(message: Message) -> str:
        runs.append(message.message_id)
        return "processed"

    return router


async def test_fail_closed_raises_store_error(
    broken_store: SQLiteStore, clock: ManualClock, bot: Bot
) -> None:
    runs: list[int] = []
    idem = Idem(broken_store, clock=clock, heartbeat=False)
    dp = dispatcher(idem, counting_router(runs), on_store_error="fail_closed")
    with pytest.raises(StoreError):
        await dp.feed_raw_update(bot, load_fixture("techpost_command"))
    assert runs == []


async def test_fail_closed_is_the_default(
    broken_store: SQLiteStore, clock: ManualClock, bot: Bot
) -> None:
    runs: list[int] = []
    dp = dispatcher(Idem(broken_store, clock=clock, heartbeat=False), counting_router(runs))
    with pytest.raises(StoreError):
        await dp.feed_raw_update(bot, load_fixture("techpost_command"))
    assert runs == []


async def test_fail_open_processes_anyway(
    broken_store: SQLiteStore, clock: ManualClock, bot: Bot
) -> None:
    runs: list[int] = []
    idem = Idem(broken_store, clock=clock, heartbeat=False)
    dp = dispatcher(idem, counting_router(runs), on_store_error="fail_open")
    update = load_fixture("techpost_command")
    assert await dp.feed_raw_update(bot, update) == "processed"
    assert await dp.feed_raw_update(bot, update) == "processed"  # unguarded: no dedup
    assert runs == [4121, 4121]


# ----------------------------------------------------------------- webhook


@pytest.fixture
async def webhook(idem: Idem, bot: Bot) -> AsyncIterator[tuple[str, list[int], list[str]]]:
    """aiogram's SimpleRequestHandler on a real aiohttp server on loopback."""
    runs: list[int] = []
    deletes: list[str] = []
    router = Router()

    @router.message()
    async def on_message(message: Message) -> None:
        runs.append(message.message_id)

    dp = dispatcher(idem, router, delete_router(deletes, in_progress="wait", wait_timeout=10.0))
    app = web.Application()
    SimpleRequestHandler(dispatcher=dp, bot=bot, handle_in_background=False).register(
        app, path="/webhook"
    )
    runner, base = await serve_app(app)
    try:
        yield f"{base}/webhook", runs, deletes
    finally:
        await runner.cleanup()


async def test_webhook_same_update_twice_runs_once(
    webhook: tuple[str, list[int], list[str]],
) -> None:
    url, runs, _ = webhook
    body = json.dumps(load_fixture("techpost_command"), ensure_ascii=False).encode()
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            async with http.post(
                url, data=body, headers={"Content-Type": "application/json"}
            ) as response:
                assert response.status == 200
    assert runs == [4121]


async def test_webhook_concurrent_redeliveries_and_double_tap(
    webhook: tuple[str, list[int], list[str]], api: FakeBotAPI
) -> None:
    url, runs, deletes = webhook
    # A copy that meets the first one in progress is answered non-2xx and re-sent later,
    # as Telegram does: enough re-sends, spaced out, for the first one to complete.
    async with TelegramDelivery(url, retry_delay=0.1, max_attempts=50) as telegram:
        reports = await telegram.deliver_concurrently(load_fixture("techpost_no_title"), 5)
        assert all(r.delivered for r in reports)
        first, second = await telegram.double_tap(load_fixture("callback_delete"))
        assert first.delivered and second.delivered
    assert runs == [4122]
    assert deletes == ["8f3a1b2c9d"]
    assert len(api.answered_callback_ids()) == 2


async def test_webhook_failure_is_retried_by_telegram_and_runs_again(idem: Idem, bot: Bot) -> None:
    attempts: list[int] = []
    router = Router()

    @router.message()
    async def flaky(message: Message) -> None:
        attempts.append(message.message_id)
        if len(attempts) == 1:
            raise ConnectionError("translation API timed out")

    dp = dispatcher(idem, router)
    app = web.Application()
    SimpleRequestHandler(dispatcher=dp, bot=bot, handle_in_background=False).register(
        app, path="/hook"
    )
    runner, base = await serve_app(app)
    try:
        async with TelegramDelivery(f"{base}/hook", retry_delay=0.0, max_attempts=3) as telegram:
            report = await telegram.deliver(load_fixture("techpost_command"))
            assert report.statuses[-1] == 200
            assert report.statuses[0] is not None and report.statuses[0] >= 500
            again = await telegram.deliver(load_fixture("techpost_command"))
            assert again.delivered
    finally:
        await runner.cleanup()
    assert attempts == [4121, 4121]
