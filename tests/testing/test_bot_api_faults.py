"""FakeBotAPI's faults, flood limits and assertions, driven by real aiogram and
python-telegram-bot clients over loopback HTTP: each fault must reach the framework as
the exception Telegram's answer would raise, and the effect of an applied fault must be
visible (the message stored and counted)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest
import telegram
import telegram.error
from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import (
    TelegramBadRequest,
    TelegramForbiddenError,
    TelegramMigrateToChat,
    TelegramNetworkError,
    TelegramRetryAfter,
    TelegramServerError,
)
from aiogram.types import InlineKeyboardButton, InlineKeyboardMarkup

from telegram_idem.flood import Limits, Rate
from telegram_idem.testing.bot_api import (
    NOT_MODIFIED,
    FakeBotAPI,
    FakeBotAPIControl,
    Fault,
    FaultKind,
)

TOKEN = "7000000001:AAFakeTokenForTestsOnly_0123456789abcd"
CHAT = 5550001001
OTHER = 5550001002
GROUP = -1001234567890


@pytest.fixture
async def api() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI() as fake:
        yield fake


def aiogram_bot(api: FakeBotAPI | str) -> Bot:
    url = api if isinstance(api, str) else api.url
    return Bot(token=TOKEN, session=AiohttpSession(api=TelegramAPIServer.from_base(url)))


@pytest.fixture
async def bot(api: FakeBotAPI) -> AsyncIterator[Bot]:
    async with aiogram_bot(api) as client:
        yield client


@pytest.fixture
async def ptb(api: FakeBotAPI) -> AsyncIterator[telegram.Bot]:
    client = telegram.Bot(TOKEN, base_url=api.ptb_base_url)
    async with client:
        yield client


def keyboard(data: str) -> InlineKeyboardMarkup:
    return InlineKeyboardMarkup(
        inline_keyboard=[[InlineKeyboardButton(text="x", callback_data=data)]]
    )


# ----------------------------------------------------------------- 429 retry_after


async def test_retry_after_for_one_method(api: FakeBotAPI, bot: Bot) -> None:
    api.inject(Fault.retry_after(5, method="sendMessage", times=2))
    for _ in range(2):
        with pytest.raises(TelegramRetryAfter) as info:
            await bot.send_message(CHAT, "hi")
        assert info.value.retry_after == 5
    await bot.get_me()  # another method is not hit
    assert (await bot.send_message(CHAT, "hi")).text == "hi"  # used up
    assert api.sent_texts(CHAT) == ["hi"]
    assert [e.error_code for e in api.errors] == [429, 429]
    assert api.errors[0].parameters == {"retry_after": 5} and api.errors[0].source == "fault"


async def test_retry_after_for_one_chat(api: FakeBotAPI, bot: Bot) -> None:
    api.inject(Fault.retry_after(3, chat_id=CHAT, times=None))
    with pytest.raises(TelegramRetryAfter):
        await bot.send_message(CHAT, "a")
    with pytest.raises(TelegramRetryAfter):
        await bot.send_message(str(CHAT), "a")  # "123" names chat 123
    assert (await bot.send_message(OTHER, "b")).text == "b"
    assert api.clear_faults(chat_id=CHAT) == 1
    assert (await bot.send_message(CHAT, "a")).text == "a"


async def test_retry_after_global_hits_every_method(api: FakeBotAPI, bot: Bot) -> None:
    api.inject(Fault.retry_after(2, times=3))
    with pytest.raises(TelegramRetryAfter):
        await bot.get_me()
    with pytest.raises(TelegramRetryAfter):
        await bot.send_message(CHAT, "x")
    with pytest.raises(TelegramRetryAfter):
        await bot.answer_callback_query("q1")
    assert api.faults == []
    await bot.get_me()


async def test_ptb_sees_retry_after(api: FakeBotAPI, ptb: telegram.Bot) -> None:
    api.inject(Fault.retry_after(4, method="sendMessage"))
    with pytest.raises(telegram.error.RetryAfter) as info:
        await ptb.send_message(CHAT, "hi")
    assert "Retry in 4" in str(info.value)


async def test_fail_next_still_works_beside_inject(api: FakeBotAPI, bot: Bot) -> None:
    api.fail_next("sendMessage", status=429, retry_after=7, times=1)
    api.fail_next("sendMessage", status=500)
    with pytest.raises(TelegramRetryAfter):
        await bot.send_message(CHAT, "x")
    with pytest.raises(TelegramServerError):
        await bot.send_message(CHAT, "x")
    await bot.send_message(CHAT, "x")
    assert api.sent_texts(CHAT) == ["x"]


# ----------------------------------------------------------------- ambiguous sends


async def test_accept_then_drop_stores_the_message_and_disconnects(
    api: FakeBotAPI, bot: Bot, ptb: telegram.Bot
) -> None:
    api.inject(Fault.drop(method="sendMessage", times=2))
    with pytest.raises(TelegramNetworkError):
        await bot.send_message(CHAT, "one")
    with pytest.raises(telegram.error.NetworkError):
        await ptb.send_message(CHAT, "two")
    assert api.sent_texts(CHAT) == ["one", "two"]  # both took effect
    assert [m.text for m in api.messages(CHAT)] == ["one", "two"]
    assert [c.params["text"] for c in api.dropped] == ["one", "two"]
    await bot.send_message(CHAT, "three")  # the next connection is fine


async def test_a_drop_that_was_not_applied_stores_nothing(api: FakeBotAPI, bot: Bot) -> None:
    api.inject(Fault.drop(method="sendMessage", applied=False))
    with pytest.raises(TelegramNetworkError):
        await bot.send_message(CHAT, "lost")
    assert api.sent_texts(CHAT) == [] and len(api.dropped) == 1


async def test_a_slow_answer_times_the_client_out_after_the_effect(
    api: FakeBotAPI, bot: Bot, ptb: telegram.Bot
) -> None:
    api.inject(Fault.slow(1.5, method="sendMessage", times=2))
    with pytest.raises(telegram.error.TimedOut):
        await ptb.send_message(CHAT, "slow ptb", read_timeout=0.3)
    with pytest.raises(TelegramNetworkError):
        await bot.send_message(CHAT, "slow aiogram", request_timeout=1)
    assert api.sent_texts(CHAT) == ["slow ptb", "slow aiogram"]


async def test_a_slow_answer_still_answers(api: FakeBotAPI, bot: Bot) -> None:
    api.inject(Fault.slow(1.0, method="sendMessage", times=1))
    slow = asyncio.create_task(bot.send_message(CHAT, "late"))
    while not api.calls_of("sendMessage"):  # it reached the fake (and took effect)...
        await asyncio.sleep(0.01)
    assert api.sent_texts(CHAT) == ["late"]
    me = await bot.get_me()  # ...and a call made after it is answered before it
    assert me.is_bot and not slow.done()
    sent = await slow
    assert sent.text == "late"


# ----------------------------------------------------------------- 5xx


@pytest.mark.parametrize("status", [500, 502])
@pytest.mark.parametrize("applied", [False, True])
async def test_server_errors_applied_or_not(
    api: FakeBotAPI, bot: Bot, ptb: telegram.Bot, status: int, applied: bool
) -> None:
    api.inject(Fault.server_error(status, applied=applied, method="sendMessage", times=2))
    with pytest.raises(TelegramServerError):
        await bot.send_message(CHAT, "a")
    with pytest.raises(telegram.error.NetworkError):
        await ptb.send_message(CHAT, "b")
    assert api.sent_texts(CHAT) == (["a", "b"] if applied else [])
    assert {e.description for e in api.errors} == {
        "Bad Gateway" if status == 502 else "Internal Server Error"
    }


def test_a_server_error_is_5xx() -> None:
    with pytest.raises(ValueError):
        Fault.server_error(429)
    with pytest.raises(ValueError):
        Fault.retry_after(1, times=0)


# ----------------------------------------------------------------- 403, 400s


async def test_blocked_chat_is_forbidden_until_cleared(
    api: FakeBotAPI, bot: Bot, ptb: telegram.Bot
) -> None:
    api.inject(Fault.blocked(CHAT))
    for _ in range(3):
        with pytest.raises(TelegramForbiddenError, match="bot was blocked by the user"):
            await bot.send_message(CHAT, "hi")
    with pytest.raises(telegram.error.Forbidden, match="bot was blocked by the user"):
        await ptb.send_message(CHAT, "hi")
    await bot.send_message(OTHER, "hi")
    api.clear_faults(chat_id=CHAT)
    await bot.send_message(CHAT, "hi")
    assert api.sent_texts(CHAT) == ["hi"]


async def test_not_modified_naturally_and_injected(
    api: FakeBotAPI, bot: Bot, ptb: telegram.Bot
) -> None:
    sent = await bot.send_message(CHAT, "v1", reply_markup=keyboard("k"))
    mid = sent.message_id
    with pytest.raises(TelegramBadRequest, match="message is not modified"):
        await bot.edit_message_text("v1", chat_id=CHAT, message_id=mid, reply_markup=keyboard("k"))
    with pytest.raises(telegram.error.BadRequest, match=r"[Mm]essage is not modified"):
        await ptb.edit_message_reply_markup(
            reply_markup=telegram.InlineKeyboardMarkup(
                [[telegram.InlineKeyboardButton("x", callback_data="k")]]
            ),
            chat_id=CHAT,
            message_id=mid,
        )
    api.inject(Fault.not_modified())
    with pytest.raises(TelegramBadRequest, match="message is not modified") as info:
        await bot.edit_message_text(
            "v2", chat_id=CHAT, message_id=mid
        )  # a real change, answered as none
    assert NOT_MODIFIED.endswith(info.value.message)
    assert api.messages(CHAT)[0].text == "v1"


async def test_query_too_old_injected_and_by_the_answer_window() -> None:
    async with FakeBotAPI(callback_answer_window=0.2) as api, aiogram_bot(api) as client:
        ptb = telegram.Bot(TOKEN, base_url=api.ptb_base_url)
        api.queue_update(
            {
                "update_id": 1,
                "callback_query": {
                    "id": "77",
                    "from": {"id": CHAT, "is_bot": False, "first_name": "U"},
                    "chat_instance": "1",
                    "data": "x",
                },
            }
        )
        assert await client.answer_callback_query("77")  # within the window
        api.inject(Fault.query_too_old())
        with pytest.raises(TelegramBadRequest, match="query is too old"):
            await client.answer_callback_query("77")
        await asyncio.sleep(0.3)
        async with ptb:
            with pytest.raises(telegram.error.BadRequest, match=r"[Qq]uery is too old"):
                await ptb.answer_callback_query("77")
        assert api.answered_callback_ids() == ["77"]
        assert await client.answer_callback_query("88")  # never queued: no window known


async def test_migrated_group_names_the_supergroup(
    api: FakeBotAPI, bot: Bot, ptb: telegram.Bot
) -> None:
    old, new = -4001, -1004001
    api.inject(Fault.migrated(old, new))
    with pytest.raises(TelegramMigrateToChat) as info:
        await bot.send_message(old, "hi")
    assert info.value.migrate_to_chat_id == new
    with pytest.raises(telegram.error.ChatMigrated) as migrated:
        await ptb.send_message(old, "hi")
    assert migrated.value.new_chat_id == new
    assert (await bot.send_message(new, "hi")).chat.id == new


# ----------------------------------------------------------------- flood limits


async def test_flood_limits_answer_429_over_the_chat_budget() -> None:
    limits = Limits(chat=Rate(1, 5.0, burst=3))  # slow enough that no call frees one
    async with FakeBotAPI(limits=limits) as api, aiogram_bot(api) as client:
        ok, limited = 0, []
        for i in range(10):
            try:
                await client.send_message(CHAT, f"m{i}")
                ok += 1
            except TelegramRetryAfter as exc:
                limited.append(exc.retry_after)
        assert ok == 3 and limited == [5] * 7  # the burst, then ceil(wait) seconds
        assert api.limit_429s == 7 and len(api.sent_texts(CHAT)) == 3
        await client.send_message(OTHER, "another chat has its own budget")
        await client.answer_callback_query("1")  # answers spend no message budget
        with pytest.raises(AssertionError, match=r"7 call.*429.*sendMessage to chat 5550001001"):
            api.assert_no_429()


async def test_flood_limits_global_budget_across_chats_and_groups() -> None:
    limits = Limits(global_=Rate(5, 10.0, burst=5), group=Rate(20, 60.0, burst=2))
    async with FakeBotAPI(limits=limits) as api, aiogram_bot(api) as client:
        results = []
        for i in range(8):
            try:
                await client.send_message(CHAT + i, "hi")
                results.append(True)
            except TelegramRetryAfter:
                results.append(False)
        assert results == [True] * 5 + [False] * 3
        # a paid broadcast spends its own budget, not the global one
        await client.send_message(OTHER + 100, "paid", allow_paid_broadcast=True)
        assert api.limit_429s == 3
    async with FakeBotAPI(limits=limits) as api, aiogram_bot(api) as client:
        sent = await client.send_message(GROUP, "g1")
        await client.send_message(GROUP, "g2")
        with pytest.raises(TelegramRetryAfter) as info:  # edits count in groups
            await client.edit_message_text("g1!", chat_id=GROUP, message_id=sent.message_id)
        assert info.value.retry_after == 3  # 60/20 s per call in a group


async def test_no_limits_by_default(api: FakeBotAPI, bot: Bot) -> None:
    await asyncio.gather(*(bot.send_message(CHAT, f"m{i}") for i in range(40)))
    api.assert_no_429()
    api.assert_no_repeated_text(CHAT)


# ----------------------------------------------------------------- assertions


async def test_assertions_say_what_was_sent(api: FakeBotAPI, bot: Bot) -> None:
    await bot.send_message(CHAT, "hello")
    await bot.send_message(CHAT, "done")
    await bot.send_message(CHAT, "done")
    api.assert_sent_once(CHAT, "hello")
    with pytest.raises(AssertionError, match=r"'done' sent once.*2 time.*1\. 'hello'"):
        api.assert_sent_once(CHAT, "done")
    with pytest.raises(AssertionError, match=r"'nope'.*0 time"):
        api.assert_sent_once(CHAT, "nope")
    with pytest.raises(AssertionError, match=r"'done' x2"):
        api.assert_no_repeated_text(CHAT)
    with pytest.raises(AssertionError, match="nothing was sent"):
        api.assert_sent_once(OTHER, "hello")
    api.assert_no_repeated_text(OTHER)
    api.assert_no_429()


# ----------------------------------------------------------------- control endpoint

CONTROL_SCRIPT = """
import asyncio, sys
from telegram_idem.testing.bot_api import FakeBotAPIControl, Fault

async def main(url):
    control = FakeBotAPIControl(url)
    await control.inject(Fault.blocked(5550001001))
    await control.inject(Fault.drop(method="sendMessage", chat_id=5550001002))
    await control.fail_next("getMe", status=429, retry_after=9)
    print(len((await control.state())["faults"]), flush=True)

asyncio.run(main(sys.argv[1]))
"""


async def test_faults_injected_from_another_process(api: FakeBotAPI, bot: Bot) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CONTROL_SCRIPT, api.url, stdout=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(60):
        out, _ = await proc.communicate()
    assert proc.returncode == 0 and out.decode().strip() == "3"
    assert [f.kind for f in api.faults] == [FaultKind.ERROR, FaultKind.DROP, FaultKind.ERROR]
    with pytest.raises(TelegramForbiddenError):
        await bot.send_message(CHAT, "x")
    with pytest.raises(TelegramNetworkError):
        await bot.send_message(OTHER, "dropped but sent")
    with pytest.raises(TelegramRetryAfter):
        await bot.get_me()
    assert api.sent_texts(OTHER) == ["dropped but sent"]


async def test_control_client_against_the_cli_fake() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "telegram_idem.testing.bot_api",
        "--limits",
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(30):
            url = (await proc.stdout.readline()).decode().strip()
        control = FakeBotAPIControl(url)
        await control.inject(Fault.migrated(-4001, -1004001))
        async with aiogram_bot(url) as client:
            with pytest.raises(TelegramMigrateToChat):
                await client.send_message(-4001, "x")
            await client.send_message(CHAT, "once")
            for i in range(2):  # Telegram's default: a burst of 3 in one chat
                await client.send_message(CHAT, f"more {i}")
            for i in range(2, 4):
                with pytest.raises(TelegramRetryAfter):
                    await client.send_message(CHAT, f"more {i}")
        await control.assert_sent_once(CHAT, "once")
        assert await control.sent_texts(CHAT) == ["once", "more 0", "more 1"]
        await control.assert_no_repeated_text(CHAT)
        with pytest.raises(AssertionError, match=r"2 call.*429.*limits"):
            await control.assert_no_429()
        with pytest.raises(AssertionError, match="'more 0'"):
            await control.assert_sent_once(CHAT, "twice?")
        assert len(await control.calls("sendmessage")) == 6
        assert await control.clear_faults() == 1
        state = await control.state()
        assert state["limit_429s"] == 2 and state["faults"] == []
        assert [e["source"] for e in state["errors"]] == ["fault", "limits", "limits"]
    finally:
        proc.terminate()
        async with asyncio.timeout(30):
            await proc.wait()


async def test_the_control_endpoint_refuses_a_bad_fault(api: FakeBotAPI) -> None:
    async with aiohttp.ClientSession() as http:
        for body in ({"kind": "explode"}, {"kind": "error", "status": 200}, {"oops": 1}, [1]):
            async with http.post(f"{api.url}/_fake/faults", json=body) as resp:
                assert resp.status == 400 and (await resp.json())["ok"] is False
    with pytest.raises(RuntimeError, match="refused"):
        await FakeBotAPIControl(api.url)._request("POST", "/_fake/faults", json={"kind": "x"})
    assert api.faults == []


def test_a_fault_survives_its_json_form() -> None:
    for fault in (
        Fault.retry_after(5, chat_id="@channel", times=None),
        Fault.drop(method="sendMessage"),
        Fault.slow(0.5),
        Fault.migrated(-1, -1001),
    ):
        assert Fault.from_json(fault.to_json()) == fault
