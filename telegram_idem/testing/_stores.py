"""Which stores the pytest plugin tests against, where their servers are, and cleanup.

Memory and SQLite need nothing. A server store's URL comes from, in this order:

| store         | CLI flag                      | environment variable     | ini option               |
|---------------|-------------------------------|--------------------------|--------------------------|
| postgres      | ``--idem-postgres-url``       | ``IDEM_POSTGRES_URL``      | ``idem_postgres_url``      |
| redis         | ``--idem-redis-url``          | ``IDEM_REDIS_URL``         | ``idem_redis_url``         |
| redis-cluster | ``--idem-redis-cluster-url``  | ``IDEM_REDIS_CLUSTER_URL`` | ``idem_redis_cluster_url`` |
| dynamodb      | ``--idem-dynamodb-url``       | ``IDEM_DYNAMODB_URL``      | ``idem_dynamodb_url``      |

NATS (JetStream) is not a store but the broker of the JetStream inbox
(:mod:`telegram_idem.backends.nats`); its URL comes from ``--idem-nats-url``,
``IDEM_NATS_URL`` or ``idem_nats_url``, else :data:`NATS_DEFAULT_URL` when a server
answers there (:func:`nats_answers`); tests that need it skip otherwise (fail with
``IDEM_REQUIRE_STORES=1``).

With none set, a ``pytest_idem_server_url`` hook (:mod:`telegram_idem.testing.hooks`)
may name one (a project's conftest that starts its own servers); then, with a Docker
engine answering (``DOCKER_HOST``, or ``/var/run/docker.sock``) and ``testcontainers``
importable, a container is started once per test session (``postgres:16-alpine``,
``redis:7-alpine``, ``amazon/dynamodb-local``; none for redis-cluster) and removed at the
end; ``idem_testcontainers = false`` (ini) turns that off. Otherwise the store's tests
are skipped with a message naming what to set.

Tests share a server but never a key: each test's :class:`~telegram_idem.Idem` gets its
own key prefix (``KeyBuilder(prefix=…)``), and :func:`purge_prefix` deletes that prefix's
records when the test ends. :class:`IsolatedUrls` goes further for tests of a store
itself: every URL it makes has a storage place of its own (a file, a table prefix, a key
prefix or a table), removed by :meth:`IsolatedUrls.close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import os
import re
import secrets
import socket
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit

from telegram_idem.backends import store_from_url

__all__ = [
    "ALL_STORES",
    "NATS_DEFAULT_URL",
    "SERVER_STORES",
    "ContainerPool",
    "IsolatedUrls",
    "ServerStore",
    "docker_answers",
    "missing_message",
    "nats_answers",
    "prepare_url",
    "purge_prefix",
    "run_in_thread",
    "with_options",
]

T = TypeVar("T")

ALL_STORES: tuple[str, ...] = ("memory", "sqlite", "postgres", "redis", "redis-cluster", "dynamodb")
"""Every store the plugin knows, in the order tests are parametrised."""


@dataclass(frozen=True, slots=True)
class ServerStore:
    """How to configure one server store (see the module table).

    Attributes:
        name: the store's name in ``--idem-stores`` (``"redis-cluster"``).
        example: a URL to show in messages.
        extra: the pip extra that installs its driver.
        testcontainers_extra: the ``testcontainers`` extra of its container, ``""`` for
            one without extra, ``None`` when no container is started for it.
    """

    name: str
    example: str
    extra: str
    testcontainers_extra: str | None

    @property
    def flag(self) -> str:
        """The CLI flag, e.g. ``--idem-postgres-url``."""
        return f"--idem-{self.name}-url"

    @property
    def env(self) -> str:
        """The environment variable, e.g. ``IDEM_REDIS_CLUSTER_URL``."""
        return f"IDEM_{self.name.upper().replace('-', '_')}_URL"

    @property
    def ini(self) -> str:
        """The ini option (also the CLI flag's ``dest``), e.g. ``idem_redis_cluster_url``."""
        return f"idem_{self.name.replace('-', '_')}_url"


SERVER_STORES: dict[str, ServerStore] = {
    s.name: s
    for s in (
        ServerStore(
            "postgres", "postgresql://user:password@127.0.0.1:5432/db", "postgres", "postgres"
        ),
        ServerStore("redis", "redis://127.0.0.1:6379/0", "redis", "redis"),
        ServerStore("redis-cluster", "redis+cluster://127.0.0.1:7000", "redis", None),
        ServerStore(
            "dynamodb",
            "dynamodb://idem_test?endpoint_url=http://127.0.0.1:8000&region=us-east-1",
            "dynamodb",
            "",
        ),
    )
}
"""The server stores by name."""


NATS_DEFAULT_URL = "nats://127.0.0.1:4222"
"""Where the plugin looks for NATS when no URL is configured."""


def nats_answers(url: str, timeout: float = 1.0) -> bool:
    """True if a NATS server greets on ``url``'s host and port (its ``INFO`` line).

    Args:
        url: ``nats://host:port`` (the first of a comma-separated list).
        timeout: seconds to wait for the greeting.
    """
    parts = urlsplit(url.split(",")[0])
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or 4222), timeout
        ) as s:
            s.settimeout(timeout)
            return s.recv(4).startswith(b"INFO")
    except OSError:
        return False


def missing_message(name: str, *, docker_note: str = "", hook_note: str = "") -> str:
    """The skip reason for an unconfigured server store: exactly what to set.

    Args:
        name: a key of :data:`SERVER_STORES`.
        docker_note: why no container was started (shown in brackets).
        hook_note: why the ``pytest_idem_server_url`` hook found no server.
    """
    s = SERVER_STORES[name]
    found = f" (pytest_idem_server_url: {hook_note})" if hook_note else ""
    if s.testcontainers_extra is None:
        containers = ""
    else:
        package = (
            f"testcontainers[{s.testcontainers_extra}]"
            if s.testcontainers_extra
            else ("testcontainers")
        )
        note = f" ({docker_note})" if docker_note else ""
        containers = f"; or run a Docker engine with '{package}' installed{note}"
    return (
        f"no {name} store configured{found}: pass {s.flag}={s.example}, set {s.env}, or set "
        f"{s.ini} in the [pytest] ini section{containers}; or leave {name} out with "
        f"--idem-stores=memory,sqlite"
    )


def with_options(url: str, **options: str) -> str:
    """``url`` with each query option set to its value (replacing one it had; the others
    kept in order)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in options]
    query += list(options.items())
    return parts._replace(query=urlencode(query)).geturl()


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
        if name not in _STARTERS:
            self._reasons[name] = f"no container is started for {name}"
            return None
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


# ---------------------------------------------------------------------- cleanup


def _is_redis(name: str) -> bool:
    return name in ("redis", "redis-cluster")


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
        if _is_redis(name):
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


def _postgres_dsn(url: str) -> str:
    """``url`` without the store's own options: a DSN asyncpg accepts."""
    from telegram_idem.backends.postgres import STORE_OPTIONS

    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in STORE_OPTIONS]
    return parts._replace(query=urlencode(query)).geturl()


async def _purge_postgres(store: Any, url: str, prefix: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(_postgres_dsn(url), timeout=10.0)
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


# ---------------------------------------------------------------------- isolated URLs


def run_in_thread(coro_fn: Callable[[], Coroutine[Any, Any, T]], timeout: float = 60.0) -> T:
    """Run ``coro_fn()`` to completion on a new event loop in a helper thread, and return
    its result: for async set-up and clean-up called from synchronous code, whether or
    not the calling thread runs an event loop.

    Args:
        coro_fn: makes the coroutine (called in the helper thread).
        timeout: seconds to wait for it.

    Raises:
        TimeoutError: it took longer than ``timeout``.
        BaseException: whatever the coroutine raised.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro_fn())
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, name="idem-store-setup", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"store set-up or clean-up took more than {timeout} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


class IsolatedUrls:
    """Fresh URLs of one store, each with a storage place no other URL uses.

    Calling it returns a new URL: ``memory://`` (every store object made from it is a
    separate, empty store); a new SQLite file under ``directory``; the PostgreSQL server
    with a new ``table_prefix`` whose tables are already made (the store's ``migrate()``);
    the Redis server or cluster with a new ``key_prefix``; the DynamoDB endpoint with a
    new table and ``create_table=1``. :meth:`close` removes what they made: the
    PostgreSQL tables of each prefix, the Redis keys under each prefix, each DynamoDB
    table (best effort: the endpoint may be gone). New names are ``t`` + 12 hex digits.

    Args:
        name: a name in :data:`ALL_STORES`.
        base: the server's URL (a store URL, e.g. the configured one); ignored for
            memory and SQLite.
        directory: where SQLite files go (a test's ``tmp_path``).

    Raises:
        ValueError: an unknown store, or a server store without ``base``.
    """

    def __init__(self, name: str, base: str | None, directory: Path) -> None:
        if name not in ALL_STORES:
            raise ValueError(f"unknown store {name!r}; known: {', '.join(ALL_STORES)}")
        if name in SERVER_STORES and not base:
            raise ValueError(f"the {name} store needs the URL of its server")
        self.name = name
        self.base = base or ""
        self.directory = directory
        self.made: list[str] = []
        """Every URL made so far, oldest first."""
        self._files = itertools.count()

    def __call__(self) -> str:
        """A new isolated URL (see the class docstring).

        Raises:
            Exception: a PostgreSQL table prefix could not be migrated (the driver's error).
        """
        name = f"t{secrets.token_hex(6)}"
        if self.name == "memory":
            url = "memory://"
        elif self.name == "sqlite":
            url = f"sqlite:///{self.directory / f'idem-{next(self._files)}.db'}"
        elif self.name == "postgres":
            url = with_options(self.base, table_prefix=name)
            run_in_thread(lambda: _migrate(url))
        elif _is_redis(self.name):
            url = with_options(self.base, key_prefix=name)
        else:
            parts = urlsplit(self.base)
            url = with_options(parts._replace(netloc=name).geturl(), create_table="1")
        self.made.append(url)
        return url

    def close(self) -> None:
        """Remove what the URLs made (see the class docstring); idempotent.

        Raises:
            Exception: PostgreSQL or Redis refused or could not be reached (the driver's
                error); the list of URLs is cleared first, so a retry does nothing.
        """
        made, self.made = self.made, []
        if not made or self.name not in SERVER_STORES:
            return
        run_in_thread(lambda: _remove(self.name, made))


async def _migrate(url: str) -> None:
    store: Any = store_from_url(url)
    try:
        await store.migrate()
    finally:
        await store.close()


async def _remove(name: str, urls: list[str]) -> None:
    if name == "postgres":
        await _drop_postgres_prefixes(urls)
        return
    for url in urls:
        store: Any = store_from_url(url)
        try:
            if _is_redis(name):
                client = store.client
                async for key in client.scan_iter(match=f"{store.key_prefix}:*", count=500):
                    await client.delete(key)
            else:
                with contextlib.suppress(Exception):  # best effort: the endpoint may be gone
                    await (await store.client()).delete_table(TableName=store.table)
        finally:
            await store.close()


async def _drop_postgres_prefixes(urls: list[str]) -> None:
    """Drop every table whose name starts with one of the URLs' ``table_prefix + "_"``."""
    import asyncpg

    prefixes = [dict(parse_qsl(urlsplit(u).query))["table_prefix"] + "_" for u in urls]
    conn = await asyncpg.connect(_postgres_dsn(urls[0]), timeout=10.0)
    try:
        for prefix in prefixes:
            tables = await conn.fetch(
                "SELECT quote_ident(tablename) AS name FROM pg_tables"
                " WHERE schemaname = current_schema() AND left(tablename, $2) = $1",
                prefix,
                len(prefix),
            )
            for row in tables:
                await conn.execute(f"DROP TABLE IF EXISTS {row['name']} CASCADE")
    finally:
        await conn.close()
