"""The shop as real processes (``python -m examples.stars_shop`` polling a local Bot API
into its inbox): killed with SIGKILL at random moments while payments arrive, killed
while a payment's credit waits on a locked database, and two processes polling at once.
However the crashes fall, every charge is credited once, and its receipt is sent at most
once (a receipt whose send a crash interrupted is *unknown*, held for the operator,
never sent twice).

Telegram is played honestly: one ``FakeBotAPI`` lives across the restarts, and an update
is sent again only while no ``getUpdates`` offset has confirmed it (the fake's
``pending_updates``). Nothing is re-queued by the test after a crash."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from examples._running import run_example
from examples.stars_shop.models import Account, Purchase
from telegram_idem import Idem
from telegram_idem.outbox import CallStatus
from telegram_idem.testing import DEFAULT_TOKEN, FakeBotAPI, Fault, UpdateFactory

LEASE = "2"  # seconds a killed process's claims stay held


def env_for(api: FakeBotAPI, db: Path) -> dict[str, str]:
    return {
        "BOT_TOKEN": DEFAULT_TOKEN,
        "TELEGRAM_API_URL": api.url,
        "SHOP_DB": str(db),
        "SHOP_LEASE": LEASE,
    }


def payments(updates: UpdateFactory, charges: list[str]) -> list[dict[str, Any]]:
    """Each charge's payment, and for each a second update with the same charge id."""
    out = []
    for charge in charges:
        out.append(updates.successful_payment(charge_id=charge, payload="sku:credits10"))
        out.append(updates.successful_payment(charge_id=charge, payload="sku:credits10"))
    return out


def ledger(db: Path) -> tuple[dict[str, int], dict[int, int]]:
    """Purchases per charge id, and balances per user, read from the shop's tables."""
    engine = create_engine(f"sqlite:///{db}")
    try:
        with Session(engine) as session:
            bought: dict[str, int] = {}
            for purchase in session.scalars(select(Purchase)):
                bought[purchase.charge_id] = bought.get(purchase.charge_id, 0) + 1
            balances = {a.user_id: a.credits for a in session.scalars(select(Account))}
    finally:
        engine.dispose()
    return bought, balances


async def receipts_settled(db: Path) -> dict[CallStatus, int]:
    idem = Idem(f"sqlite:///{db}")
    try:
        outbox = idem.store.outbox()
        counts: dict[CallStatus, int] = await outbox.counts()
        return counts
    finally:
        await idem.close()


def receipts_for(api: FakeBotAPI, chat: int, charge: str) -> int:
    return sum(1 for text in api.sent_texts(chat) if f"Charge {charge}:" in text)


async def finish(api: FakeBotAPI, tmp_path: Path, db: Path, charges: list[str], chat: int) -> None:
    """A last, uninterrupted run: Telegram re-delivers what was never confirmed, the
    worker runs what the inbox holds, the relay sends what is left, and every charge
    ends up credited."""

    def all_credited() -> bool:
        return set(ledger(db)[0]) == set(charges)

    async with run_example("stars_shop", env=env_for(api, db), workdir=tmp_path) as bot:
        await bot.until(lambda: "Start polling" in bot.output(), what="polling")
        await bot.until(all_credited, what="every charge credited", limit=60)

        async def quiet() -> bool:
            counts = await receipts_settled(db)
            return counts.get(CallStatus.PENDING, 0) == 0

        for _ in range(600):
            if await quiet():
                break
            await asyncio.sleep(0.1)
        await bot.stop()


async def test_kill_9_at_random_moments_never_credits_or_receipts_twice(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    updates = UpdateFactory()
    charges = [f"stxKill{n}" for n in range(6)]
    chat = updates.chat["id"]
    db = tmp_path / "shop.db"
    async with FakeBotAPI(long_poll_cap=0.2) as api:
        for round_ in range(3):
            workdir = tmp_path / f"run{round_}"
            workdir.mkdir()
            async with run_example("stars_shop", env=env_for(api, db), workdir=workdir) as bot:
                await bot.until(lambda: "Start polling" in bot.output(), what="polling")
                if round_ == 0:  # sent once; the fake re-sends only what was not confirmed
                    for update in payments(updates, charges):
                        api.queue_update(update)
                await asyncio.sleep(rng.uniform(0.05, 1.0))
                os.kill(bot.proc.pid, signal.SIGKILL)
                await bot.proc.wait()
        await finish(api, tmp_path, db, charges, chat)
        assert api.pending_updates == [], f"seed {seed}"
        bought, balances = ledger(db)
        assert bought == {c: 1 for c in charges}, f"seed {seed}"
        assert balances == {updates.user["id"]: 10 * len(charges)}, f"seed {seed}"
        for charge in charges:
            assert receipts_for(api, chat, charge) <= 1, f"seed {seed}: {charge} twice"
        counts = await receipts_settled(db)
        assert counts.get(CallStatus.DELIVERED, 0) + counts.get(CallStatus.UNKNOWN, 0) == len(
            charges
        ), f"seed {seed}: {counts}"
        assert counts.get(CallStatus.DELIVERED, 0) == sum(
            receipts_for(api, chat, c) for c in charges
        )


async def test_two_processes_polling_at_once_credit_each_charge_once(tmp_path: Path) -> None:
    updates = UpdateFactory()
    charges = [f"stxTwo{n}" for n in range(5)]
    chat = updates.chat["id"]
    db = tmp_path / "shop.db"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with FakeBotAPI(long_poll_cap=0.2) as api:
        env = env_for(api, db)
        async with run_example("stars_shop", env=env, workdir=tmp_path / "a") as first:
            await first.until(lambda: "Start polling" in first.output(), what="polling")
            async with run_example("stars_shop", env=env, workdir=tmp_path / "b") as second:
                await second.until(lambda: "Start polling" in second.output(), what="polling")
                for update in payments(updates, charges):
                    api.queue_update(update)
                    api.queue_update(update)  # and each one twice
                try:
                    await first.until(
                        lambda: len(api.sent_texts(chat)) >= len(charges), what="the receipts"
                    )
                except AssertionError as exc:
                    raise AssertionError(
                        f"{exc}\n--- the second process:\n{second.output()}"
                    ) from None
                await asyncio.sleep(0.5)  # time for any second receipt to go out
                await second.stop()
            await first.stop()
    bought, balances = ledger(db)
    assert bought == {c: 1 for c in charges}
    assert balances == {updates.user["id"]: 10 * len(charges)}
    assert [receipts_for(api, chat, c) for c in charges] == [1] * len(charges)


async def test_kill_9_while_telegram_refunds_leaves_the_refund_unknown_not_repeated(
    tmp_path: Path,
) -> None:
    updates = UpdateFactory()
    admin = updates.new_user(id=5550009999)
    chat = updates.chat["id"]
    db = tmp_path / "shop.db"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with FakeBotAPI(long_poll_cap=0.2) as api:
        env = {**env_for(api, db), "SHOP_ADMINS": str(admin["id"])}
        api.queue_update(
            updates.successful_payment(charge_id="stxKillRefund", payload="sku:credits10")
        )
        # Telegram refunds at once but answers 30 s later: the bot dies in between.
        api.inject(Fault.slow(30, method="refundStarPayment"))
        async with run_example("stars_shop", env=env, workdir=tmp_path / "a") as bot:
            await bot.until(lambda: len(api.sent_texts(chat)) == 1, what="the receipt")
            api.queue_update(updates.command("/refund", "stxKillRefund"))
            await bot.until(lambda: bool(api.calls_of("refundStarPayment")), what="the refund")
            os.kill(bot.proc.pid, signal.SIGKILL)
            await bot.proc.wait()
        assert api.payments.charges["stxKillRefund"].refunded
        api.clear_faults()
        async with run_example("stars_shop", env=env, workdir=tmp_path / "b") as bot:
            await bot.until(lambda: "Start polling" in bot.output(), what="polling")
            api.queue_update(updates.command("/refund", "stxKillRefund"))  # asked again
            await bot.until(
                lambda: any("could not confirm" in t for t in api.sent_texts(chat)),
                what="the refund held as unknown",
            )
            api.queue_update(
                updates.command("/unresolved", user=admin, chat=updates.private_chat(admin))
            )
            await bot.until(lambda: bool(api.sent_texts(admin["id"])), what="the listing")
            await bot.stop()
    assert len(api.calls_of("refundStarPayment")) == 1  # never asked twice
    [listing] = api.sent_texts(admin["id"])
    assert "refund:stxKillRefund" in listing and "refundStarPayment" in listing
    _, balances = ledger(db)
    assert balances == {updates.user["id"]: 10}  # not guessed: settled by the operator


def credited(db: Path, charge: str) -> int:
    """Purchases of ``charge``, read without waiting for a writer (WAL: readers never
    wait)."""
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT count(*) FROM shop_purchases WHERE charge_id = ?", (charge,)
        ).fetchone()
    return int(row[0])


async def inbox_depth(db: Path) -> int:
    idem = Idem(f"sqlite:///{db}")
    try:
        return await idem.store.inbox().depth()
    finally:
        await idem.close()


async def restart_until_credited(
    api: FakeBotAPI, workdir: Path, db: Path, charge: str, chat: int
) -> None:
    async with run_example("stars_shop", env=env_for(api, db), workdir=workdir) as bot:
        await bot.until(lambda: credited(db, charge) > 0, what=f"{charge} credited")
        await bot.until(lambda: receipts_for(api, chat, charge) > 0, what="the receipt")
        await asyncio.sleep(0.5)  # time for a second credit or receipt to show
        await bot.stop()


async def test_a_payment_fetched_while_the_database_is_locked_is_not_confirmed_and_survives_kill_9(
    tmp_path: Path,
) -> None:
    """The trial's order: the write lock is held, the payment arrives, the shop is
    killed. Nothing durable could own the update, so the offset never passed it:
    Telegram still holds it, and the restarted shop credits it once."""
    updates = UpdateFactory()
    chat = updates.chat["id"]
    db = tmp_path / "shop.db"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    payment = updates.successful_payment(charge_id="stxW1", payload="sku:credits10")
    async with FakeBotAPI(long_poll_cap=0.2) as api:
        async with run_example("stars_shop", env=env_for(api, db), workdir=tmp_path / "a") as bot:
            await bot.until(lambda: "Start polling" in bot.output(), what="polling")
            other = sqlite3.connect(db, isolation_level=None, timeout=10)
            try:
                other.execute("BEGIN IMMEDIATE")  # another writer holds the file
                queued = time.monotonic()
                api.queue_update(payment)
                # A getUpdates that arrived after the payment was queued answered it: the
                # shop holds it now and cannot admit it while the lock is held (its
                # admission waits busy_timeout behind the store's one thread, long on a
                # loaded machine, so the test waits for the fetch, not for a log line).
                await bot.until(
                    lambda: any(c.at > queued for c in api.calls_of("getUpdates")),
                    what="the payment fetched",
                    limit=60,
                )
                await asyncio.sleep(1.0)  # the shop is inside its admission now
                assert [u["update_id"] for u in api.pending_updates] == [payment["update_id"]]
                os.kill(bot.proc.pid, signal.SIGKILL)
                await bot.proc.wait()
            finally:
                other.execute("ROLLBACK")
                other.close()
        assert credited(db, "stxW1") == 0 and await inbox_depth(db) == 0  # owned by no one
        await restart_until_credited(api, tmp_path / "b", db, "stxW1", chat)
        assert api.pending_updates == []
    bought, balances = ledger(db)
    assert bought == {"stxW1": 1}
    assert balances == {updates.user["id"]: 10}
    assert receipts_for(api, chat, "stxW1") == 1


async def test_kill_9_while_the_credit_waits_on_a_locked_database_after_confirmation(
    tmp_path: Path,
) -> None:
    """The trial's scenario: the payment is confirmed to Telegram (no getUpdates will
    send it again), then another writer locks the database before the credit commits,
    and the shop is killed while it waits. The inbox owns the update: after restart the
    buyer is credited exactly once.

    The lock is taken the moment the fake sees the confirming offset, which is a race
    with the shop's worker; a round the worker wins (the credit committed first) proves
    nothing and is repeated with the next charge."""
    updates = UpdateFactory()
    chat = updates.chat["id"]
    db = tmp_path / "shop.db"
    caught: str | None = None
    async with FakeBotAPI(long_poll_cap=0.2) as api:
        for attempt in range(8):
            charge = f"stxW{attempt}"
            payment = updates.successful_payment(charge_id=charge, payload="sku:credits10")
            workdir = tmp_path / f"run{attempt}"
            workdir.mkdir()
            async with run_example("stars_shop", env=env_for(api, db), workdir=workdir) as bot:
                await bot.until(lambda: "Start polling" in bot.output(), what="polling")
                other = sqlite3.connect(db, isolation_level=None, timeout=10)
                try:
                    api.queue_update(payment)
                    deadline = time.monotonic() + 15
                    while api.pending_updates:  # until an offset confirms it
                        assert time.monotonic() < deadline, "the payment was never confirmed"
                        await asyncio.sleep(0)
                    other.execute("BEGIN IMMEDIATE")  # another writer: the credit waits
                    if credited(db, charge):  # the worker was faster: no crash window
                        other.execute("ROLLBACK")
                        await bot.stop()
                        continue
                    await asyncio.sleep(1.0)  # the shop waits on the lock, inside the credit
                    assert bot.proc.returncode is None
                    assert credited(db, charge) == 0
                    os.kill(bot.proc.pid, signal.SIGKILL)
                    await bot.proc.wait()
                finally:
                    if other.in_transaction:
                        other.execute("ROLLBACK")
                    other.close()
            caught = charge
            break
        assert caught is not None, "the worker committed every credit before the lock"
        assert api.pending_updates == []  # Telegram will not send it again
        assert credited(db, caught) == 0 and await inbox_depth(db) == 1  # the inbox owns it
        (tmp_path / "restart").mkdir()
        await restart_until_credited(api, tmp_path / "restart", db, caught, chat)
    bought, balances = ledger(db)
    assert bought[caught] == 1 and set(bought.values()) == {1}
    assert balances == {updates.user["id"]: 10 * len(bought)}
    assert receipts_for(api, chat, caught) == 1
