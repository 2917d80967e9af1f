"""``idem.transaction(conn)`` across processes, on a real SQLite file and the real
PostgreSQL: two bot processes racing on one key credit once (the other waits on the key
and replays), and a process killed with SIGKILL inside its transaction, after its credit
and its claim, leaves neither: a retry credits once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from services import postgres_dsn

from telegram_idem import Idem, Status

WORKER = str(Path(__file__).with_name("joined_worker.py"))


@dataclass
class Bot:
    """Where a bot process writes: its database kind, the store URL, its own
    connection's target, and its ``credits`` table."""

    db: str
    url: str
    target: str
    table: str

    def start(
        self, key: str, mode: str = "run", hold: float = 0.5, go: Path | None = None
    ) -> subprocess.Popen[str]:
        args = [self.db, self.url, self.target, self.table, key, mode, str(hold)]
        return subprocess.Popen(
            [sys.executable, WORKER, *args, *([str(go)] if go is not None else [])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )


async def count(bot: Bot) -> int:
    if bot.db == "sqlite":
        with sqlite3.connect(bot.target) as lite:
            return int(lite.execute(f"SELECT count(*) FROM {bot.table}").fetchone()[0])
    import asyncpg

    pg = await asyncpg.connect(bot.target)
    try:
        return int(await pg.fetchval(f"SELECT count(*) FROM {bot.table}"))
    finally:
        await pg.close()


@pytest.fixture(
    params=[
        pytest.param("sqlite", marks=pytest.mark.sqlite),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
async def bot(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Bot]:
    if request.param == "sqlite":
        path = str(tmp_path / "bot.db")
        with sqlite3.connect(path) as lite:
            lite.execute("CREATE TABLE credits (who TEXT NOT NULL)")
        yield Bot("sqlite", f"sqlite:///{path}", path, "credits")
        return
    factory: Callable[[], str] = request.getfixturevalue("postgres_url_factory")
    url = factory()
    prefix = dict(p.split("=", 1) for p in urlsplit(url).query.split("&"))["table_prefix"]
    table = f"{prefix}_credits"
    import asyncpg

    conn = await asyncpg.connect(postgres_dsn())
    await conn.execute(f"CREATE TABLE {table} (who text NOT NULL)")
    try:
        yield Bot("postgres", url, postgres_dsn(), table)
    finally:
        await conn.execute(f"DROP TABLE IF EXISTS {table}")
        await conn.close()


async def finish(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, err = await asyncio.to_thread(proc.communicate, timeout=60)
    assert proc.returncode == 0, err
    answer: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return answer


async def test_two_processes_racing_on_one_key_credit_once(bot: Bot, tmp_path: Path) -> None:
    go = tmp_path / "go"
    procs = [bot.start("pay:charge-1", hold=1.0, go=go) for _ in range(2)]
    for proc in procs:  # both set up, waiting to open their transactions together
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        assert line.strip() == "waiting"
    go.touch()
    answers = [await finish(proc) for proc in procs]
    ran = [a for a in answers if a["ran"]]
    replayed = [a for a in answers if not a["ran"]]
    assert len(ran) == 1 and len(replayed) == 1
    assert ran[0]["result"] == replayed[0]["result"] == {"credited": "pay:charge-1"}
    # the replaying process waited on the key for the other's transaction (hold 1 s)
    assert isinstance(replayed[0]["seconds"], float) and replayed[0]["seconds"] > 0.5
    assert await count(bot) == 1


async def test_a_process_killed_inside_its_transaction_leaves_nothing(bot: Bot) -> None:
    proc = bot.start("pay:charge-2", mode="hang")
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
    assert line.strip() == "ready"
    proc.send_signal(signal.SIGKILL)
    await asyncio.to_thread(proc.communicate, timeout=30)
    assert proc.returncode == -signal.SIGKILL
    idem = Idem(bot.url)
    try:
        assert await idem.store.get("pay:charge-2") is None
        assert await count(bot) == 0
        retry = await finish(bot.start("pay:charge-2", hold=0.0))
        assert retry["ran"] is True
        record = await idem.store.get("pay:charge-2")
        assert record is not None and record.status is Status.COMPLETED
    finally:
        await idem.close()
    assert await count(bot) == 1
