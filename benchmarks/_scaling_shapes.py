"""The inbox shapes the scaling benchmark measures: one table, one entry per shape.

A :class:`Shape` knows whether it can run here (:attr:`Shape.missing`), how to make the
resources of one benchmark run (a table prefix, a cluster, a stream: :attr:`Shape.setup`,
which returns a JSON-able *spec*), how a child process opens its store from that spec
(:func:`open_store`), and how to remove what it made (:attr:`Shape.teardown`). Adding a
shape is adding a row to :data:`SHAPES` and a branch to :func:`open_store`.

- ``postgres``: the PostgreSQL store (records and inbox in two tables) on
  ``IDEM_POSTGRES_URL``, under a table prefix of its own.
- ``redis-cluster``: the Redis store on a Redis Cluster this run starts on free ports
  (``scripts/services.py``'s ``start_redis_cluster``), under a key prefix of its own.
- ``jetstream``: the JetStream inbox (``telegram_idem.backends.nats``) on NATS at
  ``IDEM_NATS_URL`` (default ``nats://127.0.0.1:4222``), its claim store the PostgreSQL one,
  on a stream of its own; skipped when the module (or nats-py) is not installed.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from telegram_idem.backends import Store, store_from_url

ROOT = Path(__file__).resolve().parents[1]
POSTGRES_URL = os.environ.get("IDEM_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
NATS_URL = os.environ.get("IDEM_NATS_URL", "nats://127.0.0.1:4222")
PG_POOL = 8
"""Connections per process: 1 ingress + 4 workers stay far under ``max_connections``
(other programs share the server)."""
PARTITIONS = 16
"""JetStream subjects per bot (ordering units hashed over them)."""

Spec = dict[str, Any]


def with_query(url: str, **options: object) -> str:
    """``url`` with ``options`` appended to its query."""
    extra = "&".join(f"{k}={v}" for k, v in options.items())
    return f"{url}{'&' if '?' in url else '?'}{extra}"


@dataclass(frozen=True)
class Shape:
    """One row of :data:`SHAPES`.

    Args:
        name: the key used on the command line (``--shapes``) and in specs.
        label: the row's name in the tables.
        missing: ``() -> str | None``: why the shape cannot run here, or ``None``.
        setup: ``(tag) -> spec``: make the run's resources; the spec reaches every child.
        teardown: ``(spec) -> None``: remove them (never raises).
        server: ``(spec, updates) -> str | None``: what the store's servers did per
            update processed (``updates`` in all, warm-ups included), before teardown.
    """

    name: str
    label: str
    missing: Callable[[], str | None]
    setup: Callable[[str], Spec]
    teardown: Callable[[Spec], None]
    server: Callable[[Spec, int], str | None] = lambda _spec, _updates: None


# ---------------------------------------------------------------- postgres


def _pg_missing() -> str | None:
    try:
        asyncio.run(_pg_ping())
    except Exception as exc:
        return f"PostgreSQL at IDEM_POSTGRES_URL unreachable: {exc!r}"
    return None


async def _pg_ping() -> None:
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL, timeout=3)
    await conn.close()


def _pg_url(prefix: str) -> str:
    return with_query(POSTGRES_URL, table_prefix=prefix, auto_create=1, max_size=PG_POOL)


def _pg_setup(tag: str) -> Spec:
    prefix = f"scaling_{tag}"  # the shapes' tags differ in their last part: _pg, _js
    asyncio.run(_pg_create(_pg_url(prefix)))
    return {"shape": "postgres", "url": _pg_url(prefix), "prefix": prefix}


async def _pg_create(url: str) -> None:
    store = store_from_url(url)
    try:
        store.inbox()
        await store.get("scaling-ping")  # creates the tables once, before the children race
        await store.inbox().depth()
    finally:
        await store.close()


def _pg_server(spec: Spec, updates: int) -> str | None:
    try:
        rows = asyncio.run(_pg_rows(spec["prefix"]))
    except Exception as exc:
        return f"table statistics unavailable: {exc!r}"
    if not updates:
        return None
    ins, upd, dele = (sum(r[i] for r in rows) / updates for i in range(3))
    return (
        f"rows per update in the store's tables (`pg_stat_user_tables`): {ins:.1f} inserted, "
        f"{upd:.1f} updated, {dele:.1f} deleted"
    )


async def _pg_rows(prefix: str) -> list[tuple[int, int, int]]:
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL, timeout=3)
    try:
        await conn.execute("SELECT pg_stat_force_next_flush()")
        rows = await conn.fetch(
            "SELECT n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables WHERE relname LIKE $1",
            prefix.replace("_", "\\_") + "\\_%",
        )
    finally:
        await conn.close()
    return [(int(r[0]), int(r[1]), int(r[2])) for r in rows]


def _pg_teardown(spec: Spec) -> None:
    try:
        asyncio.run(_pg_drop(spec["prefix"]))
    except Exception as exc:
        print(f"  clean-up of {spec['prefix']}_* failed: {exc!r}", flush=True)


async def _pg_drop(prefix: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL, timeout=3)
    try:
        mine = await conn.fetch(
            "SELECT quote_ident(tablename) AS name FROM pg_tables "
            "WHERE schemaname = current_schema() AND tablename LIKE $1",
            prefix.replace("_", "\\_") + "\\_%",
        )
        if mine:
            await conn.execute(f"DROP TABLE IF EXISTS {', '.join(r['name'] for r in mine)}")
    finally:
        await conn.close()


# ----------------------------------------------------------- redis cluster


def _services() -> Any:
    """``scripts/services.py`` as a module (it is a script, not a package)."""
    path = ROOT / "scripts" / "services.py"
    spec = importlib.util.spec_from_file_location("_idem_services", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_idem_services"] = module
    spec.loader.exec_module(module)
    return module


def _cluster_missing() -> str | None:
    services = _services()
    if services._program("redis-server") is None or services._program("redis-cli") is None:
        return "redis-server / redis-cli not found: no Redis Cluster to start"
    return None


def _cluster_setup(tag: str) -> Spec:
    services = _services()
    started = services.Services(dir=tempfile.mkdtemp(prefix=f"scaling-{tag}-"))
    try:
        services.start_redis_cluster(started)
    except BaseException:
        services.stop_services(started)
        raise
    for port in started.redis_ports:  # commandstats count this run only
        _node(port).config_resetstat()
    url = with_query(started.redis_cluster_url, key_prefix=f"scaling-{tag}")
    return {
        "shape": "redis-cluster",
        "url": url,
        "dir": started.dir,
        "ports": started.redis_ports,
        "pids": started.redis_pids,
    }


def _node(port: int) -> Any:
    from redis import Redis

    return Redis(host="127.0.0.1", port=port, socket_timeout=5)


def _cluster_server(spec: Spec, updates: int) -> str | None:
    if not updates:
        return None
    scripts: list[int] = []
    usec: list[int] = []
    for port in spec["ports"]:
        with _node(port) as node:
            stats = node.info("commandstats")
        scripts.append(
            sum(
                int(v["calls"])
                for k, v in stats.items()
                if k.startswith(("cmdstat_evalsha", "cmdstat_eval"))
            )
        )
        usec.append(sum(int(v["usec"]) for v in stats.values()))
    total = sum(usec) or 1
    shares = " / ".join(f"{u / total:.0%}" for u in usec)
    return (
        f"{sum(scripts) / updates:.1f} scripts and {sum(usec) / updates:.0f} µs of Redis "
        f"server time per update, all masters together (`INFO commandstats`); the masters' "
        f"shares of that time: {shares}"
    )


def _cluster_teardown(spec: Spec) -> None:
    services = _services()
    started = services.Services(
        dir=spec["dir"], redis_ports=list(spec["ports"]), redis_pids=list(spec["pids"])
    )
    services.stop_services(started)


# --------------------------------------------------------------- jetstream

NATS_MODULE = "telegram_idem.backends.nats"


def _js_missing() -> str | None:
    try:
        importlib.import_module(NATS_MODULE)
    except ImportError:
        return f"{NATS_MODULE} not available"
    if not hasattr(importlib.import_module(NATS_MODULE), "with_jetstream_inbox"):
        return f"{NATS_MODULE} has no with_jetstream_inbox"
    try:
        asyncio.run(_js_ping())
    except Exception as exc:
        return f"NATS at {NATS_URL} unreachable: {exc!r}"
    return _pg_missing()


async def _js_ping() -> None:
    import nats  # type: ignore[import-not-found, unused-ignore]

    client = await nats.connect(NATS_URL, connect_timeout=3, allow_reconnect=False)
    try:
        await client.jetstream().account_info()
    finally:
        await client.close()


def _js_setup(tag: str) -> Spec:
    spec = _pg_setup(f"{tag}_js")
    spec.update(shape="jetstream", nats=NATS_URL, stream=f"scaling_{tag}")
    return spec


def _js_teardown(spec: Spec) -> None:
    try:
        asyncio.run(_js_delete(spec["stream"]))
    except Exception as exc:
        print(f"  clean-up of stream {spec['stream']} failed: {exc!r}", flush=True)
    _pg_teardown(spec)


async def _js_delete(stream: str) -> None:
    import nats

    client = await nats.connect(NATS_URL, connect_timeout=3, allow_reconnect=False)
    try:
        js = client.jetstream()
        # the entry stream and the state bucket's stream (KV_<stream>_state)
        for name in (stream, f"KV_{stream}_state"):
            try:
                await js.delete_stream(name)
            except Exception:  # not made (yet), or made under another name: nothing to do
                pass
    finally:
        await client.close()


SHAPES: dict[str, Shape] = {
    shape.name: shape
    for shape in (
        Shape(
            "postgres",
            "PostgreSQL",
            _pg_missing,
            lambda tag: _pg_setup(f"{tag}_pg"),
            _pg_teardown,
            _pg_server,
        ),
        Shape(
            "redis-cluster",
            "Redis Cluster (3 masters)",
            _cluster_missing,
            _cluster_setup,
            _cluster_teardown,
            _cluster_server,
        ),
        Shape(
            "jetstream",
            "JetStream (+ PostgreSQL claims)",
            _js_missing,
            _js_setup,
            _js_teardown,
            _pg_server,
        ),
    )
}
"""Every inbox shape, in the order the tables list them."""


def open_store(spec: Spec) -> Store:
    """The store (with its inbox) a child process uses for ``spec``.

    Raises:
        ValueError: an unknown shape.
        ImportError: the JetStream module is missing.
    """
    shape = spec["shape"]
    if shape in ("postgres", "redis-cluster"):
        return store_from_url(spec["url"])
    if shape == "jetstream":
        nats_backend = importlib.import_module(NATS_MODULE)
        store: Store = nats_backend.with_jetstream_inbox(
            store_from_url(spec["url"]),
            url=spec["nats"],
            stream=spec["stream"],
            partitions=PARTITIONS,
        )
        return store
    raise ValueError(f"unknown shape {shape!r}")
