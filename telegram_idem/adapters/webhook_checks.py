"""Checks every webhook request passes before anything is stored (aiohttp).

Source: Bot API, ``setWebhook``: the ``X-Telegram-Bot-Api-Secret-Token`` header carries
the ``secret_token`` given at ``setWebhook`` (1–256 chars of ``A-Z a-z 0-9 _ -``); the body
is a JSON-serialised ``Update``.

| request                                   | answer |
|-------------------------------------------|--------|
| secret header missing or wrong            | 401    |
| body over ``max_body`` bytes              | 413    |
| not JSON                                  | 400    |
| JSON without an integer ``update_id``     | 400    |
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from telegram_idem.errors import MalformedUpdateError
from telegram_idem.updates import validate_update
from telegram_idem.webhook_secret import (
    DEFAULT_MAX_BODY,
    SECRET_HEADER,
    check_secret_token,
    secret_matches,
)

__all__ = ["DEFAULT_MAX_BODY", "SECRET_HEADER", "check_secret_token", "read_update"]


async def read_update(
    request: web.Request, *, secret: str | None, max_body: int = DEFAULT_MAX_BODY
) -> dict[str, Any]:
    """Check the request and return the update it carries.

    Args:
        request: the webhook POST.
        secret: the expected secret token, or ``None`` to accept any request.
        max_body: largest body accepted, in bytes.

    Raises:
        aiohttp.web.HTTPUnauthorized: secret header missing or wrong (checked in constant
            time).
        aiohttp.web.HTTPRequestEntityTooLarge: body over ``max_body`` bytes.
        aiohttp.web.HTTPBadRequest: not JSON, or no integer ``update_id``.
    """
    if secret is not None:
        given = request.headers.get(SECRET_HEADER, "")
        if not secret_matches(given, secret):
            raise web.HTTPUnauthorized(text="wrong or missing secret token")
    length = request.content_length
    if length is not None and length > max_body:
        raise web.HTTPRequestEntityTooLarge(max_size=max_body, actual_size=length)
    body = bytearray()
    while True:  # read() returns what has arrived so far: keep reading until the end
        chunk = await request.content.read(max_body + 1 - len(body))
        if not chunk:
            break
        body += chunk
        if len(body) > max_body:
            raise web.HTTPRequestEntityTooLarge(max_size=max_body, actual_size=len(body))
    try:
        obj = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise web.HTTPBadRequest(text="body is not JSON") from None
    try:
        return validate_update(obj)
    except MalformedUpdateError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None
