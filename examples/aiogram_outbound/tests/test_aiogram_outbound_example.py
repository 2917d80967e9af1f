"""``examples.aiogram_outbound`` against a local Bot API: an update handled again after its
handler died mid-action gets its reply once, and a reply whose answer was lost after
Telegram applied it (accept, then drop) is held as unknown and never sent twice."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from examples._running import run_example
from examples.aiogram_outbound.bot import connected, reply_to
from telegram_idem.testing import DEFAULT_TOKEN, FakeBotAPI, Fault, UpdateFactory

HELD = "reply held as unknown, not sent again"


async def test_an_update_run_again_after_a_crash_mid_action_gets_one_reply(
    tmp_path: Path,
) -> None:
    update = UpdateFactory().message("two coffees")
    chat = update["message"]["chat"]["id"]
    store = f"sqlite:///{tmp_path / 'bot.db'}"
    async with FakeBotAPI() as api:
        # Telegram applies the reply at once but answers it 0.5 s later: a window in
        # which the reply is out and the handler has not finished.
        api.inject(Fault.slow(0.5, method="sendMessage"))
        async with connected(DEFAULT_TOKEN, api.url, store) as (bot, dp):  # worker 1
            handling = asyncio.create_task(dp.feed_raw_update(bot, update))
            while not api.messages(chat):  # noqa: ASYNC110 - the fake has no event for it
                await asyncio.sleep(0.01)
            handling.cancel()  # worker 1 dies mid-action: its claims are released
            with contextlib.suppress(asyncio.CancelledError):
                await handling
            # worker 1's relay still records Telegram's late answer before it stops
        async with connected(DEFAULT_TOKEN, api.url, store) as (bot, dp):  # worker 2
            await dp.feed_raw_update(bot, update)  # the update again: the action re-runs
        assert api.sent_texts(chat) == [reply_to("two coffees")]
        assert len(api.calls_of("sendMessage")) == 1  # the re-run got the stored answer


async def test_a_reply_accepted_then_dropped_is_held_and_never_sent_twice(
    tmp_path: Path,
) -> None:
    update = UpdateFactory().message("one tea")
    chat = update["message"]["chat"]["id"]
    async with FakeBotAPI(long_poll_cap=0.2) as api:
        api.inject(Fault.drop(method="sendMessage"))  # applied, then no answer
        api.queue_update(update)
        env = {
            "BOT_TOKEN": DEFAULT_TOKEN,
            "TELEGRAM_API_URL": api.url,
            "IDEM_STORE_URL": f"sqlite:///{tmp_path / 'bot.db'}",
        }
        async with run_example("aiogram_outbound", env=env, workdir=tmp_path) as bot:
            await bot.until(lambda: HELD in bot.output(), what="the reply held as unknown")
            api.queue_update(update)  # delivered again: the failed update runs again
            await bot.until(lambda: bot.output().count(HELD) == 2, what="a second hold")
            stderr = await bot.stop()
    assert len(api.calls_of("sendMessage")) == 1  # never sent again
    assert api.sent_texts(chat) == [reply_to("one tea")]  # Telegram did apply it
    assert "UnknownOutcomeError" not in stderr  # handled by on_unknown, no traceback
