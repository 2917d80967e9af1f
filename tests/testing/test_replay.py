"""Replay against real aiogram Dispatchers, real PTB Applications, a webhook on loopback and
plain callables, with real payloads; counts come from the guards' decision log.

Uses the plugin's own fixtures (``idem``, ``update_factory``, ``fake_bot_api``, ``replay``)
on the in-process stores; the store matrix is the plugin tests' and the conformance
suite's business.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiogram import Bot, Dispatcher, F, Router
from aiogram.dispatcher.event.bases import UNHANDLED
from aiogram.filters import Command
from aiogram.types import CallbackQuery, Message
from aiohttp import web
from telegram import Update
from telegram.ext import (
    Application,
    ApplicationBuilder,
    CallbackQueryHandler,
    CommandHandler,
    ContextTypes,
)

from telegram_idem import ConfigurationError, Idem, ManualClock, UpdateInProgressError, idempotent
from telegram_idem._logs import decision_logger
from telegram_idem.adapters._aiogram_webhook import FastAckWebhook
from telegram_idem.adapters.aiogram import IdempotencyMiddleware
from telegram_idem.adapters.ptb import IdempotentUpdateProcessor
from telegram_idem.adapters.ptb import idempotent as ptb_idempotent
from telegram_idem.testing import (
    DEFAULT_TOKEN,
    DROPPED,
    DecisionRecorder,
    FakeBotAPI,
    Replayer,
    UpdateFactory,
    WebhookAnswerError,
    aiogram_bot,
    assert_every_callback_answered,
    assert_no_update_lost,
    assert_ran,
    assert_ran_once,
    assert_step_ran,
    assert_step_ran_once,
    load_fixture,
)

IN_PROCESS_STORES = pytest.mark.parametrize("idem_store_name", ["memory", "sqlite"], indirect=True)
"""Tests using ``idem`` run on these stores only (the plugin's default is all five)."""

ReplayFactory = Callable[..., Replayer]
PTBApp = Application[Any, Any, Any, Any, Any, Any]


@pytest.fixture
async def bot(fake_bot_api: FakeBotAPI) -> AsyncIterator[Bot]:
    async with aiogram_bot(fake_bot_api) as client:
        yield client


def dispatcher(idem: Idem, router: Router) -> Dispatcher:
    dp = Dispatcher()
    dp.update.outer_middleware(IdempotencyMiddleware(idem))
    dp.include_router(router)
    return dp


class Flaky:
    """Fails the first ``failures`` calls, then returns ``value``."""

    def __init__(self, failures: int, value: str = "ok") -> None:
        self.failures = failures
        self.calls = 0
        self.value = value

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise TimeoutError(f"simulated outage #{self.calls}")
        return self.value


# ------------------------------------------------------------------ aiogram


@IN_PROCESS_STORES
async def test_twenty_concurrent_deliveries_run_a_decorated_handler_once(
    idem: Idem, bot: Bot, replay: ReplayFactory
) -> None:
    router = Router()

    @idempotent(key="tap:{callback_query.id}")
    async def delete_post(query: CallbackQuery) -> str:
        await asyncio.sleep(0.01)  # the other deliveries arrive while this one runs
        return "deleted"

    @router.callback_query()
    async def on_tap(query: CallbackQuery) -> str:
        return await delete_post(query)

    update = load_fixture("callback_delete")
    result = await replay((dispatcher(idem, router), bot)).concurrent(update, 20)

    assert_ran_once(result, delete_post)
    assert result.runs("delete_post") == 1  # the short name finds the qualified one
    assert result.update_runs == {update["update_id"]: 1}
    # The others met the claim in progress: not acknowledged (Telegram re-sends them), or
    # acknowledged once the first run completed; never run a second time.
    turned_away = result.updates_dropped + sum(result.updates_deferred.values())
    assert turned_away == 19
    values = [d.value for d in result.deliveries if d.error is None and d.value is not UNHANDLED]
    assert values == ["deleted"]
    assert len(result.deliveries) == 20
    assert all(isinstance(e, UpdateInProgressError) for e in result.errors)
    assert_no_update_lost(result)
    with pytest.raises(AssertionError, match=r"ran 1 time\(s\), expected 2"):
        assert_ran(result, delete_post, 2)


@IN_PROCESS_STORES
async def test_double_tap_runs_the_action_once_and_both_queries_are_answered(
    idem: Idem,
    bot: Bot,
    fake_bot_api: FakeBotAPI,
    update_factory: UpdateFactory,
    replay: ReplayFactory,
) -> None:
    router = Router()
    deleted: list[str] = []

    @idempotent(key="del:{callback_query.message.message_id}:{callback_data}", in_progress="wait")
    async def delete(data: str) -> str:
        await asyncio.sleep(0.02)
        deleted.append(data)
        return f"Deleted {data}"

    @router.callback_query(F.data.startswith("del:"))
    async def on_delete(query: CallbackQuery) -> None:
        text = await delete(query.data or "")
        await query.answer(text)  # every tap answered, the duplicate included

    tap = update_factory.callback_query("del:post-1")
    result = await replay((dispatcher(idem, router), bot)).double_tap(tap)

    assert deleted == ["del:post-1"]
    assert_ran_once(result, delete)
    assert result.handler_replays[delete.__qualname__] == 1  # the second tap got the result
    assert result.update_runs == {tap["update_id"]: 1, tap["update_id"] + 1: 1}
    assert result.duplicates_absorbed == 1
    assert_every_callback_answered(fake_bot_api, result)
    assert len(fake_bot_api.answered_callback_ids()) == 2


@IN_PROCESS_STORES
async def test_a_failing_handler_redelivered_runs_again_and_skips_finished_steps(
    idem: Idem, bot: Bot, update_factory: UpdateFactory, replay: ReplayFactory
) -> None:
    router = Router()
    notify = Flaky(failures=1)
    charged: list[int] = []

    async def charge() -> int:
        charged.append(1)
        return 50

    @idempotent(key="pay:{message.successful_payment.telegram_payment_charge_id}")
    async def fulfil(message: Message) -> str:
        await idem.step("reserve", asyncio.sleep, 0, "reserved")
        await idem.step("charge", charge)
        return await idem.step("notify", notify)

    @router.message(F.successful_payment)
    async def on_payment(message: Message) -> str:
        return await fulfil(message)

    payment = update_factory.successful_payment(charge_id="stxRetry1")
    result = await replay((dispatcher(idem, router), bot)).telegram(payment)

    assert [d.attempt for d in result.deliveries] == [1, 2]
    assert isinstance(result.deliveries[0].error, TimeoutError)
    assert result.deliveries[1].ok and result.deliveries[1].value == "ok"
    assert_ran(result, fulfil, 2)  # the body ran again after the failure...
    assert_step_ran_once(result, "reserve")  # ...but finished steps were skipped
    assert_step_ran_once(result, "charge")
    assert_step_ran(result, "notify", 2)
    assert result.step_skips == {"reserve": 1, "charge": 1}
    assert charged == [1]
    assert result.update_runs[payment["update_id"]] == 2
    assert result.update_failures[payment["update_id"]] == 1
    assert_no_update_lost(result)


@IN_PROCESS_STORES
async def test_an_update_failing_every_attempt_is_reported_lost(
    idem: Idem, bot: Bot, update_factory: UpdateFactory, replay: ReplayFactory
) -> None:
    router = Router()

    @router.message(Command("techpost"))
    async def broken(message: Message) -> None:
        raise RuntimeError("LLM down")

    update = update_factory.command("/techpost")
    result = await replay((dispatcher(idem, router), bot), max_attempts=3).telegram(update)

    assert len(result.deliveries) == 3 and len(result.errors) == 3
    assert result.lost_updates() == [update["update_id"]]
    with pytest.raises(AssertionError, match=r"started 3x, failed 3x") as caught:
        assert_no_update_lost(result)
    assert "RuntimeError: LLM down" in str(caught.value)


@IN_PROCESS_STORES
async def test_a_slow_answer_is_resent_while_the_first_attempt_still_runs(
    idem: Idem, bot: Bot, update_factory: UpdateFactory, replay: ReplayFactory
) -> None:
    router = Router()
    finished: list[int] = []

    @idempotent(key="post:{chat_id}:{message_id}")
    async def publish(message: Message) -> int:
        await asyncio.sleep(0.3)  # longer than Telegram waits (timeout below)
        finished.append(message.message_id)
        return message.message_id

    @router.message(Command("techpost"))
    async def on_post(message: Message) -> int:
        return await publish(message)

    update = update_factory.command("/techpost", "slow")
    replayer = replay((dispatcher(idem, router), bot), timeout=0.05)
    result = await replayer.telegram(update)

    first, second, *_ = result.deliveries
    assert (
        first.timed_out and first.error is None and first.value == update["message"]["message_id"]
    )
    # The re-sends met the claim in progress: not acknowledged as duplicates.
    assert second.value != update["message"]["message_id"]
    assert all(isinstance(d.error, UpdateInProgressError) for d in result.deliveries[1:] if d.error)
    assert finished == [update["message"]["message_id"]]
    assert_ran_once(result, publish)
    assert_no_update_lost(result)


@IN_PROCESS_STORES
async def test_interleaved_with_other_updates_each_runs_once(
    idem: Idem, bot: Bot, update_factory: UpdateFactory, replay: ReplayFactory
) -> None:
    router = Router()
    handled: list[int] = []

    @idempotent(key="msg:{chat_id}:{message_id}")
    async def record(message: Message) -> None:
        handled.append(message.message_id)

    @router.message()
    async def on_message(message: Message) -> None:
        await record(message)

    repeated = update_factory.message("repeated")
    others = [update_factory.message(f"other {i}") for i in range(3)]
    replayer = replay((dispatcher(idem, router), bot))
    result = await replayer.interleaved(repeated, others, times=4)

    order = [d.update_id for d in result.deliveries]
    rid = repeated["update_id"]
    o1, o2, o3 = (u["update_id"] for u in others)
    assert order == [rid, o1, rid, o2, rid, o3, rid]
    assert sorted(handled) == sorted(u["message"]["message_id"] for u in [repeated, *others])
    assert_ran(result, record, 4)
    assert_no_update_lost(result, [repeated, *others])

    again = await replayer.interleaved(repeated, others, times=2, concurrently=True)
    assert_ran(again, record, 0)  # everything was already processed
    assert again.updates_dropped == 5


# ------------------------------------------------------------------ python-telegram-bot


def ptb_app(api: FakeBotAPI, idem: Idem) -> PTBApp:
    return (
        ApplicationBuilder()
        .token(DEFAULT_TOKEN)
        .base_url(api.ptb_base_url)
        .concurrent_updates(IdempotentUpdateProcessor(idem, 8))
        .updater(None)
        .build()
    )


@IN_PROCESS_STORES
async def test_ptb_twenty_concurrent_deliveries_run_the_handler_once(
    idem: Idem, fake_bot_api: FakeBotAPI, replay: ReplayFactory
) -> None:
    app = ptb_app(fake_bot_api, idem)

    @ptb_idempotent(key="post:{chat_id}:{message_id}")
    async def techpost(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.effective_message is not None
        await asyncio.sleep(0.01)
        await update.effective_message.reply_text("published")

    app.add_handler(CommandHandler("techpost", techpost))
    update = load_fixture("techpost_command")
    result = await replay(app).concurrent(update, 20)

    assert_ran_once(result, techpost)
    assert result.update_runs == {update["update_id"]: 1}
    assert result.updates_dropped + sum(result.updates_deferred.values()) == 19
    assert [c.params["text"] for c in fake_bot_api.calls_of("sendMessage")] == ["published"]


@IN_PROCESS_STORES
async def test_ptb_double_tap_runs_once_and_answers_both(
    idem: Idem, fake_bot_api: FakeBotAPI, update_factory: UpdateFactory, replay: ReplayFactory
) -> None:
    app = ptb_app(fake_bot_api, idem)

    @ptb_idempotent(key="del:{callback_data}", in_progress="wait")
    async def delete(update: Update, context: ContextTypes.DEFAULT_TYPE) -> str:
        await asyncio.sleep(0.02)
        return "Deleted"

    async def on_tap(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.callback_query is not None
        await update.callback_query.answer(await delete(update, context))

    app.add_handler(CallbackQueryHandler(on_tap))
    tap = update_factory.callback_query("del:7")
    result = await replay(app).double_tap(tap, update_factory.double_tap(tap))

    assert_ran_once(result, delete)
    assert_every_callback_answered(fake_bot_api, result)


@IN_PROCESS_STORES
async def test_ptb_failing_handler_redelivered_skips_finished_steps(
    idem: Idem, fake_bot_api: FakeBotAPI, update_factory: UpdateFactory, replay: ReplayFactory
) -> None:
    app = ptb_app(fake_bot_api, idem)
    translate = Flaky(failures=1, value="hello")

    @ptb_idempotent(key="post:{chat_id}:{message_id}")
    async def techpost(update: Update, context: ContextTypes.DEFAULT_TYPE) -> str:
        await idem.step("draft", asyncio.sleep, 0, "초안")
        return await idem.step("translate", translate)

    app.add_handler(CommandHandler("techpost", techpost))
    update = update_factory.command("/techpost")
    replayer = replay(app)
    result = await replayer.telegram(update)

    assert isinstance(result.deliveries[0].error, TimeoutError)  # seen via PTB's error handlers
    assert result.deliveries[1].ok
    assert_ran(result, techpost, 2)
    assert_step_ran_once(result, "draft")
    assert_step_ran(result, "translate", 2)
    assert_no_update_lost(result)
    await replayer.close()  # removes the error handler it added, keeps the processor's
    owners = [getattr(handler, "__self__", None) for handler in app.error_handlers]
    assert replayer.target not in owners and len(owners) == 1


# ------------------------------------------------------------------ webhook URL


@pytest.fixture
async def webhook(idem: Idem, bot: Bot) -> AsyncIterator[tuple[str, FastAckWebhook, list[str]]]:
    """A FastAckWebhook that processes before answering, its first /post failing."""
    router = Router()
    publish_calls: list[str] = []
    upload = Flaky(failures=1, value="sha1")

    @idempotent(key="post:{chat_id}:{message_id}")
    async def publish(message: Message) -> str:
        publish_calls.append(message.text or "")
        await idem.step("draft", asyncio.sleep, 0, "draft")
        return await idem.step("commit", upload)

    @router.message(Command("post"))
    async def on_post(message: Message) -> str:
        return await publish(message)

    hook = FastAckWebhook(
        dispatcher(idem, router), bot, idem, secret_token="s3cret", background=False
    )
    app = web.Application()
    app.router.add_post("/hook", hook.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    yield f"http://{host}:{port}/hook", hook, publish_calls
    await runner.cleanup()


@IN_PROCESS_STORES
async def test_webhook_failure_answered_500_is_resent_and_finished_steps_skipped(
    webhook: tuple[str, FastAckWebhook, list[str]],
    update_factory: UpdateFactory,
    replay: ReplayFactory,
) -> None:
    url, hook, calls = webhook
    update = update_factory.command("/post", "hello")
    replayer = replay(url, secret_token="s3cret", retry_delay=0.01, settle=hook.drain)
    result = await replayer.telegram(update)

    assert [d.status for d in result.deliveries] == [500, 200]
    assert isinstance(result.deliveries[0].error, WebhookAnswerError)
    assert calls == ["/post hello", "/post hello"]
    assert_step_ran_once(result, "draft")
    assert_step_ran(result, "commit", 2)
    assert_no_update_lost(result)

    again = await replayer.concurrent(update, 5)
    assert [d.status for d in again.deliveries] == [200] * 5
    assert again.updates_dropped == 5 and again.updates_processed == 0


@IN_PROCESS_STORES
async def test_webhook_with_a_wrong_secret_is_an_error_not_a_run(
    webhook: tuple[str, FastAckWebhook, list[str]],
    update_factory: UpdateFactory,
    replay: ReplayFactory,
) -> None:
    url, _hook, calls = webhook
    result = await replay(url, secret_token="wrong").sequential(update_factory.command("/post"))
    assert [d.status for d in result.deliveries] == [401, 401]
    assert calls == []
    assert result.update_runs == {}
    assert len(result.lost_updates()) == 1


# ------------------------------------------------------------------ plain callables


@IN_PROCESS_STORES
async def test_callable_under_the_update_guard(idem: Idem, replay: ReplayFactory) -> None:
    seen: list[int] = []

    @idempotent(key="poll:{poll_answer.poll_id}:{user_id}")
    async def count_vote(update: dict[str, Any]) -> int:
        seen.append(update["update_id"])
        return len(seen)

    vote = UpdateFactory().poll_answer([1])
    revote = {**vote, "update_id": vote["update_id"] + 1}  # same vote under a new update_id
    replayer = replay(count_vote, guard=idem)
    result = await replayer.deliver([vote, vote, revote], concurrently=True)

    assert seen == [vote["update_id"]]
    assert_ran_once(result, count_vote)
    # The same update_id twice: the second is dropped, or refused while the first runs.
    second = [d for d in result.deliveries if d.update_id == vote["update_id"]][1]
    assert second.value is DROPPED or isinstance(second.error, UpdateInProgressError)
    assert result.handler_replays == {count_vote.__qualname__: 1}  # the revote replayed


@IN_PROCESS_STORES
async def test_the_update_after_a_double_tap_is_not_taken_for_its_second_tap(
    idem: Idem, replay: ReplayFactory
) -> None:
    # The default second tap takes the tap's update_id + 1; the factory must not hand
    # that id out next, or the guard drops the test's next update as a duplicate.
    seen: list[int] = []

    async def handle(update: dict[str, Any]) -> None:
        seen.append(update["update_id"])

    updates = UpdateFactory()
    tap = updates.callback_query("del:42")
    replayer = replay(handle, guard=idem)
    tapped = await replayer.double_tap(tap)
    hello = updates.message("hello")
    after = await replayer.deliver([hello])

    assert len(tapped.update_runs) == 2
    assert hello["update_id"] not in tapped.update_runs
    assert hello["update_id"] in seen
    assert after.updates_dropped == 0
    assert after.update_runs == {hello["update_id"]: 1}


async def test_callable_without_guard_counts_every_delivery(replay: ReplayFactory) -> None:
    seen: list[int] = []

    async def handle(update: dict[str, Any]) -> None:
        seen.append(update["update_id"])

    update = UpdateFactory().message()
    result = await replay(handle).sequential(update, 3)
    assert seen == [update["update_id"]] * 3
    assert result.update_runs == {update["update_id"]: 3}
    assert result.handler_runs == {}


# ------------------------------------------------------------------ plumbing


@IN_PROCESS_STORES
async def test_targets_refuse_a_second_guard(idem: Idem, bot: Bot) -> None:
    with pytest.raises(ConfigurationError, match="IdempotencyMiddleware"):
        Replayer((Dispatcher(), bot), guard=idem)
    with pytest.raises(ConfigurationError, match="webhook"):
        Replayer("http://127.0.0.1:1/hook", guard=idem)
    with pytest.raises(TypeError, match="replay target"):
        Replayer(42)
    with pytest.raises(ValueError, match="timeout"):
        Replayer(bot.session.close, timeout=0)


@IN_PROCESS_STORES
async def test_recorder_sees_decisions_whatever_the_log_level(
    idem: Idem, idem_clock: ManualClock
) -> None:
    saved = decision_logger.level
    decision_logger.setLevel(logging.ERROR)
    try:
        mine, other = UpdateFactory().message(), UpdateFactory(first_update_id=7).message()
        with DecisionRecorder({mine["update_id"]}) as recorder:
            await idem.claim_update(mine, bot_id=1)
            await idem.claim_update(other, bot_id=1)
            await idem.claim_update(mine, bot_id=1)
        assert [(d.update_id, d.decision) for d in recorder.decisions] == [
            (mine["update_id"], "acquired"),
            (mine["update_id"], "in_progress"),
        ]
        assert decision_logger.level == logging.ERROR
    finally:
        decision_logger.setLevel(saved)
