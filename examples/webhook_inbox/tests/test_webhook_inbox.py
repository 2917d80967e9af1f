"""``python -m examples.webhook_inbox`` over real HTTP, delivered to the way Telegram does:
a wrong secret is refused, an update POSTed several times (at once and later) is stored and
handled once, a double tap approves once, and both taps are answered."""

from __future__ import annotations

import asyncio
from pathlib import Path

from examples._running import free_port, run_example
from examples.webhook_inbox.bot import APPROVED, PROMPT
from telegram_idem.testing import DEFAULT_TOKEN, FakeBotAPI, TelegramDelivery, UpdateFactory

SECRET = "example-webhook-secret"


def texts(api: FakeBotAPI) -> list[str | None]:
    return [call.params.get("text") for call in api.calls_of("sendMessage")]


async def test_webhook_bot_stores_and_handles_each_update_once(tmp_path: Path) -> None:
    updates = UpdateFactory()
    start = updates.command("/start")
    chat = start["message"]["chat"]["id"]
    port = free_port()
    url = f"http://127.0.0.1:{port}/webhook"
    async with FakeBotAPI() as api:
        env = {
            "BOT_TOKEN": DEFAULT_TOKEN,
            "WEBHOOK_SECRET": SECRET,
            "TELEGRAM_API_URL": api.url,
            "IDEM_STORE_URL": f"sqlite:///{tmp_path / 'bot.db'}",
            "WEBHOOK_URL": url,
        }
        async with (
            run_example("webhook_inbox", "--port", str(port), env=env, workdir=tmp_path) as bot,
            TelegramDelivery(url, secret_token=SECRET, timeout=5, retry_delay=0.05) as telegram,
            TelegramDelivery(url, secret_token="not-the-secret", max_attempts=1) as stranger,
        ):
            await bot.listening(port)
            assert (api.webhook.url, api.webhook.secret_token) == (url, SECRET)

            assert (await stranger.deliver(start)).statuses == [401]
            reports = await telegram.deliver_concurrently(start, 3)  # one update, three POSTs
            assert [r.statuses for r in reports] == [[200]] * 3
            await bot.until(lambda: PROMPT in texts(api), what="an answer to /start")
            assert (await telegram.deliver(start)).statuses == [200]  # a late re-send

            [prompt] = api.messages(chat)
            tap = updates.callback_query("approve", from_message=prompt)
            again = updates.double_tap(tap)
            first, second = await asyncio.gather(telegram.deliver(tap), telegram.deliver(again))
            assert (first.statuses, second.statuses) == ([200], [200])
            await bot.until(lambda: len(api.answered_callback_ids()) == 2, what="two answers")
            await bot.stop()
    assert texts(api) == [PROMPT, APPROVED]  # /start handled once, approved once
    assert sorted(api.answered_callback_ids()) == sorted(
        [tap["callback_query"]["id"], again["callback_query"]["id"]]
    )
    assert bot.stderr.count("update duplicate") == 3  # two concurrent copies, one late
    assert "action replay" in bot.stderr  # the second tap replayed the approval
