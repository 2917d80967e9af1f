"""The offline end-to-end demo: ``python -m examples.blog_bot demo``.

The bot runs on SQLite + a new local git repository + the offline writer, against a local
Bot API (:class:`~telegram_idem.testing.bot_api.FakeBotAPI`) that records every call, fed
by a delivery loop (:class:`~telegram_idem.testing._delivery.TelegramDelivery`) that posts
the real payloads the way Telegram does: re-sent when the answer is slow or non-2xx,
delivered concurrently, a double tap on each button. It prints what happened and returns
1 if an invariant breaks.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from dulwich.repo import Repo

from examples.blog_bot.app import BlogBot, build_blog_bot
from examples.blog_bot.config import Settings
from examples.blog_bot.content import dead_links
from examples.blog_bot.demo_report import DecisionCounter, Report
from examples.blog_bot.demo_scenario import (
    WRONG_SECRET,
    FlakyWriter,
    bad_inputs,
    button_update,
    buttons,
    command_update,
    next_update_id,
    published_messages,
)
from examples.blog_bot.writer import OfflineWriter
from telegram_idem.adapters.aiogram import FastAckWebhook
from telegram_idem.testing import TelegramDelivery, load_fixture, make_double_tap, serve_app
from telegram_idem.testing.bot_api import FakeBotAPI

__all__ = ["run_demo"]

BOT_TOKEN = "7000000001:AAdemo-token-not-real"
AUTHOR_CHAT = 5550001001


def _commit_messages(repo_path: str) -> list[str]:
    repo = Repo(repo_path)
    try:
        return [entry.commit.message.decode() for entry in repo.get_walker()][::-1][1:]
    finally:
        repo.close()


async def _start(blog: BlogBot, slow: FastAckWebhook) -> tuple[web.AppRunner, str]:
    app = blog.web_app()
    app.router.add_post("/webhook-inline", slow.handle)
    return await serve_app(app)


async def run_demo(
    *, workdir: str | None = None, delay_scale: float = 0.02, verbose: bool = False
) -> int:
    """Run the demo; returns 0 if every invariant holds, else 1.

    Args:
        workdir: directory for the database and repository (default: a new temp dir).
        delay_scale: writer latency scale (1.0 ≈ the 45–60 s pipeline of docs/design/incident.md).
        verbose: also log every guard decision.
    """
    work = Path(workdir or tempfile.mkdtemp(prefix="blog-bot-demo-"))
    warnings.filterwarnings("ignore", message="Detected unknown update type")
    counter = DecisionCounter()
    decisions = logging.getLogger("telegram_idem.decisions")
    decisions.addHandler(counter)
    decisions.setLevel(logging.INFO)
    decisions.propagate = verbose
    if not verbose:  # the simulated LLM timeout is logged as a retried failure; expected
        logging.getLogger("telegram_idem.worker").setLevel(logging.CRITICAL)
        logging.getLogger("aiogram.event").setLevel(logging.CRITICAL)
    secret = secrets.token_urlsafe(24)
    writer = OfflineWriter(delay_scale=delay_scale)
    flaky = FlakyWriter(writer, fail_call=3)  # the second post's first translation times out
    pipeline_s = (4.5 + 25 + 20) * delay_scale
    print(
        f"blog bot demo in {work} (writer delay scale {delay_scale}: pipeline ≈ {pipeline_s:.1f} s)"
    )
    async with FakeBotAPI() as api:
        settings = Settings(
            bot_token=BOT_TOKEN,
            api_url=api.url,
            webhook_secret=secret,
            store_url=f"sqlite:///{work / 'blog_bot.db'}",
            repo_path=str(work / "blog-repo"),
            writer_delay_scale=delay_scale,
            callback_secret=secrets.token_hex(16),
            retry_backoff=0.2,
        )
        blog = build_blog_bot(settings, writer=flaky)
        slow = blog.inline_webhook()
        runner, base = await _start(blog, slow)

        async def settle() -> None:
            await slow.drain(limit=120)
            await blog.settle(limit=120)

        started = time.monotonic()
        report = Report()
        try:
            taps = await _story(blog, api, base, secret, pipeline_s, report, settle)
            await settle()
            files = await blog.publisher.snapshot()
        finally:
            await settle()
            await runner.cleanup()
            await blog.close()
            decisions.removeHandler(counter)
        _verify(report, api, writer, counter, settings, files, taps, time.monotonic() - started)
    print(report.render())
    return 1 if report.broken else 0


async def _story(
    blog: BlogBot,
    api: FakeBotAPI,
    base: str,
    secret: str,
    pipeline_s: float,
    report: Report,
    settle: Callable[[], Awaitable[None]],
) -> set[str]:
    """Deliver everything; returns the ids of the callback queries delivered."""
    taps: list[dict[str, Any]] = []
    fast = TelegramDelivery(f"{base}/webhook", secret_token=secret, timeout=10, retry_delay=0.05)
    slow = TelegramDelivery(
        f"{base}/webhook-inline",
        secret_token=secret,
        timeout=max(pipeline_s / 4, 0.05),
        retry_delay=max(pipeline_s / 8, 0.02),
        max_attempts=6,
    )
    async with fast, slow:
        print(
            "1. /techpost without a title, webhook answering only after the pipeline (docs/design/incident.md):"
        )
        no_title = load_fixture("techpost_no_title")
        r = await slow.deliver(no_title)
        print(f"   Telegram sent update {r.update_id} {len(r.attempts)} times: {r.statuses}")
        print("2. /techpost <title> delivered 5 times at once to the inbox webhook (200 at once);")
        print("   its translation times out once: the worker retries it, finished steps replay")
        await settle()
        await fast.deliver_concurrently(load_fixture("techpost_command"), 5)
        await settle()
        print("   Telegram re-sends both /techposts (as if their 200s were lost): absorbed")
        await fast.deliver(load_fixture("techpost_command"))
        await fast.deliver(no_title)
        await settle()
        print("3. the other real payloads (payment twice, group /draft, edits, channel post…):")
        for name in (
            "group_command_with_botname",
            "edited_message",
            "channel_post",
            "inline_query",
            "my_chat_member",
            "pre_checkout_query",
            "successful_payment",
            "successful_payment",
            "poll_answer",
        ):
            await fast.deliver(load_fixture(name))
        await settle()
        print("   and /post after a week of silence (update_id far below the earlier ones):")
        await fast.deliver(load_fixture("random_id_after_silence"))
        await settle()
        posts = published_messages(api, AUTHOR_CHAT)
        print(f"4. {len(posts)} posts published; double taps on their buttons:")
        if len(posts) >= 2:
            first, second = buttons(posts[0]), buttons(posts[1])
            for update in (
                button_update(posts[0], first["🗑️ Delete Post"]),
                button_update(posts[1], second["🙈 Unpublish (Draft)"]),
            ):
                second_tap = make_double_tap(update, next_update_id())
                taps += [update, second_tap]
                await asyncio.gather(fast.deliver(update), fast.deliver(second_tap))
        print("5. a forged button (an md5-style token from an old bot) and /delete's keyboard:")
        forged = load_fixture("callback_delete")
        taps.append(forged)
        await fast.deliver(forged)
        await fast.deliver(command_update("/delete"))
        await settle()
        lists = [m for m in api.messages(AUTHOR_CHAT) if (m.text or "").startswith("Pick a post")]
        if lists:
            pick = next(iter(buttons(lists[-1]).values()))
            tap = button_update(lists[-1], pick)
            taps.append(tap)
            await fast.deliver_concurrently(tap, 3)
        await settle()
        print("6. hostile and malformed requests:")
        results = await bad_inputs(f"{base}/webhook", secret)
        for name, expected, got in results:
            report.check(f"{name} → {expected}", got == expected, f"got {got}")
        leaked = await blog.idem.store.get(
            blog.idem.keys.update(blog.bot.id, WRONG_SECRET["update_id"])
        )
        report.check("nothing stored for a request with a wrong secret", leaked is None)
        await settle()
        stats = [fast.stats, slow.stats]
        report.fact(
            "updates delivered (distinct)",
            len({r.update_id for d in (fast, slow) for r in d.reports}),
        )
        report.fact("HTTP deliveries (with Telegram's re-sends)", sum(s.attempts for s in stats))
        report.fact("re-sends after slow/failed answers", sum(s.retries for s in stats))
    return {str(t["callback_query"]["id"]) for t in taps}


def _verify(
    report: Report,
    api: FakeBotAPI,
    writer: OfflineWriter,
    counter: DecisionCounter,
    settings: Settings,
    files: dict[str, str],
    taps: set[str],
    elapsed: float,
) -> None:
    messages = _commit_messages(settings.repo_path)
    publishes = [m for m in messages if m.startswith("Publish ")]
    report.fact("duplicate updates absorbed (update guard)", counter.absorbed("update"))
    report.fact("repeated actions absorbed (action guard)", counter.absorbed("action"))
    report.fact("steps replayed instead of re-run", counter.absorbed("step"))
    report.fact(
        "commits made", f"{len(messages)} ({', '.join(m.split(chr(10))[0] for m in messages)})"
    )
    report.fact("files published (post files written)", 3 * len(publishes))
    report.fact("files in the repository now", len(files))
    calls: dict[str, int] = {}
    for call in api.calls:
        calls[call.method] = calls.get(call.method, 0) + 1
    report.fact("Bot API calls", ", ".join(f"{k} {v}" for k, v in sorted(calls.items())))
    report.fact("writer calls", dict(writer.calls))
    report.fact("elapsed", f"{elapsed:.1f} s")
    report.lines.append("")
    slugs = {m.splitlines()[0].removeprefix("Publish ") for m in publishes}
    report.check(
        "one commit per published post",
        len(publishes) == len(slugs) == 3,
        f"{len(publishes)} publish commits, {len(slugs)} slugs",
    )
    report.check(
        "one title per /techpost",
        writer.calls["title"] == 1,
        f"title generated {writer.calls['title']}×",
    )
    removals = [m for m in messages if m.startswith(("Delete ", "Unpublish "))]
    report.check("one commit per delete/unpublish action", len(removals) == 3, f"{len(removals)}")
    asked = {c.params.get("callback_query_id") for c in api.calls_of("answerCallbackQuery")}
    report.check(
        "every callback query answered",
        taps <= asked and len(taps) >= 5,
        f"{len(taps)} queries, {len(asked & taps)} answered",
    )
    report.check("no dead index link", dead_links(files) == [], ", ".join(dead_links(files)))
    thanks = [c for c in api.calls_of("sendMessage") if "Thank you" in str(c.params.get("text"))]
    report.check("a re-delivered payment thanked once", len(thanks) == 1, f"{len(thanks)}")
    report.check("pre-checkout query answered", len(api.calls_of("answerPreCheckoutQuery")) == 1)


def main() -> None:
    """Entry point for ``python -m examples.blog_bot.demo``."""
    raise SystemExit(asyncio.run(run_demo()))
