"""What the reconciliation commands share (``outbox`` and ``unresolved``): a JSON value
given on the command line, the check that a result fits the Bot API method it settles,
entry ages and chat names for people.

A result given to settle an unknown send is replayed to the code that made the call as if
Telegram had answered it, and the framework adapters build their objects from it
(docs/outbound.md, "Operating it"), so :func:`result_problem` refuses what the method
could not have returned: a ``send…`` method, ``forwardMessage`` and the edits answer a
Bot API ``Message`` (at least ``message_id``, ``date`` and ``chat`` with its ``id`` and
``type``), ``copyMessage`` a ``MessageId``, ``sendMediaGroup`` a list of messages; any
other method (most answer ``true``) takes any JSON value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click
from rich.text import Text

from telegram_idem._cli._common import redact_text

__all__ = [
    "JsonText",
    "age_text",
    "chat_of",
    "decode_json",
    "json_value",
    "ordering_key_of_chat",
    "plain",
    "result_problem",
]


@dataclass(frozen=True, slots=True)
class JsonText:
    """A JSON value given on the command line (``value`` may be ``None``: JSON ``null``)."""

    value: Any


def json_value(ctx: click.Context, param: click.Parameter, value: str | None) -> JsonText | None:
    """A click callback: the option's text decoded as one JSON document into
    :class:`JsonText` (``None`` when the option is not given).

    Raises:
        click.BadParameter: it is not JSON (a usage error: exit 2).
    """
    if value is None:
        return None
    try:
        return JsonText(json.loads(value))
    except ValueError as exc:
        raise click.BadParameter(f"not JSON ({exc}): {value!r}", ctx=ctx, param=param) from None


def decode_json(data: bytes | None) -> Any:
    """``data`` (stored JSON bytes) decoded, ``None`` for none, or its text when it is not
    JSON. Never raises."""
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")


_TRUE_SENDS = frozenset({"sendChatAction", "sendGift", "sendMessageDraft"})
"""``send…`` methods that answer ``true``, not a message."""
_MESSAGE_OR_TRUE = frozenset(
    {
        "editMessageText",
        "editMessageCaption",
        "editMessageMedia",
        "editMessageReplyMarkup",
        "editMessageLiveLocation",
        "editMessageChecklist",
        "stopMessageLiveLocation",
        "setGameScore",
    }
)
"""Methods that answer the edited ``Message``, or ``true`` for an inline message."""
_MESSAGE_IDS = frozenset({"copyMessages", "forwardMessages"})


def _message_problem(value: Any, chat_id: object) -> str | None:
    """Why ``value`` is not a Bot API ``Message`` of chat ``chat_id``, or ``None``."""
    if not isinstance(value, Mapping):
        return f"a Message object is needed, got {type(value).__name__}"
    for field in ("message_id", "date"):
        if not _is_int(value.get(field)):
            return f"a Message needs an integer {field!r}"
    chat = value.get("chat")
    if not isinstance(chat, Mapping) or not _is_int(chat.get("id")):
        return "a Message needs 'chat' with an integer 'id'"
    if not isinstance(chat.get("type"), str):
        return "a Message needs 'chat' with its 'type' (private, group, supergroup, channel)"
    if _is_int(chat_id) and chat["id"] != chat_id:
        return f"the message's chat.id {chat['id']} is not the call's chat_id {chat_id}"
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def result_problem(method: str, params: Mapping[str, Any], value: Any) -> str | None:
    """Why ``value`` cannot be what Telegram returned for ``method`` called with
    ``params``, or ``None`` when it can (see the module docstring). Never raises."""
    chat_id = params.get("chat_id")
    if method == "sendMediaGroup":
        if not isinstance(value, list) or not value:
            return "sendMediaGroup returns a non-empty list of Message objects"
        for item in value:
            problem = _message_problem(item, chat_id)
            if problem is not None:
                return problem
        return None
    if method == "copyMessage":
        if not isinstance(value, Mapping) or not _is_int(value.get("message_id")):
            return 'copyMessage returns a MessageId object: {"message_id": <int>}'
        return None
    if method in _MESSAGE_IDS:
        if not isinstance(value, list) or not all(
            isinstance(v, Mapping) and _is_int(v.get("message_id")) for v in value
        ):
            return f'{method} returns a list of MessageId objects: [{{"message_id": <int>}}]'
        return None
    if method in _MESSAGE_OR_TRUE:
        if value is True:
            return None
        problem = _message_problem(value, chat_id)
        return None if problem is None else f"{method} returns a Message or true: {problem}"
    if method == "forwardMessage" or (method.startswith("send") and method not in _TRUE_SENDS):
        problem = _message_problem(value, chat_id)
        return None if problem is None else f"{method} returns a Message: {problem}"
    return None


def chat_of(ordering_key: str, key: str) -> str:
    """The chat an entry goes to, for people: ``42`` for ``chat:42``, ``-`` for a call of
    its own (its ordering key is its key), else the ordering key. Never raises."""
    if ordering_key == key:
        return "-"
    return ordering_key.removeprefix("chat:")


def ordering_key_of_chat(chat: str) -> str:
    """The ordering key an operator means by ``chat``: ``42``, ``-100123`` or ``@name``
    → ``chat:<chat>``; ``chat:42`` (or any other ordering key) as it is. Never raises."""
    text = chat.strip()
    if text.lstrip("-").isdigit() or text.startswith("@"):
        return f"chat:{text}"
    return text


def age_text(seconds: float) -> str:
    """``seconds`` for people: ``12.5 s``, ``4 min``, ``3 h 20 min``, ``2 d 5 h``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def plain(text: str) -> Text:
    """``text`` to print as it is (no rich markup or ``:emoji:`` codes, which keys such as
    ``…:o:receipt:1`` would trigger), redacted."""
    return Text(redact_text(text))
