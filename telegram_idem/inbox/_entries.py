"""From a Bot API update to an inbox entry, and back: key, ordering unit, payload bytes.

Every ingress (webhook, polling, the framework adapters) builds its entries here, so one
rule decides how updates are ordered and how their bytes are kept:

- **ordering**: :class:`telegram_idem._ordering.Ordering`, the one rule every ingress shape
  uses (re-exported here); callback queries get a lane of their own (``<unit>:cbq``).
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
from collections.abc import Mapping
from typing import Any

from telegram_idem._context import Guard
from telegram_idem._keys import bounded_key
from telegram_idem._ordering import DEFAULT_ORDERING, Ordering, OrderingUnit
from telegram_idem._updates import validate_update
from telegram_idem.errors import MalformedUpdateError, PermanentUpdateError
from telegram_idem.inbox._base import NewEntry

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

REJECTED = "telegram_idem_rejected"
"""The field that marks the payload of a rejected update (see :func:`rejected_entry`)."""


def encode_update(update: Mapping[str, Any]) -> bytes:
    """The update as compact ASCII JSON bytes (lone surrogates kept as ``\\uXXXX``).

    Raises:
        TypeError, ValueError: a value JSON cannot encode (not from a parsed JSON body).
    """
    return json.dumps(update, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def new_entry(
    idem: Guard, update: dict[str, Any], *, bot_id: int, ordering: Ordering | None = None
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
    if unit is not None:
        unit = bounded_key(unit)  # odd or huge units (a template over callback data)
    return NewEntry(
        update_key=idem.keys.update(bot_id, update["update_id"]),
        ordering_key=unit,
        payload=encode_update(update),
    )


def rejected_entry(idem: Guard, raw: object, *, bot_id: int, error: str) -> NewEntry:
    """An entry that keeps something fetched as an update but unusable, for the operator.

    Its payload is ``{"telegram_idem_rejected": error, "raw": <raw as JSON, or its repr>}``
    (no ``update_id``: no framework ever sees it); the worker dead-letters it at its first
    take. Its id is the update's guard key when ``raw`` has an integer ``update_id`` (a
    re-fetch is then a duplicate), else ``<prefix>:<bot_id>:u:rejected:<hash of raw>``.

    Args:
        idem: the guard (its keys name the entry).
        raw: what was fetched: a dict, or anything else.
        bot_id: the bot it was fetched for.
        error: why it is unusable, for the operator.
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
