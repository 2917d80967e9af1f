"""The NATS connection of a JetStream inbox: opened on first use, with the stream, the
partition consumers and the state bucket made if missing; driver errors translated once.

Every JetStream call goes through :meth:`JetStreamConnection.call`: a connection refused or lost,
a request timeout (the server is down or restarting: nats-py reconnects in the
background) and any other nats-py error become
:class:`~telegram_idem.errors.StoreError` naming the server and the operation; a wrong
user or password is a :class:`~telegram_idem.errors.ConfigurationError`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    StorageType,
    StreamConfig,
)
from nats.js.kv import KeyValue

from telegram_idem.backends import _driver as driver
from telegram_idem.backends.nats._layout import JetStreamLayout

__all__ = ["JetStreamConnection", "JetStreamSettings"]

log = logging.getLogger("telegram_idem.nats")

T = TypeVar("T")

_ERRORS = driver.DriverErrors(
    transient=(
        nats.errors.ConnectionClosedError,
        nats.errors.NoServersError,
        nats.errors.TimeoutError,
        nats.errors.NoRespondersError,
        nats.js.errors.ServiceUnavailableError,
        asyncio.TimeoutError,
        OSError,
    ),
    config=(nats.errors.AuthorizationError,),
    base=(nats.errors.Error,),
)


@dataclass(frozen=True, slots=True)
class JetStreamSettings:
    """How the inbox connects and what it makes.

    Attributes:
        url: the NATS server URL (``nats://host:port``; several, comma-separated).
        layout: the names (stream, partitions).
        duplicate_window: seconds the stream remembers a ``Nats-Msg-Id`` (the broker's
            dedup, the fast path; the claim store decides beyond it).
        discover_ack_wait: seconds a partition consumer waits for the ack of a delivered
            batch before delivering it again (a process that died while recording it).
        timeout: seconds one JetStream request waits for its answer.
        replicas: stream replicas (1 on a single server).
    """

    url: str
    layout: JetStreamLayout
    duplicate_window: float = 120.0
    discover_ack_wait: float = 30.0
    timeout: float = 5.0
    replicas: int = 1


class JetStreamConnection:
    """The connection, opened once (guarded by a lock), and the objects on the server.

    Args:
        settings: what to connect to and make.
    """

    def __init__(self, settings: JetStreamSettings) -> None:
        self.settings = settings
        self.layout = settings.layout
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._kv: KeyValue | None = None
        self._pulls: dict[int, JetStreamContext.PullSubscription] = {}
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        parts = urlsplit(self.settings.url.split(",")[0])
        return f"JetStreamInbox({parts.hostname}:{parts.port or 4222}, {self.layout.stream!r})"

    async def call(self, op: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Run ``fn`` (JetStream round trips) with nats-py errors translated.

        Args:
            op: the operation's name, for the message.
            fn: the work.

        Raises:
            StoreError: the server could not answer.
            ConfigurationError: credentials refused.
        """
        return await driver.call(op, fn, lambda o, exc: _ERRORS.translate(f"{self!r}.{o}", exc))

    async def js(self) -> JetStreamContext:
        """The JetStream context, connecting (and making what is missing) on first use."""
        if self._js is None:
            async with self._lock:
                if self._js is None:
                    await self._open()
        assert self._js is not None
        return self._js

    async def kv(self) -> KeyValue:
        """The state bucket."""
        await self.js()
        assert self._kv is not None
        return self._kv

    async def pull(self, partition: int) -> JetStreamContext.PullSubscription:
        """The pull subscription bound to ``partition``'s durable consumer.

        Args:
            partition: 0 ≤ partition < partitions.
        """
        sub = self._pulls.get(partition)
        if sub is None:
            js = await self.js()
            sub = await js.pull_subscribe_bind(self.layout.consumer(partition), self.layout.stream)
            self._pulls[partition] = sub
        return sub

    async def _open(self) -> None:
        s = self.settings
        nc = await nats.connect(
            servers=s.url.split(","),
            connect_timeout=s.timeout,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            allow_reconnect=True,
        )
        try:
            js = nc.jetstream(timeout=s.timeout)
            await self._ensure(js)
            self._kv = await self._bucket(js)
        except BaseException:
            await nc.close()
            raise
        self._nc, self._js = nc, js

    async def _ensure(self, js: JetStreamContext) -> None:
        layout, s = self.layout, self.settings
        try:
            await js.stream_info(layout.stream)
        except nats.js.errors.NotFoundError:
            await js.add_stream(
                StreamConfig(
                    name=layout.stream,
                    subjects=[f"{layout.stream}.>"],
                    storage=StorageType.FILE,
                    duplicate_window=s.duplicate_window,
                    allow_direct=True,
                    num_replicas=s.replicas,
                )
            )
        for p in range(layout.partitions):
            await js.add_consumer(
                layout.stream,
                ConsumerConfig(
                    durable_name=layout.consumer(p),
                    filter_subject=layout.filter(p),
                    deliver_policy=DeliverPolicy.ALL,
                    ack_policy=AckPolicy.ALL,
                    ack_wait=s.discover_ack_wait,
                    max_ack_pending=DISCOVER_BATCH,
                    max_deliver=-1,
                ),
            )

    async def _bucket(self, js: JetStreamContext) -> KeyValue:
        try:
            return await js.key_value(self.layout.bucket)
        except nats.js.errors.BucketNotFoundError:
            return await js.create_key_value(
                KeyValueConfig(
                    bucket=self.layout.bucket,
                    history=1,
                    storage=StorageType.FILE,
                    replicas=self.settings.replicas,
                )
            )

    async def close(self) -> None:
        """Close the connection (idempotent)."""
        nc, self._nc, self._js, self._kv = self._nc, None, None, None
        self._pulls = {}
        if nc is not None:
            try:
                await asyncio.wait_for(nc.close(), self.settings.timeout)
            except Exception as exc:  # a connection lost already is closed enough
                log.info("closing the NATS connection: %s", exc)


DISCOVER_BATCH = 256
"""Messages a partition consumer hands out at most before their ack (one batch)."""
