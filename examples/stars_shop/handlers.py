"""The shop's handlers, in the order a purchase meets them.

1. ``/shop`` shows the catalogue; ``/buy [sku]`` or a tap on "Buy" sends an **invoice**
   (an ``@idempotent`` action: a re-delivered ``/buy`` or a double tap sends one invoice).
2. Telegram asks the bot to confirm the order: the **pre-checkout query** must be answered
   within 10 seconds. :class:`PreCheckoutAnswers` answers it at ingress, as soon as
   ``getUpdates`` returns it and before its batch is admitted to the inbox (an answer may
   repeat harmlessly; the inbox's queue or a locked store must not delay it), with a stock
   check that has its own time budget.
3. Telegram charges the buyer and sends ``successful_payment``. :func:`credit` runs once
   per ``telegram_payment_charge_id`` (never per invoice payload: an old invoice can be
   paid again), inside ``idem.transaction(session)``: the purchase, the new balance, the
   action's idempotency record and the receipt's outbox entry commit together or not at
   all.
4. ``/refund <charge id>``: :func:`refund` calls ``refundStarPayment`` in an
   ``once="at_most"`` step (``CHARGE_ALREADY_REFUNDED`` counts as done), then takes the
   credits back in a step recorded in the bot's own transaction. A refund whose answer
   was lost is *unknown*: it is never sent again by itself, and the operator sees it with
   ``/unresolved`` and settles it with ``/resolve``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiogram import Bot, F, Router
from aiogram.exceptions import (
    TelegramBadRequest,
    TelegramNetworkError,
    TelegramRetryAfter,
    TelegramServerError,
)
from aiogram.filters import Command, CommandObject
from aiogram.types import (
    CallbackQuery,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    Message,
    PreCheckoutQuery,
)
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from examples.stars_shop.models import Account, Product, Purchase
from examples.stars_shop.shop import Shop
from telegram_idem import (
    EffectContext,
    ResolveError,
    StoredFailureError,
    UnknownOutcomeError,
    idempotent,
)

__all__ = [
    "BUSY",
    "SOLD_OUT",
    "PreCheckoutAnswers",
    "build_router",
    "credit",
    "receipt_text",
    "refund",
    "refund_text",
]

log = logging.getLogger("examples.stars_shop")

STOCK_CHECK_BUDGET = 3.0
"""Seconds the pre-checkout stock check may take of Telegram's 10."""
SOLD_OUT = "Sorry, this pack is sold out."
BUSY = "The shop is busy right now. Please try again in a moment."
INVOICE_WINDOW = 30.0
"""Seconds a tap on "Buy" is remembered: a double tap within them sends one invoice."""


def receipt_text(purchase: Purchase, balance: int) -> str:
    """The receipt the buyer gets, once per charge."""
    return (
        f"Thank you! {purchase.credits} credits added; your balance is {balance}.\n"
        f"Charge {purchase.charge_id}: /refund {purchase.charge_id}"
    )


def refund_text(purchase: Purchase, balance: int) -> str:
    """The confirmation of a refund, once per charge."""
    return (
        f"Refunded {purchase.stars} ⭐ for charge {purchase.charge_id}; "
        f"{purchase.credits} credits taken back, your balance is {balance}."
    )


# --------------------------------------------------------------------- 1. the invoice


async def on_shop(message: Message, shop: Shop) -> None:
    async with shop.db() as session:
        products = (await session.scalars(select(Product).order_by(Product.price))).all()
    buttons = [
        [InlineKeyboardButton(text=f"Buy {p.title} for {p.price} ⭐", callback_data=f"buy:{p.sku}")]
        for p in products
    ]
    await message.answer(
        "Credits for Telegram Stars:", reply_markup=InlineKeyboardMarkup(inline_keyboard=buttons)
    )


async def on_buy(message: Message, command: CommandObject, shop: Shop) -> None:
    await invoice_for_command(message, shop, (command.args or "credits10").strip())


@idempotent(key="invoice:{message.chat.id}:{message.message_id}")
async def invoice_for_command(message: Message, shop: Shop, sku: str) -> None:
    # The same /buy delivered again is a replay: one invoice per command message.
    await send_invoice(shop, message.chat.id, sku)


async def on_buy_tap(query: CallbackQuery, shop: Shop) -> None:
    await invoice_for_tap(query, shop)
    await query.answer()  # both taps are answered; only the first sent an invoice


@idempotent(
    key="invoice:{callback_query.message.chat.id}:{callback_query.message.message_id}:{callback_data}",
    in_progress="wait",
    window=INVOICE_WINDOW,
)
async def invoice_for_tap(query: CallbackQuery, shop: Shop) -> None:
    assert query.data is not None and query.message is not None
    await send_invoice(shop, query.message.chat.id, query.data.removeprefix("buy:"))


async def send_invoice(shop: Shop, chat_id: int, sku: str) -> None:
    async with shop.db() as session:
        product = await session.get(Product, sku)
    if product is None:
        await shop.outbound.call("sendMessage", {"chat_id": chat_id, "text": f"No pack {sku!r}."})
        return
    # Through the outbox, inside the action: sent once per action, however often it runs.
    await shop.outbound.call(
        "sendInvoice",
        {
            "chat_id": chat_id,
            "title": product.title,
            "description": product.description,
            "payload": f"sku:{product.sku}",  # what is bought; never the idempotency key
            "currency": "XTR",  # Telegram Stars: no provider token, one price
            "prices": [{"label": product.title, "amount": product.price}],
            "reply_markup": {
                "inline_keyboard": [[{"text": f"Pay {product.price} ⭐", "pay": True}]]
            },
        },
    )


# --------------------------------------------------------------------- 2. pre-checkout


GetUpdates = Callable[[int | None, int, float], Awaitable[list[dict[str, Any]]]]
"""``(offset, limit, timeout_seconds) -> updates``, one ``getUpdates`` call (Bot API dicts)."""


class PreCheckoutAnswers:
    """``getUpdates`` that answers each ``pre_checkout_query`` the moment it is fetched.

    Give it to ``PollingIngress`` in place of ``aiogram_get_updates(bot)``. Each batch is
    returned unchanged (the queries are admitted to the inbox like any update, and the
    dispatcher has no handler for them), but every pre-checkout query in it is first
    handed to a task of its own that checks the stock and answers. So the answer never
    waits for the batch's admission, the inbox worker's queue or a locked store: only
    for the stock check's budget. Telegram drops the payment if the answer is later than
    10 s; answering twice is harmless (the charge happens once, after the first ``ok``),
    so no idempotency record is needed. A query fetched again (its batch was not
    admitted, so the offset did not move) is not answered again by this process, unless
    its first answer failed.

    Args:
        get_updates: the real call, e.g. ``aiogram_get_updates(bot)``.
        bot: the bot that answers.
        shop: the shop whose stock is checked.
    """

    REMEMBERED = 1000
    """Query ids kept to recognise a re-fetched query."""

    def __init__(self, get_updates: GetUpdates, bot: Bot, shop: Shop) -> None:
        self.get_updates = get_updates
        self.bot = bot
        self.shop = shop
        self._seen: dict[str, None] = {}  # insertion-ordered: the oldest is dropped first
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, offset: int | None, limit: int, wait: float) -> list[dict[str, Any]]:
        batch = await self.get_updates(offset, limit, wait)
        for item in batch:
            raw = item.get("pre_checkout_query") if isinstance(item, dict) else None
            if not isinstance(raw, dict) or str(raw.get("id")) in self._seen:
                continue
            self._seen[str(raw.get("id"))] = None
            if len(self._seen) > self.REMEMBERED:
                del self._seen[next(iter(self._seen))]
            task = asyncio.create_task(self._answer(raw))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return batch

    async def _answer(self, raw: dict[str, Any]) -> None:
        try:
            query = PreCheckoutQuery.model_validate(raw, context={"bot": self.bot})
            await answer_pre_checkout(query, self.bot, self.shop)
        except Exception:  # a task of its own: nobody else would see the error
            log.exception("pre-checkout %s not answered", raw.get("id"))
            self._seen.pop(str(raw.get("id")), None)  # fetched again, it is tried again

    async def settle(self, limit: float = 10.0) -> None:
        """Wait up to ``limit`` seconds for the answers in flight (at shutdown, or in a
        test); the ones still running then are cancelled."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=limit)
            for task in pending:
                task.cancel()


async def answer_pre_checkout(query: PreCheckoutQuery, bot: Bot, shop: Shop) -> None:
    try:
        async with asyncio.timeout(STOCK_CHECK_BUDGET):
            problem = await order_problem(shop, query.invoice_payload, query.total_amount)
    except TimeoutError:
        problem = BUSY  # never let a slow check eat Telegram's 10 s: no charge, try again
    try:
        await bot.answer_pre_checkout_query(query.id, ok=problem is None, error_message=problem)
    except TelegramBadRequest as exc:  # answered already (a repeat), or too late
        log.warning("pre-checkout %s not answered: %s", query.id, exc.message)


async def order_problem(shop: Shop, payload: str, total: int) -> str | None:
    """Why the order cannot be taken (shown to the buyer), or ``None``."""
    async with shop.db() as session:
        product = await session.get(Product, payload.removeprefix("sku:"))
    if product is None or product.price != total:
        return "This invoice is no longer valid; send /shop for a new one."
    if product.stock < 1:
        return SOLD_OUT
    return None


# --------------------------------------------------------------------- 3. the credit


async def on_successful_payment(message: Message, shop: Shop) -> None:
    # One transaction of the bot's own database holds everything the payment changes.
    async with shop.db() as session, session.begin():
        async with shop.idem.transaction(session):
            await credit(message, shop, session)
    # Committed: the receipt's outbox entry is now visible to the relay, which sends it.


@idempotent(key="pay:{message.successful_payment.telegram_payment_charge_id}", in_progress="wait")
async def credit(message: Message, shop: Shop, session: AsyncSession) -> int:
    """Credit the buyer for one charge; returns the new balance. Runs once per charge:
    a second delivery (the same update, or another update with the same charge id) waits
    for the first transaction, then replays its balance."""
    paid = message.successful_payment
    assert paid is not None and message.from_user is not None
    product = await session.get(Product, paid.invoice_payload.removeprefix("sku:"))
    assert product is not None, f"a payment for an unknown product: {paid.invoice_payload}"
    purchase = Purchase(
        charge_id=paid.telegram_payment_charge_id,
        user_id=message.from_user.id,
        sku=product.sku,
        stars=paid.total_amount,
        credits=product.credits,
    )
    session.add(purchase)
    account = await session.get(Account, purchase.user_id)
    if account is None:
        account = Account(user_id=purchase.user_id, credits=0)
        session.add(account)
    account.credits += purchase.credits
    product.stock -= 1
    await session.flush()
    # Written in this transaction: sent after the commit, never twice, never without it.
    await shop.outbound.enqueue(
        "sendMessage", {"chat_id": message.chat.id, "text": receipt_text(purchase, account.credits)}
    )
    return account.credits


# --------------------------------------------------------------------- 4. the refund


def refund_key(update: Mapping[str, Any]) -> str:
    """``refund:<charge id>`` from ``/refund <charge id>``: one refund per charge, whoever
    asks and however often."""
    return "refund:" + str(update["message"]["text"]).split(maxsplit=1)[1].strip()


async def on_refund(message: Message, command: CommandObject, bot: Bot, shop: Shop) -> None:
    charge_id = (command.args or "").strip()
    assert message.from_user is not None
    async with shop.db() as session:
        purchase = await session.get(Purchase, charge_id) if charge_id else None
    if purchase is None or (
        purchase.user_id != message.from_user.id and message.from_user.id not in shop.admins
    ):
        await message.answer("Usage: /refund <charge id> (of one of your purchases)")
        return
    if purchase.refunded:
        await message.answer(f"Charge {charge_id} was refunded already.")
        return
    try:
        await refund(message, bot, shop, purchase)
    except UnknownOutcomeError:
        # The refund may or may not have reached Telegram: never guessed, never re-sent.
        await message.answer(
            f"We could not confirm the refund of {charge_id} with Telegram. An operator "
            "will check it; nothing is refunded twice."
        )
    except (TelegramBadRequest, StoredFailureError) as exc:
        # Refused for good (e.g. CHARGE_NOT_FOUND): stored, so asking again replays it.
        reason = exc.message if isinstance(exc, TelegramBadRequest) else exc.error_message
        await message.answer(f"Telegram refused the refund of {charge_id}: {reason}")


@idempotent(key=refund_key, in_progress="wait")
async def refund(message: Message, bot: Bot, shop: Shop, purchase: Purchase) -> int:
    """Refund one charge: the Stars at most once, then the credits taken back in the
    bot's transaction; returns the new balance."""
    await shop.idem.step(
        "refundStarPayment",
        refund_star_payment,
        bot,
        purchase.user_id,
        purchase.charge_id,
        once="at_most",  # recorded as started before the call: a crash leaves it unknown
        context=True,
        not_applied=(TelegramRetryAfter,),  # refused before anything happened
        permanent=(TelegramBadRequest,),  # e.g. CHARGE_NOT_FOUND: retries replay it
        ambiguous=(TelegramNetworkError, TelegramServerError),  # lost answers: unknown
    )
    async with shop.db() as session, session.begin():
        async with shop.idem.transaction(session):
            return await shop.idem.step(
                "take_back", take_back, session, shop, purchase.charge_id, message.chat.id
            )


async def refund_star_payment(ctx: EffectContext, bot: Bot, user_id: int, charge_id: str) -> bool:
    """``refundStarPayment``; a charge refunded before (by an earlier attempt, or from
    Telegram's side) is the outcome we wanted."""
    log.info("refundStarPayment %s (attempt %d)", charge_id, ctx.attempt)
    try:
        return await bot.refund_star_payment(user_id, charge_id)
    except TelegramBadRequest as exc:
        if "CHARGE_ALREADY_REFUNDED" in exc.message:
            return True
        raise


async def take_back(session: AsyncSession, shop: Shop, charge_id: str, chat_id: int) -> int:
    purchase = await session.get(Purchase, charge_id)
    assert purchase is not None
    account = await session.get(Account, purchase.user_id)
    assert account is not None
    if not purchase.refunded:
        purchase.refunded = True
        account.credits -= purchase.credits
        await session.flush()
        await shop.outbound.enqueue(
            "sendMessage", {"chat_id": chat_id, "text": refund_text(purchase, account.credits)}
        )
    return account.credits


# --------------------------------------------------------------------- the operator


async def on_balance(message: Message, shop: Shop) -> None:
    assert message.from_user is not None
    async with shop.db() as session:
        account = await session.get(Account, message.from_user.id)
    await message.answer(f"Your balance: {account.credits if account else 0} credits.")


async def on_unresolved(message: Message, shop: Shop) -> None:
    """Admins only: the effects that may or may not have happened, oldest first."""
    if message.from_user is None or message.from_user.id not in shop.admins:
        return
    items = await shop.idem.unresolved()
    lines = [
        f"{u.kind} {u.key}: {u.state}, {u.age:.0f} s, holder {u.holder}, "
        f"attempts {u.attempts}. {u.detail}".strip()
        for u in items
    ]
    await message.answer("\n".join(lines) if lines else "Nothing unresolved.")


async def on_resolve(message: Message, command: CommandObject, shop: Shop) -> None:
    """Admins only: ``/resolve <key> refunded`` (Telegram shows the refund: the next
    ``/refund`` takes the credits back) or ``/resolve <key> not-refunded`` (it did not
    happen: the next ``/refund`` asks Telegram again)."""
    if message.from_user is None or message.from_user.id not in shop.admins:
        return
    key, _, verdict = (command.args or "").strip().partition(" ")
    try:
        if verdict.strip() == "refunded":
            await shop.idem.resolve(key, result=True)
        elif verdict.strip() == "not-refunded":
            await shop.idem.resolve(key, not_applied=True)
        else:
            await message.answer("Usage: /resolve <key> refunded|not-refunded")
            return
    except ResolveError as exc:
        await message.answer(f"Not resolved: {exc}")
        return
    await message.answer(f"Resolved {key}: {verdict.strip()}.")


# --------------------------------------------------------------------- wiring


def build_router() -> Router:
    """A router with the shop's handlers (a new one each call: aiogram attaches a router
    to one dispatcher)."""
    router = Router(name="stars_shop")
    router.message.register(on_shop, Command("start", "shop"))
    router.message.register(on_buy, Command("buy"))
    router.callback_query.register(on_buy_tap, F.data.startswith("buy:"))
    router.message.register(on_successful_payment, F.successful_payment)
    router.message.register(on_refund, Command("refund"))
    router.message.register(on_balance, Command("balance"))
    router.message.register(on_unresolved, Command("unresolved"))
    router.message.register(on_resolve, Command("resolve"))
    return router
