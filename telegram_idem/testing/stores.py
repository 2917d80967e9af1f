"""Which stores the pytest plugin tests against, where their servers are, and cleanup.

Memory and SQLite need nothing. A server store's URL comes from, in this order:

| store    | CLI flag                 | environment variable | ini option          |
|----------|--------------------------|----------------------|---------------------|
| postgres | ``--idem-postgres-url``  | ``IDEM_POSTGRES_URL`` | ``idem_postgres_url`` |
| redis    | ``--idem-redis-url``     | ``IDEM_REDIS_URL``    | ``idem_redis_url``    |
| dynamodb | ``--idem-dynamodb-url``  | ``IDEM_DYNAMODB_URL`` | ``idem_dynamodb_url`` |

With none set, and a Docker engine answering (``DOCKER_HOST``, or
``/var/run/docker.sock``) and ``testcontainers`` importable, a container is started once
per test session (``postgres:16-alpine``, ``redis:7-alpine``,
``amazon/dynamodb-local``) and removed at the end; ``idem_testcontainers = false`` (ini)
turns that off. Otherwise the store's tests are skipped with a message naming what to set.

Tests share a server but never a key: each test's :class:`~telegram_idem.Idem` gets its
own key prefix (``KeyBuilder(prefix=…)``), and :func:`purge_prefix` deletes that prefix's
records when the test ends.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from telegram_idem.backends import store_from_url

__all__ = [
    "ALL_STORES",
    "SERVER_STORES",
    "ContainerPool",
    "ServerStore",
    "docker_answers",
    "missing_message",
    "prepare_url",
    "purge_prefix",
]

ALL_STORES: tuple[str, ...] = ("memory", "sqlite", "postgres", "redis", "dynamodb")
"""Every store the plugin knows, in the order tests are parametrised."""


@dataclass(frozen=True, slots=True)
class ServerStore:
    """How to configure one server store (see the module table)."""

    name: str
    example: str
    extra: str
    testcontainers_extra: str

    @property
    def flag(self) -> str:
        """The CLI flag, e.g. ``--idem-postgres-url``."""
        return f"--idem-{self.name}-url"

    @property
    def env(self) -> str:
        """The environment variable, e.g. ``IDEM_POSTGRES_URL``."""
        return f"IDEM_{self.name.upper()}_URL"

    @property
    def ini(self) -> str:
        """The ini option, e.g. ``idem_postgres_url``."""
        return f"idem_{self.name}_url"


SERVER_STORES: dict[str, ServerStore] = {
    s.name: s
    for s in (
        ServerStore(
            "postgres", "postgresql://user:password@127.0.0.1:5432/db", "postgres", "postgres"
        ),
        ServerStore("redis", "redis://127.0.0.1:6379/0", "redis", "redis"),
        ServerStore(
            "dynamodb",
            "dynamodb://idem_test?endpoint_url=http://127.0.0.1:8000&region=us-east-1",
            "dynamodb",
            "",
        ),
    )
}
"""The server stores by name."""


def missing_message(name: str, *, docker_note: str = "") -> str:
    """The skip reason for an unconfigured server store: exactly what to set."""
    s = SERVER_STORES[name]
    containers = (
        f"testcontainers[{s.testcontainers_extra}]"
        if s.testcontainers_extra
        else ("testcontainers")
    )
    note = f" ({docker_note})" if docker_note else ""
    return (
        f"no {name} store configured: pass {s.flag}={s.example}, set {s.env}, or set "
        f"{s.ini} in the [pytest] ini section; or run a Docker engine with "
        f"'{containers}' installed{note}; or leave {name} out with "
        f"--idem-stores=memory,sqlite"
    )


def prepare_url(name: str, url: str) -> str:
    """The configured URL with what a throwaway test store needs: Postgres
    ``auto_create=1`` and DynamoDB ``create_table=1`` unless the URL says otherwise."""
    option = {"postgres": "auto_create", "dynamodb": "create_table"}.get(name)
    if option is None:
        return url
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(k == option for k, _ in query):
        return url
    query.append((option, "1"))
    return parts._replace(query=urlencode(query)).geturl()


def docker_answers(timeout: float = 1.0) -> bool:
    """True if a Docker engine answers ``GET /_ping`` at ``DOCKER_HOST`` (``unix://`` or
    ``tcp://``) or, without it, at ``/var/run/docker.sock``; ``timeout`` in seconds."""
    host = os.environ.get("DOCKER_HOST", "")
    try:
        if host.startswith("tcp://"):
            parts = urlsplit(host)
            sock = socket.create_connection((parts.hostname or "", parts.port or 2375), timeout)
        else:
            path = host.removeprefix("unix://") if host else "/var/run/docker.sock"
            if not os.path.exists(path):
                return False
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(path)
        with sock:
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            first = sock.recv(64)
    except OSError:
        return False
    return first.startswith(b"HTTP/") and b" 200 " in first


def _testcontainers_importable() -> bool:
    return importlib.util.find_spec("testcontainers") is not None


class ContainerPool:
    """Server containers started on demand, at most once per store per session.

    Args:
        enabled: ``False`` never starts containers.
    """

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._urls: dict[str, str | None] = {}
        self._reasons: dict[str, str] = {}
        self._containers: list[Any] = []
        self._lock = threading.Lock()
        self._docker: bool | None = None

    def url(self, name: str) -> tuple[str | None, str]:
        """``(url, "")`` of a running container for ``name``, or ``(None, why not)``."""
        with self._lock:
            if name not in self._urls:
                self._urls[name] = self._start(name)
            return self._urls[name], self._reasons.get(name, "")

    def _start(self, name: str) -> str | None:
        if not self.enabled:
            self._reasons[name] = "idem_testcontainers is false"
            return None
        if self._docker is None:
            self._docker = docker_answers()
        if not self._docker:
            self._reasons[name] = "no Docker engine answered"
            return None
        if not _testcontainers_importable():
            self._reasons[name] = "a Docker engine answers, but testcontainers is not installed"
            return None
        try:
            container, url = _STARTERS[name]()
        except Exception as exc:  # image pull, port, API differences: say why, then skip
            self._reasons[name] = f"starting a {name} container failed: {exc!r}"
            return None
        self._containers.append(container)
        return url

    def stop_all(self) -> None:
        """Stop every container this pool started."""
        containers, self._containers = self._containers, []
        for container in containers:
            with contextlib.suppress(Exception):
                container.stop()


def _start_postgres() -> tuple[Any, str]:
    module = import_module("testcontainers.postgres")
    container = module.PostgresContainer("postgres:16-alpine", driver=None)
    container.start()
    url = re.sub(r"^postgresql\+\w+://", "postgresql://", container.get_connection_url())
    return container, url


def _start_redis() -> tuple[Any, str]:
    container = import_module("testcontainers.redis").RedisContainer("redis:7-alpine")
    container.start()
    host, port = container.get_container_host_ip(), container.get_exposed_port(6379)
    return container, f"redis://{host}:{port}/0"


def _start_dynamodb() -> tuple[Any, str]:
    core = import_module("testcontainers.core.container")
    waiting = import_module("testcontainers.core.waiting_utils")
    container = core.DockerContainer("amazon/dynamodb-local:latest").with_exposed_ports(8000)
    container.start()
    waiting.wait_for_logs(container, "Initializing DynamoDB Local", timeout=60)
    host, port = container.get_container_host_ip(), container.get_exposed_port(8000)
    return container, f"dynamodb://idem_test?endpoint_url=http://{host}:{port}&region=us-east-1"


_STARTERS: dict[str, Callable[[], tuple[Any, str]]] = {
    "postgres": _start_postgres,
    "redis": _start_redis,
    "dynamodb": _start_dynamodb,
}


async def purge_prefix(name: str, url: str, prefix: str) -> int:
    """Delete every record whose key starts with ``prefix + ":"`` from the server store at
    ``url``, through a fresh store object (the test may have closed its own). Returns how
    many were deleted; memory and SQLite stores return 0 (each test has its own).

    Raises:
        Exception: whatever the driver raised (the plugin turns it into a warning).
    """
    if name not in SERVER_STORES:
        return 0
    store: Any = store_from_url(url)
    try:
        if name == "redis":
            return await _purge_redis(store, prefix)
        if name == "postgres":
            return await _purge_postgres(store, url, prefix)
        return await _purge_dynamodb(store, prefix)
    finally:
        await store.close()


async def _purge_redis(store: Any, prefix: str) -> int:
    client = store.client
    pattern = f"{store.key_prefix}:{{{prefix}:*"
    deleted = 0
    async for key in client.scan_iter(match=pattern, count=500):
        deleted += int(await client.delete(key))
    return deleted


async def _purge_postgres(store: Any, url: str, prefix: str) -> int:
    import asyncpg  # type: ignore[import-untyped]

    from telegram_idem.backends.postgres import STORE_OPTIONS

    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in STORE_OPTIONS]
    dsn = parts._replace(query=urlencode(query)).geturl()
    conn = await asyncpg.connect(dsn, timeout=10.0)
    try:
        status = await conn.execute(
            f'DELETE FROM "{store.table}" WHERE left(key, $2) = $1',
            prefix + ":",
            len(prefix) + 1,
        )
    except asyncpg.UndefinedTableError:
        return 0
    finally:
        await conn.close()
    return int(str(status).rsplit(" ", 1)[-1] or 0)


async def _purge_dynamodb(store: Any, prefix: str) -> int:
    client = await store.client()
    deleted = 0
    paginator = client.get_paginator("scan")
    async for page in paginator.paginate(
        TableName=store.table,
        ProjectionExpression="pk",
        FilterExpression="begins_with(pk, :p)",
        ExpressionAttributeValues={":p": {"S": prefix + ":"}},
        ConsistentRead=True,
    ):
        for item in page.get("Items", []):
            await client.delete_item(TableName=store.table, Key={"pk": item["pk"]})
            deleted += 1
    return deleted
