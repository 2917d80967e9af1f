"""Reading a Bot API ``Update`` (a JSON object) without any framework.

Source: Bot API, "Getting updates" → ``Update``: exactly one optional field besides
``update_id`` is present in each update. Types added after this list are passed through
untouched: :func:`update_type` names them, the shorthand readers return ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from telegram_idem.errors import MalformedUpdateError

__all__ = [
    "KNOWN_UPDATE_TYPES",
    "bot_id_from_token",
    "callback_data",
    "chat_id",
    "message_id",
    "ordering_key",
    "payload",
    "thread_id",
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
)
"""Update types of the Bot API ``Update`` object, in the order the Bot API lists them."""

_MESSAGE_LIKE = {
    "message",
    "edited_message",
    "channel_post",
    "edited_channel_post",
    "business_message",
    "edited_business_message",
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


def ordering_key(update: Mapping[str, Any]) -> str | None:
    """The unit of per-chat ordering: ``chat:<id>``, else ``user:<id>`` (inline queries,
    poll answers), else ``None``."""
    chat = chat_id(update)
    if chat is not None:
        return f"chat:{chat}"
    user = user_id(update)
    return f"user:{user}" if user is not None else None
