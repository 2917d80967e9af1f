"""Where the time of a PostgreSQL claim goes: the parts of one call, measured apart.

    .venv/bin/python benchmarks/pg_profile.py [--runs 5] [--n 300] [--quick]

In one process, against ``IDEM_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``), interleaved as in benchmarks/stores.py
(chunks whose order rotates, median of ``--runs`` runs, min–max in brackets), µs per call:

- P1 parts: the baseline of benchmarks/stores.py (a prepared ``INSERT … ON CONFLICT DO
  NOTHING`` of an existing key through ``pool.execute``), the same statement on a held
  connection (no pool), a pool acquire + release alone (with a timeout, as the store took
  connections before, and without), the claim statement on a held connection, the store's
  ``claim()`` (replay) now, and the same store with ``max_size=1``, where it keeps no
  connection and takes one from the pool per call; the Python time of the store's
  ``claim()`` over a connection that answers at once (no I/O: the library's own share);
- P2 parts: a fresh raw insert through ``pool.execute`` (the baseline), ``claim()`` +
  ``complete()`` through the store, their two statements on a held connection, and a raw
  insert + update (two commits, the floor of any design that commits the claim before
  the handler runs and the result after it);
- round trips (asyncpg protocol calls) and bytes received per call (counted between
  the connection's transport and its protocol), the server's own
  times (``EXPLAIN (ANALYZE, BUFFERS)``: planning and execution) and whether the claim
  statement runs on a generic plan (``pg_prepared_statements``);
- the claim's one race: ``--race`` connections claim one new key at once, ``--trials``
  times, and the share of claims that took one round trip, or two, is counted.

Writes the tables into docs/performance.md (section "pg-profile") and its chart into
docs/img/bench/pg-profile.png. Creates tables named ``bench_<tag>_…`` and drops them.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import itertools
import os
import platform
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from _report import Chart, Panel, chart_link, write_section
from stores import POSTGRES_URL, RESULT, TAG, Ratio, command_line, interleave, with_query

from telegram_idem._records import Outcome
from telegram_idem.backends.postgres import PostgresStore

LEASE, RETENTION = 60.0, 3600.0
Call = Callable[[int], Awaitable[object]]
_counter = itertools.count()


def key(kind: str) -> str:
    return f"{kind}:{next(_counter)}"


async def measure(n: int, runs: int, sides: dict[str, Call]) -> dict[str, list[float]]:
    """µs per call of each side, one value per run, after a warm-up."""
    calls = list(sides.values())
    await interleave(max(20, n // 5), calls, chunks=2)
    out: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(runs):
        gc.collect()
        for name, v in zip(sides, await interleave(n, calls), strict=True):
            out[name].append(v * 1e6)
    return out


def med(values: list[float]) -> str:
    v = statistics.median(values)
    return f"{v:.1f}" if v < 100 else f"{v:.0f}"


def rng(values: list[float]) -> str:
    return f"{med(values)} ({min(values):.0f}–{max(values):.0f})"


class _Counting:
    """asyncpg protocol calls of a connection, each one network round trip."""

    TRIPS = frozenset({"prepare", "bind_execute", "bind", "execute", "query", "close_statement"})

    def __init__(self, inner: Any, seen: list[str]) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_seen", seen)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in self.TRIPS:
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._seen.append(name)
            return attr(*args, **kwargs)

        return counted

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)


class _ByteCounter(asyncio.Protocol):
    """Put between a connection's transport and its protocol: counts the bytes received."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.received = 0

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        self.inner.data_received(data)

    def __getattr__(self, name: str) -> Any:  # connection_lost, eof_received, pause_…
        return getattr(self.inner, name)


async def bytes_received(conn: Any, fn: Callable[[], Awaitable[object]], count: int) -> float:
    """Bytes ``conn`` receives per ``fn()`` call, the average of ``count`` calls."""
    transport = conn._transport
    counter = _ByteCounter(transport.get_protocol())
    transport.set_protocol(counter)
    try:
        for _ in range(count):
            await fn()
    finally:
        transport.set_protocol(counter.inner)
    return counter.received / count


class _StubConn:
    """Answers the claim statement at once with a completed row: no I/O."""

    def __init__(self, row: dict[str, Any]) -> None:
        self.row = row

    async def fetch(self, *args: Any) -> list[dict[str, Any]]:
        return [self.row]

    def is_in_transaction(self) -> bool:
        return False


class _StubPool:
    def __init__(self, conn: _StubConn) -> None:
        self.conn = conn

    async def acquire(self) -> _StubConn:
        return self.conn

    async def release(self, conn: Any, **kwargs: Any) -> None:
        return None


async def python_share(store: PostgresStore, n: int) -> float:
    """µs of Python per ``claim()`` (replay) of a store whose connection answers at once."""
    row = {
        "written": False,
        "key": "k",
        "status": "completed",
        "fencing_token": 1,
        "lease_expires_at": 1.0,
        "expires_at": 4e9,
        "fingerprint": None,
        "result": RESULT,
        "attempts": 1,
        "now": 1e9,
    }
    stub = PostgresStore(POSTGRES_URL.split("?")[0], table_prefix=store.table_prefix)
    stub.connection._pool = _StubPool(_StubConn(row))
    start = time.perf_counter()
    for _ in range(n):
        await stub.claim("k", lease=LEASE, retention=RETENTION)
    return (time.perf_counter() - start) / n * 1e6


async def race_rounds(prefix: str, conns: int, trials: int) -> collections.Counter[int]:
    """Round trips per claim when ``conns`` connections claim one new key at once (behind
    a barrier), over ``trials`` keys: how often the claim statement's one race (another
    claim committed the row after this statement's snapshot) costs a second round."""

    class Counted(asyncpg.Connection):
        _protocol: Any  # a slot of Connection; asyncpg-stubs give it no type

        def __init__(self, protocol: Any, *a: Any, **kw: Any) -> None:
            super().__init__(protocol, *a, **kw)
            self.trips: list[str] = []
            self._protocol = _Counting(self._protocol, self.trips)

    store = PostgresStore.from_url(
        with_query(POSTGRES_URL, table_prefix=prefix, min_size=conns, max_size=conns)
    )
    store.connection.connect_kwargs["connection_class"] = Counted
    rounds: collections.Counter[int] = collections.Counter()
    try:
        pool = await store.connection.pool()

        async def one(k: str, barrier: asyncio.Barrier, counted: bool) -> None:
            async with pool.acquire() as conn:
                await barrier.wait()
                raw = conn._con  # the Counted connection behind the pool's proxy
                raw.trips.clear()
                await store._claim_rounds(conn, [k], {k: None}, LEASE, RETENTION)
                if counted:
                    rounds[raw.trips.count("bind_execute")] += 1

        for trial in range(trials + 1):  # the first one prepares the statement everywhere
            barrier = asyncio.Barrier(conns)
            k = key("race")
            await asyncio.gather(*(one(k, barrier, trial > 0) for _ in range(conns)))
    finally:
        await store.close()
    return rounds


async def bench(args: argparse.Namespace) -> tuple[str, Chart]:
    started = time.monotonic()
    load_before = os.getloadavg()
    prefix = f"bench_{TAG}"
    url = with_query(POSTGRES_URL, table_prefix=prefix, auto_create=1, connect_timeout=3)
    store = PostgresStore.from_url(url)
    single = PostgresStore.from_url(with_query(POSTGRES_URL, table_prefix=prefix, max_size=1))
    pool = await store.connection.pool()
    raw_table = f"{prefix}_raw"
    try:
        await pool.execute(f"CREATE TABLE {raw_table} (k text PRIMARY KEY, v bytea)")
        raw = f"INSERT INTO {raw_table} (k, v) VALUES ($1, $2) ON CONFLICT DO NOTHING"
        update = f"UPDATE {raw_table} SET v = $2 WHERE k = $1"
        claim_sql, complete_sql = store._sql["claim"], store._sql["complete"]
        await pool.execute(raw, "p1", RESULT)
        first = await store.claim("p1", lease=LEASE, retention=RETENTION)
        await store.complete("p1", first.token, RESULT, retention=RETENTION)
        held = await asyncpg.connect(POSTGRES_URL.split("?")[0], statement_cache_size=100)
        n, runs = args.n, args.runs
        timeout = store.connection.options.acquire_timeout

        async def acquire_timeout(_: int) -> None:
            async with pool.acquire(timeout=timeout):
                pass

        async def acquire_plain(_: int) -> None:
            async with pool.acquire():
                pass

        async def replay(s: PostgresStore) -> None:
            claim = await s.claim("p1", lease=LEASE, retention=RETENTION)
            assert claim.outcome is Outcome.REPLAY

        p1 = await measure(
            n,
            runs,
            {
                "raw `pool.execute` (the P1 baseline)": lambda _: pool.execute(raw, "p1", RESULT),
                "raw `conn.execute`, held connection": lambda _: held.execute(raw, "p1", RESULT),
                "pool acquire + release, with a timeout": acquire_timeout,
                "pool acquire + release, no timeout": acquire_plain,
                "claim statement, held connection": lambda _: held.fetch(
                    claim_sql, "p1", None, LEASE, RETENTION
                ),
                "`store.claim()` replay (kept connection)": lambda _: replay(store),
                "`store.claim()` replay, `max_size=1` (pool per call)": lambda _: replay(single),
            },
        )
        py = statistics.median([await python_share(store, max(2000, n * 10)) for _ in range(3)])

        async def store_p2(_: int) -> None:
            k = key("p2s")
            c = await store.claim(k, lease=LEASE, retention=RETENTION)
            await store.complete(k, c.token, RESULT, retention=RETENTION)

        async def held_p2(_: int) -> None:
            k = key("p2h")
            rows = await held.fetch(claim_sql, k, None, LEASE, RETENTION)
            await held.fetchval(complete_sql, k, rows[0]["fencing_token"], RESULT, RETENTION)

        async def raw_two(_: int) -> None:
            k = key("p2r2")
            await held.execute(raw, k, RESULT)
            await held.execute(update, k, RESULT)

        p2 = await measure(
            max(20, n // 2),
            runs,
            {
                "raw fresh insert, `pool.execute` (the P2 baseline)": lambda _: pool.execute(
                    raw, key("p2r"), RESULT
                ),
                "`store.claim()` + `store.complete()`": store_p2,
                "claim + complete statements, held connection": held_p2,
                "raw insert + raw update, held connection (two commits)": raw_two,
            },
        )

        # round trips and bytes per call, on a counting connection of the store's own pool
        seen: list[str] = []
        counted = PostgresStore.from_url(with_query(POSTGRES_URL, table_prefix=prefix))

        class CountingConnection(asyncpg.Connection):
            _protocol: Any

            def __init__(self, protocol: Any, *a: Any, **kw: Any) -> None:
                super().__init__(protocol, *a, **kw)
                self._protocol = _Counting(self._protocol, seen)

        counted.connection.connect_kwargs["connection_class"] = CountingConnection
        trips: dict[str, int] = {}
        await replay(counted)
        warm = await counted.claim(key("warm"), lease=LEASE, retention=RETENTION)
        await counted.complete(warm.record.key, warm.token, RESULT, retention=RETENTION)

        async def per_call(name: str, fn: Callable[[], Awaitable[object]], count: int) -> None:
            seen.clear()
            for _ in range(count):
                await fn()
            trips[name] = round(len(seen) / count)

        fresh_keys = [key("t") for _ in range(50)]
        tokens: dict[str, int] = {}

        async def claim_fresh() -> None:
            k = fresh_keys[len(tokens)]
            tokens[k] = (await counted.claim(k, lease=LEASE, retention=RETENTION)).token

        done: list[str] = []

        async def complete_one() -> None:
            k = fresh_keys[len(done)]
            done.append(k)
            await counted.complete(k, tokens[k], RESULT, retention=RETENTION)

        await per_call("`claim()` replay", lambda: replay(counted), 50)
        await per_call("`claim()` acquired", claim_fresh, 50)
        await per_call("`complete()`", complete_one, 50)
        await counted.close()
        sizes = {
            "claim statement, replay": await bytes_received(
                held, lambda: held.fetch(claim_sql, "p1", None, LEASE, RETENTION), 50
            ),
            "raw `INSERT … ON CONFLICT DO NOTHING`": await bytes_received(
                held, lambda: held.execute(raw, "p1", RESULT), 50
            ),
        }

        async def explain(sql: str, *params: Any) -> tuple[float, float]:
            rows = await held.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", *params)
            text = "\n".join(r[0] for r in rows)
            plan = float(text.split("Planning Time: ")[1].split(" ms")[0])
            execution = float(text.split("Execution Time: ")[1].split(" ms")[0])
            return plan * 1e3, execution * 1e3

        server: dict[str, list[tuple[float, float]]] = {"claim replay": [], "raw insert": []}
        for _ in range(max(5, runs)):
            server["claim replay"].append(await explain(claim_sql, "p1", None, LEASE, RETENTION))
            server["raw insert"].append(await explain(raw, "p1", RESULT))
        plans = await held.fetchrow(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1",
            claim_sql,
        )
        race = await race_rounds(prefix, args.race, args.trials)
        preload = await held.fetchval("SHOW shared_preload_libraries")
        sync = await held.fetchval("SHOW synchronous_commit")
        version = (await held.fetchval("SHOW server_version")).split()[0]
        await held.close()
    finally:
        mine = await pool.fetch(
            "SELECT quote_ident(tablename) AS name FROM pg_tables "
            "WHERE schemaname = current_schema() AND tablename LIKE $1",
            f"bench\\_{TAG}\\_%",
        )
        if mine:
            await pool.execute(f"DROP TABLE IF EXISTS {', '.join(r['name'] for r in mine)}")
        await single.close()
        await store.close()

    base1 = p1["raw `pool.execute` (the P1 baseline)"]
    base2 = p2["raw fresh insert, `pool.execute` (the P2 baseline)"]
    lines = [
        f"Command: `{command_line()}`",
        "",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, load average "
        f"{load_before[0]:.2f} at the start and {os.getloadavg()[0]:.2f} at the end; "
        f"{time.monotonic() - started:.0f} s. PostgreSQL {version} on loopback "
        f"(synchronous_commit={sync}: durability is not traded for speed).",
        "",
        "| P1 part (duplicate with stored result) | µs per call | / baseline |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {rng(v)} | {Ratio(v, base1).cell()} |" for name, v in p1.items()]
    lines += [
        f"| Python of `store.claim()` alone (no I/O) | {py:.1f} | |",
        "",
        "| P2 part (first execution with stored result) | µs per call | / baseline |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {rng(v)} | {Ratio(v, base2).cell()} |" for name, v in p2.items()]
    lines += [
        "",
        "| call | round trips (asyncpg protocol calls) |",
        "|---|---|",
    ]
    lines += [f"| {name} | {t} |" for name, t in trips.items()]
    lines += ["", "| reply | bytes received per call |", "|---|---|"]
    lines += [f"| {name} | {size:.0f} |" for name, size in sizes.items()]
    generic, custom = (plans["generic_plans"], plans["custom_plans"]) if plans else ("?", "?")
    claims = sum(race.values())
    lines += [
        "",
        f"{args.race} connections claiming one new key at once (behind a barrier), "
        f"{args.trials} keys: "
        + ", ".join(
            f"{100 * race[r] / claims:.0f}% of the claims took {r} round trip{'s' * (r > 1)}"
            for r in sorted(race)
        )
        + " (the claim statement's one race: docs/store-postgres.md).",
    ]
    lines += ["", "| statement, server side | planning µs | execution µs |", "|---|---|---|"]
    for name, values in server.items():
        lines.append(
            f"| {name} (`EXPLAIN ANALYZE`) | {statistics.median(p for p, _ in values):.0f} "
            f"| {statistics.median(e for _, e in values):.0f} |"
        )
    lines += [
        "",
        f"The claim statement ran on a generic plan {generic} times and a custom "
        f"plan {custom} times on the held connection (PostgreSQL plans a "
        "prepared statement 5 times, then keeps its generic plan): its planning time is "
        "not paid per call. `EXPLAIN ANALYZE` plans it afresh, so its planning column is "
        "what the prepared statement saves. pg_stat_statements: "
        + ("loaded." if "pg_stat_statements" in (preload or "") else "not loaded on this server.")
        + " "
        + chart_link("pg-profile", "Each part of a claim against its baseline"),
    ]
    chart = Chart(
        "PostgreSQL claim: each part / the raw baseline of its workload",
        [
            Panel(
                "P1 parts / raw pool.execute of an existing key",
                [Ratio(v, base1).bar(name, judged=False) for name, v in p1.items()],
            ),
            Panel(
                "P2 parts / raw pool.execute of a fresh key",
                [Ratio(v, base2).bar(name, judged=False) for name, v in p2.items()],
            ),
        ],
    )
    return "\n".join(lines), chart


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5, help="runs per figure (default 5)")
    parser.add_argument("--n", type=int, default=300, help="calls per run (default 300)")
    parser.add_argument(
        "--race", type=int, default=20, help="connections claiming one key at once (20)"
    )
    parser.add_argument("--trials", type=int, default=20, help="keys they race on (20)")
    parser.add_argument("--quick", action="store_true", help="3 runs of 100 calls")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.n = 3, 100
    report, chart = asyncio.run(bench(args))
    print(report)
    write_section("pg-profile", "## PostgreSQL: where a claim's time goes\n\n" + report, chart)


if __name__ == "__main__":
    main()
