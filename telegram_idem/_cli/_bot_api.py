"""A small Bot API client for the commands that talk to Telegram (``telegram-idem
webhook``), which never lets the bot token out.

The token is part of every request URL (``<api>/bot<token>/<method>``, Bot API "Making
requests"), and aiohttp's errors carry that URL: every failure is caught here and turned
into a :class:`BotAPIError` whose message has the token replaced by ``<token>`` (the given
token itself, and anything shaped like one, through
:func:`~telegram_idem._cli._common.redact_text`), raised without its cause so no
traceback can show it either.
"""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

import aiohttp
import click

from telegram_idem._cli._common import Exit, redact_text

__all__ = [
    "API_URL_ENV",
    "DEFAULT_API_URL",
    "TOKEN_ENV",
    "BotAPIClient",
    "BotAPIError",
    "check_api_url",
    "check_token",
]

TOKEN_ENV = "BOT_TOKEN"
"""The environment variable the bot token is read from when ``--token`` is not given."""
API_URL_ENV = "TELEGRAM_API_URL"
"""The environment variable the Bot API's base URL is read from (a local Bot API server)."""
DEFAULT_API_URL = "https://api.telegram.org"
"""Telegram's Bot API."""


class BotAPIError(Exception):
    """A call that did not return a result; ``message`` is redacted and ``code`` is the
    exit code it means: :attr:`Exit.UNREACHABLE` (no answer, or not a Bot API answer),
    :attr:`Exit.CONFIGURATION` (the token was refused: 401), :attr:`Exit.PROBLEM` (an
    ``ok: false`` answer, with Telegram's description)."""

    def __init__(self, message: str, code: Exit) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def check_token(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A click callback: ``value`` is usable in a Bot API URL (it is never echoed).

    Raises:
        click.BadParameter: empty, or holds ``/``, whitespace or other characters a token
            never has.
    """
    value = value.strip()
    if not value or any(ch.isspace() or ch in "/?#%" for ch in value):
        raise click.BadParameter(f"not a bot token (${TOKEN_ENV} or --token: <bot id>:<secret>)")
    return value


def check_api_url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A click callback: ``value`` is an ``http(s)://host`` URL.

    Raises:
        click.BadParameter: another scheme, or no host.
    """
    try:
        parts = urlsplit(value)
        host = parts.hostname
    except ValueError:  # e.g. an unclosed "[" of an IPv6 address
        host = None
    if host is None or parts.scheme not in ("http", "https"):
        raise click.BadParameter(
            redact_text(f"an http(s) URL with a host, like {DEFAULT_API_URL}, not {value!r}")
        )
    return value.rstrip("/")


class BotAPIClient:
    """Calls Bot API methods as ``POST <api_url>/bot<token>/<method>`` with a JSON body.

    Args:
        token: the bot token (never shown: see :meth:`redact`).
        api_url: the Bot API's base URL (default Telegram's).
        timeout: seconds a call waits for its answer.
    """

    def __init__(
        self, token: str, api_url: str = DEFAULT_API_URL, *, timeout: float = 30.0
    ) -> None:
        self._token = token
        self.api_url = api_url.rstrip("/")
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    def redact(self, text: str) -> str:
        """``text`` with the token (and anything like a token or a URL password) hidden."""
        if self._token:
            text = text.replace(self._token, "<token>")
        return redact_text(text)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session. Idempotent."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """The ``result`` of Bot API method ``method`` called with ``params``.

        Raises:
            BotAPIError: no answer in ``timeout`` seconds, no connection, or an answer
                that is not the Bot API's (exit 3); the token refused, HTTP 401 (exit 4);
                ``ok: false`` (exit 1, Telegram's ``description``). Its message never
                holds the token.
        """
        if self._session is None:
            self._session = aiohttp.ClientSession()
        url = f"{self.api_url}/bot{self._token}/{method}"
        try:
            async with self._session.post(
                url, json=params or {}, timeout=aiohttp.ClientTimeout(total=self.timeout)
            ) as response:
                status = response.status
                text = await response.text()
        except TimeoutError:
            raise BotAPIError(
                self.redact(
                    f"the Bot API at {self.api_url} did not answer {method} "
                    f"within {self.timeout:g} s"
                ),
                Exit.UNREACHABLE,
            ) from None
        except Exception as exc:  # aiohttp's errors carry the URL, hence the token
            raise BotAPIError(
                self.redact(
                    f"the Bot API at {self.api_url} cannot be reached: {type(exc).__name__}: {exc}"
                ),
                Exit.UNREACHABLE,
            ) from None
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if status == 401 or (isinstance(body, dict) and body.get("error_code") == 401):
            raise BotAPIError(
                f"the token was refused (401 Unauthorized): check --token or ${TOKEN_ENV}",
                Exit.CONFIGURATION,
            )
        if not isinstance(body, dict) or not isinstance(body.get("ok"), bool):
            raise BotAPIError(
                self.redact(
                    f"the Bot API at {self.api_url} answered {method} with HTTP {status}, "
                    "not a Bot API answer"
                ),
                Exit.UNREACHABLE,
            )
        if body["ok"] is not True:
            description = body.get("description") or f"HTTP {status}"
            code = body.get("error_code", status)
            raise BotAPIError(
                self.redact(f"{method} failed: {description} (error_code {code})"),
                Exit.PROBLEM,
            )
        return body.get("result")
