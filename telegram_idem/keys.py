"""Idempotency keys: one key builder for every boundary, and key templates over updates.

Key layout (``prefix`` defaults to ``"idem"``)::

    {prefix}:{bot_id}:u:{update_id}          update guard
    {prefix}:{bot_id}:a:{action}             action guard (@idempotent)
    {prefix}:{bot_id}:a:{action}:s:{step}    side-effect step inside an action
    {prefix}:{bot_id}:l:{name}               lock
    {prefix}:{bot_id}:cb:{token_id}          callback token payload

Templates are ``str.format``-style with dotted paths rooted at the update, e.g.
``"approve:{callback_query.message.message_id}:{callback_query.from.id}"``, plus the
shorthands ``{bot_id}``, ``{chat_id}``, ``{user_id}``, ``{message_id}``, ``{thread_id}``,
``{callback_data}`` resolved from whichever update type arrived.
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from telegram_idem import updates as _u
from telegram_idem.errors import KeyTemplateError

__all__ = ["KeyBuilder", "KeySource", "fingerprint", "render_template"]

KeySource = str | Callable[[Mapping[str, Any]], str]
"""A key template, or a callable taking the update dict and returning the key."""

_SHORTHANDS: dict[str, Callable[[Mapping[str, Any]], object]] = {
    "chat_id": _u.chat_id,
    "user_id": _u.user_id,
    "message_id": _u.message_id,
    "thread_id": _u.thread_id,
    "callback_data": _u.callback_data,
}
_FORMATTER = string.Formatter()


def _resolve(update: Mapping[str, Any], field: str, bot_id: int | None, template: str) -> object:
    if field == "bot_id":
        value: object = bot_id
    elif field in _SHORTHANDS:
        value = _SHORTHANDS[field](update)
    else:
        value = update
        for part in field.split("."):
            if isinstance(value, Mapping) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                value = None
                break
    if value is None or isinstance(value, (Mapping, list)):
        kind = _u.update_type(update)
        raise KeyTemplateError(
            f"key template {template!r}: field {{{field}}} is absent from this "
            f"{kind or 'empty'} update (update_id={update.get('update_id')})",
            template=template,
            field=field,
        )
    return value


def render_template(template: str, update: Mapping[str, Any], *, bot_id: int | None) -> str:
    """Format ``template`` against ``update``.

    Args:
        template: e.g. ``"pay:{message.successful_payment.telegram_payment_charge_id}"``.
        update: the Bot API update as a dict (field names as the Bot API spells them,
            ``from`` included).
        bot_id: the bot's id, for ``{bot_id}``.

    Raises:
        KeyTemplateError: the template is malformed or names a field the update lacks
            (never a key with ``None`` in it).
    """
    try:
        parts = list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise KeyTemplateError(f"bad key template {template!r}: {exc}", template=template) from exc
    out: list[str] = []
    for literal, field, spec, conversion in parts:
        out.append(literal)
        if field is None:
            continue
        if not field or conversion:
            raise KeyTemplateError(
                f"bad key template {template!r}: use named fields without conversions",
                template=template,
                field=field or None,
            )
        value = _resolve(update, field, bot_id, template)
        try:
            out.append(format(value, spec or ""))
        except (ValueError, TypeError) as exc:
            raise KeyTemplateError(
                f"bad key template {template!r}: format spec {spec!r} of {{{field}}}: {exc}",
                template=template,
                field=field,
            ) from exc
    return "".join(out)


def fingerprint(value: object) -> str:
    """SHA-256 (hex, first 32 chars) of the canonical JSON of ``value``.

    Raises:
        TypeError: ``value`` is not JSON-serialisable.
    """
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class KeyBuilder:
    """Builds every key the library stores, so all boundaries share one layout.

    Args:
        prefix: namespace for all keys (give tests and tenants their own).
    """

    prefix: str = "idem"

    def update(self, bot_id: int, update_id: int) -> str:
        """Key of the update guard for ``(bot_id, update_id)``."""
        return f"{self.prefix}:{bot_id}:u:{update_id}"

    def action(self, bot_id: int, action: str) -> str:
        """Key of an action (the rendered template)."""
        return f"{self.prefix}:{bot_id}:a:{action}"

    def step(self, action_key: str, name: str) -> str:
        """Key of a named side-effect step inside the action ``action_key``."""
        return f"{action_key}:s:{name}"

    def lock(self, bot_id: int, name: str) -> str:
        """Key of a lock."""
        return f"{self.prefix}:{bot_id}:l:{name}"

    def callback(self, bot_id: int, token_id: str) -> str:
        """Key of a callback token's server-side payload."""
        return f"{self.prefix}:{bot_id}:cb:{token_id}"
