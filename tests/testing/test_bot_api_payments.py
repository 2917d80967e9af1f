"""FakeBotAPI's Telegram Stars payments, driven by a real aiogram Bot over loopback HTTP:
invoices parse as aiogram Messages, the pre-checkout answer has its deadline, a charge is
refunded once and a second refund is ``CHARGE_ALREADY_REFUNDED``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import TelegramBadRequest
from aiogram.types import InlineKeyboardButton, InlineKeyboardMarkup, LabeledPrice, Update

from telegram_idem.testing import DEFAULT_TOKEN, UpdateFactory
from telegram_idem.testing._payments import CHARGE_ALREADY_REFUNDED, CHARGE_NOT_FOUND
from telegram_idem.testing.bot_api import FakeBotAPI, FakeBotAPIControl

CHAT = 5550001001


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def api() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI() as fake:
        yield fake


@pytest.fixture
async def bot(api: FakeBotAPI) -> AsyncIterator[Bot]:
    session = AiohttpSession(api=TelegramAPIServer.from_base(api.url))
    async with Bot(token=DEFAULT_TOKEN, session=session) as client:
        yield client


async def test_send_invoice_returns_a_message_with_its_invoice(api: FakeBotAPI, bot: Bot) -> None:
    pay = InlineKeyboardMarkup(inline_keyboard=[[InlineKeyboardButton(text="Pay ⭐50", pay=True)]])
    message = await bot.send_invoice(
        CHAT,
        title="Sticker pack",
        description="Twelve stickers",
        payload="sku:stickers",
        currency="XTR",
        prices=[LabeledPrice(label="Stickers", amount=50)],
        reply_markup=pay,
    )
    assert message.invoice is not None
    assert (message.invoice.currency, message.invoice.total_amount) == ("XTR", 50)
    assert message.reply_markup is not None and message.reply_markup.inline_keyboard[0][0].pay
    [sent] = api.invoices(CHAT)
    assert (sent.message_id, sent.payload, sent.total_amount) == (
        message.message_id,
        "sku:stickers",
        50,
    )
    assert api.message(CHAT, message.message_id) is not None
    assert api.sent_texts(CHAT) == []  # an invoice is no text message


@pytest.mark.parametrize(
    ("change", "description"),
    [
        (
            {"prices": [LabeledPrice(label="a", amount=1), LabeledPrice(label="b", amount=2)]},
            "STARS_INVOICE_INVALID",
        ),
        ({"provider_token": "123:TEST"}, "PAYMENT_PROVIDER_INVALID"),
        ({"currency": "EUR"}, "PAYMENT_PROVIDER_INVALID"),
        ({"title": "x" * 33}, "INVOICE_TITLE_INVALID"),
        ({"prices": [LabeledPrice(label="a", amount=0)]}, "CURRENCY_TOTAL_AMOUNT_INVALID"),
    ],
)
async def test_a_bad_stars_invoice_is_refused(
    api: FakeBotAPI, bot: Bot, change: dict[str, object], description: str
) -> None:
    params: dict[str, object] = {
        "title": "Pack",
        "description": "Stickers",
        "payload": "sku:1",
        "currency": "XTR",
        "prices": [LabeledPrice(label="Pack", amount=5)],
        **change,
    }
    with pytest.raises(TelegramBadRequest, match=description):
        await bot.send_invoice(CHAT, **params)  # type: ignore[arg-type]
    assert api.invoices(CHAT) == []


async def test_the_pre_checkout_answer_is_recorded_with_its_delay(
    api: FakeBotAPI, bot: Bot
) -> None:
    query = UpdateFactory().pre_checkout_query()
    api.learn_update(query)
    query_id = query["pre_checkout_query"]["id"]
    assert await bot.answer_pre_checkout_query(query_id, ok=False, error_message="Sold out")
    [answer] = api.payments.answered(query_id)
    assert (answer.ok, answer.error_message) == (False, "Sold out")
    assert answer.after is not None and 0 <= answer.after < 5
    with pytest.raises(TelegramBadRequest, match="ERROR_MESSAGE_EMPTY"):
        await bot.answer_pre_checkout_query(query_id, ok=False)


async def test_a_pre_checkout_answer_after_the_deadline_is_too_old() -> None:
    clock = Clock()
    async with FakeBotAPI() as api:
        api.payments.clock = clock
        session = AiohttpSession(api=TelegramAPIServer.from_base(api.url))
        async with Bot(token=DEFAULT_TOKEN, session=session) as late:
            query = UpdateFactory().pre_checkout_query()
            api.queue_update(query)  # queued: its 10 s start now
            clock.now += 10.5
            with pytest.raises(TelegramBadRequest, match="query is too old"):
                await late.answer_pre_checkout_query(query["pre_checkout_query"]["id"], ok=True)
            assert api.payments.answered(query["pre_checkout_query"]["id"]) == []


async def test_a_charge_is_refunded_once(api: FakeBotAPI, bot: Bot) -> None:
    updates = UpdateFactory()
    paid = updates.successful_payment(charge_id="stxCharge1", total_amount=50)
    user = paid["message"]["from"]["id"]
    Update.model_validate(paid)  # the factory's update parses
    with pytest.raises(TelegramBadRequest, match="CHARGE_NOT_FOUND"):
        await bot.refund_star_payment(user, "stxCharge1")  # not known yet
    api.queue_update(paid)
    assert await bot.refund_star_payment(user, "stxCharge1") is True
    with pytest.raises(TelegramBadRequest) as second:
        await bot.refund_star_payment(user, "stxCharge1")
    assert second.value.message == CHARGE_ALREADY_REFUNDED
    charge = api.payments.charges["stxCharge1"]
    assert (charge.refunds, charge.refund_attempts, charge.total_amount) == (1, 2, 50)
    with pytest.raises(TelegramBadRequest) as other:
        await bot.refund_star_payment(user + 1, "stxCharge1")  # another user's charge
    assert other.value.message == CHARGE_NOT_FOUND


async def test_the_payments_are_in_the_state_another_process_reads(
    api: FakeBotAPI, bot: Bot
) -> None:
    await bot.send_invoice(
        CHAT, "Pack", "Stickers", "sku:1", "XTR", [LabeledPrice(label="Pack", amount=5)]
    )
    paid = UpdateFactory().successful_payment(charge_id="stxState", total_amount=5)
    api.queue_update(paid)
    await bot.refund_star_payment(paid["message"]["from"]["id"], "stxState")
    state = await FakeBotAPIControl(api.url).state()
    [invoice] = state["payments"]["invoices"]
    assert (invoice["chat_id"], invoice["payload"], invoice["total_amount"]) == (CHAT, "sku:1", 5)
    [charge] = state["payments"]["charges"]
    assert (charge["charge_id"], charge["refunds"], charge["refund_attempts"]) == ("stxState", 1, 1)
