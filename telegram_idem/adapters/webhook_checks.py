"""Checks every webhook request passes before anything is stored (aiohttp).

Source: Bot API, ``setWebhook``: the ``X-Telegram-Bot-Api-Secret-Token`` header carries
the ``secret_token`` given at ``setWebhook`` (1–256 chars of ``A-Z a-z 0-9 _ -``); the body
is a JSON-serialised ``Update``. The secret rule (required unless opted out, rotation)
is :mod:`telegram_idem.webhook_secret`'s; the full answer table is ``docs/answers.md``.

| request                                          | answer |
|--------------------------------------------------|--------|
| secret header missing or wrong                   | 401    |
| body over ``max_body`` bytes                     | 413    |
| body not complete within ``read_timeout`` s      | 408    |
| not JSON                                         | 400    |
| JSON without an integer ``update_id``            | 400    |
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from telegram_idem.errors import MalformedUpdateError
from telegram_idem.updates import validate_update
from telegram_idem.webhook_secret import (
    DEFAULT_MAX_BODY,
    SECRET_HEADER,
    SecretCheck,
    check_secret_token,
    secret_check,
)

__all__ = [
    "DEFAULT_MAX_BODY",
    "DEFAULT_READ_TIMEOUT",
    "SECRET_HEADER",
    "SecretCheck",
    "check_secret_token",
    "read_update",
    "secret_check",
]

DEFAULT_READ_TIMEOUT = 10.0
"""Seconds a request body may take to arrive in full (Telegram sends it at once)."""


async def read_update(
    request: web.Request,
    *,
    secret: SecretCheck,
    max_body: int = DEFAULT_MAX_BODY,
    read_timeout: float = DEFAULT_READ_TIMEOUT,
) -> dict[str, Any]:
    """Check the request and return the update it carries.

    Args:
        request: the webhook POST.
        secret: the secret check (:func:`~telegram_idem.webhook_secret.secret_check`).
        max_body: largest body accepted, in bytes.
        read_timeout: seconds the whole body may take to arrive (a client that sends a
            ``Content-Length`` larger than its body would hold the request open).

    Raises:
        aiohttp.web.HTTPUnauthorized: secret header missing or wrong (checked in constant
            time).
        aiohttp.web.HTTPRequestEntityTooLarge: body over ``max_body`` bytes.
        aiohttp.web.HTTPRequestTimeout: the body did not arrive within ``read_timeout``.
        aiohttp.web.HTTPBadRequest: not JSON, or no integer ``update_id``.
    """
    if not secret.accepts(request.headers.get(SECRET_HEADER)):
        raise web.HTTPUnauthorized(text="wrong or missing secret token")
    length = request.content_length
    if length is not None and length > max_body:
        raise web.HTTPRequestEntityTooLarge(max_size=max_body, actual_size=length)
    body = bytearray()
    try:
        async with asyncio.timeout(read_timeout):
            while True:  # read() returns what has arrived so far: read until the end
                chunk = await request.content.read(max_body + 1 - len(body))
                if not chunk:
                    break
                body += chunk
                if len(body) > max_body:
                    raise web.HTTPRequestEntityTooLarge(max_size=max_body, actual_size=len(body))
    except TimeoutError:
        raise web.HTTPRequestTimeout(text="request body incomplete") from None
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise web.HTTPBadRequest(text="body is not JSON") from None
    try:
        return validate_update(obj)
    except MalformedUpdateError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None
