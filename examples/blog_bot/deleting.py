"""[🗑️ Delete Post], [🙈 Unpublish] and ``/delete``: one commit each, no dead link.

Buttons carry signed callback tokens (≤ 64 bytes) standing for ``{"slug": …}`` on the
server. A double tap is two callback queries with different ``update_id``: the action key
``{callback_data}`` collapses them, the second waits for the first's result, and both
queries are answered (Bot API, ``answerCallbackQuery``: the client shows a spinner until
then). ``/delete`` without arguments shows a paginated keyboard of recent posts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiogram import Bot, F, Router
from aiogram.filters import Command, CommandObject
from aiogram.types import CallbackQuery, InlineKeyboardButton, InlineKeyboardMarkup, Message

from examples.blog_bot.content import (
    Changeset,
    delete_changes,
    index_path,
    list_posts,
    unpublish_changes,
)
from examples.blog_bot.publisher import Publisher
from telegram_idem import CallbackTokenError, CallbackTokens, idempotent

__all__ = ["PAGE_SIZE", "make_router"]

PAGE_SIZE = 5


async def _change(publisher: Publisher, slug: str, kind: str) -> str | None:
    """Delete or unpublish in one commit; ``None`` when there was nothing to change."""
    empty = False

    def build(files: Mapping[str, str]) -> Changeset:
        nonlocal empty
        changes = (
            delete_changes(files, slug) if kind == "delete" else unpublish_changes(files, slug)
        )
        empty = changes.is_empty
        return changes

    sha = await publisher.transact(build)
    return None if empty else sha


@idempotent(key="button:{callback_data}", in_progress="wait")
async def button_action(
    query: CallbackQuery, slug: str, kind: str, *, bot: Bot, publisher: Publisher
) -> dict[str, Any]:
    """Delete or unpublish ``slug`` once per button; edits the post's message."""
    sha = await _change(publisher, slug, kind)
    done = "🗑️ Deleted" if kind == "delete" else "🙈 Unpublished (draft)"
    if query.message is not None:
        await bot.edit_message_text(
            text=f"{done}: {slug}",
            chat_id=query.message.chat.id,
            message_id=query.message.message_id,
        )
    return {
        "slug": slug,
        "commit": sha,
        "text": f"{done}: {slug}" if sha else f"Nothing to do: {slug}",
    }


async def on_post_button(
    query: CallbackQuery, bot: Bot, idem_tokens: CallbackTokens, publisher: Publisher
) -> None:
    """Every tap is answered, duplicates and bad tokens included."""
    text, alert = "", False
    try:
        payload = await idem_tokens.resolve(query.data or "", bot_id=bot.id)
        kind = "unpublish" if (query.data or "").startswith("unpub:") else "delete"
        result = await button_action(
            query, str(payload["slug"]), kind, bot=bot, publisher=publisher
        )
        text = str(result["text"])
    except CallbackTokenError:
        text, alert = "This button is no longer valid.", True
    finally:
        await query.answer(text, show_alert=alert)


async def _keyboard(
    publisher: Publisher, tokens: CallbackTokens, bot_id: int, page: int
) -> tuple[str, InlineKeyboardMarkup | None]:
    files = await publisher.snapshot()
    posts = sorted(list_posts(files.get(index_path("ko"), "")), key=lambda e: e.date, reverse=True)
    if not posts:
        return "No published posts.", None
    pages = (len(posts) + PAGE_SIZE - 1) // PAGE_SIZE
    page = max(0, min(page, pages - 1))
    rows = [
        [
            InlineKeyboardButton(
                text=f"🗑️ {entry.title[:48]}",
                callback_data=await tokens.issue("dsel", {"slug": entry.slug}, bot_id=bot_id),
            )
        ]
        for entry in posts[page * PAGE_SIZE : (page + 1) * PAGE_SIZE]
    ]
    nav = []
    if page > 0:
        nav.append(InlineKeyboardButton(text="◀️", callback_data=f"dpage:{page - 1}"))
    if page < pages - 1:
        nav.append(InlineKeyboardButton(text="▶️", callback_data=f"dpage:{page + 1}"))
    if nav:
        rows.append(nav)
    return f"Pick a post to delete (page {page + 1}/{pages}):", InlineKeyboardMarkup(
        inline_keyboard=rows
    )


@idempotent(key="delete-list:{chat_id}:{message_id}", in_progress="wait")
async def send_delete_list(
    message: Message, *, bot: Bot, tokens: CallbackTokens, publisher: Publisher
) -> int:
    """Send page 1 of the delete keyboard once for this ``/delete`` message."""
    text, markup = await _keyboard(publisher, tokens, bot.id, 0)
    sent = await message.answer(text, reply_markup=markup)
    return sent.message_id


@idempotent(key="delete-cmd:{chat_id}:{message_id}", in_progress="wait")
async def delete_by_name(message: Message, slug: str, *, publisher: Publisher) -> str | None:
    """``/delete <slug>``: delete once for this message; returns the commit or ``None``."""
    sha = await _change(publisher, slug, "delete")
    await message.answer(f"🗑️ Deleted: {slug}" if sha else f"No post named {slug}.")
    return sha


async def on_delete(
    message: Message,
    command: CommandObject,
    bot: Bot,
    idem_tokens: CallbackTokens,
    publisher: Publisher,
) -> None:
    """``/delete [slug]``."""
    if command.args:
        await delete_by_name(message, command.args.strip(), publisher=publisher)
    else:
        await send_delete_list(message, bot=bot, tokens=idem_tokens, publisher=publisher)


async def on_page(
    query: CallbackQuery, bot: Bot, idem_tokens: CallbackTokens, publisher: Publisher
) -> None:
    """Turn a page of the delete keyboard (idempotent by nature: same page, same edit)."""
    try:
        if query.message is not None:
            page = int((query.data or "dpage:0").split(":")[1])
            text, markup = await _keyboard(publisher, idem_tokens, bot.id, page)
            await bot.edit_message_text(
                text=text,
                chat_id=query.message.chat.id,
                message_id=query.message.message_id,
                reply_markup=markup,
            )
    finally:
        await query.answer()


def make_router() -> Router:
    """A new router with this module's handlers (a router attaches to one dispatcher)."""
    router = Router(name="deleting")
    router.callback_query.register(on_post_button, F.data.regexp(r"^(del|unpub|dsel):"))
    router.message.register(on_delete, Command("delete"))
    router.callback_query.register(on_page, F.data.regexp(r"^dpage:\d{1,4}$"))
    return router
