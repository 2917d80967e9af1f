"""Reading a webhook request in aiohttp: the request core's checks
(:mod:`telegram_idem.webhook_request`) around a body streamed within its bounds.

Shared by every aiohttp webhook: :class:`~telegram_idem.ingress._webhook.WebhookIngress`,
aiogram's :class:`~telegram_idem.adapters._aiogram_webhook.FastAckWebhook` and PTB's
:func:`~telegram_idem.adapters._ptb_webhook.ptb_webhook`. The answers are the core's table;
this module adds only what streaming needs: the ``Content-Length`` aiohttp parsed is
checked before reading, the body is read until its end but never past ``max_body + 1``
bytes (``Content-Length`` may lie; chunked bodies have none), and a body that does not
arrive within ``read_timeout`` seconds is answered 408.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from telegram_idem._webhook_secret import SecretCheck
from telegram_idem.webhook_request import (
    BODY_INCOMPLETE,
    DEFAULT_MAX_BODY,
    DEFAULT_READ_TIMEOUT,
    Refusal,
    body_too_large,
    check_request_body,
    check_request_head,
)

__all__ = ["http_error", "read_update"]

_ERRORS: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest,
    401: web.HTTPUnauthorized,
    408: web.HTTPRequestTimeout,
}


def http_error(refusal: Refusal, *, method: str = "POST") -> web.HTTPException:
    """The aiohttp exception that answers ``refusal`` (its status, text and headers).

    Args:
        refusal: a refusal of :mod:`telegram_idem.webhook_request`.
        method: the request's method (aiohttp's 405 names it).

    Raises:
        ValueError: a status the request core never refuses with.
    """
    headers = dict(refusal.headers)
    if refusal.status == 405:
        headers.pop("Allow", None)  # aiohttp sets it from allowed_methods
        return web.HTTPMethodNotAllowed(method, ["POST"], text=refusal.reason, headers=headers)
    if refusal.status == 413:
        return web.HTTPRequestEntityTooLarge(
            max_size=refusal.limit or 0,
            actual_size=refusal.size or 0,
            text=refusal.reason,
            headers=headers,
        )
    kind = _ERRORS.get(refusal.status)
    if kind is None:
        raise ValueError(f"no aiohttp answer for a refusal with status {refusal.status}")
    return kind(text=refusal.reason, headers=headers)


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
        secret: the secret check (:func:`~telegram_idem._webhook_secret.secret_check`).
        max_body: largest body accepted, bytes.
        read_timeout: seconds the whole body may take to arrive (a client that sends a
            ``Content-Length`` larger than its body would hold the request open).

    Returns:
        The update, a Bot API dict with an integer ``update_id``.

    Raises:
        aiohttp.web.HTTPMethodNotAllowed: not a POST (405).
        aiohttp.web.HTTPUnauthorized: secret header missing or wrong (401).
        aiohttp.web.HTTPRequestEntityTooLarge: body over ``max_body`` bytes (413).
        aiohttp.web.HTTPRequestTimeout: the body did not arrive within ``read_timeout``
            (408).
        aiohttp.web.HTTPBadRequest: not JSON, or no integer ``update_id`` (400).
    """
    refused = check_request_head(
        request.method,
        request.headers,
        secret=secret,
        max_body=max_body,
        content_length=request.content_length,
    )
    if refused is not None:
        raise http_error(refused, method=request.method)
    body = bytearray()
    try:
        async with asyncio.timeout(read_timeout):
            while True:  # read() returns what has arrived so far: read until the end
                chunk = await request.content.read(max_body + 1 - len(body))
                if not chunk:
                    break
                body += chunk
                if len(body) > max_body:
                    raise http_error(body_too_large(max_body, len(body)))
    except TimeoutError:
        raise http_error(BODY_INCOMPLETE) from None
    result = check_request_body(bytes(body), max_body=max_body)
    if isinstance(result, Refusal):
        raise http_error(result)
    return result.update
