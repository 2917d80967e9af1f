"""The fast lane: one pipelined connection to a single Redis node for the store's scripts.

redis-py's asyncio client spends about 90 µs of CPU per command on this project's
machines (a connection checked out of its pool and back, a timeout task per read,
observability hooks) where the round trip itself is about 40 µs; its sync client spends
about 50 µs. :class:`Lane` sends each command as bytes on one ``asyncio.Protocol``
connection and reads the replies with hiredis (the parser redis-py uses), so a script
costs about 20 µs of CPU (``benchmarks/redis_profile.py`` measures all three in one run).

One connection serves every concurrent caller: commands are written in call order and
Redis answers in that order, so concurrent calls travel together (pipelining). Errors
are redis-py's own classes (its parser's mapping of error replies; ``ConnectionError``
and ``TimeoutError`` for the connection), so the store's error translation
(:mod:`telegram_idem.backends.redis._errors`) is the same on both paths. A command is
never sent twice: a lost connection or a timeout fails every command in flight, and the
next call connects again.

:meth:`Lane.for_client` builds a lane only for what it reproduces exactly: a single-node
client over plain TCP or a Unix socket, RESP2, password/username, database and client
name (no TLS, no credential provider, no other connection class); anything else keeps
redis-py's path.
"""

from __future__ import annotations

import asyncio
import collections
import socket
from collections.abc import Sequence
from typing import Any

import hiredis
import redis.exceptions as rexc
from redis._parsers.base import BaseParser
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, UnixDomainSocketConnection

__all__ = ["Lane", "pack"]

_SUPPORTED = frozenset(
    {
        "host",
        "port",
        "path",
        "db",
        "username",
        "password",
        "socket_timeout",
        "socket_connect_timeout",
        "client_name",
        "socket_keepalive",
        # what the lane does not need: redis-py's own retries (the store's clients never
        # retry), health checks (a closed connection is noticed when it closes; a dead
        # peer fails the calls in flight at socket_timeout, and the next call
        # reconnects), encoding (replies stay bytes), the pool size (one connection)
        "retry",
        "retry_on_error",
        "retry_on_timeout",
        "socket_keepalive_options",
        "health_check_interval",
        "encoding",
        "encoding_errors",
        "decode_responses",
        "max_connections",
        "protocol",
        "lib_name",
        "lib_version",
        "connection_class",
        "socket_type",
        "redis_connect_func",
        "parser_class",
        "event_dispatcher",
        "socket_read_size",
        "himport_registry",
    }
)


def pack(args: Sequence[Any]) -> bytes:
    """One command as RESP bytes (``str`` as UTF-8, numbers as their decimal text).

    Args:
        args: the command and its arguments (``bytes``, ``str``, ``int`` or ``float``).
    """
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        kind = type(arg)
        if kind is str:
            arg = arg.encode()
        elif kind is not bytes:
            arg = bytes(arg) if isinstance(arg, bytearray | memoryview) else str(arg).encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return b"".join(parts)


def _abort(transport: asyncio.Transport) -> None:
    """Close ``transport`` now, even when its event loop is closed (a store used again
    under a new loop, as successive ``asyncio.run`` calls do)."""
    try:
        transport.abort()
    except RuntimeError:  # the loop is closed: do what abort() would have scheduled
        lost = getattr(transport, "_call_connection_lost", None)
        if lost is not None:
            lost(None)


class _Protocol(asyncio.Protocol):
    """The connection's replies, matched in order with the calls waiting for them.

    A timeout is one watchdog per connection, not a timer per call: every call in flight
    has a deadline (sent + ``timeout``), and the watchdog wakes at the oldest one's. A
    call still unanswered at its deadline breaks the connection (a later reply could not
    be matched to its call) and fails every call in flight with ``TimeoutError``.
    """

    def __init__(self, where: str, timeout: float | None) -> None:
        self.where = where
        self.timeout = timeout
        self.reader = hiredis.Reader(
            protocolError=rexc.InvalidResponse, replyError=BaseParser.parse_error
        )
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.deadlines: collections.deque[float] = collections.deque()
        self.watchdog: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None
        self.broken: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.reader.feed(data)
            while (reply := self.reader.gets()) is not False:
                future = self.waiting.popleft()
                if self.timeout is not None:
                    self.deadlines.popleft()
                if not future.done():  # a cancelled caller's reply is read and dropped
                    future.set_result(reply)
        except (rexc.InvalidResponse, IndexError) as exc:  # garbage, or an unasked reply
            self.fail(rexc.ConnectionError(f"Protocol error from {self.where}: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(rexc.ConnectionError(f"Connection to {self.where} lost: {exc or 'closed'}"))

    def fail(self, exc: Exception) -> None:
        """Break the connection: every call in flight raises ``exc``."""
        if self.broken is None:
            self.broken = exc
        if self.watchdog is not None:
            self.watchdog.cancel()
            self.watchdog = None
        self.deadlines.clear()
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(exc)
        if self.transport is not None:
            _abort(self.transport)

    def send(self, data: bytes, count: int) -> list[asyncio.Future[Any]]:
        """Write ``data`` (``count`` commands); the futures of their replies.

        Raises:
            redis.exceptions.ConnectionError: the connection is broken.
        """
        if self.broken is not None or self.transport is None:
            raise self.broken or rexc.ConnectionError(f"Not connected to {self.where}")
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(count)]
        self.waiting.extend(futures)
        if self.timeout is not None:
            deadline = loop.time() + self.timeout
            self.deadlines.extend([deadline] * count)
            if self.watchdog is None:
                self.watchdog = loop.call_at(deadline, self._check)
        self.transport.write(data)
        return futures

    def _check(self) -> None:
        self.watchdog = None
        if not self.deadlines:
            return
        loop = asyncio.get_running_loop()
        if self.deadlines[0] <= loop.time():
            self.fail(rexc.TimeoutError(f"Timeout reading from {self.where}"))
        else:
            self.watchdog = loop.call_at(self.deadlines[0], self._check)


class Lane:
    """One pipelined connection (see the module docstring), connected on first use.

    Args:
        kwargs: a redis-py single-node pool's ``connection_kwargs``.
        unix: connect to ``kwargs["path"]`` rather than ``host:port``.
    """

    def __init__(self, kwargs: dict[str, Any], *, unix: bool) -> None:
        self._unix = unix
        self._host = kwargs.get("host", "localhost")
        self._port = int(kwargs.get("port", 6379))
        self._path = kwargs.get("path", "")
        self.where = self._path if unix else f"{self._host}:{self._port}"
        self._timeout: float | None = kwargs.get("socket_timeout")
        self._connect_timeout: float | None = kwargs.get("socket_connect_timeout")
        if self._connect_timeout is None:
            self._connect_timeout = self._timeout
        self._keepalive = bool(kwargs.get("socket_keepalive"))
        self._handshake: list[list[Any]] = []
        password, username = kwargs.get("password"), kwargs.get("username")
        if password is not None:
            self._handshake.append(["AUTH", *([username] if username else []), password])
        if kwargs.get("client_name"):
            self._handshake.append(["CLIENT", "SETNAME", kwargs["client_name"]])
        if int(kwargs.get("db") or 0):
            self._handshake.append(["SELECT", int(kwargs["db"])])
        self._protocol: _Protocol | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Lock | None = None

    def __repr__(self) -> str:
        return f"Lane({self.where!r})"

    @classmethod
    def for_client(cls, client: Any) -> Lane | None:
        """A lane to the node of ``client``, or ``None`` when the lane cannot reproduce
        how ``client`` connects (see the module docstring).

        Args:
            client: any client the store accepts.
        """
        if type(client) is not Redis:
            return None
        pool = client.connection_pool
        kind = pool.connection_class
        kwargs = dict(pool.connection_kwargs)
        if kind not in (Connection, UnixDomainSocketConnection) or not set(kwargs) <= _SUPPORTED:
            return None
        if str(kwargs.get("protocol") or 2) != "2" or kwargs.get("decode_responses"):
            return None
        if kwargs.get("username") and kwargs.get("password") is None:
            return None
        return cls(kwargs, unix=kind is UnixDomainSocketConnection)

    # ----------------------------------------------------------------- connection

    def _make(self) -> _Protocol:
        return _Protocol(self.where, self._timeout)

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                if self._unix:
                    _, protocol = await loop.create_unix_connection(self._make, self._path)
                else:
                    _, protocol = await loop.create_connection(self._make, self._host, self._port)
                    if self._keepalive and protocol.transport is not None:
                        sock = protocol.transport.get_extra_info("socket")
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                if self._handshake:
                    data = b"".join(pack(command) for command in self._handshake)
                    try:
                        replies = await asyncio.gather(*protocol.send(data, len(self._handshake)))
                    except BaseException:
                        protocol.fail(rexc.ConnectionError(f"Handshake with {self.where} failed"))
                        raise
                    for reply in replies:
                        if isinstance(reply, Exception):
                            protocol.fail(
                                rexc.ConnectionError(f"Handshake with {self.where} failed")
                            )
                            raise reply
        except TimeoutError:
            raise rexc.TimeoutError(f"Timeout connecting to {self.where}") from None
        except OSError as exc:
            raise rexc.ConnectionError(
                f"Error {exc.errno} connecting to {self.where}. {exc.strerror or exc}"
            ) from exc
        return protocol

    async def _ready(self) -> _Protocol:
        """The live connection, connected (again) if need be: one connect at a time."""
        protocol = self._protocol
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use, or a new event loop: the old one is gone
            if protocol is not None and protocol.transport is not None:
                _abort(protocol.transport)
            self._protocol, self._loop, self._connecting = None, loop, asyncio.Lock()
        assert self._connecting is not None
        async with self._connecting:
            protocol = self._protocol
            if protocol is None or protocol.broken is not None:
                protocol = self._protocol = await self._connect()
            return protocol

    def _live(self) -> _Protocol | None:
        """The connection when it is up and of the running loop (the fast path)."""
        protocol = self._protocol
        if protocol is None or protocol.broken is not None:
            return None
        if self._loop is not asyncio.get_running_loop():
            return None
        return protocol

    # ----------------------------------------------------------------- calls

    async def call(self, *args: Any) -> Any:
        """One command's reply.

        Args:
            args: the command and its arguments.

        Raises:
            redis.exceptions.RedisError: Redis answered an error, as redis-py's parser
                maps its code (``NoScriptError``, ``AuthenticationError``…).
            redis.exceptions.ConnectionError: the connection could not be made or was
                lost (the command may have run).
            redis.exceptions.TimeoutError: no connection or no reply within the client's
                timeouts (the command may have run).
        """
        protocol = self._live() or await self._ready()
        reply = await protocol.send(pack(args), 1)[0]
        if isinstance(reply, Exception):  # an error reply, as redis-py's parser maps it
            raise reply
        return reply

    async def pipeline(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Every command's reply in order, written at once; an error reply is returned in
        its place (as redis-py's ``execute(raise_on_error=False)``).

        Args:
            commands: each command and its arguments.

        Raises:
            redis.exceptions.ConnectionError: as :meth:`call`.
            redis.exceptions.TimeoutError: as :meth:`call`.
        """
        protocol = self._live() or await self._ready()
        data = b"".join(pack(command) for command in commands)
        return list(await asyncio.gather(*protocol.send(data, len(commands))))

    async def close(self) -> None:
        """Close the connection (a later call connects again)."""
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            protocol.fail(rexc.ConnectionError(f"Connection to {self.where} closed"))
