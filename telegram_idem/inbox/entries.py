"""From a Bot API update to an inbox entry, and back: key, ordering unit, payload bytes.

Every ingress (webhook, polling, the framework adapters) builds its entries here, so one
rule decides how updates are ordered and how their bytes are kept:

- **ordering** (:class:`Ordering`): the unit is :func:`telegram_idem.updates.ordering_key`
  (chat, split by business connection and forum topic) or the bot author's own rule;
  callback queries get a lane of their own (``<unit>:cbq``) so a button tap is never
  answered late because a long job of its chat is running (Telegram shows an error when
  ``answerCallbackQuery`` does not come within about 15 s — Bot API,
  "answerCallbackQuery"). Taps stay in order among themselves.
- **payload**: JSON with ``ensure_ascii=True``, so any string Telegram can send — a lone
  UTF-16 surrogate escape (``"\\ud800"``) included — is kept losslessly as ASCII bytes.
- **rejected updates** (:func:`rejected_entry`): something polling fetched that is not an
  update or cannot be encoded is admitted as a marked entry the worker dead-letters at
  once (:func:`decode_payload` raises :class:`~telegram_idem.errors.PermanentUpdateError`),
  so it is kept for the operator and never stalls the offset.
"""

from __future__ import annotations

import hashlib
import json
import logging
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from telegram_idem.errors import (
    ConfigurationError,
    KeyTemplateError,
    MalformedUpdateError,
    PermanentUpdateError,
)
from telegram_idem.inbox.base import NewEntry
from telegram_idem.updates import ordering_key, update_type, validate_update

if TYPE_CHECKING:
    from telegram_idem.guard import Idem

__all__ = [
    "DEFAULT_ORDERING",
    "REJECTED",
    "Ordering",
    "OrderingUnit",
    "decode_payload",
    "encode_update",
    "new_entry",
    "rejected_entry",
]

log = logging.getLogger("telegram_idem.ingress")

OrderingUnit = str | Callable[[Mapping[str, Any]], "str | None"]
"""A key template over the update (``"chat:{chat_id}"``, the shorthands and dotted paths of
:mod:`telegram_idem.keys`), or a callable ``(update dict) -> str | None``."""

REJECTED = "telegram_idem_rejected"
"""The field that marks the payload of a rejected update (see :func:`rejected_entry`)."""


@dataclass(frozen=True, slots=True)
class Ordering:
    """How admitted updates are ordered: entries of one unit run one at a time, in
    admission order; different units run in parallel.

    Args:
        unit: the rule; ``None`` is :func:`telegram_idem.updates.ordering_key`. A template
            that names a field the update lacks, or a callable that returns ``None``,
            makes the update a unit of its own (not ordered with anything).
        callback_lane: put callback queries in the lane ``<unit>:cbq`` (default), so they
            never wait behind a long message job of their unit; ``False`` orders them with
            the messages of their unit (then a tap during a job longer than ~15 s is
            answered too late for Telegram).

    Raises:
        KeyTemplateError: ``unit`` is a malformed template.
    """

    unit: OrderingUnit | None = None
    callback_lane: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.unit, str):
            try:
                fields = [f for _, f, _, _ in string.Formatter().parse(self.unit) if f]
            except ValueError as exc:
                raise KeyTemplateError(
                    f"ordering template {self.unit!r}: {exc}", template=self.unit
                ) from None
            if not fields:
                raise KeyTemplateError(
                    f"ordering template {self.unit!r} names no field: every update would "
                    "share one unit",
                    template=self.unit,
                )

    def key(self, update: Mapping[str, Any]) -> str | None:
        """The ordering key of ``update`` (``None``: a unit of its own).

        Raises:
            ConfigurationError: a callable ``unit`` returned something other than a
                non-empty string or ``None``.
            Exception: whatever a callable ``unit`` raised.
        """
        base = self._unit(update)
        if base is not None and self.callback_lane and update_type(update) == "callback_query":
            return f"{base}:cbq"
        return base

    def _unit(self, update: Mapping[str, Any]) -> str | None:
        rule = self.unit
        if rule is None:
            return ordering_key(update)
        if isinstance(rule, str):
            from telegram_idem.keys import render_template

            try:
                return render_template(rule, update, bot_id=None)
            except KeyTemplateError:
                return None
        value = rule(update)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise ConfigurationError(
                f"the ordering rule {rule!r} returned {value!r}; it must return a non-empty "
                "string or None"
            )
        return value


DEFAULT_ORDERING = Ordering()
"""Chat (split by business connection and forum topic), callback queries in their own lane."""


def encode_update(update: Mapping[str, Any]) -> bytes:
    """The update as compact ASCII JSON bytes (lone surrogates kept as ``\\uXXXX``).

    Raises:
        TypeError, ValueError: a value JSON cannot encode (not from a parsed JSON body).
    """
    return json.dumps(update, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def new_entry(
    idem: Idem, update: dict[str, Any], *, bot_id: int, ordering: Ordering | None = None
) -> NewEntry:
    """The inbox entry for a validated update.

    A failing ordering rule never refuses the update: it is logged (ERROR) and the update
    becomes a unit of its own.

    Args:
        idem: the guard (its key builder names the entry).
        update: the update (``validate_update`` passed).
        bot_id: the bot it is for.
        ordering: the ordering rule (default :data:`DEFAULT_ORDERING`).

    Raises:
        TypeError, ValueError: the update holds a value JSON cannot encode.
    """
    rule = ordering or DEFAULT_ORDERING
    try:
        unit = rule.key(update)
    except Exception:
        log.exception(
            "ordering rule failed for update %s; it is admitted as a unit of its own",
            update.get("update_id"),
        )
        unit = None
    return NewEntry(
        update_key=idem.keys.update(bot_id, update["update_id"]),
        ordering_key=unit,
        payload=encode_update(update),
    )


def rejected_entry(idem: Idem, raw: object, *, bot_id: int, error: str) -> NewEntry:
    """An entry that keeps something fetched as an update but unusable, for the operator.

    Its payload is ``{"telegram_idem_rejected": error, "raw": <raw as JSON, or its repr>}``
    (no ``update_id``: no framework ever sees it); the worker dead-letters it at its first
    take. Its id is the update's guard key when ``raw`` has an integer ``update_id`` (a
    re-fetch is then a duplicate), else ``<prefix>:<bot_id>:u:rejected:<hash of raw>``.
    """
    try:
        body = json.loads(json.dumps(raw, ensure_ascii=True, default=repr))
    except (TypeError, ValueError):
        body = repr(raw)
    data = json.dumps({REJECTED: error, "raw": body}, ensure_ascii=True, separators=(",", ":"))
    uid = raw.get("update_id") if isinstance(raw, Mapping) else None
    if isinstance(uid, int) and not isinstance(uid, bool):
        key = idem.keys.update(bot_id, uid)
    else:
        digest = hashlib.sha256(data.encode("ascii")).hexdigest()[:24]
        key = f"{idem.keys.update(bot_id, 0)[:-1]}rejected:{digest}"
    return NewEntry(update_key=key, ordering_key=None, payload=data.encode("ascii"))


def decode_payload(payload: bytes) -> dict[str, Any]:
    """The update an entry holds.

    Raises:
        PermanentUpdateError: the payload is not JSON, not an update, or a rejected update
            (:func:`rejected_entry`) — retrying can never help.
    """
    try:
        obj = json.loads(payload)
    except (UnicodeDecodeError, ValueError) as exc:
        raise PermanentUpdateError(f"the entry's payload is not JSON: {exc}") from None
    if isinstance(obj, dict) and REJECTED in obj and "update_id" not in obj:
        raise PermanentUpdateError(f"rejected at admission: {obj[REJECTED]}")
    try:
        return validate_update(obj)
    except MalformedUpdateError as exc:
        raise PermanentUpdateError(f"the entry's payload is not an update: {exc}") from None
