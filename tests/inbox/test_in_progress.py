"""An inbox entry whose action is in progress elsewhere waits for that claim's lease
without spending attempts, and never becomes a dead letter only because of it.

The user trial: ``InboxWorker(lease=20)`` with the default ``Idem`` lease (60 s), the
worker killed mid-handler; after restart the entry was taken over after 20 s while the
action's claim lived for 60 s, every take raised ``InProgressError`` and counted, and the
update was dead-lettered. Here the claim is held by a second ``Idem`` on the same store
(real SQLite files, the real PostgreSQL and Redis), time moved with the shared clock; and
once with a real ``kill -9`` of a worker process mid-action on SQLite.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from telegram import Update
from telegram.ext import ApplicationBuilder, CommandHandler, ContextTypes

from telegram_idem import Idem, ManualClock
from telegram_idem.adapters.ptb import idempotent
from telegram_idem.adapters.ptb import inbox_dispatch as ptb_inbox_dispatch
from telegram_idem.inbox._base import EntryStatus
from telegram_idem.inbox._entries import new_entry
from telegram_idem.inbox._worker import IN_PROGRESS_MIN_DELAY, InboxWorker
from telegram_idem.testing._factories import UpdateFactory
from telegram_idem.testing.bot_api import FakeBotAPI

pytestmark = [pytest.mark.inbox, pytest.mark.shared_state]

TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"
BOT = 7000000001
IDEM_LEASE = 60.0
ENTRY_LEASE = 20.0
KEY = "idem:7000000001:act:receipt"


@pytest.fixture
async def guards(store_url: str, clock: ManualClock) -> AsyncIterator[tuple[Idem, Idem]]:
    """``(worker_side, holder)``: two guards on one store, the holder's lease 60 s."""
    worker_side = Idem(store_url, clock=clock, lease=IDEM_LEASE)
    holder = Idem(store_url, clock=clock, lease=IDEM_LEASE)
    yield worker_side, holder
    await worker_side.close()
    await holder.close()


class Receipt:
    """The bot's dispatch: one ``@idempotent``-style action under a fixed key."""

    def __init__(self, idem: Idem) -> None:
        self.idem = idem
        self.effects: list[int] = []

    async def __call__(self, update: dict[str, Any]) -> None:
        async def effect() -> int:
            self.effects.append(update["update_id"])
            return int(update["update_id"])

        await self.idem.run(KEY, effect)


async def admit(idem: Idem) -> tuple[str, int]:
    """Admit one update: ``(entry id, update_id)``."""
    update = UpdateFactory().command("/start")
    made = new_entry(idem, update, bot_id=BOT)
    assert await idem.store.inbox().admit(made, retention=3600)
    return made.update_key, int(update["update_id"])


def waits(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "in progress elsewhere" in r.getMessage()]


async def test_an_entry_meeting_a_live_claim_waits_without_spending_attempts_then_runs_once(
    guards: tuple[Idem, Idem], clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    idem, holder = guards
    inbox = idem.store.inbox()
    entry_id, update_id = await admit(idem)
    # A killed worker's action claim, or a paused store: the lease outlives the entry's.
    claim = await holder.store.claim(KEY, lease=IDEM_LEASE, retention=3600)
    dispatch = Receipt(idem)
    worker = InboxWorker(inbox, dispatch, lease=ENTRY_LEASE, max_attempts=2)
    caplog.set_level(logging.DEBUG, logger="telegram_idem.worker")
    lease_end = claim.record.lease_expires_at
    for _ in range(5):  # far more takes than max_attempts
        assert await worker.run_once()
        waiting = await inbox.get(entry_id)
        assert waiting is not None and waiting.status is EntryStatus.PENDING
        assert waiting.attempts == 0  # the take was refunded
        # it waits until the holder's lease ends, not its own backoff of 1 s
        assert waiting.available_at == pytest.approx(lease_end, abs=1.0)
        assert not await worker.run_once()  # not takeable meanwhile
        clock.advance(lease_end - clock.now - 1.0)
        # the holder is alive (or the store paused): its heartbeat renews its lease
        assert await holder.store.extend(KEY, claim.token, lease=IDEM_LEASE)
        renewed = await holder.store.get(KEY)
        assert renewed is not None
        lease_end = renewed.lease_expires_at
        clock.advance(2.0)
    # the holder stops renewing (it was killed): after its lease the update runs once
    clock.advance(IDEM_LEASE)
    assert await worker.run_once()
    assert dispatch.effects == [update_id]
    assert await inbox.dead_letters() == []
    assert await inbox.depth() == 0
    assert (worker.processed, worker.failures) == (1, 0)
    logged = waits(caplog)
    assert len(logged) == 5
    assert [r.levelno for r in logged] == [logging.WARNING] + [logging.DEBUG] * 4


async def test_an_entry_meeting_a_claim_whose_holder_finishes_replays_its_result(
    guards: tuple[Idem, Idem], clock: ManualClock
) -> None:
    idem, holder = guards
    inbox = idem.store.inbox()
    await admit(idem)
    release = asyncio.Event()
    started = asyncio.Event()
    ran: list[str] = []

    async def held_effect() -> int:
        started.set()
        await release.wait()
        ran.append("holder")
        return 1

    holding = asyncio.create_task(holder.run(KEY, held_effect))
    await started.wait()
    dispatch = Receipt(idem)
    worker = InboxWorker(inbox, dispatch, lease=ENTRY_LEASE, max_attempts=1)
    assert await worker.run_once()  # in progress elsewhere: waits
    release.set()
    assert await holding == 1
    clock.advance(IDEM_LEASE)
    assert await worker.run_once()
    assert ran == ["holder"] and dispatch.effects == []  # replayed, not run again
    assert await inbox.depth() == 0 and await inbox.dead_letters() == []
    assert (worker.processed, worker.failures) == (1, 0)


@pytest.mark.parametrize(("claim_lease", "expected"), [(10_000.0, 30.0), (0.2, None)])
async def test_the_wait_is_bounded_by_backoff_max_and_a_minimum(
    guards: tuple[Idem, Idem], clock: ManualClock, claim_lease: float, expected: float | None
) -> None:
    idem, holder = guards
    inbox = idem.store.inbox()
    entry_id, _ = await admit(idem)
    await holder.store.claim(KEY, lease=claim_lease, retention=20_000)
    worker = InboxWorker(inbox, Receipt(idem), lease=ENTRY_LEASE, backoff_max=30.0)
    before = clock.now
    assert await worker.run_once()
    waiting = await inbox.get(entry_id)
    assert waiting is not None and waiting.attempts == 0
    delay = waiting.available_at - before
    assert delay == pytest.approx(expected or IN_PROGRESS_MIN_DELAY, abs=0.05)


async def test_ptb_inbox_dispatch_waits_for_an_idempotent_handler_held_elsewhere(
    guards: tuple[Idem, Idem], clock: ManualClock
) -> None:
    """A real PTB application behind the worker: its ``@idempotent`` handler's
    ``InProgressError`` reaches the worker through PTB's error handlers."""
    idem, holder = guards
    inbox = idem.store.inbox()
    update = UpdateFactory().command("/start")
    chat_id = update["message"]["chat"]["id"]
    assert await inbox.admit(new_entry(idem, update, bot_id=BOT), retention=3600)
    action_key = idem.keys.action(BOT, f"receipt:{chat_id}")
    await holder.store.claim(action_key, lease=IDEM_LEASE, retention=3600)
    sent: list[int] = []

    @idempotent(key="receipt:{chat_id}")
    async def receipt(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.effective_message is not None
        sent.append(update.effective_message.message_id)
        await update.effective_message.reply_text("receipt")

    async with FakeBotAPI() as api:
        app = ApplicationBuilder().token(TOKEN).base_url(api.ptb_base_url).build()
        app.add_handler(CommandHandler("start", receipt))
        await app.initialize()
        try:
            worker = InboxWorker(
                inbox, ptb_inbox_dispatch(app, idem), lease=ENTRY_LEASE, max_attempts=1
            )
            assert await worker.run_once()  # met the claim: waits for its lease
            clock.advance(ENTRY_LEASE)
            assert not await worker.run_once()  # a counting worker buried it by now
            assert sent == [] and await inbox.dead_letters() == []
            clock.advance(IDEM_LEASE - ENTRY_LEASE)  # the holder's lease ended
            assert await worker.run_once()
        finally:
            await app.shutdown()
        assert len(sent) == 1 and [m.text for m in api.messages(chat_id)] == ["receipt"]
    assert await inbox.depth() == 0 and worker.failures == 0


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from telegram_idem import Idem
    from telegram_idem.inbox._worker import InboxWorker

    async def main() -> None:
        idem = Idem(sys.argv[1], lease=float(sys.argv[2]))

        async def dispatch(update):
            async def effect():
                print("in-action", flush=True)
                await asyncio.Event().wait()  # killed here, mid-action

            await idem.run(sys.argv[3], effect)

        worker = InboxWorker(idem.store.inbox(), dispatch, lease=float(sys.argv[4]))
        await worker.run_once()

    asyncio.run(main())
    """
)


async def test_a_worker_killed_mid_action_with_a_shorter_entry_lease_is_not_dead_lettered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="telegram_idem.worker")
    url = f"sqlite:///{tmp_path / 'killed.db'}"
    idem = Idem(url, lease=1.5)
    try:
        _, update_id = await admit(idem)
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            url,
            "1.5",
            KEY,
            "0.3",
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            assert child.stdout is not None
            assert (await child.stdout.readline()).strip() == b"in-action"
        finally:
            child.send_signal(signal.SIGKILL)
            await child.wait()
        dispatch = Receipt(idem)
        # The killed take was attempt 1; each take that meets its live action claim is
        # attempt 2, refunded: on a counting worker the first would bury the update.
        worker = InboxWorker(
            idem.store.inbox(), dispatch, lease=0.3, max_attempts=2, poll_interval=0.02
        )
        async with worker:
            await worker.drain(limit=20)
        assert dispatch.effects == [update_id]
        assert await idem.store.inbox().dead_letters() == []
        assert worker.failures == 0
        assert len(waits(caplog)) == 1  # it met the killed worker's live action claim
    finally:
        await idem.close()
