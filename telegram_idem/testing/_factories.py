"""Bot API updates for tests, built field by field or loaded from recorded payloads.

An :class:`UpdateFactory` hands out valid ``Update`` objects as JSON-shaped dicts (field
names as the Bot API spells them, ``from`` included), each with the next ``update_id``, and
messages with the next ``message_id``. The id after a callback query's is kept for its second
tap (:func:`make_double_tap`'s default, which ``Replayer.double_tap`` and
``TelegramDelivery.double_tap`` use), so the factory never hands it out to another update. Every shape is checked by the test suite to parse
with aiogram 3 (``Update.model_validate``) and python-telegram-bot 22
(``Update.de_json``) with no field either library does not know::

    updates = UpdateFactory()
    cmd = updates.command("/techpost", "Exactly once")
    tap = updates.callback_query("del:42", from_message=cmd["message"])
    again = updates.double_tap(tap)          # second tap: new update_id, same button

Overrides are merged into the update's payload object (the ``message``, the
``callback_query``, …) as a nested dict merge: dicts merge key by key, any other value
replaces, and :data:`OMIT` deletes the field. A key that is a Python keyword plus ``_``
names the keyword (``from_={"id": 1}`` sets ``from.id``). ``update_id=`` sets the update's
id. ``chat=`` and ``user=`` (where offered) replace the chat or sender wholesale.

This module imports no framework.
"""

from __future__ import annotations

import copy
import itertools
import keyword
import os
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from telegram_idem.testing._payloads import (
    fixture_names,
    load_fixture,
    load_update,
    make_double_tap,
)

__all__ = [
    "DEFAULT_BOT",
    "DEFAULT_BOT_ID",
    "DEFAULT_TOKEN",
    "DEFAULT_USER",
    "OMIT",
    "UpdateFactory",
    "chat_member_status",
    "merge",
]

DEFAULT_BOT_ID: Final = 7000000001
"""The bot id of the defaults (and of the shipped payloads)."""
DEFAULT_TOKEN: Final = f"{DEFAULT_BOT_ID}:AAtelegram-idem-test-token"
"""A syntactically valid token for :data:`DEFAULT_BOT_ID` (never valid on Telegram)."""
DEFAULT_BOT: Final[Mapping[str, Any]] = {
    "id": DEFAULT_BOT_ID,
    "is_bot": True,
    "first_name": "Blog Bot",
    "username": "example_blog_bot",
}
"""The bot user; name and username match :class:`~telegram_idem.testing.FakeBotAPI`'s
``getMe`` defaults, so ``/cmd@example_blog_bot`` passes aiogram's ``Command`` filter."""
DEFAULT_USER: Final[Mapping[str, Any]] = {
    "id": 5550001001,
    "is_bot": False,
    "first_name": "Min",
    "username": "example_author",
    "language_code": "en",
}
"""The user who sends, taps and pays by default."""


class _Omit:
    def __repr__(self) -> str:
        return "OMIT"


OMIT: Final[Any] = _Omit()
"""Override value that removes a field: ``updates.message("hi", from_=OMIT)``."""


def _field_name(name: str) -> str:
    if name.endswith("_") and keyword.iskeyword(name[:-1]):
        return name[:-1]
    return name


def merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``base`` with ``overrides`` merged in.

    Nested dicts merge key by key; lists and scalars replace; :data:`OMIT` deletes; a key
    such as ``from_`` (a Python keyword plus ``_``) names ``from``. Neither input changes.
    """
    out = copy.deepcopy(dict(base))
    for raw, value in overrides.items():
        name = _field_name(raw)
        if value is OMIT:
            out.pop(name, None)
        elif isinstance(value, Mapping) and isinstance(out.get(name), Mapping):
            out[name] = merge(out[name], value)
        else:
            out[name] = copy.deepcopy(value)
    return out


def chat_member_status(
    status: str, user: Mapping[str, Any], *, until_date: int = 0
) -> dict[str, Any]:
    """A ``ChatMember`` object of ``status`` for ``user``, with every field it requires.

    Args:
        status: ``"creator"``, ``"administrator"``, ``"member"``, ``"restricted"``,
            ``"left"`` or ``"kicked"``.
        user: the member (a Bot API ``User``).
        until_date: Unix time in seconds the restriction or ban ends (0 = forever).

    Raises:
        ValueError: an unknown status.
    """
    member: dict[str, Any] = {"status": status, "user": copy.deepcopy(dict(user))}
    if status == "creator":
        member["is_anonymous"] = False
    elif status == "administrator":
        member.update(
            can_be_edited=False,
            is_anonymous=False,
            can_manage_chat=True,
            can_delete_messages=True,
            can_manage_video_chats=False,
            can_restrict_members=True,
            can_promote_members=False,
            can_change_info=False,
            can_invite_users=True,
            can_post_stories=False,
            can_edit_stories=False,
            can_delete_stories=False,
            can_send_welcome_messages=False,  # Bot API 9.6; aiogram 3.31 requires it
        )
    elif status == "restricted":
        member.update(
            is_member=True,
            can_send_messages=False,
            can_send_audios=False,
            can_send_documents=False,
            can_send_photos=False,
            can_send_videos=False,
            can_send_video_notes=False,
            can_send_voice_notes=False,
            can_send_polls=False,
            can_send_other_messages=False,
            can_add_web_page_previews=False,
            can_react_to_messages=False,
            can_edit_tag=False,
            can_change_info=False,
            can_invite_users=False,
            can_pin_messages=False,
            can_manage_topics=False,
            until_date=until_date,
        )
    elif status == "kicked":
        member["until_date"] = until_date
    elif status not in ("member", "left"):
        raise ValueError(
            f"unknown chat member status {status!r}; known: creator, administrator, "
            "member, restricted, left, kicked"
        )
    return member


def _as_message(source: Any) -> dict[str, Any]:
    """A message dict from a message, an update holding one, or a FakeBotAPI SentMessage."""
    if (
        hasattr(source, "message")
        and hasattr(source, "message_id")
        and not isinstance(source, Mapping)
    ):
        stored = dict(source.message)  # SentMessage: its last known Message, current text
        stored["text"] = source.text
        if source.reply_markup is not None:
            stored["reply_markup"] = source.reply_markup
        return copy.deepcopy(stored)
    if not isinstance(source, Mapping):
        raise TypeError(f"from_message must be a message dict or an update, got {source!r}")
    for key in ("message", "edited_message", "channel_post", "callback_query"):
        inner = source.get(key)
        if isinstance(inner, Mapping) and "update_id" in source:
            return _as_message(inner) if key != "callback_query" else _as_message(inner["message"])
    if "message_id" not in source or "chat" not in source:
        raise ValueError("from_message needs a Bot API Message (message_id and chat)")
    return copy.deepcopy(dict(source))


class UpdateFactory:
    """Builds Bot API updates with rising ids and shared defaults.

    Args:
        bot: the bot user (default :data:`DEFAULT_BOT`).
        user: the default sender (default :data:`DEFAULT_USER`).
        chat: the default chat (default: the private chat with ``user``).
        first_update_id: the first ``update_id`` handed out. Ids rise from there, skipping
            each callback query's ``update_id`` + 1: that is its default second tap's
            (:func:`make_double_tap`), and the guard would drop a later update given it.
        first_message_id: the first ``message_id`` handed out.
        clock: seconds since the epoch for ``date`` fields (e.g. the ``idem_clock``
            fixture); default a fixed 2023-11-14 date, so updates are reproducible.

    Every method returns a new dict; nothing returned is shared with the factory.
    """

    def __init__(
        self,
        *,
        bot: Mapping[str, Any] = DEFAULT_BOT,
        user: Mapping[str, Any] = DEFAULT_USER,
        chat: Mapping[str, Any] | None = None,
        first_update_id: int = 100_000_001,
        first_message_id: int = 1,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.bot: dict[str, Any] = dict(bot)
        self.user: dict[str, Any] = dict(user)
        self.chat: dict[str, Any] = dict(chat) if chat is not None else self.private_chat()
        self._update_ids = itertools.count(first_update_id)
        self._kept_update_ids: set[int] = set()  # callback query id + 1: its second tap's
        self._message_ids = itertools.count(first_message_id)
        self._object_ids = itertools.count(1)
        self._user_ids = itertools.count(int(self.user["id"]) + 1)
        self._clock = clock

    # ------------------------------------------------------------------ ids and parts

    def next_update_id(self) -> int:
        """The next ``update_id`` (rising by one, as Telegram's do, but never one kept for
        a callback query's second tap)."""
        while (uid := next(self._update_ids)) in self._kept_update_ids:
            self._kept_update_ids.discard(uid)
        return uid

    def _take_update_id(self, kind: str, update_id: int | None) -> int:
        uid = self.next_update_id() if update_id is None else update_id
        if kind == "callback_query":
            # make_double_tap's default second tap takes uid + 1: never hand that out.
            self._kept_update_ids.add(uid + 1)
        return uid

    def next_message_id(self) -> int:
        """The next ``message_id``."""
        return next(self._message_ids)

    def _next_numeric_id(self) -> str:
        return str(4_382_910_027_000_000_000 + next(self._object_ids) * 1000)

    def now(self) -> int:
        """The ``date`` of new objects: Unix time in whole seconds."""
        return int(self._clock()) if self._clock is not None else 1_700_000_000

    def new_user(self, **fields: Any) -> dict[str, Any]:
        """Another user (next id) with ``fields`` merged in.

        Args:
            fields: ``User`` fields to set (``username="ann"``…), merged over the defaults.
        """
        uid = next(self._user_ids)
        return merge({"id": uid, "is_bot": False, "first_name": f"User{uid % 1000}"}, fields)

    def private_chat(self, user: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The private chat with ``user`` (default the factory's user).

        Args:
            user: the other party (a ``User`` dict); default the factory's ``user``.
        """
        user = user or self.user
        chat: dict[str, Any] = {"id": user["id"], "type": "private"}
        for name in ("first_name", "last_name", "username"):
            if name in user:
                chat[name] = user[name]
        return chat

    def group(
        self, title: str = "Test Group", *, chat_id: int = -1001234567890, forum: bool = False
    ) -> dict[str, Any]:
        """A supergroup chat (``is_forum`` when ``forum``).

        Args:
            title: the group's title.
            chat_id: the supergroup's id (negative, ``-100…``).
            forum: a forum supergroup (``is_forum``: topics).
        """
        chat: dict[str, Any] = {"id": chat_id, "title": title, "type": "supergroup"}
        if forum:
            chat["is_forum"] = True
        return chat

    def channel(
        self, title: str = "Test Channel", *, chat_id: int = -1009876543210
    ) -> dict[str, Any]:
        """A channel chat.

        Args:
            title: the channel's title.
            chat_id: the channel's id (negative, ``-100…``).
        """
        return {"id": chat_id, "title": title, "type": "channel"}

    def update(
        self, kind: str, payload: Mapping[str, Any], *, update_id: int | None = None
    ) -> dict[str, Any]:
        """``{"update_id": …, kind: payload}`` for any update type (a copy of ``payload``).

        Args:
            kind: the update type, the key of its object (``"message"``,
                ``"business_message"``…).
            payload: the object under ``kind`` (copied).
            update_id: the ``update_id``; default the next one (:meth:`next_update_id`).
        """
        uid = self._take_update_id(kind, update_id)
        return {"update_id": uid, kind: copy.deepcopy(dict(payload))}

    def _message_body(
        self,
        text: str | None,
        chat: Mapping[str, Any] | None,
        user: Mapping[str, Any] | None,
        message_id: int | None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "message_id": self.next_message_id() if message_id is None else message_id,
            "from": dict(user or self.user),
            "chat": dict(chat or self.chat),
            "date": self.now(),
        }
        if text is not None:
            body["text"] = text
        return body

    # ------------------------------------------------------------------ messages

    def message(
        self,
        text: str = "Hello",
        *,
        chat: Mapping[str, Any] | None = None,
        user: Mapping[str, Any] | None = None,
        update_id: int | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """A ``message`` update with ``text`` from ``user`` in ``chat``.

        Args:
            text: the message's text.
            chat: the chat (a Bot API ``Chat`` dict); default the factory's ``chat``.
            user: the user it comes from (a Bot API ``User`` dict); default the factory's
                ``user``.
            update_id: the ``update_id``; default the next one (:meth:`next_update_id`).
            overrides: fields merged into the update's object (nested dicts merged), e.g.
                ``message_thread_id=7``.
        """
        body = self._message_body(text, chat, user, None)
        return self.update("message", merge(body, overrides), update_id=update_id)

    def command(
        self,
        command: str,
        args: str | Sequence[str] | None = None,
        *,
        mention: bool = False,
        chat: Mapping[str, Any] | None = None,
        user: Mapping[str, Any] | None = None,
        update_id: int | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """A command message: ``/command args`` with its ``bot_command`` entity.

        Args:
            command: ``"/techpost"`` or ``"techpost"``.
            args: text after the command; a sequence is joined with spaces.
            mention: write ``/command@<bot username>``, as clients do in groups.
            chat: the chat (a Bot API ``Chat`` dict); default the factory's ``chat``.
            user: the user it comes from (a Bot API ``User`` dict); default the factory's
                ``user``.
            update_id: the ``update_id``; default the next one (:meth:`next_update_id`).
            overrides: fields merged into the update's object (nested dicts merged), e.g.
                ``message_thread_id=7``.
        """
        head = "/" + command.lstrip("/")
        if mention:
            head += "@" + str(self.bot["username"])
        tail = args if isinstance(args, str) or args is None else " ".join(args)
        text = f"{head} {tail}" if tail else head
        body = self._message_body(text, chat, user, None)
        body["entities"] = [{"offset": 0, "length": len(head), "type": "bot_command"}]
        return self.update("message", merge(body, overrides), update_id=update_id)

    def edited_message(
        self,
        text: str = "Hello (edited)",
        *,
        original: Any = None,
        update_id: int | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """An ``edited_message`` update: ``original`` (a message or an update holding one)
        with new ``text`` and ``edit_date``; without ``original``, a new message id.

        Args:
            text: the new text.
            original: the message edited: a Message dict, an update holding one, or a
                ``SentMessage``; ``None``: a new message id.
            update_id: the ``update_id``; default the next one (:meth:`next_update_id`).
            overrides: fields merged into the update's object (nested dicts merged), e.g.
                ``message_thread_id=7``.
        """
        if original is not None:
            body = _as_message(original)
            body.pop("entities", None)
            body["text"] = text
        else:
            body = self._message_body(text, None, None, None)
        body["edit_date"] = max(self.now(), int(body["date"]) + 1)
        return self.update("edited_message", merge(body, overrides), update_id=update_id)

    def channel_post(
        self,
        text: str = "New post",
        *,
        chat: Mapping[str, Any] | None = None,
        update_id: int | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """A ``channel_post`` update (no ``from``; ``sender_chat`` is the channel).

        Args:
            text: the post's text.
            chat: the channel; default :meth:`channel`.
            update_id: the ``update_id``; default the next one (:meth:`next_update_id`).
            overrides: fields merged into the update's object (nested dicts merged), e.g.
                ``message_thread_id=7``.
        """
        channel = dict(chat or self.channel())
        body: dict[str, Any] = {
            "message_id": self.next_message_id(),
            "sender_chat": channel,
            "chat": channel,
            "date": self.now(),
            "text": text,
        }
        return self.update("channel_post", merge(body, overrides), update_id=update_id)

    # ------------------------------------------------------------------ buttons and queries

    def bot_message(
        self,
        text: str = "Choose:",
        *,
        buttons: Mapping[str, str] | None = None,
        chat: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A Message the bot sent (``from`` is the bot), with an inline keyboard of
        ``buttons`` (text → callback data, one row) if given.

        Args:
            text: the message's text.
            buttons: button text → callback data, one row; ``None``: no keyboard.
            chat: the chat it is in; default the factory's ``chat``.
        """
        body = self._message_body(text, chat, self.bot, None)
        if buttons:
            row = [{"text": t, "callback_data": d} for t, d in buttons.items()]
            body["reply_markup"] = {"inline_keyboard": [row]}
        return body

    def callback_query(
        self,
        data: str,
        *,
        from_message: Any = None,
        inline_message_id: str | None = None,
        user: Mapping[str, Any] | None = None,
        update_id: int | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """A tap on an inline button whose ``callback_data`` is ``data``.

        Args:
            data: the button's callback data (the Bot API allows 1–64 bytes).
            from_message: the message carrying the button: a Message dict, an update
                holding one, or a :class:`~telegram_idem.testing.SentMessage` from
                ``FakeBotAPI.messages``; default a new bot message with that button.
            inline_message_id: the button sits on an inline message instead (no
                ``message`` field); exclusive with ``from_message``.
            user: the user it comes from (a Bot API ``User`` dict); default the factory's
                ``user``.
            update_id: the ``update_id``; default the next one (:meth:`next_update_id`).
            overrides: fields merged into the update's object (nested dicts merged), e.g.
                ``message_thread_id=7``.

        Raises:
            ValueError: both ``from_message`` and ``inline_message_id``, or ``data`` is
                not 1–64 bytes of UTF-8.
        """
        if from_message is not None and inline_message_id is not None:
            raise ValueError("a button is on a message or on an inline message, not both")
        if not 1 <= len(data.encode()) <= 64:
            raise ValueError("callback_data must be 1-64 bytes (Bot API, InlineKeyboardButton)")
        query: dict[str, Any] = {"id": self._next_numeric_id(), "from": dict(user or self.user)}
        if inline_message_id is not None:
            query["inline_message_id"] = inline_message_id
            query["chat_instance"] = f"-{zlib.crc32(inline_message_id.encode())}"
        else:
            message = (
                _as_message(from_message)
                if from_message is not None
                else self.bot_message(buttons={"Button": data})
            )
            query["message"] = message
            query["chat_instance"] = f"-{3012345678901234567 + abs(int(message['chat']['id']))}"
        query["data"] = data
        return self.update("callback_query", merge(query, overrides), update_id=update_id)

    def double_tap(self, callback_update: Mapping[str, Any]) -> dict[str, Any]:
        """The second tap on the same button: the next ``update_id``, a new query id, the
        same ``from``, message and ``data`` (see :func:`make_double_tap`). Being a callback
        query, its own ``update_id`` + 1 is kept too (a third tap's default).

        Args:
            callback_update: the first tap: a callback query update
                (:meth:`callback_query`).

        Raises:
            ValueError: ``callback_update`` is not a callback query update.
        """
        second = make_double_tap(callback_update, new_callback_query_id=self._next_numeric_id())
        second["update_id"] = self._take_update_id("callback_query", None)
        return second

    def inline_query(
        self,
        query: str = "",
        *,
        user: Mapping[str, Any] | None = None,
        update_id: int | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """An ``inline_query`` update (no chat: per-chat logic falls back to the user).

        Args:
            query: the text typed after the bot's username.
            user: the user it comes from (a Bot API ``User`` dict); default the factory's
                ``user``.
            update_id: the ``update_id``; default the next one (:meth:`next_update_id`).
            overrides: fields merged into the update's object (nested dicts merged), e.g.
                ``message_thread_id=7``.
        """
        body = {"id": self._next_numeric_id(), "from": dict(user or self.user), "query": query}
        body["offset"] = ""
        return self.update("inline_query", merge(body, overrides), update_id=update_id)

    # ------------------------------------------------------------------ membership

    def _member_update(
        self,
        kind: str,
        member: Mapping[str, Any],
        old_status: str,
        new_status: str,
        chat: Mapping[str, Any] | None,
        user: Mapping[str, Any] | None,
        update_id: int | None,
        overrides: Mapping[str, Any],
    ) -> dict[str, Any]:
        body = {
            "chat": dict(chat or self.group()),
            "from": dict(user or self.user),
            "date": self.now(),
            "old_chat_member": chat_member_status(old_status, member),
            "new_chat_member": chat_member_status(new_status, member),
        }
        return self.update(kind, merge(body, overrides), update_id=update_id)

    def chat_member(
        self,
        *,
        member: Mapping[str, Any] | None = None,
        old_status: str = "left",
        new_status: str = "member",
        chat: Mapping[str, Any] | None = None,
        user: Mapping[str, Any] | None = None,
        update_id: int | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """A ``chat_member`` update: ``member`` (default a new user) goes from
        ``old_status`` to ``new_status`` in ``chat`` (default a supergroup), changed by
        ``user``. Statuses as in :func:`chat_member_status`.

        Args:
            member: the user whose status changes (a ``User`` dict); default a new user
                (:meth:`new_user`).
            old_status: the status before (``"left"``, ``"member"``, ``"administrator"``…).
            new_status: the status after.
            chat: the chat; default a supergroup (:meth:`group`).
            user: who made the change; default the factory's ``user``.
            update_id: the ``update_id``; default the next one (:meth:`next_update_id`).
            overrides: fields merged into the update's object (nested dicts merged), e.g.
                ``message_thread_id=7``.
        """
        who = member if member is not None else self.new_user()
        return self._member_update(
            "chat_member", who, old_status, new_status, chat, user, update_id, overrides
        )

    def my_chat_member(
        self,
        *,
        old_status: str = "left",
        new_status: str = "member",
        chat: Mapping[str, Any] | None = None,
        user: Mapping[str, Any] | None = None,
        update_id: int | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """A ``my_chat_member`` update: the bot's own status changes (default: added to
        a supergroup by ``user``).

        Args:
            old_status: the bot's status before (``"left"``, ``"member"``, ``"kicked"``…).
            new_status: the bot's status after.
            chat: the chat; default a supergroup (:meth:`group`).
            user: who made the change; default the factory's ``user``.
            update_id: the ``update_id``; default the next one (:meth:`next_update_id`).
            overrides: fields merged into the update's object (nested dicts merged), e.g.
                ``message_thread_id=7``.
        """
        return self._member_update(
            "my_chat_member", self.bot, old_status, new_status, chat, user, update_id, overrides
        )

    def chat_join_request(
        self,
        *,
        chat: Mapping[str, Any] | None = None,
        user: Mapping[str, Any] | None = None,
        update_id: int | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """A ``chat_join_request`` update from ``user`` to ``chat`` (default a supergroup).

        Args:
            chat: the chat asked to join; default a supergroup (:meth:`group`).
            user: who asks to join; default the factory's ``user``.
            update_id: the ``update_id``; default the next one (:meth:`next_update_id`).
            overrides: fields merged into the update's object (nested dicts merged), e.g.
                ``message_thread_id=7``.
        """
        sender = dict(user or self.user)
        body = {
            "chat": dict(chat or self.group()),
            "from": sender,
            "user_chat_id": sender["id"],
            "date": self.now(),
        }
        return self.update("chat_join_request", merge(body, overrides), update_id=update_id)

    # ------------------------------------------------------------------ payments and polls

    def pre_checkout_query(
        self,
        *,
        payload: str = "order:1",
        total_amount: int = 50,
        currency: str = "XTR",
        user: Mapping[str, Any] | None = None,
        update_id: int | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """A ``pre_checkout_query`` (default 50 Telegram Stars, ``XTR``).

        ``total_amount`` is in the smallest units of ``currency`` (Stars: whole stars).

        Args:
            payload: the invoice payload (the bot's own order id).
            total_amount: the price in the smallest units of ``currency`` (Stars: whole
                stars).
            currency: the ISO 4217 code, or ``"XTR"`` for Telegram Stars.
            user: the buyer; default the factory's ``user``.
            update_id: the ``update_id``; default the next one (:meth:`next_update_id`).
            overrides: fields merged into the update's object (nested dicts merged), e.g.
                ``message_thread_id=7``.
        """
        body = {
            "id": self._next_numeric_id(),
            "from": dict(user or self.user),
            "currency": currency,
            "total_amount": total_amount,
            "invoice_payload": payload,
        }
        return self.update("pre_checkout_query", merge(body, overrides), update_id=update_id)

    def successful_payment(
        self,
        *,
        payload: str = "order:1",
        total_amount: int = 50,
        currency: str = "XTR",
        charge_id: str | None = None,
        chat: Mapping[str, Any] | None = None,
        user: Mapping[str, Any] | None = None,
        update_id: int | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """A service message with ``successful_payment``; ``charge_id`` (the
        ``telegram_payment_charge_id``, the natural action key) defaults to a new one.

        Args:
            payload: the invoice payload (the bot's own order id).
            total_amount: the price in the smallest units of ``currency`` (Stars: whole
                stars).
            currency: the ISO 4217 code, or ``"XTR"`` for Telegram Stars.
            charge_id: the ``telegram_payment_charge_id``; default a new one.
            chat: the chat (a Bot API ``Chat`` dict); default the factory's ``chat``.
            user: the buyer; default the factory's ``user``.
            update_id: the ``update_id``; default the next one (:meth:`next_update_id`).
            overrides: fields merged into the update's object (nested dicts merged), e.g.
                ``message_thread_id=7``.
        """
        body = self._message_body(None, chat, user, None)
        body["successful_payment"] = {
            "currency": currency,
            "total_amount": total_amount,
            "invoice_payload": payload,
            "telegram_payment_charge_id": charge_id or f"stxTestCharge{next(self._object_ids)}",
            "provider_payment_charge_id": "",
        }
        return self.update("message", merge(body, overrides), update_id=update_id)

    def subscription(
        self,
        *,
        state: str = "active",
        payload: str = "plan:monthly",
        user: Mapping[str, Any] | None = None,
        update_id: int | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """A ``subscription`` update (``BotSubscriptionUpdated``): ``user``'s payment
        subscription to the bot changed; ``state`` is ``"active"``, ``"canceled"`` or
        ``"failed"``. No chat.

        Args:
            state: ``"active"``, ``"canceled"`` or ``"failed"``.
            payload: the subscription's invoice payload.
            user: the subscriber; default the factory's ``user``.
            update_id: the ``update_id``; default the next one (:meth:`next_update_id`).
            overrides: fields merged into the update's object (nested dicts merged), e.g.
                ``message_thread_id=7``.
        """
        body = {"user": dict(user or self.user), "invoice_payload": payload, "state": state}
        return self.update("subscription", merge(body, overrides), update_id=update_id)

    # ------------------------------------------------------------------ bots

    def managed_bot(
        self,
        *,
        bot: Mapping[str, Any] | None = None,
        user: Mapping[str, Any] | None = None,
        update_id: int | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """A ``managed_bot`` update (``ManagedBotUpdated``): a bot this bot manages was
        created or changed; ``user`` owns it, ``bot`` is the managed bot. No chat.

        Args:
            bot: the managed bot (a ``User`` dict with ``is_bot``); default a fixed bot
                user (id 7100000001).
            user: the bot's owner; default the factory's ``user``.
            update_id: the ``update_id``; default the next one (:meth:`next_update_id`).
            overrides: fields merged into the update's object (nested dicts merged), e.g.
                ``message_thread_id=7``.
        """
        managed = dict(bot or {"id": 7100000001, "is_bot": True, "first_name": "Managed"})
        body = {"user": dict(user or self.user), "bot": managed}
        return self.update("managed_bot", merge(body, overrides), update_id=update_id)

    def guest_message(
        self,
        text: str = "@example_blog_bot summarise this",
        *,
        chat: Mapping[str, Any] | None = None,
        user: Mapping[str, Any] | None = None,
        update_id: int | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """A ``guest_message``: a message that summoned this bot as a guest in a chat it
        is not a member of (answer with ``answerGuestQuery`` and ``guest_query_id``).

        Args:
            text: the message's text (it mentions the bot).
            chat: the chat (a Bot API ``Chat`` dict); default the factory's ``chat``.
            user: the user it comes from (a Bot API ``User`` dict); default the factory's
                ``user``.
            update_id: the ``update_id``; default the next one (:meth:`next_update_id`).
            overrides: fields merged into the update's object (nested dicts merged), e.g.
                ``message_thread_id=7``.
        """
        body = self._message_body(text, chat or self.group(), user, None)
        body["guest_query_id"] = self._next_numeric_id()
        return self.update("guest_message", merge(body, overrides), update_id=update_id)

    def poll_answer(
        self,
        option_ids: Iterable[int] = (0,),
        *,
        poll_id: str | None = None,
        user: Mapping[str, Any] | None = None,
        update_id: int | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """A ``poll_answer`` (no chat; ``user`` answered; empty ``option_ids`` = vote
        retracted). ``option_persistent_ids`` are ``"option-<id>"``.

        Args:
            option_ids: the chosen options' indexes (empty: the vote was retracted).
            poll_id: the poll's id; default a new one.
            user: who answered; default the factory's ``user``.
            update_id: the ``update_id``; default the next one (:meth:`next_update_id`).
            overrides: fields merged into the update's object (nested dicts merged), e.g.
                ``message_thread_id=7``.
        """
        chosen = list(option_ids)
        body = {
            "poll_id": poll_id or self._next_numeric_id(),
            "user": dict(user or self.user),
            "option_ids": chosen,
            "option_persistent_ids": [f"option-{i}" for i in chosen],  # Bot API 9.6
        }
        return self.update("poll_answer", merge(body, overrides), update_id=update_id)

    def message_reaction(
        self,
        emoji: str | Sequence[str] = "👍",
        *,
        old: str | Sequence[str] = (),
        message_id: int | None = None,
        chat: Mapping[str, Any] | None = None,
        user: Mapping[str, Any] | None = None,
        update_id: int | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """A ``message_reaction`` update: ``user`` changes their reaction on
        ``message_id`` (default the last message id handed out) from ``old`` to
        ``emoji`` (one emoji or several; empty = reaction removed).

        Args:
            emoji: the new reaction: one emoji or several (empty: the reaction was removed).
            old: the reaction before (empty: none).
            message_id: the message reacted to; default the last message id handed out.
            chat: the chat (a Bot API ``Chat`` dict); default the factory's ``chat``.
            user: who reacted; default the factory's ``user``.
            update_id: the ``update_id``; default the next one (:meth:`next_update_id`).
            overrides: fields merged into the update's object (nested dicts merged), e.g.
                ``message_thread_id=7``.
        """

        def reactions(value: str | Sequence[str]) -> list[dict[str, str]]:
            items = [value] if isinstance(value, str) else list(value)
            return [{"type": "emoji", "emoji": e} for e in items]

        body = {
            "chat": dict(chat or self.chat),
            "message_id": message_id if message_id is not None else self.next_message_id(),
            "user": dict(user or self.user),
            "date": self.now(),
            "old_reaction": reactions(old),
            "new_reaction": reactions(emoji),
        }
        return self.update("message_reaction", merge(body, overrides), update_id=update_id)

    # ------------------------------------------------------------------ recorded payloads

    def recorded(
        self,
        name_or_path: str | os.PathLike[str],
        *,
        renumber: bool = True,
        **overrides: Any,
    ) -> dict[str, Any]:
        """A recorded update: a shipped payload by name (``"callback_delete"``, see
        :func:`~telegram_idem.testing.fixture_names`) or any Update JSON file.

        Args:
            renumber: give it the factory's next ``update_id`` (so several copies are
                different updates); ``False`` keeps the recorded id.
            overrides: merged into the payload object, as for the other methods.
            name_or_path: a shipped payload's name (``"callback_delete"``) or the path of an
                Update JSON file.

        Raises:
            FileNotFoundError: no such fixture or file.
            ValueError: the file is not an Update with an integer ``update_id``.
        """
        text = os.fspath(name_or_path)
        bare = "/" not in text and os.sep not in text
        if bare and text.removesuffix(".json") in fixture_names():
            update = load_fixture(text)
        elif bare and not Path(text).exists():
            update = load_fixture(text)  # raises FileNotFoundError naming the fixtures
        else:
            update = load_update(text)
        kind = next(k for k in update if k != "update_id")
        if renumber:
            update["update_id"] = self._take_update_id(kind, None)
        if overrides:
            update[kind] = merge(update[kind], overrides)
        return update
