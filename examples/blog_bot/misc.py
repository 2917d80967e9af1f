"""The other update types the bot meets: payments, inline queries, anything else.

- ``pre_checkout_query`` must be answered within 10 s (Bot API, ``answerPreCheckoutQuery``).
- ``successful_payment``: the charge id is the natural action key, so a re-delivered or
  re-processed payment thanks the payer once.
- Updates without handlers (edits, channel posts, poll answers, membership changes) pass
  the update guard and are left alone.
"""

from __future__ import annotations

from aiogram import F, Router
from aiogram.types import InlineQuery, Message, PreCheckoutQuery

from telegram_idem import idempotent

__all__ = ["make_router"]


async def on_pre_checkout(query: PreCheckoutQuery) -> None:
    """Accept the order (the demo sells nothing real)."""
    await query.answer(ok=True)


@idempotent(key="pay:{message.successful_payment.telegram_payment_charge_id}")
async def on_payment(message: Message) -> int:
    """Thank the payer once per charge; returns the thank-you message id."""
    sent = await message.answer("⭐ Thank you for supporting the blog!")
    return sent.message_id


async def on_inline(query: InlineQuery) -> None:
    """No inline mode here: answer with no results so the client stops waiting."""
    await query.answer(results=[], cache_time=1)


def make_router() -> Router:
    """A new router with this module's handlers (a router attaches to one dispatcher)."""
    router = Router(name="misc")
    router.pre_checkout_query.register(on_pre_checkout)
    router.message.register(on_payment, F.successful_payment)
    router.inline_query.register(on_inline)
    return router
