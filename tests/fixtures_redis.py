"""The Redis stores' URL factories: a single node and a Redis Cluster.

- ``redis_url_factory``: ``IDEM_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``)
  with a new ``key_prefix`` per call; the prefix's keys are deleted (SCAN + DEL) at
  teardown.
- ``redis_cluster_url_factory``: ``IDEM_TEST_REDIS_CLUSTER_URL`` if set; otherwise a
  private 3-master cluster is started for the test session with the logic of
  ``scripts/services.py`` (stopped at the end of the session). Same per-call prefix
  and cleanup.

An unreachable server (or a cluster that cannot be started) is
``service_missing(reason)``: a skip, or a failure under ``IDEM_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest
import redis
import redis.cluster
from services import REDIS_CLUSTER_URL, REDIS_URL, load_services_script, service_missing

UrlFactory = Callable[[], str]


def with_option(url: str, name: str, value: str) -> str:
    """``url`` with the query option ``name=value`` set (others kept)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    query[name] = value
    return parts._replace(query=urlencode(query)).geturl()


def new_prefix() -> str:
    """A key prefix no other test uses."""
    return f"t{uuid.uuid4().hex[:12]}"


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


def _delete_prefix(client: redis.Redis | redis.cluster.RedisCluster, prefix: str) -> None:
    for key in list(client.scan_iter(match=f"{prefix}:*", count=500)):
        client.delete(key)


_checked: dict[str, str] = {}
"""Session cache: base URL name → the URL, or ``"!" + reason`` when unusable."""


def redis_base_url() -> str:
    """The single-node test URL, checked with PING once per session."""
    if "single" not in _checked:
        client = sync_single_client(REDIS_URL)
        try:
            client.ping()
            _checked["single"] = REDIS_URL
        except (redis.exceptions.RedisError, OSError) as exc:
            _checked["single"] = f"!Redis not reachable at {REDIS_URL}: {exc}"
        finally:
            client.close()
    found = _checked["single"]
    if found.startswith("!"):
        service_missing(found[1:])
    return found


def redis_cluster_base_url(config: pytest.Config) -> str:
    """``IDEM_TEST_REDIS_CLUSTER_URL``, or a private cluster started once for the session
    (stopped when the session ends)."""
    if "cluster" not in _checked:
        _checked["cluster"] = _find_cluster(config)
    found = _checked["cluster"]
    if found.startswith("!"):
        service_missing(found[1:])
    return found


def _find_cluster(config: pytest.Config) -> str:
    url = REDIS_CLUSTER_URL
    if not url:
        module = load_services_script()
        try:
            services = module.start("redis")
        except Exception as exc:
            return f"!no IDEM_TEST_REDIS_CLUSTER_URL, and a private cluster failed: {exc}"
        config.add_cleanup(lambda: module.stop_services(services))
        url = str(services.redis_cluster_url)
        if not url:
            return "!no IDEM_TEST_REDIS_CLUSTER_URL, and redis-server is not installed"
    try:
        client = sync_cluster_client(url)
        client.ping()
        client.close()
    except (redis.exceptions.RedisError, OSError) as exc:
        return f"!Redis Cluster not reachable at {url}: {exc}"
    return url


def _factory(base: str, client: redis.Redis | redis.cluster.RedisCluster) -> Iterator[UrlFactory]:
    prefixes: list[str] = []

    def make() -> str:
        prefix = new_prefix()
        prefixes.append(prefix)
        return with_option(base, "key_prefix", prefix)

    try:
        yield make
    finally:
        try:
            for prefix in prefixes:
                _delete_prefix(client, prefix)
        finally:
            client.close()


@pytest.fixture
def redis_url_factory() -> Iterator[UrlFactory]:
    """Single-node store URLs, each with its own ``key_prefix``; keys deleted after."""
    base = redis_base_url()
    yield from _factory(base, sync_single_client(base))


@pytest.fixture
def redis_cluster_url_factory(pytestconfig: pytest.Config) -> Iterator[UrlFactory]:
    """Redis Cluster store URLs, each with its own ``key_prefix``; keys deleted after."""
    base = redis_cluster_base_url(pytestconfig)
    yield from _factory(base, sync_cluster_client(base))
