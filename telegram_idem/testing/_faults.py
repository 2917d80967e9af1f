"""Faults the fake Bot API can inject: what Telegram answers when things go wrong.

A :class:`Fault` says which calls it hits (a method, a chat, or every call of the bot),
how many times (``times``; ``None``: until cleared) and what the call gets instead of its
answer. Error answers have the Bot API's error shape (Bot API "Making requests":
``{"ok": false, "error_code", "description", "parameters"}``, where ``parameters`` is a
``ResponseParameters``: ``retry_after`` seconds or ``migrate_to_chat_id``). The transport
faults are the ambiguous cases of a send: the call takes effect and the connection is
closed without an answer (``drop``), or the answer comes only after a delay (``slow``).

Faults are plain data with a JSON form, so another process can inject them through the
fake's control endpoint (``POST /_fake/faults``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from http import HTTPStatus
from typing import Any

__all__ = [
    "BLOCKED",
    "MIGRATED",
    "NOT_MODIFIED",
    "QUERY_TOO_OLD",
    "Fault",
    "FaultKind",
    "matches_chat",
]

NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup are "
    "exactly the same as a current content and reply markup of the message"
)
"""Bot API 400 for an edit that changes nothing (text, entities and markup as they are)."""

QUERY_TOO_OLD = "Bad Request: query is too old and response timeout expired or query ID is invalid"
"""Bot API 400 for ``answerCallbackQuery`` past the answer window or with an unknown id."""

BLOCKED = "Forbidden: bot was blocked by the user"
"""Bot API 403 for any call to a private chat whose user blocked the bot."""

MIGRATED = "Bad Request: group chat was upgraded to a supergroup chat"
"""Bot API 400 for a call to a group that became a supergroup (``migrate_to_chat_id``)."""


class FaultKind(StrEnum):
    """What a fault does to the call it hits."""

    ERROR = "error"
    """Answer an error (``status``, ``description``, ``parameters``)."""
    DROP = "drop"
    """Close the connection without an answer (the client sees a disconnect)."""
    SLOW = "slow"
    """Answer normally, but only after ``delay`` seconds."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault. Build it with the class methods; fields are its JSON form.

    Attributes:
        kind: error, drop or slow.
        method: the Bot API method it hits (case-insensitive), ``None`` for every method.
        chat_id: the chat it hits (the call's ``chat_id``), ``None`` for every chat.
        times: calls it hits before it is used up; ``None`` until cleared.
        applied: whether the call takes effect before the fault (a message is stored and
            counted, then the error, the disconnect or the late answer).
        status: the HTTP status and ``error_code`` of an error.
        description: the error's ``description``.
        parameters: the error's ``ResponseParameters`` (``retry_after``,
            ``migrate_to_chat_id``), or ``None``.
        delay: seconds before a slow answer.
    """

    kind: FaultKind
    method: str | None = None
    chat_id: int | str | None = None
    times: int | None = 1
    applied: bool = False
    status: int = 0
    description: str = ""
    parameters: dict[str, Any] | None = field(default=None)
    delay: float = 0.0

    def __post_init__(self) -> None:
        if self.times is not None and self.times < 1:
            raise ValueError(f"times must be >= 1 (or None: until cleared), not {self.times}")
        if self.kind is FaultKind.ERROR and not 400 <= self.status <= 599:
            raise ValueError(f"an error fault needs an HTTP status 400-599, not {self.status}")
        if self.delay < 0:
            raise ValueError(f"delay must be >= 0 seconds, not {self.delay}")

    # ----------------------------------------------------------------- builders

    @classmethod
    def error(
        cls,
        status: int,
        description: str | None = None,
        *,
        method: str | None = None,
        chat_id: int | str | None = None,
        times: int | None = 1,
        applied: bool = False,
        parameters: dict[str, Any] | None = None,
    ) -> Fault:
        """Any error answer: HTTP ``status`` (400-599) with ``description`` (default: the
        HTTP reason phrase).

        Args:
            status: the HTTP status and ``error_code`` (400-599).
            description: the answer's ``description``; default the HTTP reason phrase.
            method: only calls of this Bot API method (case-insensitive); ``None``: any
                method.
            chat_id: only calls to this chat (``chat_id`` parameter, ``"123"`` is ``123``);
                ``None``: any chat.
            times: how many calls it answers before it is used up (≥ 1); ``None``: until
                cleared.
            applied: the call takes effect before the error answer (a lost success).
            parameters: the answer's ``parameters`` (``retry_after``,
                ``migrate_to_chat_id``), or ``None``.

        Raises:
            ValueError: another status, or ``times`` < 1.
        """
        text = description if description is not None else HTTPStatus(status).phrase
        return cls(
            FaultKind.ERROR,
            method=method,
            chat_id=chat_id,
            times=times,
            applied=applied,
            status=status,
            description=text,
            parameters=parameters,
        )

    @classmethod
    def retry_after(
        cls,
        seconds: int,
        *,
        method: str | None = None,
        chat_id: int | str | None = None,
        times: int | None = 1,
    ) -> Fault:
        """Flood control: 429 ``"Too Many Requests: retry after N"`` with
        ``parameters.retry_after`` = ``seconds`` (int, as Telegram sends it). With neither
        ``method`` nor ``chat_id`` it hits every call of the bot (aiogram raises
        ``TelegramRetryAfter``, python-telegram-bot ``RetryAfter``).

        Args:
            seconds: the wait Telegram asks for, seconds (``parameters.retry_after``).
            method: only calls of this Bot API method (case-insensitive); ``None``: any
                method.
            chat_id: only calls to this chat (``chat_id`` parameter, ``"123"`` is ``123``);
                ``None``: any chat.
            times: how many calls it answers before it is used up (≥ 1); ``None``: until
                cleared.
        """
        return cls.error(
            429,
            f"Too Many Requests: retry after {seconds}",
            method=method,
            chat_id=chat_id,
            times=times,
            parameters={"retry_after": int(seconds)},
        )

    @classmethod
    def drop(
        cls,
        *,
        method: str | None = None,
        chat_id: int | str | None = None,
        times: int | None = 1,
        applied: bool = True,
    ) -> Fault:
        """Accept, then drop: the call takes effect (unless ``applied=False``) and the
        connection is closed without an answer. The client cannot tell whether it was
        sent (aiogram raises ``TelegramNetworkError``, python-telegram-bot
        ``NetworkError``).

        Args:
            method: only calls of this Bot API method (case-insensitive); ``None``: any
                method.
            chat_id: only calls to this chat (``chat_id`` parameter, ``"123"`` is ``123``);
                ``None``: any chat.
            times: how many calls it answers before it is used up (≥ 1); ``None``: until
                cleared.
            applied: the call takes effect before the connection is closed (default);
                ``False``: it does not.
        """
        return cls(FaultKind.DROP, method=method, chat_id=chat_id, times=times, applied=applied)

    @classmethod
    def slow(
        cls,
        seconds: float,
        *,
        method: str | None = None,
        chat_id: int | str | None = None,
        times: int | None = 1,
    ) -> Fault:
        """The call takes effect at once; its answer comes after ``seconds`` (a client
        with a shorter timeout gives up: python-telegram-bot ``TimedOut``, aiogram
        ``TelegramNetworkError``).

        Args:
            seconds: how long the answer is held back, seconds (≥ 0).
            method: only calls of this Bot API method (case-insensitive); ``None``: any
                method.
            chat_id: only calls to this chat (``chat_id`` parameter, ``"123"`` is ``123``);
                ``None``: any chat.
            times: how many calls it answers before it is used up (≥ 1); ``None``: until
                cleared.

        Raises:
            ValueError: ``seconds`` < 0.
        """
        return cls(
            FaultKind.SLOW,
            method=method,
            chat_id=chat_id,
            times=times,
            applied=True,
            delay=float(seconds),
        )

    @classmethod
    def server_error(
        cls,
        status: int = 502,
        *,
        applied: bool = False,
        method: str | None = None,
        chat_id: int | str | None = None,
        times: int | None = 1,
    ) -> Fault:
        """A 5xx (500 "Internal Server Error", 502 "Bad Gateway", ...); ``applied`` says
        whether the call took effect before it.

        Args:
            status: the 5xx status.
            applied: the call takes effect before the error answer.
            method: only calls of this Bot API method (case-insensitive); ``None``: any
                method.
            chat_id: only calls to this chat (``chat_id`` parameter, ``"123"`` is ``123``);
                ``None``: any chat.
            times: how many calls it answers before it is used up (≥ 1); ``None``: until
                cleared.

        Raises:
            ValueError: a status outside 500-599.
        """
        if not 500 <= status <= 599:
            raise ValueError(f"a server error is 500-599, not {status}")
        return cls.error(status, method=method, chat_id=chat_id, times=times, applied=applied)

    @classmethod
    def blocked(cls, chat_id: int | str, *, times: int | None = None) -> Fault:
        """403 ``"Forbidden: bot was blocked by the user"`` for every call to ``chat_id``,
        until cleared (aiogram ``TelegramForbiddenError``, python-telegram-bot
        ``Forbidden``).

        Args:
            chat_id: the chat whose user blocked the bot.
            times: how many calls it answers before it is used up (≥ 1); ``None``: until
                cleared.
        """
        return cls.error(403, BLOCKED, chat_id=chat_id, times=times)

    @classmethod
    def not_modified(
        cls,
        *,
        method: str | None = "editMessageText",
        chat_id: int | str | None = None,
        times: int | None = 1,
    ) -> Fault:
        """400 "message is not modified" (:data:`NOT_MODIFIED`); the fake also answers it
        by itself when an edit sets the text and markup the message already has.

        Args:
            method: only calls of this method; default ``editMessageText`` (``None``: any).
            chat_id: only calls to this chat (``chat_id`` parameter, ``"123"`` is ``123``);
                ``None``: any chat.
            times: how many calls it answers before it is used up (≥ 1); ``None``: until
                cleared.
        """
        return cls.error(400, NOT_MODIFIED, method=method, chat_id=chat_id, times=times)

    @classmethod
    def query_too_old(cls, *, times: int | None = 1) -> Fault:
        """400 :data:`QUERY_TOO_OLD` for ``answerCallbackQuery`` (aiogram
        ``TelegramBadRequest``, python-telegram-bot ``BadRequest``).

        Args:
            times: how many calls it answers before it is used up (≥ 1); ``None``: until
                cleared.
        """
        return cls.error(400, QUERY_TOO_OLD, method="answerCallbackQuery", times=times)

    @classmethod
    def migrated(cls, chat_id: int | str, to_chat_id: int, *, times: int | None = None) -> Fault:
        """400 "group chat was upgraded to a supergroup chat" with
        ``parameters.migrate_to_chat_id`` = ``to_chat_id`` for every call to ``chat_id``,
        until cleared (aiogram ``TelegramMigrateToChat``, python-telegram-bot
        ``ChatMigrated``).

        Args:
            chat_id: the group that was upgraded.
            to_chat_id: the supergroup's id (``parameters.migrate_to_chat_id``).
            times: how many calls it answers before it is used up (≥ 1); ``None``: until
                cleared.
        """
        return cls.error(
            400,
            MIGRATED,
            chat_id=chat_id,
            times=times,
            parameters={"migrate_to_chat_id": int(to_chat_id)},
        )

    # ----------------------------------------------------------------- JSON form

    def to_json(self) -> dict[str, Any]:
        """The fault as a JSON object (the body of ``POST /_fake/faults``)."""
        data = asdict(self)
        data["kind"] = self.kind.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fault:
        """A fault from :meth:`to_json`'s form.

        Args:
            data: the JSON object (as :meth:`to_json` makes it).

        Raises:
            ValueError: unknown fields, a bad kind or bad values.
        """
        known = set(cls.__dataclass_fields__)
        extra = set(data) - known
        if extra:
            raise ValueError(f"unknown fault fields: {sorted(extra)}")
        try:
            kind = FaultKind(str(data.get("kind")))
        except ValueError as exc:
            raise ValueError(f"unknown fault kind {data.get('kind')!r}") from exc
        try:
            return cls(**{**data, "kind": kind})
        except TypeError as exc:
            raise ValueError(str(exc)) from exc

    # ----------------------------------------------------------------- matching

    def hits(self, method: str, chat_key: int | str | None) -> bool:
        """Whether a call of ``method`` to ``chat_key`` (``None``: no chat) is hit.

        Args:
            method: the call's method.
            chat_key: the call's chat (``None``: the call has no chat).
        """
        if self.method is not None and self.method.lower() != method.lower():
            return False
        return self.chat_id is None or matches_chat(self.chat_id, chat_key)

    def body(self) -> dict[str, Any]:
        """The error answer's JSON body (Bot API "Making requests")."""
        out: dict[str, Any] = {
            "ok": False,
            "error_code": self.status,
            "description": self.description,
        }
        if self.parameters:
            out["parameters"] = dict(self.parameters)
        return out


def matches_chat(wanted: int | str, chat_key: int | str | None) -> bool:
    """Whether a fault's ``chat_id`` names the chat of a call (``"123"`` is ``123``)."""
    if chat_key is None:
        return False
    return str(wanted) == str(chat_key)
