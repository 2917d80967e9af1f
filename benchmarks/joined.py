"""Joined-transaction benchmark: an action recorded inside the bot's own transaction vs
the same business transaction alone.

    .venv/bin/python benchmarks/joined.py [--quick] [--runs 5] [--n 300] [--no-write]

Per store (PostgreSQL over one asyncpg connection, SQLite over one sqlite3 connection of
the bot on the store's file), three sides interleaved in rounds whose order alternates:

- **baseline**: ``BEGIN``, insert an order row, update the buyer's balance, ``COMMIT``;
- **joined block**: the same, inside ``async with idem.transaction(conn)`` but with no
  action (what joining alone costs: the checks of the connection);
- **joined action**: the same writes as the work of ``idem.run(key, work)`` with a fresh
  key inside ``async with idem.transaction(conn)``: the claim and the completion are
  written in the bot's transaction (one statement each);
- **floor**: the store's claim and completion statements written by hand around the
  business writes, no library code: what the database charges for the two records.

Goal: joined action ≤ 1.3× the baseline. Services by the pytest plugin's variables
(docs/testing.md): ``IDEM_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``). Everything created is removed at the end.
Writes the table into docs/performance.md (section "joined") and its chart into
docs/img/bench/joined.png.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import secrets
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

from _report import Bar, Chart, Panel, chart_link, write_section
from stores import CHUNKS, Ratio, command_line, measure, on_exit, us, with_query

from telegram_idem import Idem
from telegram_idem.backends import store_from_url
from telegram_idem.backends.postgres import PostgresStore
from telegram_idem.backends.postgres._joined_records import new_key_sql
from telegram_idem.backends.sqlite._joined_records import _INSERT, _UPDATES
from telegram_idem.testing._stores import SERVER_STORES

GOAL = 1.3
POSTGRES_URL = os.environ.get(
    SERVER_STORES["postgres"].env, "postgresql://postgres@127.0.0.1:5432/test"
)
TAG = secrets.token_hex(4)
"""Names everything this run creates (tables, keys), so concurrent runs never collide."""

Call = Callable[[int], Awaitable[object]]
CLAIM = {"fp": None, "lease": 60.0, "retention": 86400.0}
DONE = {"token": 1, "result": b"1", "retention": 86400.0}


@dataclass
class Row:
    store: str
    base: list[float]
    block: list[float]
    action: list[float]
    floor: list[float]
    info: str

    @property
    def ratio(self) -> Ratio:
        return Ratio(self.action, self.base)


async def drop_postgres(prefix: str, extra: list[str]) -> None:
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        mine = await conn.fetch(
            "SELECT quote_ident(tablename) AS name FROM pg_tables "
            "WHERE schemaname = current_schema() AND tablename LIKE $1",
            prefix.replace("_", "\\_") + "\\_%",
        )
        names = [r["name"] for r in mine] + extra
        if names:
            await conn.execute(f"DROP TABLE IF EXISTS {', '.join(names)}")
    finally:
        await conn.close()


async def bench_postgres(n: int, runs: int, stack: AsyncExitStack) -> Row:
    import asyncpg

    prefix = f"bench_{TAG}_joined"
    orders, balances = f"{prefix}_orders", f"{prefix}_balances"
    on_exit(stack, drop_postgres, prefix, [])
    idem = Idem(store_from_url(with_query(POSTGRES_URL, table_prefix=prefix, auto_create=1)))
    on_exit(stack, idem.close)
    await idem.store.get("warm")  # tables created
    conn = await asyncpg.connect(POSTGRES_URL)
    on_exit(stack, conn.close)
    await conn.execute(f"CREATE TABLE {orders} (id bigint PRIMARY KEY, buyer bigint, stars int)")
    await conn.execute(f"CREATE TABLE {balances} (buyer bigint PRIMARY KEY, stars int)")
    await conn.execute(f"INSERT INTO {balances} SELECT g, 0 FROM generate_series(0, 99) g")
    insert = f"INSERT INTO {orders} VALUES ($1, $2, 5)"
    update = f"UPDATE {balances} SET stars = stars + 5 WHERE buyer = $1"
    ids = iter(range(10**9))

    async def business(i: int) -> int:
        order = next(ids)
        await conn.execute(insert, order, i % 100)
        await conn.execute(update, i % 100)
        return order

    store = idem.store
    assert isinstance(store, PostgresStore)
    claim_sql, complete_sql = new_key_sql(store.table, True), store._sql["complete"]

    def sides(count: int) -> tuple[Call, Call, Call, Call]:
        async def baseline(i: int) -> None:
            async with conn.transaction():
                await business(i)

        async def floor(i: int) -> None:
            key = f"bench:{TAG}:{secrets.token_hex(6)}"
            async with conn.transaction():
                await conn.fetch(claim_sql, key, None, 60.0, 86400.0)
                await business(i)
                await conn.fetch(complete_sql, key, 1, b"1", 86400.0)

        async def block(i: int) -> None:
            async with conn.transaction(), idem.transaction(conn):
                await business(i)

        async def action(i: int) -> None:
            async with conn.transaction(), idem.transaction(conn):
                await idem.run(f"bench:{TAG}:{secrets.token_hex(6)}", lambda: business(i))

        return baseline, block, action, floor

    base, block, act, low = await measure(n, runs, sides)
    version = await conn.fetchval("SHOW server_version")
    sync = await conn.fetchval("SHOW synchronous_commit")
    return Row(
        "postgres",
        base,
        block,
        act,
        low,
        f"PostgreSQL {str(version).split()[0]} (synchronous_commit={sync}), one asyncpg "
        "connection: `async with conn.transaction()`",
    )


async def bench_sqlite(n: int, runs: int, stack: AsyncExitStack) -> Row:
    tmp = tempfile.mkdtemp(prefix="idem-bench-joined-")
    on_exit(stack, shutil.rmtree, tmp, True)
    path = Path(tmp) / "bot.db"
    idem = Idem(f"sqlite:///{path}")
    on_exit(stack, idem.close)
    await idem.store.get("warm")  # the file set up
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    on_exit(stack, conn.close)
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=5000")
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, buyer INTEGER, stars INTEGER)")
    conn.execute("CREATE TABLE balances (buyer INTEGER PRIMARY KEY, stars INTEGER)")
    conn.executemany("INSERT INTO balances VALUES (?, 0)", [(b,) for b in range(100)])

    async def business(i: int) -> int:
        cur = conn.execute("INSERT INTO orders (buyer, stars) VALUES (?, 5)", (i % 100,))
        conn.execute("UPDATE balances SET stars = stars + 5 WHERE buyer = ?", (i % 100,))
        return int(cur.lastrowid or 0)

    def sides(count: int) -> tuple[Call, Call, Call, Call]:
        async def baseline(i: int) -> None:
            conn.execute("BEGIN IMMEDIATE")
            await business(i)
            conn.execute("COMMIT")

        async def floor(i: int) -> None:
            key, now = f"bench:{TAG}:{secrets.token_hex(6)}", time.time()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(_INSERT, {**CLAIM, "key": key, "now": now}).fetchall()
            await business(i)
            conn.execute(_UPDATES["complete"], {**DONE, "key": key, "now": now}).fetchall()
            conn.execute("COMMIT")

        async def block(i: int) -> None:
            conn.execute("BEGIN IMMEDIATE")
            async with idem.transaction(conn):
                await business(i)
            conn.execute("COMMIT")

        async def action(i: int) -> None:
            conn.execute("BEGIN IMMEDIATE")
            async with idem.transaction(conn):
                await idem.run(f"bench:{TAG}:{secrets.token_hex(6)}", lambda: business(i))
            conn.execute("COMMIT")

        return baseline, block, action, floor

    base, block, act, low = await measure(n, runs, sides)
    return Row(
        "sqlite",
        base,
        block,
        act,
        low,
        f"SQLite {sqlite3.sqlite_version} (WAL, synchronous=NORMAL) in "
        f"{tempfile.gettempdir()}, one sqlite3 connection of the bot on the store's file: "
        "`BEGIN IMMEDIATE … COMMIT` in the event loop",
    )


BENCHES: dict[str, Callable[[int, int, AsyncExitStack], Awaitable[Row]]] = {
    "postgres": bench_postgres,
    "sqlite": bench_sqlite,
}


def table(rows: list[Row], n: int, runs: int) -> list[str]:
    lines = [
        "| store | business tx µs | + joined block µs | + joined action µs | added µs "
        f"| ratio (≤ {GOAL}×) | floor: the two statements by hand |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        added = [a - b for a, b in zip(r.action, r.base, strict=True)]
        lines.append(
            f"| {r.store} | {us(r.base)} | {us(r.block)} | {us(r.action)} | {us(added)} "
            f"| {r.ratio.cell(lambda m: m <= GOAL)} | {Ratio(r.floor, r.base).cell()} |"
        )
    if rows:
        lines += ["", chart_link("joined", "The ratios of the table above as bars")]
    lines += [
        "",
        f"Median of {runs} runs (min–max in brackets); each run is {n} transactions of each "
        f"side, interleaved in {CHUNKS} chunks whose order alternates. The business "
        "transaction inserts an order row and updates the buyer's balance; *joined block* "
        "runs it inside `async with idem.transaction(conn)` with no action; *joined action* "
        "runs it as the work of `idem.run(key, work)` (a fresh key each time) inside that "
        "block, so the claim and the completion commit with the rows. *Floor*: the same "
        "claim and completion statements written by hand around the business writes (no "
        "library code): what the database itself charges for the two records.",
        "",
        *[f"- {r.store}: {r.info}." for r in rows],
        "",
        "Where the time goes: the library's own Python code is a few µs per action (a "
        "profile of the PostgreSQL side shows the socket and the event loop, nothing "
        "else); the rest is the two statements. On PostgreSQL the business transaction "
        "is four round trips (`BEGIN`, two writes, `COMMIT`) and the joined action adds "
        "two (the claim, the completion), so when round trips dominate the ratio cannot "
        "go below about 1.5×; it reaches the goal when the commit's flush dominates "
        "(`synchronous_commit=on` on a slower disk, a heavier transaction). On SQLite the "
        "baseline is ~20 µs in process, and the floor column shows that SQLite itself "
        "charges 3–5× for one more indexed row written twice in the transaction (the "
        "record's page and its `expires_at` index page go to the WAL at the commit): the "
        "goal is out of reach there by construction, and the joined action costs what "
        "the floor costs. Figures on a loaded 2-core machine vary from run to run (see "
        "the ranges).",
    ]
    return lines


async def bench(args: argparse.Namespace) -> tuple[str, Chart | None]:
    rows: list[Row] = []
    notes: list[str] = []
    load_before = os.getloadavg()
    started = time.monotonic()
    for name, fn in BENCHES.items():
        async with AsyncExitStack() as stack:
            print(f"{name} ({args.runs} runs × {args.n} transactions) …", flush=True)
            try:
                row = await asyncio.wait_for(fn(args.n, args.runs, stack), timeout=300)
            except Exception as exc:
                notes.append(f"{name}: skipped ({type(exc).__name__}: {exc})")
                print(notes[-1], flush=True)
                continue
            rows.append(row)
            print("  " + table([row], args.n, args.runs)[2], flush=True)
    load_after = os.getloadavg()
    reading = [
        f"- An action joined to the bot's transaction costs {r.ratio.median:.2f}× the "
        f"business transaction alone on {r.store} (goal ≤ {GOAL}×)."
        for r in rows
    ]
    lines = [
        f"Command: `{command_line()}`",
        "",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, load average "
        f"{load_before[0]:.2f} at the start and {load_after[0]:.2f} at the end; "
        f"{time.monotonic() - started:.0f} s."
        + (f" While it ran: {args.note}" if args.note else ""),
        "",
        *reading,
        "",
        *table(rows, args.n, args.runs),
    ]
    if notes:
        lines += ["", "Skipped:", "", *[f"- {note}" for note in notes]]
    return "\n".join(lines), joined_chart(rows)


def joined_chart(rows: list[Row]) -> Chart | None:
    """The section's chart: the joined action and the floor, per store."""
    if not rows:
        return None
    bars: list[Bar] = []
    for r in rows:
        bars.append(r.ratio.bar(f"{r.store}: joined action"))
        bars.append(
            Ratio(r.floor, r.base).bar(
                f"{r.store}: floor, the two statements by hand", judged=False
            )
        )
    return Chart(
        "Joined transactions: an action in the bot's transaction",
        [Panel("+ joined action / the business transaction alone", bars, goal=GOAL)],
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="the smallest settings")
    parser.add_argument("--runs", type=int, default=None, help="runs (default 5)")
    parser.add_argument("--n", type=int, default=None, help="transactions per run (300)")
    parser.add_argument("--note", default="", help="what else the machine was doing")
    parser.add_argument(
        "--no-write", action="store_true", help="print only; leave docs/performance.md alone"
    )
    args = parser.parse_args()
    args.runs = args.runs or (2 if args.quick else 5)
    args.n = args.n or (30 if args.quick else 300)
    if args.runs < 1 or args.n < 1:
        parser.error("--runs and --n must be ≥ 1")
    report, chart = asyncio.run(bench(args))
    print()
    print(report)
    if not args.no_write:
        write_section("joined", "## Joined transactions\n\n" + report, chart)


if __name__ == "__main__":
    main()
