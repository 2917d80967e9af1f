"""The Redis store URL → the redis-py client the store makes (docs/store-redis.md).

- ``redis://[[user]:password@]host[:port][/db]`` — a single node (or a proxy);
- ``rediss://…`` — the same over TLS;
- ``redis+cluster://[[user]:password@]host:port[,host:port…]`` — a Redis Cluster.

Read through :class:`~telegram_idem.backends._url.StoreURL`: ``key_prefix``,
``inbox_shards``, ``socket_timeout`` and ``socket_connect_timeout`` are the store's; the redis-py options
listed below pass through; anything else is a
:class:`~telegram_idem.errors.ConfigurationError` (its message never shows the password).
Clients made here never resend a command (``retries=0``): a script whose reply was lost
may have run.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from telegram_idem.backends._url import StoreURL

__all__ = ["DEFAULT_PROTOCOL", "SCHEMES", "RedisClient", "client_from_url"]

RedisClient = Redis | RedisCluster
"""The clients the store accepts: ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster``."""

SCHEMES = ("redis", "rediss", "redis+cluster")
"""The URL schemes of the Redis store."""

DEFAULT_PROTOCOL = 2
"""RESP2 unless the URL asks for 3: with RESP3, redis-py 8 skips its check of pooled
connections at checkout (they may hold maintenance push messages), so after a Redis
restart every idle connection would fail one call; with RESP2 they are replaced."""

_DEFAULT_TIMEOUT = 5.0
_SINGLE_PASSTHROUGH = frozenset(
    {
        "db",
        "client_name",
        "health_check_interval",
        "max_connections",
        "socket_keepalive",
        "protocol",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_check_hostname",
    }
)
_CLUSTER_PASSTHROUGH = (_SINGLE_PASSTHROUGH - {"db"}) | {"ssl"}
_CLUSTER_FLAGS = ("ssl", "ssl_check_hostname", "socket_keepalive")
_CLUSTER_INTEGERS = ("max_connections", "protocol")


def client_from_url(url: str) -> tuple[RedisClient, str | None, int | None]:
    """The client for ``url`` (no connection opened yet), its ``key_prefix`` and its
    ``inbox_shards`` (each ``None`` when the URL does not say).

    Raises:
        ConfigurationError: another scheme, an unknown option (a TLS option on a plain
            ``redis://`` URL included), a value that does not parse, no host, a ``/db``
            that is not a number, a cluster URL without ``host:port`` or with a database
            other than 0, an ``inbox_shards`` below 1.
    """
    cluster = url.partition("://")[0].strip().lower() == "redis+cluster"
    parsed = StoreURL.parse(url, schemes=SCHEMES, multi_host=cluster)
    scheme = parsed.scheme
    prefix = parsed.take_text("key_prefix")
    shards = parsed.take_int("inbox_shards", None, minimum=1)
    timeouts: dict[str, Any] = {
        name: parsed.take_seconds(name, _DEFAULT_TIMEOUT)
        for name in ("socket_timeout", "socket_connect_timeout")
    }
    if cluster:
        allowed = _CLUSTER_PASSTHROUGH
    elif scheme == "rediss":
        allowed = _SINGLE_PASSTHROUGH
    else:  # plain TCP: a TLS option would reach redis-py's Connection as a bad keyword
        allowed = frozenset(o for o in _SINGLE_PASSTHROUGH if not o.startswith("ssl"))
    passthrough = dict(parsed.take_passthrough(allowed))
    parsed.finish()
    if passthrough.get("protocol", "2") not in ("2", "3"):
        raise parsed.error("protocol must be 2 or 3")
    if cluster:
        return _cluster(parsed, passthrough, timeouts), prefix, shards
    return _single(parsed, passthrough, timeouts), prefix, shards


def _single(parsed: StoreURL, options: dict[str, str], timeouts: dict[str, Any]) -> Redis:
    if not parsed.parts.hostname:
        raise parsed.error("a Redis URL needs a host")
    path = parsed.parts.path.strip("/")
    if path and not path.isdigit():
        raise parsed.error("the database must be a number")
    try:
        return Redis.from_url(
            parsed.with_query(options.items()),
            retry=Retry(NoBackoff(), 0),
            protocol=DEFAULT_PROTOCOL,  # a protocol option in the query wins
            **timeouts,
        )
    except ValueError as exc:  # redis-py's own parsing (ports, numbers, booleans)
        raise parsed.error(f"bad Redis URL ({exc})") from None


def _cluster(parsed: StoreURL, options: dict[str, str], timeouts: dict[str, Any]) -> RedisCluster:
    if parsed.parts.path.strip("/") not in ("", "0"):
        raise parsed.error("a Redis Cluster has only database 0")
    userinfo, _, hosts = parsed.parts.netloc.rpartition("@")
    nodes: list[ClusterNode] = []
    for item in hosts.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise parsed.error("redis+cluster:// needs host:port[,host:port…]")
        nodes.append(ClusterNode(host.strip("[]"), int(port)))
    kwargs: dict[str, Any] = dict(timeouts, protocol=DEFAULT_PROTOCOL)
    if userinfo:
        user, _, password = userinfo.partition(":")
        kwargs["username"] = unquote(user) or None
        kwargs["password"] = unquote(password) or None
    typed = StoreURL(raw=parsed.raw, parts=parsed.parts, shown=parsed.shown, options=options)
    for name in _CLUSTER_FLAGS:
        if name in typed.options:
            kwargs[name] = typed.take_bool(name, False)
    for name in _CLUSTER_INTEGERS:
        number = typed.take_int(name, None, minimum=0)
        if number is not None:
            kwargs[name] = number
    interval = typed.take_seconds("health_check_interval", None, allow_zero=True)
    if interval is not None:
        kwargs["health_check_interval"] = interval
    kwargs.update(typed.options)  # the rest is text (client_name, TLS file names…)
    return RedisCluster(startup_nodes=nodes, retry=Retry(NoBackoff(), 0), **kwargs)
