"""``python -m examples.stars_shop.demo``: the shop, offline, against a local Bot API
(``FakeBotAPI``), fed what Telegram sends when things go wrong: a command delivered
twice, a double tap on "Buy", one payment delivered three times, a refund asked twice, a
refund whose answer is lost. Pre-checkout queries go through the shop's ingress (answered
when fetched); the rest is fed to the dispatcher directly. It prints each check and exits
1 if one fails.

``--db PATH`` keeps the shop's SQLite file (default: a temporary directory).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from examples.stars_shop.app import build_polling, connected
from examples.stars_shop.models import Account, Product
from telegram_idem.testing import DEFAULT_TOKEN, FakeBotAPI, Fault, UpdateFactory

__all__ = ["main", "scenario"]

ADMIN = 5550009999


class Checks:
    """What the demo checked, printed as it goes."""

    def __init__(self) -> None:
        self.failed = 0

    def __call__(self, ok: bool, what: str) -> None:
        print(f"{'✓' if ok else '✗'} {what}", flush=True)
        self.failed += not ok


async def settle(predicate: Callable[[], bool], limit: float = 5.0) -> bool:
    """Wait up to ``limit`` seconds for the relay to send what the bot committed."""
    for _ in range(int(limit / 0.05)):
        if predicate():
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # and a moment more, for anything sent twice
    return predicate()


async def scenario(db: Path, check: Checks) -> None:
    """Run the shop against a fresh ``FakeBotAPI``, checking as it goes."""
    updates = UpdateFactory()
    user, chat = updates.user["id"], updates.chat["id"]
    admin = updates.new_user(id=ADMIN)
    admin_chat = updates.private_chat(admin)
    async with FakeBotAPI() as api:
        async with connected(DEFAULT_TOKEN, api.url, db, admins=frozenset({ADMIN})) as (
            bot,
            dp,
            shop,
        ):

            async def feed(*many: dict[str, Any]) -> None:
                for update in many:
                    api.learn_update(update)  # as Telegram knows its queries and charges
                await asyncio.gather(*(dp.feed_raw_update(bot, u) for u in many))

            async def balance() -> int:
                async with shop.db() as session:
                    account = await session.get(Account, user)
                return account.credits if account else 0

            def texts(part: str, where: int = chat) -> int:
                return sum(1 for t in api.sent_texts(where) if part in t)

            print("1. invoices")
            buy = updates.command("/buy", "credits10")
            await feed(buy)
            await feed(buy)
            check(len(api.invoices(chat)) == 1, "/buy delivered twice sends one invoice (XTR)")
            await feed(updates.command("/shop"))
            [catalogue] = [m for m in api.messages(chat) if m.text]
            tap = updates.callback_query("buy:credits50", from_message=catalogue)
            await feed(tap, updates.double_tap(tap))
            check(len(api.invoices(chat)) == 2, "a double tap on Buy sends one more invoice")
            check(len(api.answered_callback_ids()) == 2, "and both taps are answered")

            print("2. pre-checkout (Telegram waits 10 s for the answer)")
            async with shop.db() as session, session.begin():
                product = await session.get(Product, "credits50")
                assert product is not None
                product.stock = 0
            fine = updates.pre_checkout_query(payload="sku:credits10", total_amount=50)
            gone = updates.pre_checkout_query(payload="sku:credits50", total_amount=200)
            # Through the shop's real ingress: answered as soon as getUpdates returns them.
            polling = build_polling(bot, dp, shop)
            for query in (fine, gone):
                api.queue_update(query)
            await polling.ingress.poll_once()
            await polling.answers.settle()
            [yes] = api.payments.answered(fine["pre_checkout_query"]["id"])
            [no] = api.payments.answered(gone["pre_checkout_query"]["id"])
            check(yes.ok and (yes.after or 0) < 2, f"in stock: ok, after {yes.after or 0:.2f} s")
            check(not no.ok, f"sold out: refused ({no.error_message})")

            print("3. the credit, once per telegram_payment_charge_id")
            payment = updates.successful_payment(charge_id="stxDemo1", payload="sku:credits10")
            again = updates.successful_payment(charge_id="stxDemo1", payload="sku:credits10")
            await feed(payment, again)
            await feed(payment)
            check(await balance() == 10, "one payment delivered three times credits 10, once")
            check(await settle(lambda: texts("Charge stxDemo1:") == 1), "one receipt")

            print("4. a refund, at most once")
            await feed(
                updates.command("/refund", "stxDemo1"), updates.command("/refund", "stxDemo1")
            )
            charge = api.payments.charges["stxDemo1"]
            check(charge.refund_attempts == 1, "asked twice: refundStarPayment called once")
            check(await balance() == 0, "the credits taken back once")
            check(await settle(lambda: texts("for charge stxDemo1;") == 1), "one confirmation")

            print("5. a refund whose answer is lost")
            await feed(updates.successful_payment(charge_id="stxDemo2", payload="sku:credits10"))
            api.inject(Fault.drop(method="refundStarPayment"))  # applied, never answered
            await feed(updates.command("/refund", "stxDemo2"))
            await feed(updates.command("/refund", "stxDemo2"))
            lost = api.payments.charges["stxDemo2"]
            check(lost.refund_attempts == 1, "asked again: not sent again (unknown, not guessed)")
            check(await balance() == 10, "the credits stay until the operator decides")
            [item] = await shop.idem.unresolved()
            await feed(updates.command("/unresolved", user=admin, chat=admin_chat))
            check(texts(item.key, ADMIN) == 1, f"/unresolved lists it: {item.key}")
            await feed(
                updates.command("/resolve", f"{item.key} refunded", user=admin, chat=admin_chat)
            )
            await feed(updates.command("/refund", "stxDemo2"))
            check(
                lost.refund_attempts == 1 and await balance() == 0,
                "resolved as refunded: the next /refund takes the credits back, asks nobody",
            )
            check(await shop.idem.unresolved() == [], "nothing is left unresolved")


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module doc); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m examples.stars_shop.demo")
    parser.add_argument("--db", type=Path, help="the shop's SQLite file (default: temporary)")
    args = parser.parse_args(argv)
    check = Checks()
    with tempfile.TemporaryDirectory() as scratch:
        asyncio.run(scenario(args.db or Path(scratch) / "shop.db", check))
    print("all checks passed" if not check.failed else f"{check.failed} check(s) FAILED")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
