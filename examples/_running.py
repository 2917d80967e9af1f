"""Test support for the examples: run one as ``python -m examples.<name>``, as a user would,
and stop it as a user would (SIGINT).

The example runs in its own process with ``cwd`` a scratch directory (so a default
``sqlite:///….db`` lands there) and this repository on ``PYTHONPATH``; its stdout and
stderr go to files in that directory, read back when it stops.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ROOT", "Running", "free_port", "run_example"]

ROOT = Path(__file__).resolve().parents[1]
"""The repository: the directory holding ``examples/``."""

BAD_SIGNS = ("Traceback", "Unclosed", "never awaited", "never retrieved")
"""Text on stderr that means the example did not run or stop cleanly."""


def free_port() -> int:
    """A TCP port free on ``127.0.0.1`` right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Running:
    """An example's process. ``stderr`` is filled in by :meth:`stop`."""

    name: str
    proc: asyncio.subprocess.Process
    workdir: Path
    stderr: str = ""

    def output(self) -> str:
        """What the process wrote to stderr so far."""
        return (self.workdir / "stderr.txt").read_text(encoding="utf-8", errors="replace")

    async def until(self, predicate: Callable[[], bool], *, what: str, limit: float = 30.0) -> None:
        """Poll ``predicate`` every 50 ms until it holds.

        Raises:
            AssertionError: the process exited first, or ``limit`` seconds passed (the
                message names ``what`` was awaited and carries the process's stderr).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        # Polls what another process changes: there is no event to wait on.
        while not predicate():
            if self.proc.returncode is not None:
                raise AssertionError(
                    f"{self.name} exited ({self.proc.returncode}) before {what}:\n{self.output()}"
                )
            if loop.time() > deadline:
                raise AssertionError(f"{self.name}: no {what} within {limit} s:\n{self.output()}")
            await asyncio.sleep(0.05)

    async def listening(self, port: int, *, limit: float = 30.0) -> None:
        """Wait until the example accepts TCP connections on ``127.0.0.1:port``.

        Raises:
            AssertionError: the process exited first, or ``limit`` seconds passed.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while True:
            if self.proc.returncode is not None:
                raise AssertionError(f"{self.name} exited before listening:\n{self.output()}")
            try:
                _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                if loop.time() > deadline:
                    raise AssertionError(f"{self.name} never listened on {port}") from None
                await asyncio.sleep(0.05)
            else:
                writer.close()
                await writer.wait_closed()
                return

    async def stop(self, *, limit: float = 30.0) -> str:
        """Send SIGINT and wait for the exit; returns stderr.

        Raises:
            AssertionError: the exit code is not 0, or stderr shows a traceback, an
                unclosed resource or an unawaited coroutine.
        """
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                async with asyncio.timeout(limit):
                    await self.proc.wait()
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
                raise AssertionError(f"{self.name} ignored SIGINT:\n{self.output()}") from None
        self.stderr = self.output()
        assert self.proc.returncode == 0, f"{self.name} exit {self.proc.returncode}\n{self.stderr}"
        for sign in BAD_SIGNS:
            assert sign not in self.stderr, f"{sign!r} on {self.name}'s stderr:\n{self.stderr}"
        return self.stderr


@asynccontextmanager
async def run_example(
    name: str, *args: str, env: Mapping[str, str], workdir: Path
) -> AsyncIterator[Running]:
    """Start ``python -m examples.<name> *args`` with ``env`` added to this environment.

    Yields the :class:`Running` process; on leaving the block it is stopped with SIGINT
    (killed if it does not exit within 30 s). Call :meth:`Running.stop` inside the block
    to check the clean exit.
    """
    full_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "PYTHONUNBUFFERED": "1",
        "PYTHONWARNINGS": "always::ResourceWarning",
        **env,
    }
    with (
        (workdir / "stdout.txt").open("wb") as stdout,
        (workdir / "stderr.txt").open("wb") as stderr,
    ):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            f"examples.{name}",
            *args,
            cwd=workdir,
            env=full_env,
            stdout=stdout,
            stderr=stderr,
        )
    running = Running(name, proc, workdir)
    try:
        yield running
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
            try:
                async with asyncio.timeout(30):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
