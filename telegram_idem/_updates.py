"""Reading a Bot API ``Update`` (a JSON object) without any framework.

Source: Bot API, "Getting updates" → ``Update``: exactly one optional field besides
``update_id`` is present in each update. Types added after this list are passed through
untouched: :func:`update_type` names them, and the readers look for the usual ``chat`` /
``from`` / ``user`` fields in their payload (``None`` when absent).

The unit of per-chat ordering (:func:`ordering_key`) is the chat, split by business
connection and by forum topic; see its docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from telegram_idem.errors import MalformedUpdateError

__all__ = [
    "KNOWN_UPDATE_TYPES",
    "bot_id_from_token",
    "business_connection_id",
    "callback_data",
    "chat_id",
    "message_id",
    "ordering_key",
    "payload",
    "thread_id",
    "topic_id",
    "update_type",
    "user_id",
    "validate_update",
]

KNOWN_UPDATE_TYPES: tuple[str, ...] = (
    "message",
    "edited_message",
    "channel_post",
    "edited_channel_post",
    "business_connection",
    "business_message",
    "edited_business_message",
    "deleted_business_messages",
    "message_reaction",
    "message_reaction_count",
    "inline_query",
    "chosen_inline_result",
    "callback_query",
    "shipping_query",
    "pre_checkout_query",
    "purchased_paid_media",
    "poll",
    "poll_answer",
    "my_chat_member",
    "chat_member",
    "chat_join_request",
    "chat_boost",
    "removed_chat_boost",
    "managed_bot",
    "guest_message",
    "subscription",
)
"""Update types of the Bot API ``Update`` object, in the order the Bot API lists them
(``managed_bot``: ``ManagedBotUpdated``, Bot API 9.6; ``guest_message``: a ``Message``
sent to a guest bot, Bot API 10.0; ``subscription``: ``BotSubscriptionUpdated``, a user's
payment subscription changed — each carries the user in ``user`` or ``from``)."""

_MESSAGE_LIKE = {
    "message",
    "edited_message",
    "channel_post",
    "edited_channel_post",
    "business_message",
    "edited_business_message",
    "guest_message",
}


def validate_update(obj: object) -> dict[str, Any]:
    """Return ``obj`` as an update dict if it has an integer ``update_id``.

    Raises:
        MalformedUpdateError: ``obj`` is not a JSON object or ``update_id`` is missing or
            not an integer (booleans are not integers here).
    """
    if not isinstance(obj, dict):
        raise MalformedUpdateError(f"an update must be a JSON object, got {type(obj).__name__}")
    uid = obj.get("update_id")
    if not isinstance(uid, int) or isinstance(uid, bool):
        raise MalformedUpdateError("an update needs an integer 'update_id'")
    return obj


def bot_id_from_token(token: str) -> int:
    """The bot id: the number before ``:`` in a bot token (Bot API, "Authorizing your bot").

    Args:
        token: the bot token (``<bot id>:<secret>``).

    Raises:
        ConfigurationError: the token has no numeric part before ``:``.
    """
    from telegram_idem.errors import ConfigurationError

    head = token.split(":", 1)[0]
    if not head.isdigit():
        raise ConfigurationError("a bot token looks like '<bot_id>:<secret>'")
    return int(head)


def update_type(update: Mapping[str, Any]) -> str | None:
    """The name of the update's payload field (known or not), or ``None`` if it has none."""
    for name in KNOWN_UPDATE_TYPES:
        if name in update:
            return name
    for name in update:
        if name != "update_id":
            return name
    return None


def payload(update: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The update's payload object (the value of its one optional field), or ``None``."""
    kind = update_type(update)
    value = update.get(kind) if kind else None
    return value if isinstance(value, Mapping) else None


def _get(obj: Any, *path: str) -> Any:
    for part in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(part)
    return obj


def _message(update: Mapping[str, Any]) -> Mapping[str, Any] | None:
    kind = update_type(update)
    body = payload(update)
    if body is None:
        return None
    if kind in _MESSAGE_LIKE:
        return body
    if kind == "callback_query":
        msg = body.get("message")
        return msg if isinstance(msg, Mapping) else None
    return None


def chat_id(update: Mapping[str, Any]) -> int | None:
    """The chat the update belongs to, or ``None`` (inline queries, poll answers, …)."""
    msg = _message(update)
    if msg is not None:
        value = _get(msg, "chat", "id")
    else:
        value = _get(payload(update), "chat", "id")
    return value if isinstance(value, int) else None


def user_id(update: Mapping[str, Any]) -> int | None:
    """The user who caused the update (``from``, or ``user`` for poll answers and
    reactions), or ``None`` (channel posts)."""
    body = payload(update)
    for path in (("from", "id"), ("user", "id")):
        value = _get(body, *path)
        if isinstance(value, int):
            return value
    return None


def message_id(update: Mapping[str, Any]) -> int | None:
    """The message id (for a callback query: the id of the message carrying the button)."""
    value = _get(_message(update), "message_id")
    if value is None:
        value = _get(payload(update), "message_id")
    return value if isinstance(value, int) else None


def thread_id(update: Mapping[str, Any]) -> int | None:
    """The forum topic (``message_thread_id``) of the update's message, or ``None``."""
    value = _get(_message(update), "message_thread_id")
    return value if isinstance(value, int) else None


def callback_data(update: Mapping[str, Any]) -> str | None:
    """The ``data`` of a callback query, or ``None``."""
    if update_type(update) != "callback_query":
        return None
    value = _get(payload(update), "data")
    return value if isinstance(value, str) else None


def business_connection_id(update: Mapping[str, Any]) -> str | None:
    """The business connection the update came through (``business_connection_id`` of a
    business message, a callback query on one, deleted business messages; the ``id`` of a
    ``business_connection`` update), or ``None``. Bot API, "BusinessConnection"."""
    body = payload(update)
    if update_type(update) == "business_connection":
        value = _get(body, "id")
    else:
        value = _get(_message(update), "business_connection_id")
        if value is None:
            value = _get(body, "business_connection_id")
    return value if isinstance(value, str) and value else None


def topic_id(update: Mapping[str, Any]) -> int | None:
    """The forum topic of the update's message: its ``message_thread_id`` when the message
    is a topic message (``is_topic_message``) or its chat is a forum (``chat.is_forum``);
    ``None`` otherwise — a reply thread of a plain group is not a topic. Bot API,
    "Message" and "Chat"."""
    msg = _message(update)
    if msg is None or not (msg.get("is_topic_message") is True or _get(msg, "chat", "is_forum")):
        return None
    value = msg.get("message_thread_id")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def ordering_key(update: Mapping[str, Any]) -> str | None:
    """The default unit of per-chat ordering.

    ``chat:<chat id>``, else ``user:<user id>`` (inline queries, poll answers, …), else
    ``None`` (no ordering: the update is a unit of its own); then

    - ``:topic:<message_thread_id>`` for a message in a forum topic (:func:`topic_id`), so
      topics of one forum never wait for each other;
    - prefixed by ``biz:<business_connection_id>:`` for business updates, so a customer
      writing to two businesses served by one bot is two units.

    E.g. ``chat:42``, ``chat:-1001:topic:20``, ``biz:AbC:chat:42``, ``user:7``. The inbox
    can use another rule and puts callback queries in a lane of their own:
    :class:`telegram_idem._ordering.Ordering`.
    """
    chat = chat_id(update)
    if chat is not None:
        unit = f"chat:{chat}"
    else:
        user = user_id(update)
        if user is None:
            return None
        unit = f"user:{user}"
    topic = topic_id(update)
    if topic is not None:
        unit += f":topic:{topic}"
    biz = business_connection_id(update)
    return f"biz:{biz}:{unit}" if biz is not None else unit
