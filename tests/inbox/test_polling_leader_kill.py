"""Replica processes polling one bot, the leader killed with ``kill -9`` again and again
(or paused with SIGSTOP): every update is admitted and processed exactly once, none is
lost, the offsets passed to ``getUpdates`` never move back across leaders, and no two
replicas ever poll at once (the fake answers that with 409, as Telegram does)."""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from telegram_idem import Idem, KeyBuilder
from telegram_idem.backends import ledger_of
from telegram_idem.inbox import InboxWorker
from telegram_idem.ingress import LeaderLease
from telegram_idem.ingress._leader import Leadership
from telegram_idem.testing._factories import UpdateFactory
from telegram_idem.testing.bot_api import FakeBotAPI

REPLICA = Path(__file__).parent.parent / "poll_replica.py"
TOKEN = "7000000003:AAkill"
BOT = 7000000003
LEASE = 2.0
BOUND = 60.0
"""How long a test waits for a condition (a hang guard, not a speed check)."""


async def until(condition: Any, bound: float = BOUND) -> None:
    async with asyncio.timeout(bound):
        while not condition():
            await asyncio.sleep(0.02)


class Replicas:
    """Replica processes of one bot, started and killed by name."""

    def __init__(self, store_url: str, prefix: str, api: FakeBotAPI, logs: Path) -> None:
        self.store_url = store_url
        self.prefix = prefix
        self.api = api
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._names = (f"r{i}" for i in itertools.count(1))

    def start(self) -> str:
        name = next(self._names)
        with (self.logs / f"{name}.log").open("wb") as log:
            self.procs[name] = self._spawn(name, log)
        return name

    def _spawn(self, name: str, log: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable,
                str(REPLICA),
                "--store",
                self.store_url,
                "--prefix",
                self.prefix,
                "--api",
                self.api.url,
                "--token",
                TOKEN,
                "--lease",
                str(LEASE),
                "--name",
                name,
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def polls(self) -> list[tuple[str, int | None]]:
        return [
            (str(c.params.get("replica")), c.params.get("offset"))
            for c in self.api.calls
            if c.method.lower() == "getupdates"
        ]

    def leader(self) -> str | None:
        """The replica that polled last, if it is alive."""
        polls = self.polls()
        if not polls:
            return None
        name = polls[-1][0]
        return name if self.procs[name].poll() is None else None

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait()


@pytest.fixture
def replicas_of(tmp_path: Path) -> Iterator[Any]:
    made: list[Replicas] = []

    def make(store_url: str, prefix: str, api: FakeBotAPI) -> Replicas:
        made.append(Replicas(store_url, prefix, api, tmp_path))
        return made[-1]

    yield make
    for replicas in made:
        replicas.stop_all()


@pytest.fixture
async def worked(store_url: str) -> AsyncIterator[tuple[str, Counter[int], InboxWorker]]:
    """The test process's worker on the replicas' inbox: counts each update it runs."""
    prefix = f"kill{secrets.token_hex(4)}"
    idem = Idem(store_url, keys=KeyBuilder(prefix))
    runs: Counter[int] = Counter()

    async def dispatch(update: dict[str, Any]) -> None:
        runs[int(update["update_id"])] += 1

    worker = InboxWorker(idem.store.inbox(), dispatch, concurrency=4, poll_interval=0.05)
    async with worker:
        yield prefix, runs, worker
    await idem.close()


def assert_offsets_never_move_back(offsets: list[int | None]) -> None:
    seen = [o for o in offsets if o is not None]
    assert seen == sorted(seen), seen
    first = next((i for i, o in enumerate(offsets) if o is not None), len(offsets))
    assert None not in offsets[first:], "a leader resumed without the stored offset"


@pytest.mark.inbox
@pytest.mark.shared_state
async def test_kill_9_the_leader_again_and_again(
    store_url: str, worked: tuple[str, Counter[int], InboxWorker], replicas_of: Any
) -> None:
    prefix, runs, _worker = worked
    factory = UpdateFactory()
    sent: list[int] = []
    async with FakeBotAPI() as api:
        replicas: Replicas = replicas_of(store_url, prefix, api)
        for _ in range(3):
            replicas.start()

        feeding = True

        async def feed() -> None:
            while feeding:
                update = factory.message(f"m{len(sent)}")
                api.queue_update(update)
                sent.append(update["update_id"])
                await asyncio.sleep(0.02)

        feeder = asyncio.create_task(feed())
        killed: list[str] = []
        try:
            for _ in range(3):
                await until(lambda: replicas.leader() is not None)
                leader = replicas.leader()
                assert leader is not None
                mark = len(runs)
                await until(lambda mark=mark: len(runs) > mark + 10)  # it leads a while
                os.kill(replicas.procs[leader].pid, signal.SIGKILL)  # mid-run, no goodbye
                replicas.procs[leader].wait()
                killed.append(leader)
                replicas.start()  # keep two standbys
                await until(lambda: replicas.leader() not in (None, *killed))  # takeover
                mark = len(runs)
                await until(lambda mark=mark: len(runs) > mark + 10)
        finally:
            feeding = False
            await feeder
        await until(lambda: set(runs) >= set(sent))
        leaders = [name for name, _ in replicas.polls()]
        assert len(set(leaders)) >= 4  # three takeovers happened
        assert api.poll_conflicts == 0
        assert_offsets_never_move_back([o for _, o in replicas.polls()])
    assert set(runs) == set(sent)  # nothing lost, nothing invented
    assert set(runs.values()) == {1}, {u: n for u, n in runs.items() if n != 1}


@pytest.mark.inbox
@pytest.mark.shared_state
async def test_a_paused_leader_resumes_stale_and_neither_polls_nor_writes_the_offset(
    store_url: str, worked: tuple[str, Counter[int], InboxWorker], replicas_of: Any
) -> None:
    prefix, runs, _worker = worked
    factory = UpdateFactory()
    async with FakeBotAPI() as api:
        replicas: Replicas = replicas_of(store_url, prefix, api)
        replicas.start()
        replicas.start()
        first = [factory.message(f"a{i}") for i in range(10)]
        for update in first:
            api.queue_update(update)
        await until(lambda: len(runs) >= 10 and replicas.leader() is not None)
        paused = replicas.leader()
        assert paused is not None
        os.kill(replicas.procs[paused].pid, signal.SIGSTOP)
        await until(lambda: replicas.leader() not in (None, paused))  # taken over
        second = [factory.message(f"b{i}") for i in range(10)]
        for update in second:
            api.queue_update(update)
        await until(lambda: len(runs) >= 20)
        idem = Idem(store_url, keys=KeyBuilder(prefix))
        lead = Leadership(idem, bot_id=BOT, config=LeaderLease(lease=LEASE))
        before = await lead.read_offset()
        row_before = await ledger_of(idem.store).get(lead.key)
        calls_at_resume = len(replicas.polls())
        os.kill(replicas.procs[paused].pid, signal.SIGCONT)
        await until(lambda: "lost leadership" in replicas.log(paused))
        third = [factory.message(f"c{i}") for i in range(10)]
        for update in third:
            api.queue_update(update)
        await until(lambda: len(runs) >= 30)
        after = await lead.read_offset()
        row_after = await ledger_of(idem.store).get(lead.key)
        await idem.close()
        late = [name for name, _ in replicas.polls()[calls_at_resume:] if name == paused]
        assert late == []  # the stale leader never polled again
        assert before is not None and after is not None and after >= before
        assert row_before is not None and row_after is not None
        assert row_after.token >= row_before.token  # only the new leader wrote the row
        assert api.poll_conflicts == 0
        assert_offsets_never_move_back([o for _, o in replicas.polls()])
    assert set(runs.values()) == {1}
    assert set(runs) == {u["update_id"] for u in first + second + third}
