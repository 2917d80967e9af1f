"""The webhook request checks, without any HTTP framework: ``(method, headers, body)`` in,
an update or a refusal with its status out.

Every webhook shell (the aiohttp ones in :mod:`telegram_idem.ingress`, aiogram's and
PTB's request handlers, the AWS Lambda handler) hands its request to these functions and
turns a :class:`Refusal` into its framework's answer, so every shell refuses the same
requests with the same status. Source: Bot API, ``setWebhook``: the
``X-Telegram-Bot-Api-Secret-Token`` header carries the ``secret_token`` given at
``setWebhook``; the body is a JSON-serialised ``Update``. The secret rule (required unless
opted out, rotation) is :mod:`telegram_idem._webhook_secret`'s; the table for every
ingress shape is ``docs/answers.md``.

| request (checked in this order)                        | answer                     |
|--------------------------------------------------------|----------------------------|
| method not ``POST``                                    | 405 (``Allow: POST``)      |
| secret header missing or wrong                         | 401                        |
| body over ``max_body`` bytes (declared or read)        | 413                        |
| body not complete within ``read_timeout`` s            | 408 (streaming shells)     |
| base64 body that is not valid base64                   | 400 (gateways that encode) |
| not JSON (not UTF-8/16/32, ``NaN``, nesting too deep)  | 400                        |
| JSON without an integer ``update_id`` (bools are not)  | 400                        |
| JSON with an integer ``update_id``                     | the update: admit it       |

The secret header is looked up in any ASCII case (Lambda Function URLs deliver header
names in lower case); a value that is not valid UTF-8 is simply a wrong secret, and so is
a secret header sent twice (its values joined with ``,``). A body of
exactly ``max_body`` bytes is read; one byte more is refused. The 408 row belongs to the
shells that stream the body (aiohttp): they time the read with ``read_timeout`` (default
:data:`DEFAULT_READ_TIMEOUT`) and answer :data:`BODY_INCOMPLETE`; a ``Content-Length``
larger than ``max_body`` is refused before reading (pass it to
:func:`check_request_head`), and a body that keeps coming past its bound is refused after
``max_body + 1`` bytes (:func:`body_too_large`), whatever ``Content-Length`` claimed.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from telegram_idem._updates import validate_update
from telegram_idem._webhook_secret import SECRET_HEADER, SecretCheck
from telegram_idem.errors import MalformedUpdateError

__all__ = [
    "BODY_INCOMPLETE",
    "DEFAULT_MAX_BODY",
    "DEFAULT_READ_TIMEOUT",
    "SECRET_HEADER",
    "Refusal",
    "SecretCheck",
    "WebhookRequest",
    "WebhookUpdate",
    "body_too_large",
    "check_request_body",
    "check_request_head",
    "check_webhook_request",
    "header",
]

DEFAULT_MAX_BODY = 1024 * 1024
"""1 MiB: far above any real update, small enough to refuse abuse."""
DEFAULT_READ_TIMEOUT = 10.0
"""Seconds a request body may take to arrive in full (Telegram sends it at once)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request that is not an update, and how to answer it.

    Attributes:
        status: the HTTP status to answer (405, 401, 413, 408 or 400).
        reason: the answer's text body, one line of plain text (also fit for a log line).
        headers: headers the answer must carry (``Allow: POST`` with a 405).
        size: for a 413, the body size in bytes that was refused (declared or read so
            far), else ``None``.
        limit: for a 413, the ``max_body`` it exceeded, in bytes, else ``None``.
    """

    status: int
    reason: str
    headers: Mapping[str, str] = field(default_factory=dict)
    size: int | None = None
    limit: int | None = None


@dataclass(frozen=True, slots=True)
class WebhookUpdate:
    """A request that carries an update.

    Attributes:
        update: the update, a Bot API dict with an integer ``update_id``.
        body: the body's bytes as received (after base64 decoding, if any).
    """

    update: dict[str, Any]
    body: bytes

    @property
    def update_id(self) -> int:
        """The update's ``update_id``."""
        uid: int = self.update["update_id"]
        return uid


WebhookRequest = WebhookUpdate | Refusal
"""What :func:`check_webhook_request` makes of a request."""

BODY_INCOMPLETE = Refusal(408, "request body incomplete")
"""The answer of a streaming shell whose body did not arrive within ``read_timeout``."""

_NOT_POST = Refusal(405, "POST only", headers={"Allow": "POST"})
_WRONG_SECRET = Refusal(401, "wrong or missing secret token")
_NOT_JSON = Refusal(400, "body is not JSON")
_NOT_BASE64 = Refusal(400, "body is not valid base64")


def body_too_large(max_body: int, size: int | None = None) -> Refusal:
    """The 413 refusal of a body over ``max_body`` bytes.

    Args:
        max_body: the bound, bytes.
        size: the body size refused, bytes, when known (a streaming shell knows only
            that it read ``max_body + 1``).
    """
    return Refusal(413, f"body too large (over {max_body} bytes)", size=size, limit=max_body)


def header(headers: Mapping[str, str], name: str) -> str | None:
    """The value of header ``name`` in ``headers``, its name matched in any ASCII case.

    A header sent more than once is one value, its values joined with ``,`` (RFC 9110,
    section 5.3; what Lambda Function URLs deliver), so two secret headers are never a
    valid secret, whichever shell reads them.

    Args:
        headers: the request's headers: a case-insensitive multidict (aiohttp; every
            value of ``name`` is read with its ``getall``) or a plain mapping in whatever
            case the platform delivers (Lambda: lower case).
        name: the header's name.

    Returns:
        The value, or ``None`` if no string value is there.
    """
    getall = getattr(headers, "getall", None)
    if callable(getall):
        found: list[object] = list(getall(name, ()))
    else:
        wanted = name.lower()
        found = [v for k, v in headers.items() if isinstance(k, str) and _ascii_lower(k) == wanted]
    values = [v for v in found if isinstance(v, str)]
    return ",".join(values) if values else None


def _ascii_lower(text: str) -> str | None:
    """``text`` in lower case if it is ASCII; ``None`` otherwise (so that U+212A, the
    Kelvin sign, which ``str.lower`` turns into ``k``, never passes for a header name)."""
    return text.lower() if text.isascii() else None


def check_request_head(
    method: str | None,
    headers: Mapping[str, str],
    *,
    secret: SecretCheck,
    max_body: int = DEFAULT_MAX_BODY,
    content_length: int | None = None,
) -> Refusal | None:
    """The checks a request passes before its body is read: method, secret, declared size.

    Args:
        method: the HTTP method (compared case-insensitively), or ``None`` when the shell
            cannot tell (not checked then).
        headers: the request headers (see :func:`header`).
        secret: the secret check (:func:`~telegram_idem._webhook_secret.secret_check`);
            every accepted secret is compared in constant time.
        max_body: largest body accepted, bytes.
        content_length: the ``Content-Length`` a streaming shell parsed, bytes, or
            ``None``; a larger one than ``max_body`` is refused before reading.

    Returns:
        The refusal (405, 401 or 413), or ``None`` to go on and read the body.
    """
    if method is not None and method.upper() != "POST":
        return _NOT_POST
    if not secret.accepts(header(headers, SECRET_HEADER)):
        return _WRONG_SECRET
    if content_length is not None and content_length > max_body:
        return body_too_large(max_body, content_length)
    return None


def check_request_body(body: bytes, *, max_body: int = DEFAULT_MAX_BODY) -> WebhookRequest:
    """The checks of a complete body: its size, JSON, an integer ``update_id``.

    Args:
        body: the body's bytes (JSON in UTF-8, UTF-16 or UTF-32, as RFC 8259 allows).
        max_body: largest body accepted, bytes.

    Returns:
        The :class:`WebhookUpdate`, or the :class:`Refusal` (413 or 400).
    """
    if len(body) > max_body:
        return body_too_large(max_body, len(body))
    try:
        obj = json.loads(body, parse_constant=_not_json)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return _NOT_JSON
    try:
        update = validate_update(obj)
    except MalformedUpdateError as exc:
        return Refusal(400, str(exc))
    return WebhookUpdate(update, body)


def _not_json(constant: str) -> Any:
    """``NaN``, ``Infinity`` and ``-Infinity`` are Python's, not JSON's (RFC 8259)."""
    raise ValueError(f"{constant} is not JSON")


def check_webhook_request(
    method: str | None,
    headers: Mapping[str, str],
    body: bytes,
    *,
    secret: SecretCheck,
    max_body: int = DEFAULT_MAX_BODY,
    base64_encoded: bool = False,
) -> WebhookRequest:
    """Check a complete webhook request (the module's table, top to bottom).

    Args:
        method: the HTTP method, or ``None`` when the shell cannot tell.
        headers: the request headers, any case (see :func:`header`).
        body: the body's bytes; with ``base64_encoded``, the base64 text a gateway
            delivered (AWS Lambda's ``isBase64Encoded``).
        secret: the secret check (:func:`~telegram_idem._webhook_secret.secret_check`).
        max_body: largest body accepted, bytes, counted after base64 decoding.
        base64_encoded: ``body`` is base64 (strict alphabet, no line breaks).

    Returns:
        The :class:`WebhookUpdate`, or the :class:`Refusal` with its status: 405, 401,
        413 or 400. Never raises for anything the request holds.
    """
    refused = check_request_head(method, headers, secret=secret, max_body=max_body)
    if refused is not None:
        return refused
    if base64_encoded:
        if len(body) > (max_body + 2) // 3 * 4 + 4:  # refused before decoding it
            return body_too_large(max_body)
        try:
            body = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            return _NOT_BASE64
    return check_request_body(body, max_body=max_body)
