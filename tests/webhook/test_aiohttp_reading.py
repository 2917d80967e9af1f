"""The aiohttp shell around the request core: what only a shell that streams the body can
get wrong — a ``Content-Length`` that lies, chunked bodies with no length, the answer of
each refusal. Real aiohttp on loopback, requests written byte for byte."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from aiohttp import web

from telegram_idem._webhook_secret import secret_check
from telegram_idem.ingress._reading import http_error, read_update
from telegram_idem.testing._loopback import serve_app
from telegram_idem.webhook_request import BODY_INCOMPLETE, Refusal, body_too_large

SECRET = "reading-secret"
MAX_BODY = 1000
UPDATE = json.dumps({"update_id": 1, "message": {"text": "hi"}}).encode()


@pytest.fixture
async def base() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A server whose every route reads the update with ``read_update``; the updates read
    are listed."""
    seen: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(
            await read_update(
                request, secret=secret_check(SECRET), max_body=MAX_BODY, read_timeout=0.5
            )
        )
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("*", "/webhook", handle)
    runner, url = await serve_app(app)
    try:
        yield url, seen
    finally:
        await runner.cleanup()


async def exchange(url: str, request: bytes, *, limit: float = 5.0) -> tuple[int, bytes]:
    """Write ``request`` as it is; the status and the raw answer, read for ``limit`` s."""
    where = urlsplit(url)
    assert where.hostname is not None and where.port is not None
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(limit):  # bounded: the server must answer on its own
            status_line = await reader.readline()
            rest = await reader.read(4096)
    finally:
        writer.close()
    return int(status_line.split()[1]), rest


def head(*lines: bytes, method: bytes = b"POST") -> bytes:
    return b"\r\n".join(
        [
            method + b" /webhook HTTP/1.1",
            b"Host: x",
            b"Connection: close",
            b"X-Telegram-Bot-Api-Secret-Token: " + SECRET.encode(),
            *lines,
        ]
    ) + (b"\r\n\r\n")


def chunked(body: bytes, size: int = 100) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


async def test_a_declared_length_over_max_body_is_413_before_any_body_arrives(
    base: tuple[str, list[dict[str, Any]]],
) -> None:
    url, seen = base
    status, rest = await exchange(url, head(b"Content-Length: 1000000000"), limit=2.0)
    assert status == 413
    assert b"body too large (over 1000 bytes)" in rest
    assert seen == []


async def test_a_declared_length_over_what_comes_is_408_within_the_read_timeout(
    base: tuple[str, list[dict[str, Any]]],
) -> None:
    url, seen = base
    status, rest = await exchange(url, head(b"Content-Length: 900") + UPDATE, limit=5.0)
    assert status == 408
    assert BODY_INCOMPLETE.reason.encode() in rest
    assert seen == []


async def test_a_declared_length_under_the_body_reads_only_that_much(
    base: tuple[str, list[dict[str, Any]]],
) -> None:
    url, seen = base
    status, _ = await exchange(url, head(b"Content-Length: 10") + UPDATE)
    assert status == 400  # the first 10 bytes are not an update
    assert seen == []


@pytest.mark.parametrize(("size", "expected"), [(MAX_BODY, 200), (MAX_BODY + 1, 413)])
async def test_a_chunked_body_without_a_length_is_bounded_as_it_streams(
    base: tuple[str, list[dict[str, Any]]], size: int, expected: int
) -> None:
    url, seen = base
    body = UPDATE + b" " * (size - len(UPDATE))
    status, _ = await exchange(url, head(b"Transfer-Encoding: chunked") + chunked(body))
    assert status == expected
    assert len(seen) == (1 if expected == 200 else 0)


async def test_a_chunked_body_that_never_ends_is_413_once_past_the_bound(
    base: tuple[str, list[dict[str, Any]]],
) -> None:
    """Refused at ``max_body + 1`` bytes read, not after the whole stream."""
    url, seen = base
    endless = b"".join(b"64\r\n" + b" " * 100 + b"\r\n" for _ in range(20))  # 2000 bytes, open
    status, _ = await exchange(url, head(b"Transfer-Encoding: chunked") + endless)
    assert status == 413
    assert seen == []


async def test_a_method_other_than_post_is_405_with_allow(
    base: tuple[str, list[dict[str, Any]]],
) -> None:
    url, _ = base
    status, rest = await exchange(url, head(b"Content-Length: 0", method=b"PUT"))
    assert status == 405
    assert b"Allow: POST" in rest


def test_every_refusal_of_the_core_has_its_aiohttp_answer() -> None:
    refusals = [
        Refusal(405, "POST only", headers={"Allow": "POST"}),
        Refusal(401, "wrong or missing secret token"),
        body_too_large(10, 11),
        BODY_INCOMPLETE,
        Refusal(400, "body is not JSON"),
    ]
    for refusal in refusals:
        answer = http_error(refusal)
        assert (answer.status, answer.text) == (refusal.status, refusal.reason)
    assert http_error(refusals[0]).headers["Allow"] == "POST"
    with pytest.raises(ValueError, match="status 418"):
        http_error(Refusal(418, "teapot"))
