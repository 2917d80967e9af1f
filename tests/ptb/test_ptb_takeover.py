"""Item: an update whose holder died is run by takeover, never dropped as a duplicate.

PTB's updater confirms a batch with its next ``getUpdates``, so an update the processor
drops is gone. A restart that re-reads an update within the dead holder's lease must wait
for that lease (the shared admission rule) and then run it once; a holder that is still
alive after the wait is reported, never dropped silently.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ptb_support import BOT, build, feed, running
from telegram import Update
from telegram.ext import CommandHandler, ContextTypes

from telegram_idem import Idem, Status
from telegram_idem._records import Outcome
from telegram_idem.errors import UpdateInProgressError
from telegram_idem.testing._delivery import load_fixture
from telegram_idem.testing.bot_api import FakeBotAPI

Ctx = ContextTypes.DEFAULT_TYPE


@pytest.fixture
async def api() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI() as fake:
        yield fake


async def leave_a_claim(url: str, update: dict[str, object], *, lease: float) -> None:
    """What a run killed mid-handler leaves behind: an acquired claim, never completed
    nor released (no heartbeat either: its process is gone)."""
    killed = Idem(url, lease=lease, heartbeat=False)
    claim = await killed.claim_update(update, bot_id=BOT)
    assert claim.outcome is Outcome.ACQUIRED
    await killed.close()


async def test_an_update_left_by_a_killed_holder_runs_once_after_its_lease(
    api: FakeBotAPI, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'bot.db'}"
    update = load_fixture("techpost_command")
    await leave_a_claim(url, update, lease=0.5)
    runs: list[int] = []

    async def techpost(u: Update, context: Ctx) -> None:
        runs.append(u.update_id)

    idem = Idem(url, lease=0.5)  # the restarted bot, same store
    try:
        app = build(api, idem)
        app.add_handler(CommandHandler("techpost", techpost))
        async with running(app):
            await feed(app, update)  # re-read within the dead holder's lease
            await feed(app, update)  # and once more: now it is done
        assert runs == [update["update_id"]]
        record = await idem.store.get(idem.keys.update(BOT, update["update_id"]))
        assert record is not None and record.status is Status.COMPLETED
    finally:
        await idem.close()


async def test_a_live_holder_after_the_wait_is_reported_not_dropped_silently(
    api: FakeBotAPI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'bot.db'}"
    update = load_fixture("techpost_command")
    await leave_a_claim(url, update, lease=60)  # its lease outlives the test
    runs: list[int] = []
    reported: list[BaseException | None] = []

    async def techpost(u: Update, context: Ctx) -> None:
        runs.append(u.update_id)

    async def on_error(u: object, context: Ctx) -> None:
        reported.append(context.error)

    idem = Idem(url)
    try:
        app = build(api, idem, in_progress_wait=0.2)
        app.add_handler(CommandHandler("techpost", techpost))
        app.add_error_handler(on_error)
        with caplog.at_level(logging.ERROR, logger="telegram_idem.ptb"):
            async with running(app):
                await feed(app, update)
    finally:
        await idem.close()
    assert runs == []
    assert [type(e) for e in reported] == [UpdateInProgressError]
    assert any(
        r.levelno == logging.ERROR and "still in progress elsewhere" in r.getMessage()
        for r in caplog.records
    )


def test_the_default_wait_covers_one_lease() -> None:
    from telegram_idem.adapters.ptb import TAKEOVER_MARGIN, IdempotentUpdateProcessor

    processor = IdempotentUpdateProcessor(Idem("memory://", lease=7.0), 4)
    assert processor.in_progress_wait == 7.0 + TAKEOVER_MARGIN
    with pytest.raises(ValueError):
        IdempotentUpdateProcessor(Idem("memory://"), 4, in_progress_wait=-1)
