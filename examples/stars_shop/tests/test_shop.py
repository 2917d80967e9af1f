"""The shop in one process, as a bot author tests it: the plugin's ``fake_bot_api`` and
``update_factory``, a real aiogram ``Dispatcher`` fed the updates Telegram would send
(the same update again, a second update for one charge, a double tap), and the shop's
own SQLite file holding its tables and the guard's records. Pre-checkout queries take
the real ingress (``PollingIngress`` fetching from the fake), where they are answered."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiogram import Bot, Dispatcher
from sqlalchemy import func, select

from examples.stars_shop import handlers
from examples.stars_shop.app import ERROR_DELAY_MAX, Polling, build_polling, connected
from examples.stars_shop.handlers import BUSY, SOLD_OUT, credit, invoice_for_tap
from examples.stars_shop.models import Account, Product, Purchase
from examples.stars_shop.shop import Shop
from telegram_idem.testing import (
    DEFAULT_TOKEN,
    FakeBotAPI,
    Fault,
    Replayer,
    UpdateFactory,
    assert_ran_once,
)

ADMIN = 5550009999


@dataclass
class Running:
    api: FakeBotAPI
    bot: Bot
    dp: Dispatcher
    shop: Shop
    db: Path
    polling: Polling

    async def feed(self, update: dict[str, Any]) -> Any:
        self.api.learn_update(update)  # as Telegram would know the query or the charge
        return await self.dp.feed_raw_update(self.bot, update)

    async def poll(self, *updates: dict[str, Any]) -> None:
        """Telegram queues ``updates``; one poll fetches them (pre-checkout queries are
        answered then) and admits them to the inbox."""
        for update in updates:
            self.api.queue_update(update)
        await self.polling.ingress.poll_once()
        await self.polling.answers.settle()

    async def balance(self, user_id: int) -> int:
        async with self.shop.db() as session:
            account = await session.get(Account, user_id)
        return account.credits if account else 0

    async def purchases(self) -> int:
        async with self.shop.db() as session:
            return int(await session.scalar(select(func.count()).select_from(Purchase)) or 0)


async def until(predicate: Callable[[], bool], what: str, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {limit} s"
        await asyncio.sleep(0.02)


@pytest.fixture
async def running(fake_bot_api: FakeBotAPI, tmp_path: Path) -> AsyncIterator[Running]:
    db = tmp_path / "shop.db"
    admins = frozenset({ADMIN})
    async with connected(DEFAULT_TOKEN, fake_bot_api.url, db, admins=admins, lease=5.0) as (
        bot,
        dp,
        shop,
    ):
        polling = build_polling(bot, dp, shop, lease=5.0)
        polling.ingress.poll_timeout = 0.2  # a poll with nothing queued returns soon
        yield Running(fake_bot_api, bot, dp, shop, db, polling)


def paid(
    updates: UpdateFactory, charge: str, sku: str = "credits10", stars: int = 50
) -> dict[str, Any]:
    return updates.successful_payment(charge_id=charge, payload=f"sku:{sku}", total_amount=stars)


# --------------------------------------------------------------------- invoices


async def test_a_repeated_buy_command_sends_one_invoice(
    running: Running, update_factory: UpdateFactory
) -> None:
    buy = update_factory.command("/buy", "credits10")
    chat = buy["message"]["chat"]["id"]
    await running.feed(buy)
    await running.feed(buy)  # the same update again (a re-sent webhook, a re-read poll)
    [invoice] = running.api.invoices(chat)
    assert (invoice.currency, invoice.total_amount, invoice.payload) == ("XTR", 50, "sku:credits10")
    assert invoice.message["reply_markup"]["inline_keyboard"][0][0]["pay"] is True


async def test_a_double_tap_on_buy_sends_one_invoice_and_answers_both_taps(
    running: Running, update_factory: UpdateFactory
) -> None:
    await running.feed(update_factory.command("/shop"))
    chat = update_factory.chat["id"]
    [catalogue] = running.api.messages(chat)
    tap = update_factory.callback_query("buy:credits50", from_message=catalogue)
    result = await Replayer((running.dp, running.bot)).double_tap(tap)
    assert_ran_once(result, invoice_for_tap)
    assert [i.payload for i in running.api.invoices(chat)] == ["sku:credits50"]
    assert len(running.api.answered_callback_ids()) == 2


# --------------------------------------------------------------------- pre-checkout


async def test_the_pre_checkout_query_is_answered_at_ingress_and_refused_when_sold_out(
    running: Running, update_factory: UpdateFactory
) -> None:
    async with running.shop.db() as session, session.begin():
        product = await session.get(Product, "credits50")
        assert product is not None
        product.stock = 0
    fine = update_factory.pre_checkout_query(payload="sku:credits10", total_amount=50)
    gone = update_factory.pre_checkout_query(payload="sku:credits50", total_amount=200)
    await running.poll(fine, gone)
    [yes] = running.api.payments.answered(fine["pre_checkout_query"]["id"])
    [no] = running.api.payments.answered(gone["pre_checkout_query"]["id"])
    assert (yes.ok, no.ok, no.error_message) == (True, False, SOLD_OUT)
    # Admitted like any update; the worker runs them through the dispatcher, which has
    # nothing more to say: still one answer each.
    inbox = running.shop.idem.store.inbox()
    assert await inbox.depth() == 2
    async with running.polling.worker:
        for _ in range(200):
            if await inbox.depth() == 0:
                break
            await asyncio.sleep(0.02)
    assert await inbox.depth() == 0 and await inbox.dead_letters() == []
    assert len(running.api.payments.answered(fine["pre_checkout_query"]["id"])) == 1
    assert len(running.api.payments.answered(gone["pre_checkout_query"]["id"])) == 1


async def test_the_pre_checkout_answer_never_waits_for_the_admission_to_a_locked_store(
    running: Running, update_factory: UpdateFactory
) -> None:
    await running.feed(update_factory.command("/balance"))  # the store is set up and in use
    query = update_factory.pre_checkout_query(payload="sku:credits10", total_amount=50)
    qid = query["pre_checkout_query"]["id"]
    running.api.queue_update(query)
    # Another writer holds the database file: the batch's admission waits for it.
    with sqlite3.connect(running.db, isolation_level=None) as other:
        other.execute("BEGIN IMMEDIATE")
        try:
            polled = asyncio.ensure_future(running.polling.ingress.poll_once())
            await until(lambda: bool(running.api.payments.answered(qid)), "the answer", 2)
            assert not polled.done()  # still admitting: the answer did not wait for it
        finally:
            other.execute("ROLLBACK")
    await polled  # admitted once the lock is gone
    [answer] = running.api.payments.answered(qid)
    assert answer.ok and (answer.after or 0) < 2, f"answered {answer.ok} after {answer.after}"
    assert running.api.pending_updates == [query]  # confirmed only by the next poll


async def test_pre_checkout_queries_keep_being_answered_while_the_store_stays_locked(
    running: Running, update_factory: UpdateFactory
) -> None:
    """Each refused batch is fetched again within ERROR_DELAY_MAX (1 s) of the store's
    busy timeout (5 s): a query sent while a batch waits for the lock is answered in
    under 10 s, and never twice."""
    await running.feed(update_factory.command("/balance"))
    first = update_factory.pre_checkout_query(payload="sku:credits10", total_amount=50)
    later = update_factory.pre_checkout_query(payload="sku:credits10", total_amount=50)
    stop = asyncio.Event()
    with sqlite3.connect(running.db, isolation_level=None) as other:
        other.execute("BEGIN IMMEDIATE")
        try:
            polling = asyncio.ensure_future(running.polling.ingress.run(stop))
            running.api.queue_update(first)
            await until(
                lambda: bool(running.api.payments.answered(first["pre_checkout_query"]["id"])),
                "the first answer",
                2,
            )
            await asyncio.sleep(0.3)  # the first batch now waits for the lock
            running.api.queue_update(later)
            await until(
                lambda: bool(running.api.payments.answered(later["pre_checkout_query"]["id"])),
                "the later answer",
                10,
            )
        finally:
            other.execute("ROLLBACK")
            stop.set()
    await polling
    [one] = running.api.payments.answered(first["pre_checkout_query"]["id"])
    [two] = running.api.payments.answered(later["pre_checkout_query"]["id"])
    assert one.ok and two.ok
    assert (two.after or 0) < 5.0 + ERROR_DELAY_MAX + 1, f"answered after {two.after} s"


# --------------------------------------------------------------------- the credit


async def test_a_payment_delivered_again_and_under_another_update_credits_once(
    running: Running, update_factory: UpdateFactory
) -> None:
    payment = paid(update_factory, "stxShopCharge1")
    user, chat = payment["message"]["from"]["id"], payment["message"]["chat"]["id"]
    other_update = paid(update_factory, "stxShopCharge1")  # new update_id, same charge
    result = await Replayer((running.dp, running.bot)).concurrent(payment, 5)
    await running.feed(other_update)
    assert_ran_once(result, credit)
    assert await running.balance(user) == 10
    assert await running.purchases() == 1
    await until(lambda: len(running.api.sent_texts(chat)) >= 1, "receipt")
    await asyncio.sleep(0.3)  # a second receipt would have been sent by now
    [receipt] = running.api.sent_texts(chat)
    assert "10 credits added; your balance is 10" in receipt


async def test_an_old_invoice_paid_again_is_a_new_purchase(
    running: Running, update_factory: UpdateFactory
) -> None:
    # The same invoice (same payload) paid twice: two charges, two purchases.
    first, second = paid(update_factory, "stxOld1"), paid(update_factory, "stxOld2")
    await running.feed(first)
    await running.feed(second)
    assert await running.balance(first["message"]["from"]["id"]) == 20
    assert await running.purchases() == 2


async def test_a_credit_rolled_back_leaves_no_record_and_runs_again(
    running: Running, update_factory: UpdateFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    payment = paid(update_factory, "stxRollback")
    user = payment["message"]["from"]["id"]
    enqueue = running.shop.outbound.enqueue

    async def broken(*args: Any, **kwargs: Any) -> str:
        await enqueue(*args, **kwargs)
        raise RuntimeError("the database went away before the commit")

    monkeypatch.setattr(running.shop.outbound, "enqueue", broken)
    with pytest.raises(RuntimeError):
        await running.feed(payment)
    assert (await running.balance(user), await running.purchases()) == (0, 0)
    monkeypatch.undo()
    await running.feed(payment)  # Telegram delivers it again: now it credits, once
    assert (await running.balance(user), await running.purchases()) == (10, 1)
    chat = payment["message"]["chat"]["id"]
    await until(lambda: len(running.api.sent_texts(chat)) >= 1, "receipt")
    await asyncio.sleep(0.3)
    assert len(running.api.sent_texts(chat)) == 1


# --------------------------------------------------------------------- refunds


async def bought(running: Running, updates: UpdateFactory, charge: str) -> tuple[int, int]:
    """A paid purchase of 10 credits; returns (user id, chat id)."""
    payment = paid(updates, charge)
    await running.feed(payment)
    return payment["message"]["from"]["id"], payment["message"]["chat"]["id"]


def refunds_confirmed(running: Running, chat: int, charge: str) -> int:
    return sum(
        1
        for t in running.api.sent_texts(chat)
        if t.startswith(f"Refunded 50 ⭐ for charge {charge}")
    )


async def test_a_refund_asked_twice_refunds_once_and_takes_the_credits_back_once(
    running: Running, update_factory: UpdateFactory
) -> None:
    user, chat = await bought(running, update_factory, "stxRefund1")
    ask = update_factory.command("/refund", "stxRefund1")
    await asyncio.gather(
        running.feed(ask), running.feed(update_factory.command("/refund", "stxRefund1"))
    )
    await running.feed(ask)  # the same update again
    charge = running.api.payments.charges["stxRefund1"]
    assert (charge.refunds, charge.refund_attempts) == (1, 1)
    assert await running.balance(user) == 0
    await until(lambda: refunds_confirmed(running, chat, "stxRefund1") == 1, "the confirmation")
    await asyncio.sleep(0.3)
    assert refunds_confirmed(running, chat, "stxRefund1") == 1


async def test_a_charge_refunded_already_on_telegram_is_a_successful_refund(
    running: Running, update_factory: UpdateFactory
) -> None:
    user, chat = await bought(running, update_factory, "stxRefundedElsewhere")
    running.api.payments.charges["stxRefundedElsewhere"].refunds = 1  # e.g. by support
    await running.feed(update_factory.command("/refund", "stxRefundedElsewhere"))
    assert running.api.payments.charges["stxRefundedElsewhere"].refund_attempts == 1
    assert await running.balance(user) == 0  # CHARGE_ALREADY_REFUNDED: the credits go back
    await until(lambda: refunds_confirmed(running, chat, "stxRefundedElsewhere") == 1, "it")


async def test_a_refund_whose_answer_was_lost_is_unknown_listed_and_never_sent_again(
    running: Running, update_factory: UpdateFactory
) -> None:
    user, chat = await bought(running, update_factory, "stxLost")
    running.api.inject(Fault.drop(method="refundStarPayment"))  # applied, then no answer
    await running.feed(update_factory.command("/refund", "stxLost"))
    await running.feed(update_factory.command("/refund", "stxLost"))  # the buyer asks again
    charge = running.api.payments.charges["stxLost"]
    assert (charge.refunds, charge.refund_attempts) == (1, 1)  # Telegram refunded; asked once
    assert await running.balance(user) == 10  # not guessed: the credits stay until settled
    held = [t for t in running.api.sent_texts(chat) if "could not confirm the refund" in t]
    assert len(held) == 2

    admin = update_factory.new_user(id=ADMIN)
    await running.feed(
        update_factory.command("/unresolved", user=admin, chat=update_factory.private_chat(admin))
    )
    [listing] = running.api.sent_texts(ADMIN)
    [item] = await running.shop.idem.unresolved()
    assert item.key.endswith(":s:refundStarPayment") and "refund:stxLost" in item.key
    assert item.key in listing and item.kind == "step"

    # The operator checks Telegram (the Stars went back) and settles it: refunded.
    await running.feed(
        update_factory.command(
            "/resolve", f"{item.key} refunded", user=admin, chat=update_factory.private_chat(admin)
        )
    )
    assert await running.shop.idem.unresolved() == []
    await running.feed(update_factory.command("/refund", "stxLost"))  # asked once more
    assert charge.refund_attempts == 1  # the resolution is replayed: Telegram is not asked
    assert await running.balance(user) == 0
    await until(lambda: refunds_confirmed(running, chat, "stxLost") == 1, "the confirmation")


async def test_resolving_a_key_that_is_not_unknown_is_refused(
    running: Running, update_factory: UpdateFactory
) -> None:
    admin = update_factory.new_user(id=ADMIN)
    chat = update_factory.private_chat(admin)
    await running.feed(
        update_factory.command("/resolve", "idem:nothing:here refunded", user=admin, chat=chat)
    )
    [answer] = running.api.sent_texts(ADMIN)
    assert answer.startswith("Not resolved:")


async def test_a_stock_check_past_its_budget_is_answered_busy_in_time(
    running: Running, update_factory: UpdateFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def stuck(*args: Any) -> str | None:
        await asyncio.sleep(30)  # a database that does not answer
        return None

    monkeypatch.setattr(handlers, "order_problem", stuck)
    monkeypatch.setattr(handlers, "STOCK_CHECK_BUDGET", 0.2)
    query = update_factory.pre_checkout_query(payload="sku:credits10", total_amount=50)
    await asyncio.wait_for(running.poll(query), timeout=2)
    [answer] = running.api.payments.answered(query["pre_checkout_query"]["id"])
    assert (answer.ok, answer.error_message) == (False, BUSY)  # no charge: the buyer retries


async def test_a_refund_telegram_refuses_is_stored_and_asking_again_replays_it(
    running: Running, update_factory: UpdateFactory
) -> None:
    payment = paid(update_factory, "stxUnknownToTelegram")
    await running.dp.feed_raw_update(running.bot, payment)  # the fake never learns the charge
    chat = payment["message"]["chat"]["id"]
    await running.feed(update_factory.command("/refund", "stxUnknownToTelegram"))
    await running.feed(update_factory.command("/refund", "stxUnknownToTelegram"))
    refused = [t for t in running.api.sent_texts(chat) if t.startswith("Telegram refused")]
    assert len(refused) == 2 and all("CHARGE_NOT_FOUND" in t for t in refused), refused
    assert len(running.api.calls_of("refundStarPayment")) == 1  # the failure is replayed
    assert await running.balance(payment["message"]["from"]["id"]) == 10
