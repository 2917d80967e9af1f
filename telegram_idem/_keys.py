"""Idempotency keys: one key builder for every boundary, and key templates over updates.

Key layout (``prefix`` defaults to ``"idem"``)::

    {prefix}:{bot_id}:u:{update_id}          update guard
    {prefix}:{bot_id}:a:{action}             action guard (@idempotent)
    {prefix}:{bot_id}:a:{action}:s:{step}    side-effect step inside an action's first run
    {prefix}:{bot_id}:a:{action}:r{n}:s:{step}  the same in a later run ``n`` of the key
    {prefix}:{bot_id}:l:{name}               lock
    {prefix}:{bot_id}:o:{name}               outbox call (effect key given by the caller)
    {action or step key}:o:{digest}:{n}      outbox call made inside an action or step
    {prefix}:{bot_id}:f:{scope}              flood-control budget
    {prefix}:{bot_id}:cb:{token_id}          callback token payload

Templates are ``str.format``-style with dotted paths rooted at the update, e.g.
``"approve:{callback_query.message.message_id}:{callback_query.from.id}"``, plus the
shorthands ``{bot_id}``, ``{chat_id}``, ``{user_id}``, ``{message_id}``, ``{thread_id}``,
``{callback_data}`` resolved from whichever update type arrived.

Every key is bounded (:func:`bounded_key`): a key longer than :data:`MAX_KEY_BYTES`
(UTF-8), or one no store driver takes as it is (a lone surrogate, NUL), is stored as its
first :data:`KEY_PREFIX_BYTES` bytes (odd characters escaped), ``":h:"`` and the SHA-256
of the whole key, so every store accepts it (PostgreSQL's index limit is about 2.7 KB
and its ``text`` holds no NUL, DynamoDB's partition key 2 KB, no driver encodes a
surrogate) and it stays readable in logs.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from telegram_idem import _updates as _u
from telegram_idem.errors import KeyTemplateError

__all__ = [
    "KEY_PREFIX_BYTES",
    "MAX_KEY_BYTES",
    "KeyBuilder",
    "KeySource",
    "bounded_key",
    "fingerprint",
    "render_key",
    "render_template",
]

KeySource = str | Callable[[Mapping[str, Any]], str]
"""A key template, or a callable taking the update dict and returning the key."""

MAX_KEY_BYTES = 1024
"""Keys up to this many UTF-8 bytes are stored as they are; longer ones are hashed."""

KEY_PREFIX_BYTES = 200
"""How much of a hashed key is kept readable (UTF-8 bytes, cut at a character)."""


def bounded_key(key: str) -> str:
    """A key every store can hold, for any ``str``: ``key`` itself when it is at most
    :data:`MAX_KEY_BYTES` bytes of strict UTF-8 without NUL; otherwise a readable head +
    ``":h:"`` + the SHA-256 (hex) of the whole key.

    The head is the key's first :data:`KEY_PREFIX_BYTES` UTF-8 bytes (cut at a character)
    with lone surrogates (``"\\ud800"``, a valid JSON escape that is not UTF-8) and NUL
    (which PostgreSQL ``text`` cannot hold) spelled as backslash escapes; the hash is
    taken over the key's ``surrogatepass`` encoding, so distinct keys stay distinct (a key
    that spells the escape out is another key).

    Deterministic and idempotent (a bounded key is returned unchanged), so it is applied
    wherever a key enters a store. Never raises.
    """
    if len(key) <= MAX_KEY_BYTES and key.isascii() and "\x00" not in key:
        return key  # the common case, decided without encoding
    raw = key.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_KEY_BYTES and "\x00" not in key and _is_utf8(key):
        return key
    return f"{_readable_head(key)}:h:{hashlib.sha256(raw).hexdigest()}"


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _readable_head(key: str) -> str:
    """The first :data:`KEY_PREFIX_BYTES` bytes of ``key`` as strict UTF-8 without NUL."""
    head = key[:KEY_PREFIX_BYTES]  # enough characters: each is at least one byte
    escaped = head.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return escaped.encode("utf-8")[:KEY_PREFIX_BYTES].decode("utf-8", "ignore")


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


def render_key(source: KeySource, update: Mapping[str, Any], *, bot_id: int | None) -> str:
    """The action key ``source`` gives for ``update``: a template rendered by
    :func:`render_template`, or the callable's return value.

    Raises:
        KeyTemplateError: the template fails (see :func:`render_template`), or the
            callable returned anything but a non-empty ``str`` (``None`` would make one
            key shared by unrelated updates).
    """
    if not callable(source):
        key = render_template(source, update, bot_id=bot_id)
        if not key:
            raise KeyTemplateError(
                f"key template {source!r} rendered an empty key", template=source
            )
        return key
    key = source(update)
    if not isinstance(key, str) or not key:
        name = getattr(source, "__qualname__", repr(source))
        raise KeyTemplateError(
            f"key callable {name} returned {key!r} for update_id="
            f"{update.get('update_id')}; it must return a non-empty str",
            template=name,
        )
    return key


_SUBKEY = re.compile(r":(?=(?:s|o|h)(?::|$)|r\d+(?::s:|$))")
"""A ``:`` that starts, or would start once a step's ``:s:<name>`` is appended, a key
inside an action (``:s:``, ``:o:``, ``:r<n>:s:``) or a bounded key's ``:h:`` part."""


def escape_action(name: str) -> str:
    """``name`` unless it holds a backslash or a sub-key separator (``:s:``, ``:o:``,
    ``:h:``, ``:r<n>:s:``, or one of them cut off at the end: ``…:r3``, ``…:s``); then
    backslashes doubled and a backslash put after each such ``:``. Injective (distinct
    names give distinct results); never raises."""
    if "\\" not in name and not _SUBKEY.search(name):
        return name
    return _SUBKEY.sub(":\\\\", name.replace("\\", "\\\\"))


def fingerprint(value: object) -> str:
    """SHA-256 (hex, first 32 chars) of the canonical JSON of ``value``.

    Args:
        value: what to fingerprint (JSON-serialisable).

    Raises:
        TypeError: ``value`` is not JSON-serialisable.
    """
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class KeyBuilder:
    """Builds every key the library stores, so all boundaries share one layout.

    Every key it returns is bounded (:func:`bounded_key`).

    Args:
        prefix: namespace for all keys (give tests and tenants their own).
    """

    prefix: str = "idem"

    def update(self, bot_id: int, update_id: int) -> str:
        """Key of the update guard for ``(bot_id, update_id)``.

        Args:
            bot_id: the bot's id.
            update_id: the update's ``update_id``.
        """
        return bounded_key(f"{self.prefix}:{bot_id}:u:{update_id}")

    def action(self, bot_id: int, action: str) -> str:
        """Key of an action (the rendered template).

        The name is kept as it is unless it could spell a key *inside* another action
        (a step ``:s:``, a later run's step ``:r<n>:s:``, an outbox call ``:o:``): a
        template over user text (``{callback_data}``, ``{message.text}``) must never
        steer an action onto another action's step record. Such a name is escaped
        injectively by :func:`escape_action` (a backslash before those separators, and
        backslashes doubled), so distinct names keep distinct keys.

        Args:
            bot_id: the bot's id.
            action: the action's name (a rendered key template).
        """
        return bounded_key(f"{self.prefix}:{bot_id}:a:{escape_action(action)}")

    def step(self, action_key: str, name: str, epoch: int = 0) -> str:
        """Key of a named side-effect step inside the action ``action_key``.

        Args:
            action_key: the running action's (or step's) full key.
            name: the step's name, unique within its action.
            epoch: the action run's identity
                (:attr:`~telegram_idem._context.ActionContext.epoch`): ``0`` for the
                key's first run (``<action>:s:<name>``), ``n`` for a later one
                (``<action>:r<n>:s:<name>``), so a step recorded by an earlier run of
                the action key is never replayed into a new run.
        """
        if epoch:
            return bounded_key(f"{action_key}:r{epoch}:s:{name}")
        return bounded_key(f"{action_key}:s:{name}")

    def lock(self, bot_id: int, name: str) -> str:
        """Key of a lock.

        Args:
            bot_id: the bot's id.
            name: the lock's name.
        """
        return bounded_key(f"{self.prefix}:{bot_id}:l:{name}")

    def effect(self, bot_id: int, name: str) -> str:
        """The effect key of an outbox call named by the caller (outside an action).

        Args:
            bot_id: the bot's id.
            name: the name the caller gave the call.
        """
        return bounded_key(f"{self.prefix}:{bot_id}:o:{name}")

    def call(self, action_key: str, digest: str, n: int) -> str:
        """The effect key of the ``n``-th call (from 0) with content ``digest`` made inside
        the action or step ``action_key``.

        Args:
            action_key: the key of the action or step making the call.
            digest: the call's content digest (:func:`~telegram_idem.outbox.call_digest`).
            n: which call with that content, from 0.
        """
        return bounded_key(f"{action_key}:o:{digest}:{n}")

    def flood(self, bot_id: int, scope: str) -> str:
        """The key of a flood-control budget (``global``, ``chat:<id>``, ``pause``...).

        Args:
            bot_id: the bot's id.
            scope: the budget's scope (``global``, ``chat:<id>``, ``pause``…).
        """
        return bounded_key(f"{self.prefix}:{bot_id}:f:{scope}")

    def callback(self, bot_id: int, token_id: str) -> str:
        """Key of a callback token's server-side payload.

        Args:
            bot_id: the bot's id.
            token_id: the callback token's id.
        """
        return bounded_key(f"{self.prefix}:{bot_id}:cb:{token_id}")
