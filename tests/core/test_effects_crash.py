"""A real ``kill -9`` of a process that started an at-most-once effect on a SQLite file:
the retry raises ``UnknownOutcomeError`` instead of running it again, ``unresolved()``
names the dead holder, ``resolve`` settles it (a result the next run replays, or
"not applied": it runs once more), and a holder that wakes up late cannot overwrite the
resolution.

The child runs on the real clock with a 5 s lease and no heartbeat; the parent's
``ManualClock`` starts an hour later, so the child's lease is over for it without
sleeping.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from telegram_idem import Idem, ManualClock, Status, UnknownOutcomeError
from telegram_idem.ledger import LedgerState

KEY = "idem:7000000001:a:grant:crash"

CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    from pathlib import Path
    from telegram_idem import Idem, LostClaimError

    db, key, marker, go = sys.argv[1:5]

    async def main() -> int:
        idem = Idem(f"sqlite:///{db}", lease=5.0, heartbeat=False, holder=f"child:{os.getpid()}")

        async def grant() -> str:
            Path(marker).write_text("started")
            while not Path(go).exists():
                await asyncio.sleep(0.01)
            return "the child's grant"

        try:
            await idem.run(key, grant, once="at_most", handler="grant")
        except LostClaimError:
            return 3
        finally:
            await idem.close()
        return 0

    sys.exit(asyncio.run(main()))
    """
)


class Child:
    """A child process running one at-most-once action on ``db``."""

    def __init__(self, tmp: Path, db: Path, key: str) -> None:
        name = key.rsplit(":", 1)[-1]
        self.marker = tmp / f"{name}.started"
        self.go = tmp / f"{name}.go"
        self.errors = tmp / f"{name}.stderr"
        script = tmp / "child.py"
        script.write_text(CHILD)
        with self.errors.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(script), str(db), key, str(self.marker), str(self.go)],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    async def started(self, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while not self.marker.exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"the child exited early: {self.errors.read_text()}")
            assert time.monotonic() < deadline, "the child never started its effect"
            await asyncio.sleep(0.02)

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait(timeout=30) == -signal.SIGKILL

    def finish(self) -> int:
        self.go.write_text("go")
        return self.proc.wait(timeout=60)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "bot.db"


@pytest.fixture
async def idem(db: Path) -> AsyncIterator[Idem]:
    clock = ManualClock(time.time() + 3600)  # the child's 5 s lease is long over
    guard = Idem(f"sqlite:///{db}", clock=clock, heartbeat=False, lease=30.0, holder="parent")
    yield guard
    await guard.close()


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for child in made:
        if child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait(timeout=30)


class Grant:
    def __init__(self) -> None:
        self.runs = 0

    async def __call__(self) -> str:
        self.runs += 1
        return "the parent's grant"


async def test_killed_after_start_then_unknown_then_resolved(
    idem: Idem, db: Path, tmp_path: Path, children: list[Child]
) -> None:
    child = Child(tmp_path, db, KEY)
    children.append(child)
    await child.started()
    child.kill()

    grant = Grant()
    with pytest.raises(UnknownOutcomeError) as caught:
        await idem.run(KEY, grant, once="at_most", handler="grant")
    assert grant.runs == 0
    assert f"child:{child.proc.pid}" in str(caught.value)

    [item] = await idem.unresolved()
    assert item.key == KEY and item.kind == "action" and item.state == "unknown"
    assert item.holder == f"child:{child.proc.pid}"
    assert item.attempts == 2  # the child's start, and the retry that met it

    await idem.resolve(KEY, result="granted by the operator")
    assert await idem.run(KEY, grant, once="at_most") == "granted by the operator"
    assert grant.runs == 0
    assert await idem.unresolved() == []


async def test_a_late_holder_cannot_overwrite_the_resolution(
    idem: Idem, db: Path, tmp_path: Path, children: list[Child]
) -> None:
    key = KEY + ":late"
    child = Child(tmp_path, db, key)
    children.append(child)
    await child.started()
    [item] = await idem.unresolved()  # its lease is over on the parent's clock
    assert item.state == "started"
    await idem.resolve(key, result="the operator's")
    assert child.finish() == 3  # its completion lost: LostClaimError
    record = await idem.store.get(key)
    assert record is not None and record.status is Status.COMPLETED
    assert idem.codec.decode(record.result or b"") == "the operator's"
    assert await idem.store.ledger().get(key) is None
    assert await idem.run(key, Grant(), once="at_most") == "the operator's"


async def test_killed_then_resolved_not_applied_runs_once_more(
    idem: Idem, db: Path, tmp_path: Path, children: list[Child]
) -> None:
    key = KEY + ":again"
    child = Child(tmp_path, db, key)
    children.append(child)
    await child.started()
    child.kill()
    row = await idem.store.ledger().get(key)
    assert row is not None and row.state is LedgerState.STARTED

    await idem.resolve(key, not_applied=True)
    grant = Grant()
    assert await idem.run(key, grant, once="at_most") == "the parent's grant"
    assert await idem.run(key, grant, once="at_most") == "the parent's grant"
    assert grant.runs == 1
