"""The python-telegram-bot adapter with a real ``Application`` talking to FakeBotAPI.

Updates are the shipped payloads, made into ``telegram.Update`` with ``Update.de_json`` and
fed the way PTB receives them: through ``application.update_queue`` (what
``run_polling`` / ``run_webhook`` do, so the :class:`IdempotentUpdateProcessor` runs), and
through ``application.process_update`` (handlers only) for ``@idempotent`` alone.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import inspect
import logging
import warnings
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from ptb_support import build, feed, running
from telegram import Update
from telegram.ext import (
    Application,
    ApplicationBuilder,
    CallbackContext,
    CallbackQueryHandler,
    CommandHandler,
    ContextTypes,
    TypeHandler,
)

from telegram_idem import Idem, ManualClock, Status, StoreError, current_update
from telegram_idem import idempotent as core_idempotent
from telegram_idem._keys import render_template
from telegram_idem.adapters.ptb import (
    idem_of,
    idempotent,
    install_update_guard,
    update_to_dict,
)
from telegram_idem.errors import ConfigurationError
from telegram_idem.testing._delivery import fixture_names, load_fixture, make_double_tap
from telegram_idem.testing._targets import PTBTarget, as_target
from telegram_idem.testing.bot_api import FakeBotAPI

TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"
BOT = 7000000001
CHAT = 5550001001

App = Application[Any, Any, Any, Any, Any, Any]
Ctx = ContextTypes.DEFAULT_TYPE


@pytest.fixture
async def api() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI() as fake:
        yield fake


@pytest.fixture(params=["memory", "sqlite"])
async def idem(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Idem]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'idem.db'}"
    guard = Idem(url)
    yield guard
    await guard.close()


@pytest.fixture
async def broken_idem(tmp_path: Path) -> AsyncIterator[Idem]:
    """A store that cannot answer: SQLite cannot open a directory as its database."""
    guard = Idem("sqlite:///" + str(tmp_path))
    yield guard
    await guard.close()


def another_update(update: dict[str, Any], update_id: int) -> dict[str, Any]:
    """The same payload under another update_id (e.g. re-sent after a restart)."""
    copied = copy.deepcopy(update)
    copied["update_id"] = update_id
    return copied


async def update_status(idem: Idem, update_id: int) -> Status | None:
    record = await idem.store.get(idem.keys.update(BOT, update_id))
    return None if record is None else record.status


# ------------------------------------------------------------------ conversion


@pytest.mark.parametrize("name", fixture_names())
def test_update_to_dict_is_the_bot_api_json(name: str) -> None:
    raw = load_fixture(name)
    assert update_to_dict(Update.de_json(copy.deepcopy(raw), None)) == raw


def test_templates_render_against_ptb_updates() -> None:
    update = update_to_dict(Update.de_json(load_fixture("callback_delete"), None))
    template = "approve:{callback_query.message.message_id}:{callback_query.from.id}"
    assert render_template(template, update, bot_id=BOT) == f"approve:4130:{CHAT}"
    assert (
        render_template("del:{chat_id}:{message_id}:{callback_data}", update, bot_id=BOT)
        == f"del:{CHAT}:4130:del:8f3a1b2c9d"
    )


# ----------------------------------------------------------------- update guard


async def test_sequential_duplicates_never_reach_the_handler(api: FakeBotAPI, idem: Idem) -> None:
    seen: list[int] = []

    async def techpost(update: Update, context: Ctx) -> None:
        assert update.message is not None
        seen.append(update.message.message_id)

    app = build(api, idem)
    app.add_handler(CommandHandler("techpost", techpost))
    update = load_fixture("techpost_command")
    async with running(app):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            await feed(app, update, update, update)
            gc.collect()
    assert seen == [4121]
    assert await update_status(idem, update["update_id"]) is Status.COMPLETED
    # a duplicate's coroutine is closed, never left unawaited
    assert not [w for w in caught if "never awaited" in str(w.message)]


async def test_twenty_concurrent_deliveries_run_the_handler_once(
    api: FakeBotAPI, idem: Idem
) -> None:
    runs: list[str] = []

    async def on_tap(update: Update, context: Ctx) -> None:
        assert update.callback_query is not None
        runs.append(update.callback_query.id)
        await asyncio.sleep(0.01)  # let the other deliveries in while this one runs

    app = build(api, idem, concurrency=20)
    app.add_handler(CallbackQueryHandler(on_tap))
    update = load_fixture("callback_delete")
    async with running(app):
        await feed(app, *[update] * 20)
    assert runs == ["4382910027364512345"]


async def test_failing_handler_releases_the_claim_so_a_redelivery_runs(
    api: FakeBotAPI, idem: Idem
) -> None:
    attempts: list[int] = []
    reported: list[BaseException | None] = []

    async def flaky(update: Update, context: Ctx) -> None:
        attempts.append(update.update_id)
        if len(attempts) == 1:
            raise ConnectionError("github 502")

    async def on_error(update: object, context: Ctx) -> None:
        reported.append(context.error)

    app = build(api, idem)
    app.add_handler(CommandHandler("techpost", flaky))
    app.add_error_handler(on_error)
    update = load_fixture("techpost_no_title")
    async with running(app):
        await feed(app, update)
        record = await idem.store.get(idem.keys.update(BOT, update["update_id"]))
        assert record is not None and record.status is Status.IN_PROGRESS  # released
        await feed(app, update)  # Telegram re-sends: runs again
        await feed(app, update)  # now a duplicate
    assert len(attempts) == 2
    assert [type(e) for e in reported] == [ConnectionError]  # user's error handler still ran
    assert await update_status(idem, update["update_id"]) is Status.COMPLETED


async def test_install_update_guard_is_refused_and_names_the_processor(
    api: FakeBotAPI, idem: Idem
) -> None:
    """The group -1 guard completed the claim before the handlers ran, so a handler that
    raised lost every re-delivery; it is gone, and calling it says what to use."""
    app: App = ApplicationBuilder().token(TOKEN).base_url(api.ptb_base_url).build()
    with pytest.raises(ConfigurationError, match="IdempotentUpdateProcessor"):
        install_update_guard(app, idem)
    assert app.handlers == {}  # nothing half-installed


async def test_processor_logs_handler_errors_when_no_error_handler_is_registered(
    api: FakeBotAPI, idem: Idem, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(update: Update, context: Ctx) -> None:
        raise ValueError("boom")

    app = build(api, idem)
    app.add_handler(CommandHandler("techpost", broken))
    with caplog.at_level(logging.ERROR, logger="telegram_idem.ptb"):
        async with running(app):
            await feed(app, load_fixture("techpost_command"))
    assert any(r.exc_info and isinstance(r.exc_info[1], ValueError) for r in caplog.records)


async def test_unknown_update_type_is_guarded_and_passed_through_untouched(
    api: FakeBotAPI, idem: Idem
) -> None:
    seen: list[Mapping[str, Any]] = []

    async def anything(update: Update, context: Ctx) -> None:
        seen.append(update.api_kwargs)

    app = build(api, idem)
    app.add_handler(TypeHandler(Update, anything))
    update = {"update_id": 1, "future_thing": {"id": "abc", "from": {"id": CHAT}}}
    async with running(app):
        await feed(app, update, update)
    assert seen == [{"future_thing": {"id": "abc", "from": {"id": CHAT}}}]  # once, untouched
    assert await update_status(idem, 1) is Status.COMPLETED


async def test_non_update_objects_pass_through_the_processor(api: FakeBotAPI, idem: Idem) -> None:
    seen: list[object] = []

    async def custom(update: object, context: Ctx) -> None:
        seen.append(update)

    app = build(api, idem)
    app.add_handler(TypeHandler(dict, custom))
    async with running(app):
        await app.update_queue.put({"source": "payment-webhook"})
        await app.update_queue.join()
    assert seen == [{"source": "payment-webhook"}]


# ------------------------------------------------------------- store outages


async def test_fail_closed_reports_the_store_error_after_its_outage_wait(
    api: FakeBotAPI, broken_idem: Idem, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[int] = []
    reported: list[BaseException | None] = []

    async def techpost(update: Update, context: Ctx) -> None:
        runs.append(1)

    async def on_error(update: object, context: Ctx) -> None:
        reported.append(context.error)

    app = build(api, broken_idem, outage_wait=0.5)  # the store never comes back
    app.add_handler(CommandHandler("techpost", techpost))
    app.add_error_handler(on_error)
    with caplog.at_level(logging.ERROR, logger="telegram_idem"):
        async with running(app):
            await feed(app, load_fixture("techpost_command"))
    assert runs == []
    assert [type(e) for e in reported] == [StoreError]
    # Polled or queued by PTB, Telegram will not re-send it: the log says it is gone, on
    # the admission's logger (docs/deploy-ptb.md names it).
    lost = [
        r for r in caplog.records if "fail_closed" in r.getMessage() and "LOST" in r.getMessage()
    ]
    assert [(r.name, r.levelno) for r in lost] == [("telegram_idem", logging.ERROR)]


async def test_fail_open_processes_the_update_unguarded(
    api: FakeBotAPI, broken_idem: Idem, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[int] = []

    async def techpost(update: Update, context: Ctx) -> None:
        runs.append(1)

    app = build(api, broken_idem, on_store_error="fail_open")
    app.add_handler(CommandHandler("techpost", techpost))
    with caplog.at_level(logging.ERROR, logger="telegram_idem.ptb"):
        async with running(app):
            await feed(app, load_fixture("techpost_command"))
    assert runs == [1]
    assert any("fail_open" in r.getMessage() for r in caplog.records)


# ----------------------------------------------------------------- action guard


async def test_double_tap_runs_the_action_once_and_answers_both_queries(
    api: FakeBotAPI, idem: Idem
) -> None:
    deletions: list[str] = []

    @idempotent(
        key="approve:{callback_query.message.message_id}:{callback_query.from.id}",
        in_progress="wait",
    )
    async def delete_post(update: Update, context: Ctx) -> str:
        assert update.callback_query is not None
        deletions.append(update.callback_query.id)
        await asyncio.sleep(0.01)  # the second tap arrives while this runs
        return "deleted"

    results: list[str] = []

    async def on_tap(update: Update, context: Ctx) -> None:
        assert update.callback_query is not None
        await update.callback_query.answer()  # every query, duplicates included
        results.append(await delete_post(update, context))

    app = build(api, idem, concurrency=2)
    app.add_handler(CallbackQueryHandler(on_tap, pattern="^del:"))
    first = load_fixture("callback_delete")
    second = make_double_tap(first)
    async with running(app):
        await feed(app, first, second)
    assert deletions == ["4382910027364512345"]
    assert results == ["deleted", "deleted"]
    assert sorted(api.answered_callback_ids()) == sorted(
        [first["callback_query"]["id"], second["callback_query"]["id"]]
    )
    record = await idem.store.get(idem.keys.action(BOT, f"approve:4130:{CHAT}"))
    assert record is not None and record.status is Status.COMPLETED


async def test_a_window_replays_a_repeat_tap_and_lets_a_later_tap_act(api: FakeBotAPI) -> None:
    """``window=`` reaches the core guard: a navigation button tapped twice within the
    window turns the page once; a tap after it turns the page again."""
    clock = ManualClock(1_700_000_000.0)
    guard = Idem("memory://", clock=clock, lease=60.0)
    pages: list[str] = []

    @idempotent(key="nav:{callback_query.message.message_id}", window=2.0)
    async def next_page(update: Update, context: Ctx) -> int:
        assert update.callback_query is not None
        pages.append(update.callback_query.id)
        return len(pages)

    shown: list[int] = []

    async def on_tap(update: Update, context: Ctx) -> None:
        shown.append(await next_page(update, context))

    app = build(api, guard)
    app.add_handler(CallbackQueryHandler(on_tap))
    first = load_fixture("callback_delete")
    repeat = make_double_tap(first)
    later = make_double_tap(repeat)
    try:
        async with running(app):
            await feed(app, first)
            clock.advance(1.5)
            await feed(app, repeat)  # within the window: replayed
            clock.advance(1.0)
            await feed(app, later)  # past it: acts again
    finally:
        await guard.close()
    assert shown == [1, 1, 2]
    assert len(pages) == 2


def test_the_ptb_idempotent_takes_every_option_of_the_core_one() -> None:
    assert inspect.signature(idempotent).parameters.keys() == (
        inspect.signature(core_idempotent).parameters.keys()
    )


def title_generator() -> tuple[list[str], Callable[[], str]]:
    made: list[str] = []

    def generate() -> str:
        made.append(f"웹훅 재시도 {len(made) + 1}")  # an LLM gives a new title every time
        return made[-1]

    return made, generate


async def test_techpost_without_title_delivered_five_times_runs_once(
    api: FakeBotAPI, idem: Idem
) -> None:
    made, generate = title_generator()

    @idempotent(key="techpost:{chat_id}:{message_id}")
    async def techpost(update: Update, context: Ctx) -> str:
        assert update.effective_chat is not None
        title = generate()
        await context.bot.send_message(update.effective_chat.id, f"✅ Published: {title}")
        return title

    app = build(api, idem)
    app.add_handler(CommandHandler("techpost", techpost))
    update = load_fixture("techpost_no_title")
    async with running(app):
        await feed(app, *[update] * 5)
    assert made == ["웹훅 재시도 1"]
    assert [m.text for m in api.messages(CHAT)] == ["✅ Published: 웹훅 재시도 1"]


async def test_same_command_as_new_updates_replays_the_stored_title(
    api: FakeBotAPI, idem: Idem
) -> None:
    """Different update ids pass the update guard; the action key collapses them."""
    made, generate = title_generator()
    titles: list[str] = []

    @idempotent(key="techpost:{chat_id}:{message_id}")
    async def publish(update: Update, context: Ctx) -> str:
        title = generate()
        assert update.effective_chat is not None
        await context.bot.send_message(update.effective_chat.id, f"✅ Published: {title}")
        return title

    async def techpost(update: Update, context: Ctx) -> None:
        titles.append(await publish(update, context))

    app = build(api, idem)
    app.add_handler(CommandHandler("techpost", techpost))
    update = load_fixture("techpost_no_title")
    async with running(app):
        await feed(app, *(another_update(update, 734519002 + n * 100) for n in range(5)))
    assert made == ["웹훅 재시도 1"]
    assert titles == ["웹훅 재시도 1"] * 5
    assert len(api.calls_of("sendMessage")) == 1


async def test_the_processor_binds_the_update_for_the_core_api(api: FakeBotAPI, idem: Idem) -> None:
    got: dict[str, Any] = {}

    async def handler(update: Update, context: Ctx) -> None:
        bound = current_update()
        got["update_id"], got["bot_id"] = bound.update["update_id"], bound.bot_id
        got["idem"] = idem_of(context)
        async with bound.idem.chat_lock() as lock:
            got["lock"] = lock.record.key

    app = build(api, idem)
    app.add_handler(CommandHandler("draft", handler))
    async with running(app):
        await feed(app, load_fixture("group_command_with_botname"))
    assert got == {
        "update_id": 734519020,
        "bot_id": BOT,
        "idem": idem,
        "lock": idem.keys.lock(BOT, "chat:-1001234567890:topic:77"),  # the ordering unit
    }


async def test_idempotent_without_any_guard_installed_names_the_fix(api: FakeBotAPI) -> None:
    errors: list[BaseException | None] = []

    @idempotent(key="techpost:{chat_id}:{message_id}")
    async def techpost(update: Update, context: Ctx) -> None:
        raise AssertionError("must not run")

    async def on_error(update: object, context: Ctx) -> None:
        errors.append(context.error)

    app: App = ApplicationBuilder().token(TOKEN).base_url(api.ptb_base_url).build()
    app.add_handler(CommandHandler("techpost", techpost))
    app.add_error_handler(on_error)
    await app.initialize()
    try:
        await app.process_update(Update.de_json(load_fixture("techpost_command"), app.bot))
    finally:
        await app.shutdown()
    assert len(errors) == 1 and isinstance(errors[0], ConfigurationError)
    assert "IdempotentUpdateProcessor" in str(errors[0])


async def test_idempotent_finds_an_idem_put_in_bot_data(api: FakeBotAPI, idem: Idem) -> None:
    runs: list[int] = []

    @idempotent(key="techpost:{chat_id}:{message_id}")
    async def techpost(update: Update, context: CallbackContext[Any, Any, Any, Any]) -> int:
        runs.append(1)
        return len(runs)

    app: App = ApplicationBuilder().token(TOKEN).base_url(api.ptb_base_url).build()
    app.bot_data["idem"] = idem
    app.add_handler(CommandHandler("techpost", techpost))
    await app.initialize()
    try:
        payload = load_fixture("techpost_command")
        for n in range(3):
            await app.process_update(Update.de_json(another_update(payload, 900 + n), app.bot))
    finally:
        await app.shutdown()
    assert runs == [1]


def test_idempotent_needs_an_async_callback() -> None:
    def sync(update: Update, context: Ctx) -> None: ...

    with pytest.raises(TypeError, match="async"):
        idempotent(key="x")(sync)  # type: ignore[arg-type]


async def test_polling_redelivery_is_dropped(
    api: FakeBotAPI, idem: Idem, caplog: pytest.LogCaptureFixture
) -> None:
    """``getUpdates`` through PTB's updater (what ``run_polling`` runs): an update that
    comes back (e.g. a batch re-fetched after a restart) is not processed twice. PTB's own
    polling confirms a batch at once, so a crash mid-handler loses it: one WARNING says
    so and names the durable shape."""
    caplog.set_level(logging.WARNING, logger="telegram_idem.ptb")
    runs: list[int] = []

    async def techpost(update: Update, context: Ctx) -> None:
        runs.append(update.update_id)

    app = build(api, idem)
    app.add_handler(CommandHandler("techpost", techpost))
    update = load_fixture("techpost_command")
    api.queue_update(update)
    api.queue_update(update)
    api.queue_update(load_fixture("techpost_no_title"))
    async with running(app):
        assert app.updater is not None
        await app.updater.start_polling(poll_interval=0.02, timeout=0)
        try:
            for _ in range(200):
                if len(api.calls_of("getUpdates")) >= 2 and app.update_queue.empty():
                    break
                await asyncio.sleep(0.01)
            await app.update_queue.join()
        finally:
            await app.updater.stop()
    assert runs == [734519001, 734519002]
    warned = [r.getMessage() for r in caplog.records if "PTB's own polling" in r.getMessage()]
    assert len(warned) == 1 and "PollingIngress + ptb_get_updates + InboxWorker" in warned[0]


# ------------------------------------------------------------------ replay target


def test_the_replay_target_names_the_processor_not_the_removed_guard(
    api: FakeBotAPI, idem: Idem
) -> None:
    """``install_update_guard`` now only raises; the replay harness must not send bot
    authors to it."""
    app = build(api, idem)
    with pytest.raises(ConfigurationError) as refused:
        as_target(app, guard=idem)
    assert "IdempotentUpdateProcessor" in str(refused.value)
    assert "install_update_guard" not in str(refused.value)
    assert "install_update_guard" not in (PTBTarget.__doc__ or "")
