"""``/techpost [title]``, ``/post [title]`` and ``/draft [topic]``: the pipeline of docs/design/incident.md
behind all three guards.

update guard (middleware) → action guard (``post:{chat_id}:{message_id}``) → per-chat
lock (120 s, released in ``finally``) → steps: status message, title, Korean draft, EN and
JA translations in parallel, one commit, buttons → the status message edited in place
(1/3 → 2/3 → 3/3 → ✅) with [🗑️ Delete Post] [🙈 Unpublish] buttons.

A retried ``/techpost`` (same update re-sent, or the same message processed again after a
crash) replays finished steps: the title is generated once per action key, so a retry can
never produce a second file name.

Every Bot API call here goes through the outbox (``app.py`` installs it on the bot's
session), keyed by the action and the call's content, so a retried pipeline re-sends
nothing Telegram already accepted. ``sendMessage`` is held when its answer is lost
(policy ``hold``: it may be on screen, so it is never sent again by itself): a status
message that comes back :class:`~telegram_idem.errors.UnknownOutcomeError` is given up —
no progress edits, and the final ✅ is a new message, so it is shown exactly once. The
edits are latest-wins and resent when in doubt (an edit to the same text is answered
"message is not modified", Bot API "Updating messages").
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from aiogram import Bot, Router
from aiogram.filters import Command, CommandObject
from aiogram.types import InlineKeyboardButton, InlineKeyboardMarkup, Message

from examples.blog_bot.content import Post, make_post, publish_changes
from examples.blog_bot.publisher import Publisher
from examples.blog_bot.writer import Writer
from telegram_idem import CallbackTokens, Idem, LockHeldError, idempotent
from telegram_idem.errors import UnknownOutcomeError

__all__ = ["make_router"]


def post_buttons(tokens: dict[str, str]) -> InlineKeyboardMarkup:
    """The [🗑️ Delete Post] [🙈 Unpublish] keyboard for callback tokens ``del``/``unpub``."""
    return InlineKeyboardMarkup(
        inline_keyboard=[
            [
                InlineKeyboardButton(text="🗑️ Delete Post", callback_data=tokens["del"]),
                InlineKeyboardButton(text="🙈 Unpublish (Draft)", callback_data=tokens["unpub"]),
            ]
        ]
    )


async def _send_status(bot: Bot, message: Message, text: str) -> int | None:
    """The status message's id; ``None`` if Telegram may or may not have shown it."""
    try:
        sent = await bot.send_message(
            chat_id=message.chat.id, text=text, message_thread_id=message.message_thread_id
        )
    except UnknownOutcomeError:
        return None  # held, never resent: go on without it
    return sent.message_id


async def _progress(bot: Bot, message: Message, status: int | None, text: str) -> None:
    """Edit the status message (latest-wins, safe to resend); without one, nothing."""
    if status is not None:
        await bot.edit_message_text(text=text, chat_id=message.chat.id, message_id=status)


async def _finish(
    bot: Bot, message: Message, status: int | None, text: str, markup: InlineKeyboardMarkup
) -> None:
    """Show the final text once: the status message edited, or a new message without one."""
    if status is None:
        await bot.send_message(
            chat_id=message.chat.id,
            text=text,
            message_thread_id=message.message_thread_id,
            reply_markup=markup,
        )
    else:
        await bot.edit_message_text(
            text=text, chat_id=message.chat.id, message_id=status, reply_markup=markup
        )


async def _commit(publisher: Publisher, post: Post, bodies: dict[str, str]) -> str:
    return await publisher.transact(lambda files: publish_changes(files, post, bodies))


async def _issue_buttons(tokens: CallbackTokens, slug: str, bot_id: int) -> dict[str, str]:
    return {
        "del": await tokens.issue("del", {"slug": slug}, bot_id=bot_id),
        "unpub": await tokens.issue("unpub", {"slug": slug}, bot_id=bot_id),
    }


@idempotent(key="post:{chat_id}:{message_id}", in_progress="wait", wait_timeout=180)
async def publish_post(
    message: Message,
    given_title: str,
    *,
    bot: Bot,
    idem: Idem,
    tokens: CallbackTokens,
    writer: Writer,
    publisher: Publisher,
    lock_ttl: float,
) -> dict[str, Any]:
    """Run the publishing pipeline once for this message; returns slug and commit."""
    async with idem.chat_lock(ttl=lock_ttl, name="post"):
        status = await idem.step("status", _send_status, bot, message, "⏳ 1/3 Preparing the post…")
        title = given_title or await idem.step("title", writer.title, "")
        await _progress(bot, message, status, f"⏳ 2/3 Writing the Korean draft: {title}")
        ko = await idem.step("draft", writer.draft, title, given_title)
        await _progress(bot, message, status, f"🌐 3/3 Translating to EN and JA: {title}")
        en, ja = await asyncio.gather(
            idem.step("translate:en", writer.translate, ko, "en"),
            idem.step("translate:ja", writer.translate, ko, "ja"),
        )
        bodies = {"ko": ko, "en": en, "ja": ja}
        post = make_post(title, bodies, message.date.date())
        sha = await idem.step("commit", _commit, publisher, post, bodies)
        buttons = await idem.step("buttons", _issue_buttons, tokens, post.slug, bot.id)
        await _finish(bot, message, status, f"✅ Published: {post.slug}", post_buttons(buttons))
    return {"slug": post.slug, "commit": sha, "status_message_id": status}


async def on_techpost(
    message: Message,
    command: CommandObject,
    bot: Bot,
    idem: Idem,
    idem_tokens: CallbackTokens,
    writer: Writer,
    publisher: Publisher,
    lock_ttl: float,
) -> None:
    """``/techpost [title]``: publish a post in three languages in one commit."""
    try:
        await publish_post(
            message,
            (command.args or "").strip(),
            bot=bot,
            idem=idem,
            tokens=idem_tokens,
            writer=writer,
            publisher=publisher,
            lock_ttl=lock_ttl,
        )
    except LockHeldError as exc:
        await message.answer(
            f"⏳ A post is already being generated in this chat. "
            f"Try again in {math.ceil(exc.retry_after)} s."
        )


@idempotent(key="draft:{chat_id}:{message_id}", in_progress="wait", wait_timeout=180)
async def write_draft(message: Message, topic: str, *, idem: Idem, writer: Writer) -> int:
    """Write a Korean draft once for this message and send it; returns the reply's id."""
    title = topic or await idem.step("title", writer.title, "")
    body = await idem.step("draft", writer.draft, title, topic)
    sent = await idem.step("reply", _reply, message, f"📝 Draft: {title}\n\n{body[:3500]}")
    return int(sent)


async def _reply(message: Message, text: str) -> int:
    sent = await message.answer(text)
    return sent.message_id


async def on_draft(message: Message, command: CommandObject, idem: Idem, writer: Writer) -> None:
    """``/draft [topic]`` (also ``/draft@botname`` in groups and forum topics)."""
    await write_draft(message, (command.args or "").strip(), idem=idem, writer=writer)


def make_router() -> Router:
    """A new router with this module's handlers (a router attaches to one dispatcher)."""
    router = Router(name="posting")
    router.message.register(on_techpost, Command("techpost", "post"))
    router.message.register(on_draft, Command("draft"))
    return router
