"""kill -9 at any moment of a /techpost pipeline, then a restart: one commit, at most one
status message and exactly one ✅ on screen.

The bot runs as a real process (``python -m examples.blog_bot serve``) against the
FakeBotAPI of this test process; faults are injected into the fake directly. Every Bot API
call of the pipeline goes through the outbox, so what a restart does depends on where the
kill fell:

- before the status message was recorded: the retried step enqueues the same call (same
  effect key) and gets its recorded answer, or it is still in flight in the dead process
  and becomes *unknown* after the relay lease (``sendMessage`` is held, never resent);
- between steps, or after the commit: the steps replay, the edits replay their recorded
  answers, the ✅ edit is made once;
- while the ✅ edit was on its way: edits are resent when in doubt, and an edit to what
  the message already says is answered "message is not modified" (Bot API, "Updating
  messages"), recorded as done.

When the status message's answer is lost (Telegram showed it, the bot never learnt its
id), the pipeline goes on without progress edits and sends the ✅ as a new message.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from examples.blog_bot.tests.blog_harness import free_port, publish_commits, start_serve, until
from telegram_idem.testing import TelegramDelivery, load_fixture
from telegram_idem.testing.bot_api import Call, FakeBotAPI, Fault, FaultKind

CHAT = 5550001001
LEASE = 2.0
"""Seconds of the bot's leases (``IDEM_LEASE``): a dead worker's entry, claim and outbox
call are free after it."""
SCALE = "0.06"
"""``WRITER_DELAY_SCALE``: title 0.27 s, draft 1.5 s, translations 1.2 s (≈ 3 s in all)."""
STATUS = "⏳ 1/3"
DONE = "✅ Published: "


def _env(tmp_path: Path, api: FakeBotAPI) -> dict[str, str]:
    return {
        **os.environ,
        "BOT_TOKEN": "7000000001:AAcrash",
        "TELEGRAM_API_URL": api.url,
        "WEBHOOK_SECRET": "crash-secret",
        "IDEM_STORE_URL": f"sqlite:///{tmp_path / 'bot.db'}",
        "BLOG_REPO_PATH": str(tmp_path / "repo"),
        "WRITER_DELAY_SCALE": SCALE,
        "IDEM_LEASE": str(LEASE),
    }


def _sent(api: FakeBotAPI, prefix: str) -> list[str]:
    """Texts sent with ``sendMessage`` (applied by Telegram, answer lost or not)."""
    return [t for t in api.sent_texts(CHAT) if t.startswith(prefix)]


def _done_on_screen(api: FakeBotAPI) -> list[int]:
    """Ids of the chat's messages that read ✅ now."""
    return [m.message_id for m in api.messages(CHAT) if (m.text or "").startswith(DONE)]


def _done_edits(api: FakeBotAPI) -> list[Call]:
    """``editMessageText`` calls to ✅ that reached Telegram."""
    return [c for c in api.calls_of("editMessageText") if str(c.params["text"]).startswith(DONE)]


def _edit_seen(api: FakeBotAPI, prefix: str) -> bool:
    return any(
        str(c.params.get("text", "")).startswith(prefix) for c in api.calls_of("editMessageText")
    )


def _hold_the_done_edit(api: FakeBotAPI, fault: Fault) -> None:
    """Once the 3/3 edit was made, ``fault`` hits the next edit: the ✅ (call this from a
    kill condition, which is polled)."""
    if _edit_seen(api, "🌐 3/3") and not _done_edits(api) and not api.faults:
        api.inject(fault)


def _never_applied() -> Fault:
    """The ✅ edit reaches Telegram and hangs there, not applied (until the fake closes)."""
    return Fault(FaultKind.SLOW, method="editMessageText", delay=60.0)


async def _techpost_with_restart(
    tmp_path: Path,
    api: FakeBotAPI,
    kill_when: Callable[[], bool] | None,
    *,
    settle: float = 0.0,
    done_before_kill: bool = False,
) -> None:
    """Deliver ``/techpost``; once ``kill_when()`` holds (and ``settle`` s later), kill -9
    the bot, check the ✅ is not on screen yet (unless ``done_before_kill``), start it
    again and wait for the ✅ and one lease more (a duplicate could only come from a
    second take after a lease). ``None``: the first process runs to the end, then is
    killed and restarted all the same."""
    port = free_port()
    env = _env(tmp_path, api)
    first = await start_serve(env, port)
    try:
        async with TelegramDelivery(
            f"http://127.0.0.1:{port}/webhook", secret_token="crash-secret"
        ) as tg:
            report = await tg.deliver(load_fixture("techpost_no_title"))
        assert report.statuses == [200]
        await until(kill_when or (lambda: bool(_done_on_screen(api))), limit=30)
        await asyncio.sleep(settle)
    finally:
        os.kill(first.pid, signal.SIGKILL)
        await first.wait()
    if kill_when is not None:
        on_screen = bool(_done_on_screen(api))
        assert on_screen == done_before_kill, f"✅ on screen at the kill: {on_screen}"
    second = await start_serve(env, port)
    try:
        await until(lambda: bool(_done_on_screen(api)), limit=30)
        await asyncio.sleep(LEASE * 1.5)
    finally:
        second.terminate()
        await second.wait()


def _assert_one_post(tmp_path: Path, api: FakeBotAPI) -> None:
    assert len(publish_commits(tmp_path / "repo")) == 1
    assert len(_done_on_screen(api)) == 1, [m.text for m in api.messages(CHAT)]
    assert len(_sent(api, DONE)) <= 1  # never a ✅ message beside a ✅ edit


def _status_sent(api: FakeBotAPI, _repo: Path) -> bool:
    return bool(_sent(api, STATUS))


def _mid_progress(api: FakeBotAPI, _repo: Path) -> bool:
    return _edit_seen(api, "⏳ 2/3")


def _committed(api: FakeBotAPI, repo: Path) -> bool:
    _hold_the_done_edit(api, _never_applied())  # the ✅ cannot land before the kill
    return bool(publish_commits(repo))


def _done_edit_sent(api: FakeBotAPI, _repo: Path) -> bool:
    _hold_the_done_edit(api, _never_applied())
    return bool(_done_edits(api))


MOMENTS: dict[str, tuple[Callable[[FakeBotAPI, Path], bool], float]] = {
    # The status message is on screen and recorded; the title is being written.
    "status sent": (_status_sent, 0.1),
    # The Korean draft is being written (progress edit 2/3 made).
    "mid-progress": (_mid_progress, 0.0),
    # The commit is in the repository (its step recorded or not, the ✅ not yet shown).
    "right after the commit": (_committed, 0.0),
    # The ✅ edit left the bot and never took effect: the restarted relay sends it again.
    "right before the done edit": (_done_edit_sent, 0.0),
}


@pytest.mark.parametrize("moment", list(MOMENTS))
async def test_kill_9_then_restart_gives_one_commit_one_status_message_one_done(
    tmp_path: Path, moment: str
) -> None:
    seen, settle = MOMENTS[moment]
    async with FakeBotAPI() as api:
        await _techpost_with_restart(
            tmp_path, api, lambda: seen(api, tmp_path / "repo"), settle=settle
        )
    _assert_one_post(tmp_path, api)
    assert len(api.calls_of("sendMessage")) == 1  # the status message, never resent...
    assert len(_sent(api, STATUS)) == 1
    done = api.message(CHAT, _done_on_screen(api)[0])
    assert done is not None and done.edits >= 1  # ...and edited in place into the ✅
    assert done.reply_markup is not None  # with its [🗑️ Delete] [🙈 Unpublish] buttons


async def test_kill_9_after_telegram_applied_the_done_edit_before_its_answer(
    tmp_path: Path,
) -> None:
    # The ✅ is on screen, its answer is late and the bot dies: the resent edit is answered
    # "message is not modified", which the outbox records as done.
    async with FakeBotAPI() as api:

        def done_applied() -> bool:
            _hold_the_done_edit(api, Fault.slow(60.0, method="editMessageText"))
            return bool(_done_edits(api))

        await _techpost_with_restart(tmp_path, api, done_applied, done_before_kill=True)
    _assert_one_post(tmp_path, api)
    assert len(_sent(api, STATUS)) == 1
    assert len(api.calls_of("sendMessage")) == 1
    assert len(_done_edits(api)) == 2
    assert any("not modified" in e.description for e in api.errors)


@pytest.mark.parametrize("killed", [False, True], ids=["not killed", "killed mid-pipeline"])
async def test_status_message_accepted_but_its_answer_dropped(tmp_path: Path, killed: bool) -> None:
    # Telegram shows the status message and the connection drops before its answer: the
    # call is held as unknown (never sent again), so the ✅ comes as a new message.
    async with FakeBotAPI() as api:
        api.inject(Fault.drop(method="sendMessage"))
        await _techpost_with_restart(
            tmp_path,
            api,
            (lambda: bool(api.dropped)) if killed else None,
            settle=0.3,  # into the draft (the status step is recorded by then, or not)
        )
    _assert_one_post(tmp_path, api)
    assert len(_sent(api, STATUS)) == 1  # the one Telegram showed, not sent again
    assert len(_sent(api, DONE)) == 1  # the ✅ as its own message
    assert not api.calls_of("editMessageText")  # the status message's id was never known


async def test_status_message_accepted_then_kill_9_before_its_answer(tmp_path: Path) -> None:
    # Telegram applied the status message and answers late; the bot dies in between. After
    # the restart, the call is in flight in a dead process: after its lease it is unknown
    # (policy hold), not resent; the ✅ comes as a new message.
    async with FakeBotAPI() as api:
        api.inject(Fault.slow(60.0, method="sendMessage"))
        await _techpost_with_restart(tmp_path, api, lambda: bool(_sent(api, STATUS)))
    _assert_one_post(tmp_path, api)
    assert len(_sent(api, STATUS)) == 1
    assert len(_sent(api, DONE)) == 1
    assert len(api.calls_of("sendMessage")) == 2  # the status message once, the ✅ once
