"""The blog bot end to end: real aiogram Dispatcher, real payloads, SQLite, git, HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from examples.blog_bot.content import dead_links, index_path, list_posts
from examples.blog_bot.demo_scenario import (
    button_update,
    buttons,
    command_update,
    published_messages,
)
from examples.blog_bot.tests.blog_harness import Harness
from telegram_idem.testing import load_fixture, make_double_tap

AUTHOR = 5550001001


def _slugs(files: dict[str, str]) -> set[str]:
    return {entry.slug for entry in list_posts(files.get(index_path("ko"), ""))}


async def test_techpost_without_title_delivered_5_times_gives_one_file_name_and_one_commit(
    harness: Harness,
) -> None:
    update = load_fixture("techpost_no_title")
    for _ in range(5):
        report = await harness.telegram.deliver(update)
        assert report.statuses == [200]
    await harness.settle()
    files = await harness.blog.publisher.snapshot()
    [slug] = _slugs(files)
    publishes = [m for m in await harness.commit_messages() if m.startswith("Publish")]
    assert [m.splitlines()[0] for m in publishes] == [f"Publish {slug}"]
    assert harness.writer.calls["title"] == 1
    assert len([p for p in files if p.endswith(".md") and "/tech/" in p and "index" not in p]) == 3


async def test_techpost_delivered_5_times_concurrently_runs_the_pipeline_once(
    harness: Harness,
) -> None:
    reports = await harness.telegram.deliver_concurrently(load_fixture("techpost_no_title"), 5)
    assert all(r.statuses == [200] for r in reports)
    await harness.settle()
    messages = await harness.commit_messages()
    assert len([m for m in messages if m.startswith("Publish")]) == 1
    assert harness.writer.calls == {"title": 1, "draft": 1, "translate": 2}
    published = published_messages(harness.api, AUTHOR)
    assert len(published) == 1
    assert set(buttons(published[0])) == {"🗑️ Delete Post", "🙈 Unpublish (Draft)"}
    assert all(len(d.encode()) <= 64 for d in buttons(published[0]).values())


async def test_progress_is_one_message_edited_in_place(harness: Harness) -> None:
    await harness.feed(load_fixture("techpost_command"))
    sent = harness.api.calls_of("sendMessage")
    assert len(sent) == 1
    edits = [c.params["text"] for c in harness.api.calls_of("editMessageText")]
    assert [e[:5] for e in edits] == ["⏳ 2/3", "🌐 3/3", "✅ Pub"]


async def test_double_tap_on_delete_makes_one_commit_and_answers_both(harness: Harness) -> None:
    await harness.feed(load_fixture("techpost_command"))
    [post] = published_messages(harness.api, AUTHOR)
    first = button_update(post, buttons(post)["🗑️ Delete Post"])
    second = make_double_tap(first)
    await asyncio.gather(harness.feed(first), harness.feed(second))
    messages = await harness.commit_messages()
    assert len([m for m in messages if m.startswith("Delete")]) == 1
    answered = harness.api.answered_callback_ids()
    assert sorted(answered) == sorted(
        [first["callback_query"]["id"], second["callback_query"]["id"]]
    )
    files = await harness.blog.publisher.snapshot()
    assert _slugs(files) == set()
    assert dead_links(files) == []


async def test_unpublish_moves_files_to_drafts_in_one_commit(harness: Harness) -> None:
    await harness.feed(load_fixture("techpost_command"))
    [post] = published_messages(harness.api, AUTHOR)
    await harness.feed(button_update(post, buttons(post)["🙈 Unpublish (Draft)"]))
    files = await harness.blog.publisher.snapshot()
    assert _slugs(files) == set()
    assert len([p for p in files if p.startswith("drafts/")]) == 3
    assert dead_links(files) == []
    assert len(await harness.commit_messages()) == 2


async def test_forged_button_is_answered_with_an_alert_and_changes_nothing(
    harness: Harness,
) -> None:
    await harness.feed(load_fixture("callback_delete"))
    [answer] = harness.api.calls_of("answerCallbackQuery")
    assert answer.params.get("show_alert") is True
    assert "no longer valid" in str(answer.params.get("text"))
    assert await harness.commit_messages() == []


async def test_second_post_in_the_same_chat_waits_for_the_chat_lock(tmp_path: Path) -> None:
    from examples.blog_bot.tests.blog_harness import running_blog

    async with running_blog(tmp_path, writer_delay_scale=0.01) as h:
        started = asyncio.Event()
        original = h.writer.draft

        async def draft(title: str, topic: str) -> str:
            started.set()
            return await original(title, topic)

        h.writer.draft = draft  # type: ignore[method-assign]
        task = asyncio.create_task(h.feed(load_fixture("techpost_command")))
        await started.wait()
        await h.feed(command_update("/techpost another one"))
        await task
        texts = [str(c.params["text"]) for c in h.api.calls_of("sendMessage")]
        assert any(t.startswith("⏳ A post is already being generated") for t in texts)
        assert len([m for m in await h.commit_messages() if m.startswith("Publish")]) == 1


async def test_a_failed_step_is_retried_and_finished_steps_are_replayed(
    harness: Harness,
) -> None:
    original = harness.writer.translate
    failures = {"left": 1}

    async def flaky(markdown: str, lang: str) -> str:
        if lang == "ja" and failures["left"]:
            failures["left"] -= 1
            raise ConnectionError("LLM timed out")
        return await original(markdown, lang)

    harness.writer.translate = flaky  # type: ignore[method-assign]
    update = load_fixture("techpost_no_title")
    with pytest.raises(ConnectionError):
        await harness.feed(update)
    await harness.feed(update)  # Telegram re-sends: the update guard was released
    assert harness.writer.calls["title"] == 1
    assert harness.writer.calls["draft"] == 1
    assert len(harness.api.calls_of("sendMessage")) == 1  # the status message is reused
    assert len([m for m in await harness.commit_messages() if m.startswith("Publish")]) == 1


async def test_delete_keyboard_lists_posts_and_a_tap_deletes_one(harness: Harness) -> None:
    await harness.feed(load_fixture("techpost_command"))
    await harness.feed(load_fixture("random_id_after_silence"))
    await harness.feed(command_update("/delete"))
    [keyboard] = [m for m in harness.api.messages(AUTHOR) if (m.text or "").startswith("Pick")]
    choices = buttons(keyboard)
    assert len(choices) == 2
    tap = button_update(keyboard, next(iter(choices.values())))
    await asyncio.gather(harness.feed(tap), harness.feed(make_double_tap(tap)))
    files = await harness.blog.publisher.snapshot()
    assert len(_slugs(files)) == 1
    assert len([m for m in await harness.commit_messages() if m.startswith("Delete")]) == 1


async def test_payment_redelivered_is_thanked_once(harness: Harness) -> None:
    await harness.telegram.deliver(load_fixture("successful_payment"))
    again = load_fixture("successful_payment")
    again["update_id"] += 1000  # the same charge in another update
    await harness.telegram.deliver(again)
    await harness.settle()
    thanks = [
        c for c in harness.api.calls_of("sendMessage") if "Thank you" in str(c.params["text"])
    ]
    assert len(thanks) == 1


@pytest.mark.parametrize(
    ("headers", "body", "status"),
    [
        ({"X-Telegram-Bot-Api-Secret-Token": "wrong"}, b'{"update_id": 5}', 401),
        ({}, b'{"update_id": 5}', 401),
        (None, b"not json", 400),
        (None, b'{"message": {}}', 400),
        (None, b'{"update_id": true}', 400),
        (None, b"[" + b"1," * 600_000 + b"1]", 413),
        (None, b'{"update_id": 5, "brand_new_type": {"x": 1}}', 200),
    ],
)
async def test_bad_input_gets_a_clear_status_and_stores_nothing(
    harness: Harness, headers: dict[str, str] | None, body: bytes, status: int
) -> None:
    sent = (
        headers
        if headers is not None
        else {"X-Telegram-Bot-Api-Secret-Token": "test-webhook-secret"}
    )
    async with (
        aiohttp.ClientSession() as session,
        session.post(harness.url, data=body, headers=sent) as resp,
    ):
        assert resp.status == status
    await harness.settle()
    idem = harness.blog.idem
    seen = await idem.store.get(idem.keys.update(harness.blog.bot.id, 5))
    if status == 200:  # an unknown update type is admitted and handed to aiogram untouched
        assert seen is not None
        assert await idem.store.inbox().depth() == 0
    else:
        assert seen is None


async def test_store_outage_answers_503_so_telegram_retries(tmp_path: Path) -> None:
    from examples.blog_bot.tests.blog_harness import running_blog

    async with running_blog(tmp_path, store_url=f"sqlite:///{tmp_path}") as h:  # a directory
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                h.url,
                json=load_fixture("techpost_command"),
                headers={"X-Telegram-Bot-Api-Secret-Token": "test-webhook-secret"},
            ) as resp,
        ):
            assert resp.status == 503
        assert h.api.calls_of("sendMessage") == []
