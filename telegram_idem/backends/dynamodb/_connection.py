"""The connection every part of the DynamoDB store shares: client, table, clock, errors.

:class:`DynamoDBConnection` is what the records store
(:class:`~telegram_idem.backends.dynamodb.DynamoDBStore`) holds; a later part (an
outbox, a rate limiter) is one more object over the same connection. It owns:

- one aiobotocore client, created on first use and reused, closed by
  :meth:`DynamoDBConnection.close`;
- readiness: with ``create_table``, the table is created (and TTL enabled) before the
  first call, and again if it vanishes (:meth:`call` retries that call once);
- the clock: DynamoDB has no server clock, so it is the writer's (``clock``, or the
  host's ``time.time``);
- one request with its errors translated (:meth:`call`, :meth:`translate`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any, Final, TypeVar

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session
from botocore.exceptions import ClientError

from telegram_idem._clock import Clock
from telegram_idem.backends import _driver as driver
from telegram_idem.backends.dynamodb._errors import (
    DRIVER_BASE,
    DRIVER_ERRORS,
    error_code,
    translate,
)
from telegram_idem.backends.dynamodb._setup import create_table_on
from telegram_idem.backends.dynamodb._table import Table
from telegram_idem.errors import IdemError, StoreError

__all__ = ["DEFAULT_CONFIG", "DynamoDBConnection"]

T = TypeVar("T")

DEFAULT_CONFIG: Final[dict[str, Any]] = {
    "connect_timeout": 2.0,
    "read_timeout": 5.0,
    "retries": {"mode": "standard", "total_max_attempts": 3},
    "max_pool_connections": 32,
}
"""The client's defaults: 2 s connect, 5 s read timeout, 3 attempts in botocore's
"standard" retry mode, 32 pooled connections."""

_DUMMY_KEY: Final = "testing"
_loader: Any = None


def _new_session() -> AioSession:
    """A new aiobotocore session sharing one botocore data loader (the parsed service
    models: parsing them again costs ~0.2 s of CPU per client)."""
    global _loader
    session = get_session()
    if _loader is None:
        _loader = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _loader)
    return session


class DynamoDBConnection:
    """One aiobotocore client on one table, and what every part of the store does with it.

    Args:
        table: the table name (already checked).
        label: how messages name the store (its ``repr``: table, region, endpoint).
        region: AWS region.
        endpoint_url: DynamoDB Local, moto or a VPC endpoint; ``None`` = AWS's.
        clock: seconds since the epoch; ``None`` = the host's ``time.time``.
        session: an aiobotocore session; ``None`` = a new one on first use.
        client_config: a botocore/aiobotocore ``Config`` merged over :data:`DEFAULT_CONFIG`.
        create_table: create the table (and TTL) on first use if absent.
    """

    def __init__(
        self,
        table: str,
        *,
        label: str,
        region: str,
        endpoint_url: str | None = None,
        clock: Clock | None = None,
        session: AioSession | None = None,
        client_config: Any | None = None,
        create_table: bool = False,
    ) -> None:
        self.table = table
        self.label = label
        self.region = region
        self.endpoint_url = endpoint_url
        self.clock: Clock = clock if clock is not None else time.time
        self.config = AioConfig(**DEFAULT_CONFIG)
        if client_config is not None:
            self.config = self.config.merge(client_config)
        self.create_table = create_table
        self._session = session
        self._table_ready = not create_table
        self._stack = AsyncExitStack()
        self._db: Table | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"DynamoDBConnection({self.label})"

    def now(self) -> float:
        """The writer's clock, seconds since the epoch: DynamoDB has no server clock."""
        return self.clock()

    # ------------------------------------------------------------- client

    async def client(self) -> Any:
        """The aiobotocore DynamoDB client, created on first use.

        Raises:
            StoreError: closed, or the client could not be made (credentials could not
                be resolved…).
            ConfigurationError: no credentials at all.
        """
        if self._closed:
            raise StoreError(f"{self.label} is closed")
        if self._db is None:
            async with self._lock:
                if self._closed:
                    raise StoreError(f"{self.label} is closed")
                if self._db is None:
                    try:
                        self._db = Table(await self._open(), self.table)
                    except DRIVER_ERRORS as exc:
                        raise translate(exc, f"{self.label}.client", self.table) from exc
        return self._db.client

    async def _open(self) -> Any:
        session = self._session if self._session is not None else _new_session()
        kwargs: dict[str, Any] = {}
        if self.endpoint_url is not None and await session.get_credentials() is None:
            kwargs = {"aws_access_key_id": _DUMMY_KEY, "aws_secret_access_key": _DUMMY_KEY}
        return await self._stack.enter_async_context(
            session.create_client(
                "dynamodb",
                region_name=self.region,
                endpoint_url=self.endpoint_url,
                config=self.config,
                **kwargs,
            )
        )

    async def ready(self) -> Table:
        """The table, once the client exists and (with ``create_table``) the table does.

        Raises:
            StoreError, ConfigurationError: as :meth:`client` and :meth:`ensure_table`.
        """
        await self.client()
        if not self._table_ready:
            async with self._lock:
                if not self._table_ready:
                    await create_table_on(await self.client(), self.table)
                    self._table_ready = True
        if self._db is None:  # closed meanwhile
            raise StoreError(f"{self.label} is closed")
        return self._db

    async def ensure_table(self) -> bool:
        """Create the table if absent and enable TTL on ``exp`` (idempotent); returns
        ``True`` if this call created it. Errors are translated (``create_table(…)``)."""
        created = await create_table_on(await self.client(), self.table)
        self._table_ready = True
        return created

    # ------------------------------------------------------------- errors

    def translate(self, op: str, exc: Exception) -> IdemError | None:
        """The library error for ``exc`` raised by ``op``, or ``None`` if not the driver's.

        Args:
            op: the operation's name, for error messages (``claim``, ``inbox.take``…).
            exc: what the operation raised.
        """
        if isinstance(exc, DRIVER_ERRORS + DRIVER_BASE):
            return translate(exc, f"{self.label}.{op}", self.table)
        return None

    def call(self, op: str, fn: Callable[[], Awaitable[T]]) -> Awaitable[T]:
        """``fn()`` as operation ``op``, its driver errors translated. With
        ``create_table``, a table that vanished (an emulator restarted, a table deleted)
        is made again and ``fn`` retried once: nothing was written.

        Args:
            op: the operation's name, for error messages (``claim``, ``inbox.take``…).
            fn: the request(s), untranslated.

        Raises:
            StoreError: DynamoDB cannot answer now (throttling included), or closed.
            ConfigurationError: credentials, permissions, a missing table, a request
                DynamoDB can never accept.
        """

        async def once_more() -> T:
            try:
                return await fn()
            except ClientError as exc:
                if not (self.create_table and error_code(exc) == "ResourceNotFoundException"):
                    raise
                self._table_ready = False
                return await fn()

        return driver.call(op, once_more, self.translate)

    async def close(self) -> None:
        """Close the client and its connections. Idempotent; later calls raise StoreError."""
        self._closed = True
        self._db = None
        stack, self._stack = self._stack, AsyncExitStack()
        await stack.aclose()
