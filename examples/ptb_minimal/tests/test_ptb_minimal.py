"""``python -m examples.ptb_minimal`` (python-telegram-bot 22) polls a local Bot API: an update delivered twice
is handled once, a double tap approves once, and both taps are answered."""

from __future__ import annotations

from pathlib import Path

from examples._running import run_example
from examples.ptb_minimal.bot import APPROVED, PROMPT
from telegram_idem.testing import DEFAULT_TOKEN, FakeBotAPI, UpdateFactory


def texts(api: FakeBotAPI) -> list[str | None]:
    return [call.params.get("text") for call in api.calls_of("sendMessage")]


async def test_polling_bot_handles_a_repeated_update_and_a_double_tap_once(
    tmp_path: Path,
) -> None:
    updates = UpdateFactory()
    start = updates.command("/start")
    chat = start["message"]["chat"]["id"]
    async with FakeBotAPI(long_poll_cap=0.2) as api:
        api.webhook.url = "https://old.example/webhook"  # the bot must delete it to poll
        api.queue_update(start)
        api.queue_update(start)  # the same update_id again in the batch: a re-read
        env = {
            "BOT_TOKEN": DEFAULT_TOKEN,
            "TELEGRAM_API_URL": api.url,
            "IDEM_STORE_URL": f"sqlite:///{tmp_path / 'bot.db'}",
        }
        async with run_example("ptb_minimal", env=env, workdir=tmp_path) as bot:
            await bot.until(lambda: PROMPT in texts(api), what="an answer to /start")
            [prompt] = api.messages(chat)
            tap = updates.callback_query("approve", from_message=prompt)
            again = updates.double_tap(tap)
            api.queue_update(tap)
            api.queue_update(again)
            await bot.until(lambda: len(api.answered_callback_ids()) == 2, what="two answers")
            await bot.stop()
    assert api.webhook.url == ""
    assert texts(api) == [PROMPT, APPROVED]  # /start handled once, approved once
    assert sorted(api.answered_callback_ids()) == sorted(
        [tap["callback_query"]["id"], again["callback_query"]["id"]]
    )
    assert [c.params.get("text") for c in api.calls_of("answerCallbackQuery")] == ["Approved"] * 2
    assert "update replay" in bot.stderr  # the decision log saw the second /start
    assert "action replay" in bot.stderr  # and the second tap
