"""Delivering updates to a webhook the way Telegram does (Bot API "setWebhook" and "Getting
updates"), used by ``telegram-idem replay`` and, through :mod:`telegram_idem.testing`, by tests.

:class:`TelegramDelivery` POSTs an Update as a JSON body with ``Content-Type:
application/json``, the ``X-Telegram-Bot-Api-Secret-Token`` header when a secret is set, and
sends the **same** update (same ``update_id``, same bytes) again when the answer is not a
2xx, the connection fails, or no answer arrives within ``timeout`` seconds (Telegram waits
about 60 s). Telegram does not publish its retry schedule; here the first re-send waits
``retry_delay`` seconds, each next one ``backoff`` times longer (at most
``max_retry_delay``), and an update gets at most ``max_attempts`` attempts.
:meth:`TelegramDelivery.deliver_concurrently` sends one update several times at once
(several data centres, or a re-send racing a slow first attempt).

It lives outside :mod:`telegram_idem.testing` so the command line can use it without the
test toolkit; :mod:`telegram_idem.testing` re-exports it (with ``double_tap``).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import aiohttp

__all__ = [
    "SECRET_HEADER",
    "Attempt",
    "DeliveryReport",
    "DeliveryStats",
    "TelegramDelivery",
]

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"

_SECRET_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,256}")


@dataclass(frozen=True, slots=True)
class Attempt:
    """One POST of an update.

    ``number`` counts from 1 within a delivery; ``status`` is the HTTP status or None when no
    answer came; ``error`` is ``"timeout"`` or the connection error's text; ``elapsed`` and
    ``started_at`` are seconds (``started_at`` on the delivery's clock, `time.monotonic` by
    default); ``body`` is the answer's text (a webhook may answer with a method call).
    """

    number: int
    status: int | None
    error: str | None
    elapsed: float
    started_at: float
    timed_out: bool = False
    body: str | None = None

    @property
    def ok(self) -> bool:
        """True for a 2xx answer: Telegram considers the update delivered."""
        return self.status is not None and 200 <= self.status < 300


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    """Every attempt made to deliver one update, in order."""

    update_id: int
    attempts: tuple[Attempt, ...]

    @property
    def delivered(self) -> bool:
        """The last attempt got a 2xx (False: Telegram gave up after ``max_attempts``)."""
        return bool(self.attempts) and self.attempts[-1].ok

    @property
    def retries(self) -> int:
        """Re-sends after the first attempt."""
        return max(0, len(self.attempts) - 1)

    @property
    def statuses(self) -> list[int | None]:
        """HTTP status per attempt (None: timeout or connection error)."""
        return [attempt.status for attempt in self.attempts]


@dataclass(slots=True)
class DeliveryStats:
    """Totals over every delivery a `TelegramDelivery` made.

    ``non_2xx`` counts answers with a non-2xx status; ``timeouts`` attempts cut at ``timeout``;
    ``connection_errors`` attempts that got no answer otherwise; ``failed`` deliveries that
    gave up.
    """

    deliveries: int = 0
    attempts: int = 0
    retries: int = 0
    non_2xx: int = 0
    timeouts: int = 0
    connection_errors: int = 0
    failed: int = 0


class TelegramDelivery:
    """Delivers updates to ``url`` like Telegram's webhook sender (Bot API "setWebhook").

    ``secret_token`` (1-256 of ``A-Z a-z 0-9 _ -``, else `ValueError`) is sent in
    ``X-Telegram-Bot-Api-Secret-Token``. An attempt fails when no answer arrives within
    ``timeout`` seconds, the status is not 2xx, or the connection fails; the same update is then
    re-sent, at most ``max_attempts`` attempts in all. The first re-send waits ``retry_delay``
    seconds, each next one ``backoff`` times the previous wait (``1.0``, the default: always
    ``retry_delay``), never more than ``max_retry_delay`` seconds (``None``: no cap). ``sleep``
    and ``clock`` (seconds) can be replaced in tests. Pass ``session`` to reuse an aiohttp
    ``ClientSession`` (not closed by `close`); otherwise one is created on first use, with a
    fresh connection per attempt like separate Telegram senders.

    Raises:
        ValueError: a bad ``secret_token``, ``timeout`` <= 0, ``retry_delay`` < 0,
            ``backoff`` < 1, ``max_retry_delay`` < 0 or ``max_attempts`` < 1.
    """

    def __init__(
        self,
        url: str,
        *,
        secret_token: str | None = None,
        timeout: float = 60.0,
        retry_delay: float = 1.0,
        max_attempts: int = 5,
        backoff: float = 1.0,
        max_retry_delay: float | None = None,
        session: aiohttp.ClientSession | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if secret_token is not None and not _SECRET_TOKEN.fullmatch(secret_token):
            raise ValueError("secret_token must be 1-256 characters of A-Z a-z 0-9 _ -")
        if timeout <= 0:
            raise ValueError("timeout must be > 0 seconds")
        if retry_delay < 0:
            raise ValueError("retry_delay must be >= 0 seconds")
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if backoff < 1:
            raise ValueError("backoff must be >= 1")
        if max_retry_delay is not None and max_retry_delay < 0:
            raise ValueError("max_retry_delay must be >= 0 seconds")
        self.url = url
        self.secret_token = secret_token
        self.timeout = timeout
        self.retry_delay = retry_delay
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.max_retry_delay = max_retry_delay
        self.stats = DeliveryStats()
        self.reports: list[DeliveryReport] = []
        self._sleep = sleep
        self._clock = clock
        self._session = session
        self._owns_session = session is None

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
        """Close the session this object created. Idempotent."""
        if self._owns_session and self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(force_close=True, limit=0)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def deliver(self, update: Mapping[str, Any]) -> DeliveryReport:
        """POST ``update`` until a 2xx answer or ``max_attempts``; return every attempt.

        The body is serialised once, so re-sends are byte-identical. Raises `ValueError`
        without an int ``update_id``; network failures are recorded, never raised.
        """
        update_id = _update_id(update)
        body = json.dumps(update, ensure_ascii=False).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self.secret_token is not None:
            headers[SECRET_HEADER] = self.secret_token
        attempts: list[Attempt] = []
        self.stats.deliveries += 1
        for number in range(1, self.max_attempts + 1):
            if number > 1:
                self.stats.retries += 1
                await self._sleep(self.delay_before(number))
            attempt = await self._attempt(number, body, headers)
            attempts.append(attempt)
            self.stats.attempts += 1
            if attempt.ok:
                break
        report = DeliveryReport(update_id, tuple(attempts))
        if not report.delivered:
            self.stats.failed += 1
        self.reports.append(report)
        return report

    def delay_before(self, number: int) -> float:
        """Seconds waited before attempt ``number`` (2 for the first re-send): ``retry_delay``
        times ``backoff`` to the power ``number - 2``, at most ``max_retry_delay``; 0 for the
        first attempt."""
        if number <= 1:
            return 0.0
        delay = self.retry_delay * self.backoff ** (number - 2)
        if self.max_retry_delay is not None:
            delay = min(delay, self.max_retry_delay)
        return delay

    async def _attempt(self, number: int, body: bytes, headers: dict[str, str]) -> Attempt:
        started = self._clock()
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        try:
            async with self._client().post(
                self.url, data=body, headers=headers, timeout=timeout
            ) as response:
                text = await response.text()
                status = response.status
        except TimeoutError:
            self.stats.timeouts += 1
            elapsed = self._clock() - started
            return Attempt(number, None, "timeout", elapsed, started, timed_out=True)
        except (aiohttp.ClientError, OSError) as err:
            self.stats.connection_errors += 1
            error = f"{type(err).__name__}: {err}"
            return Attempt(number, None, error, self._clock() - started, started)
        attempt = Attempt(number, status, None, self._clock() - started, started, body=text)
        if not attempt.ok:
            self.stats.non_2xx += 1
        return attempt

    async def deliver_concurrently(self, update: Mapping[str, Any], n: int) -> list[DeliveryReport]:
        """Deliver the same update ``n`` times at once (each with its own retries).

        Mirrors one update reaching the bot through several senders simultaneously, or a
        Telegram retry racing the first attempt. Raises `ValueError` if ``n < 1``.
        """
        if n < 1:
            raise ValueError("n must be >= 1")
        return list(await asyncio.gather(*(self.deliver(update) for _ in range(n))))


def _update_id(update: Mapping[str, Any]) -> int:
    """The integer ``update_id`` of ``update``. Raises `ValueError`: none, or not an int."""
    update_id = update.get("update_id")
    if not isinstance(update_id, int) or isinstance(update_id, bool):
        raise ValueError("an update needs an integer update_id")
    return update_id
