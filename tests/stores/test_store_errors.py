"""Store errors say what failed and where, and tell mistakes from outages (issue 8, items
11, 18, 22).

Real servers: a Redis of the test's own with ``requirepass`` on a free port, the shared
Redis read-only (a database index it lacks), an unresolvable host, the shared PostgreSQL,
and for DynamoDB a loopback HTTP server answering as DynamoDB does.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from aiohttp import web
from fixtures_dynamodb import free_port
from services import postgres_dsn, redis_url

from telegram_idem import ConfigurationError, StoreError, store_from_url
from telegram_idem.backends._base import Store
from telegram_idem.errors import IdemError

PASSWORD = "s3cret-Pw-42"
LEASE, RETENTION = 30.0, 3600.0


async def first_use(store: Store) -> IdemError:
    """The error the store's first call raises (it must raise a library error)."""
    try:
        with pytest.raises(IdemError) as info:
            await store.claim("idem:7:u:1", lease=LEASE, retention=RETENTION)
        return info.value
    finally:
        await store.close()


def assert_no_password(error: BaseException) -> None:
    assert PASSWORD not in str(error) and PASSWORD not in repr(error)


# ----------------------------------------------------------------- Redis


@pytest.fixture(scope="module")
def redis_with_password(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A redis-server of this module's own with ``requirepass``; yields its port."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    directory: Path = tmp_path_factory.mktemp("redis-auth")
    proc = subprocess.Popen(
        [
            *(server, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", PASSWORD),
            *("--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", str(directory)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=port, password=PASSWORD, socket_timeout=1).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_redis_wrong_password_is_a_configuration_error_naming_the_host(
    redis_with_password: int,
) -> None:
    port = redis_with_password
    error = await first_use(store_from_url(f"redis://:wrong-{PASSWORD}@127.0.0.1:{port}/0"))
    assert isinstance(error, ConfigurationError), error
    assert f"127.0.0.1:{port}/0" in str(error)
    assert "WRONGPASS" in str(error) or "invalid" in str(error).lower()
    assert_no_password(error)


async def test_redis_no_password_is_a_configuration_error(redis_with_password: int) -> None:
    error = await first_use(store_from_url(f"redis://127.0.0.1:{redis_with_password}/0"))
    assert isinstance(error, ConfigurationError), error
    assert "NOAUTH" in str(error) or "Authentication required" in str(error)


async def test_redis_right_password_works_and_an_outage_keeps_the_driver_text(
    redis_with_password: int,
) -> None:
    store = store_from_url(f"redis://:{PASSWORD}@127.0.0.1:{redis_with_password}/0")
    try:
        claim = await store.claim("idem:7:u:1", lease=LEASE, retention=RETENTION)
        assert claim.record.fencing_token == 1
    finally:
        await store.close()
    closed = free_port()  # nothing listens there
    error = await first_use(store_from_url(f"redis://:{PASSWORD}@127.0.0.1:{closed}/0"))
    assert isinstance(error, StoreError), error
    assert f"127.0.0.1:{closed}" in str(error)
    assert "Connect call failed" in str(error) or "refused" in str(error).lower()
    assert "network:ConnectionError" not in str(error)  # redis-py 8's repr: a category only
    assert_no_password(error)


async def test_redis_database_index_the_server_lacks_is_a_configuration_error() -> None:
    parts = urlsplit(redis_url())
    url = parts._replace(path="/99").geturl()  # the shared server: nothing is written
    error = await first_use(store_from_url(url))
    assert isinstance(error, ConfigurationError), error
    assert "DB index is out of range" in str(error) and "/99" in str(error)


async def test_redis_unresolvable_host_is_a_store_error_naming_it() -> None:
    error = await first_use(store_from_url("redis://no-such-host.invalid:6379/0"))
    assert isinstance(error, StoreError), error
    assert "no-such-host.invalid" in str(error)


# ----------------------------------------------------------------- PostgreSQL


def _postgres(database: str | None = None, port: int | None = None) -> str:
    parts = urlsplit(postgres_dsn())
    user = parts.username or "postgres"
    host = parts.hostname or "127.0.0.1"
    netloc = f"{user}:{PASSWORD}@{host}:{port or parts.port or 5432}"
    path = f"/{database}" if database else parts.path
    return parts._replace(netloc=netloc, path=path).geturl()


async def test_postgres_unknown_database_is_a_configuration_error_naming_the_host() -> None:
    error = await first_use(store_from_url(_postgres(database="no_such_db_idem")))
    if isinstance(error, StoreError) and "refused" in str(error).lower():
        pytest.skip(f"PostgreSQL not reachable: {error}")
    assert isinstance(error, ConfigurationError), error
    assert "no_such_db_idem" in str(error) and "host=" in str(error)
    assert_no_password(error)


async def test_postgres_outage_names_the_host_and_keeps_the_driver_text() -> None:
    error = await first_use(store_from_url(_postgres(port=free_port()) + "?connect_timeout=2"))
    assert isinstance(error, StoreError), error
    assert "host='127.0.0.1'" in str(error) or "host=" in str(error)
    assert "Connect call failed" in str(error) or "refused" in str(error).lower()
    assert_no_password(error)


async def test_postgres_never_leaks_a_raw_driver_error_for_a_long_key(
    postgres_url_factory: Callable[[], str],
) -> None:
    """A 10 KB key called directly on the store: stored (if keys are bounded before the
    store sees them) or a ConfigurationError naming the limit; never asyncpg's own
    ProgramLimitExceededError."""
    store = store_from_url(postgres_url_factory() + "&auto_create=1")
    key = "idem:7:a:" + secrets.token_hex(5_000)  # 10 KB that compression cannot shrink
    try:
        try:
            claim = await store.claim(key, lease=LEASE, retention=RETENTION)
        except ConfigurationError as exc:
            assert "2,700 bytes" in str(exc)
        else:
            assert claim.record.fencing_token == 1
            assert await store.get(key) is not None
    finally:
        await store.close()


# ----------------------------------------------------------------- DynamoDB


@asynccontextmanager
async def serve(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[str]:
    """An HTTP server on a free loopback port; yields its URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    "code",
    ["UnrecognizedClientException", "InvalidSignatureException", "AccessDeniedException"],
)
async def test_dynamodb_bad_credentials_are_a_configuration_error_naming_the_table(
    code: str,
) -> None:
    async def refuse(request: web.Request) -> web.Response:
        body = {"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": f"no: {code}"}
        return web.Response(
            status=400, body=json.dumps(body).encode(), content_type="application/x-amz-json-1.0"
        )

    async with serve(refuse) as endpoint:
        store = store_from_url(f"dynamodb://bot-idem?endpoint_url={endpoint}&max_attempts=1")
        error = await first_use(store)
    assert isinstance(error, ConfigurationError), error
    assert "'bot-idem'" in str(error) and code in str(error) and f"no: {code}" in str(error)


# ----------------------------------------------------------------- passwords in messages


@pytest.mark.parametrize(
    "url",
    [
        f"mysql://bot:{PASSWORD}@db/bot",  # unknown scheme
        f"redis://:{PASSWORD}@127.0.0.1:6379/0?bogus=1",
        f"redis://:{PASSWORD}@127.0.0.1:6379/x",
        f"redis://:{PASSWORD}@127.0.0.1:6379/0?socket_timeout=-1",
        f"rediss://:{PASSWORD}@127.0.0.1:6379/0?protocol=9",
        f"redis+cluster://:{PASSWORD}@127.0.0.1:7000/3",
        f"redis+cluster://:{PASSWORD}@127.0.0.1:7000?bogus=1",
        f"postgresql://bot:{PASSWORD}@db/bot?bogus=1",
        f"postgresql://bot:{PASSWORD}@db/bot?auto_create=maybe",
        f"postgresql://bot:{PASSWORD}@db:99999/bot",
        f"postgres://bot:{PASSWORD}@db/bot?min_size=x",
    ],
)
def test_no_configuration_error_shows_the_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        store_from_url(url)
    assert_no_password(info.value)
