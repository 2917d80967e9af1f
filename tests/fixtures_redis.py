"""The Redis stores' URL factories, and the servers found without configuration.

- ``redis_url_factory``: the single server's URL (the plugin's ``--idem-redis-url`` /
  ``IDEM_REDIS_URL`` / ``idem_redis_url``, else :func:`find_redis`) with a new
  ``key_prefix`` per call; the prefix's keys are deleted at teardown.
- ``redis_cluster_url_factory``: the same on a Redis Cluster (``--idem-redis-cluster-url``
  / ``IDEM_REDIS_CLUSTER_URL`` / ``idem_redis_cluster_url``, else
  :func:`start_private_cluster`: a 3-master cluster for the session, with the logic of
  ``scripts/services.py``, stopped at the end of the session).

Both are the plugin's :class:`~telegram_idem.testing._stores.IsolatedUrls`. A server
that cannot be found is a skip with the reason, or a failure when stores are required.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest
import redis
import redis.cluster
from services import (
    DEFAULT_REDIS_URL,
    ServiceUnavailable,
    UrlFactory,
    load_services_script,
    redis_url,
    service_missing,
)

from telegram_idem.testing.plugin import isolated_urls

__all__ = [
    "find_redis",
    "load_services_script",
    "redis_base_url",
    "redis_cluster_url_factory",
    "redis_url_factory",
    "start_private_cluster",
    "sync_cluster_client",
    "sync_single_client",
    "with_option",
]


def with_option(url: str, name: str, value: str) -> str:
    """``url`` with the query option ``name=value`` set (others kept)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    query[name] = value
    return parts._replace(query=urlencode(query)).geturl()


def sync_single_client(url: str) -> redis.Redis:
    """A synchronous client for a ``redis://`` test URL (store options dropped)."""
    parts = urlsplit(url)
    query = {k: v for k, v in parse_qsl(parts.query) if k not in {"key_prefix", "socket_timeout"}}
    plain = parts._replace(query=urlencode(query)).geturl()
    return redis.Redis.from_url(plain, socket_timeout=5, socket_connect_timeout=5)


def sync_cluster_client(url: str) -> redis.cluster.RedisCluster:
    """A synchronous cluster client for a ``redis+cluster://`` test URL."""
    parts = urlsplit(url)
    first = parts.netloc.rpartition("@")[2].split(",")[0]
    host, _, port = first.rpartition(":")
    return redis.cluster.RedisCluster(
        host=host,
        port=int(port),
        username=parts.username or None,
        password=parts.password or None,
        socket_timeout=5,
        socket_connect_timeout=5,
    )


def find_redis() -> str:
    """``DEFAULT_REDIS_URL`` if the server answers PING.

    Raises:
        ServiceUnavailable: it does not (the message says why).
    """
    client = sync_single_client(DEFAULT_REDIS_URL)
    try:
        client.ping()
    except (redis.exceptions.RedisError, OSError) as exc:
        raise ServiceUnavailable(f"Redis not reachable at {DEFAULT_REDIS_URL}: {exc}") from exc
    finally:
        client.close()
    return DEFAULT_REDIS_URL


def start_private_cluster(config: pytest.Config) -> str:
    """A private 3-master Redis Cluster for the session (stopped when it ends); its URL.

    Raises:
        ServiceUnavailable: redis-server is not installed, or the cluster did not start
            or does not answer.
    """
    module = load_services_script()
    try:
        services = module.start("redis")
    except Exception as exc:
        raise ServiceUnavailable(f"a private Redis Cluster failed: {exc}") from exc
    config.add_cleanup(lambda: module.stop_services(services))
    url = str(services.redis_cluster_url)
    if not url:
        raise ServiceUnavailable("redis-server is not installed: no private Redis Cluster")
    try:
        client = sync_cluster_client(url)
        client.ping()
        client.close()
    except (redis.exceptions.RedisError, OSError) as exc:
        raise ServiceUnavailable(f"Redis Cluster not reachable at {url}: {exc}") from exc
    return url


def private_redis_server(prefix: str) -> Iterator[int]:
    """A redis-server of the caller's own on a free port, for the life of the generator
    (kill -9 and its directory removed after): for tests that read the server's command
    statistics, which no other test may touch. Skips (or fails, see services) without
    ``redis-server``."""
    if shutil.which("redis-server") is None:
        service_missing("redis-server is not installed: no private server")
    module = load_services_script()
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    port = module.free_port()
    try:
        pid = module.start_redis_server(directory, port)
    except module.ServiceError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        service_missing(f"private redis-server failed: {exc}")
    yield port
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    shutil.rmtree(directory, ignore_errors=True)


def redis_base_url() -> str:
    """The single Redis server's URL, no store options (skips when there is none)."""
    return redis_url()


@pytest.fixture
def redis_url_factory(pytestconfig: pytest.Config, tmp_path: Path) -> Iterator[UrlFactory]:
    """Single-node store URLs, each with its own ``key_prefix``; keys deleted after."""
    urls = isolated_urls(pytestconfig, "redis", tmp_path)
    try:
        yield urls
    finally:
        urls.close()


@pytest.fixture
def redis_cluster_url_factory(pytestconfig: pytest.Config, tmp_path: Path) -> Iterator[UrlFactory]:
    """Redis Cluster store URLs, each with its own ``key_prefix``; keys deleted after."""
    urls = isolated_urls(pytestconfig, "redis-cluster", tmp_path)
    try:
        yield urls
    finally:
        urls.close()
