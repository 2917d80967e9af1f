"""What a Bot API call is and what its answer means: pure rules, no I/O.

Outcome classes (Bot API "Making requests": every answer is a JSON object with ``ok``;
on failure ``error_code``, ``description`` and optionally ``parameters``, a
ResponseParameters object with ``retry_after`` and ``migrate_to_chat_id``):

| class | when | what the relay does |
|---|---|---|
| ``DELIVERED`` | ``ok: true`` | record ``result`` |
| ``RETRY`` | 429 (``retry_after`` seconds, for the whole bot) | pause the bot, send again |
| ``MIGRATE`` | 400 with ``migrate_to_chat_id`` | send again to the new chat |
| ``ALREADY_DONE`` | "message is not modified", "message to delete not found" | record as done |
| ``EXPIRED`` | "query is too old and response timeout expired" | dead letter, no retry |
| ``BLOCKED`` | 403 (blocked, kicked, deactivated, can't initiate) | park the chat |
| ``PERMANENT`` | any other 4xx | dead letter with Telegram's description |
| ``AMBIGUOUS`` | 5xx; the connection broke or timed out after the request was written | policy |
| ``NOT_SENT`` | the request never left (connect refused, DNS) | send again |
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from telegram_idem.outbox._base import AmbiguousPolicy

__all__ = [
    "COLLAPSING_METHODS",
    "SAFE_TO_REPEAT",
    "Answer",
    "FileRef",
    "OutcomeClass",
    "Verdict",
    "call_digest",
    "classify",
    "collapse_key",
    "default_policy",
    "encode_params",
    "ordering_key_of",
]


class OutcomeClass(StrEnum):
    """What one answer (or its absence) means; see the module docstring."""

    DELIVERED = "delivered"
    RETRY = "retry"
    MIGRATE = "migrate"
    ALREADY_DONE = "already_done"
    EXPIRED = "expired"
    BLOCKED = "blocked"
    PERMANENT = "permanent"
    AMBIGUOUS = "ambiguous"
    NOT_SENT = "not_sent"


@dataclass(frozen=True, slots=True)
class Answer:
    """A Bot API answer as received (Bot API "Making requests").

    Attributes:
        ok: the answer's ``ok``.
        result: ``result`` when ``ok``.
        error_code: the HTTP-like code when not ``ok``.
        description: Telegram's human-readable description.
        retry_after: ``parameters.retry_after`` (seconds), if any.
        migrate_to_chat_id: ``parameters.migrate_to_chat_id``, if any.
    """

    ok: bool
    result: Any = None
    error_code: int | None = None
    description: str = ""
    retry_after: float | None = None
    migrate_to_chat_id: int | None = None

    @classmethod
    def from_json(cls, body: Mapping[str, Any], *, status: int = 200) -> Answer:
        """Read an answer body; a body without ``ok`` is a failure with ``status``.

        Args:
            body: the decoded JSON answer.
            status: the HTTP status it came with.
        """
        params = body.get("parameters") if isinstance(body.get("parameters"), Mapping) else {}
        assert isinstance(params, Mapping)
        retry = params.get("retry_after")
        migrate = params.get("migrate_to_chat_id")
        code = body.get("error_code", None if body.get("ok") is True else status)
        return cls(
            ok=body.get("ok") is True,
            result=body.get("result"),
            error_code=code if isinstance(code, int) else status,
            description=str(body.get("description", "")),
            retry_after=float(retry) if isinstance(retry, int | float) else None,
            migrate_to_chat_id=migrate if isinstance(migrate, int) else None,
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    """The class of an answer, and what it carries.

    Attributes:
        outcome: the outcome class (the module docstring's table).
        retry_after: seconds to wait before the next attempt (429), or ``None``.
        migrate_to_chat_id: the supergroup a migrated group became, or ``None``.
        description: Telegram's description of the failure (``""`` when delivered).
    """

    outcome: OutcomeClass
    retry_after: float | None = None
    migrate_to_chat_id: int | None = None
    description: str = ""


_ALREADY_DONE = (
    "message is not modified",
    "message to delete not found",
    "message can't be deleted",  # already gone or too old: nothing left to do
)
_EXPIRED = ("query is too old", "query id is invalid")


def classify(answer: Answer) -> Verdict:
    """The outcome class of an answer (the table of the module docstring). Never raises.

    Args:
        answer: the Bot API answer.
    """
    if answer.ok:
        return Verdict(OutcomeClass.DELIVERED)
    code = answer.error_code or 0
    text = answer.description
    low = text.lower()
    if code == 429 or answer.retry_after is not None:
        return Verdict(OutcomeClass.RETRY, retry_after=answer.retry_after or 1.0, description=text)
    if answer.migrate_to_chat_id is not None:
        return Verdict(
            OutcomeClass.MIGRATE, migrate_to_chat_id=answer.migrate_to_chat_id, description=text
        )
    if code >= 500:
        return Verdict(OutcomeClass.AMBIGUOUS, description=text)
    if code == 400 and any(s in low for s in _ALREADY_DONE):
        return Verdict(OutcomeClass.ALREADY_DONE, description=text)
    if code == 400 and any(s in low for s in _EXPIRED):
        return Verdict(OutcomeClass.EXPIRED, description=text)
    if code == 403:
        return Verdict(OutcomeClass.BLOCKED, description=text)
    return Verdict(OutcomeClass.PERMANENT, description=text)


SAFE_TO_REPEAT = frozenset(
    {
        "editMessageText",
        "editMessageCaption",
        "editMessageMedia",
        "editMessageReplyMarkup",
        "editMessageLiveLocation",
        "stopMessageLiveLocation",
        "deleteMessage",
        "deleteMessages",
        "answerCallbackQuery",
        "answerInlineQuery",
        "answerPreCheckoutQuery",
        "answerShippingQuery",
        "sendChatAction",
        "pinChatMessage",
        "unpinChatMessage",
        "unpinAllChatMessages",
        "setMessageReaction",
        "banChatMember",
        "unbanChatMember",
        "restrictChatMember",
        "promoteChatMember",
        "approveChatJoinRequest",
        "declineChatJoinRequest",
    }
)
"""Methods whose second application changes nothing a user sees: an edit to the same
content ("message is not modified"), a delete of a deleted message, an answer or a setter.
Their default ambiguous policy is ``resend``; every other method (``send*``,
``copyMessage``, ``forwardMessage``, invoices, anything unknown) defaults to ``hold``."""


def default_policy(method: str) -> AmbiguousPolicy:
    """``resend`` for :data:`SAFE_TO_REPEAT` and setters (``set*``), else ``hold``.

    Args:
        method: the Bot API method.
    """
    if method in SAFE_TO_REPEAT or method.startswith(("set", "get", "delete")):
        return AmbiguousPolicy.RESEND
    return AmbiguousPolicy.HOLD


COLLAPSING_METHODS = frozenset({"editMessageText", "editMessageCaption", "editMessageReplyMarkup"})
"""Pending edits of one message by one of these methods collapse to the newest."""


def collapse_key(method: str, params: Mapping[str, Any]) -> str | None:
    """``"<method>:<chat_id>:<message_id>"`` (or ``"<method>:inline:<inline_message_id>"``)
    for :data:`COLLAPSING_METHODS`, else ``None``. A text edit and a markup edit of one
    message do not collapse into each other: each carries different content.

    Args:
        method: the Bot API method.
        params: the call's parameters (Bot API names).
    """
    if method not in COLLAPSING_METHODS:
        return None
    if params.get("inline_message_id") is not None:
        return f"{method}:inline:{params['inline_message_id']}"
    chat, message = params.get("chat_id"), params.get("message_id")
    if chat is None or message is None:
        return None
    return f"{method}:{chat}:{message}"


def ordering_key_of(params: Mapping[str, Any]) -> str | None:
    """``"chat:<chat_id>"`` when the call names a chat (Bot API ``chat_id``: an integer or
    ``@channelusername``), else ``None``. The same unit the inbox orders a chat's
    updates by, so a chat's replies go out in the order its updates were processed.

    Args:
        params: the call's parameters (Bot API names).
    """
    chat = params.get("chat_id")
    if chat is None or isinstance(chat, bool):
        return None
    return f"chat:{chat}"


@dataclass(frozen=True, slots=True)
class FileRef:
    """A local file to upload when the call is sent, kept in the entry by its path.

    (Bot API "Sending files": a ``file_id`` or an HTTP URL is a plain string parameter
    and needs no reference.)

    Attributes:
        path: the local file's path, read when the call is sent.
    """

    path: str


FILE_FIELD = "telegram_idem_file"
"""How a :class:`FileRef` is spelled in stored params: ``{"telegram_idem_file": path}``."""


def _default(value: object) -> object:
    if isinstance(value, FileRef):
        return {FILE_FIELD: value.path}
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def encode_params(params: Mapping[str, Any]) -> bytes:
    """The params as compact ASCII JSON with sorted keys (``None`` values dropped, as the
    Bot API treats an absent parameter), :class:`FileRef` spelled as a reference.

    Args:
        params: the call's parameters (Bot API names).

    Raises:
        TypeError: a value JSON cannot encode (bytes, an open file, an object): nothing is
            stored. Upload bytes once and send the ``file_id``, or pass a ``FileRef``.
        ValueError: a float that is not finite, or a circular structure.
    """
    clean = {k: v for k, v in params.items() if v is not None}
    return json.dumps(
        clean,
        ensure_ascii=True,
        separators=(",", ":"),
        sort_keys=True,
        default=_default,
        allow_nan=False,
    ).encode("ascii")


def call_digest(method: str, params: bytes) -> str:
    """A short stable digest of a call's content (method + encoded params), for effect
    keys: 16 hex characters of SHA-256.

    Args:
        method: the Bot API method.
        params: the encoded parameters (:func:`encode_params`).
    """
    return hashlib.sha256(method.encode("utf-8", "surrogatepass") + b"\0" + params).hexdigest()[:16]
