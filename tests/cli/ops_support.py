"""Helpers of the ``outbox`` and ``unresolved`` command tests: the command run the way a
shell runs it (click's runner, on a thread of its own so the command's ``asyncio.run``
gets its own loop while the test's loop serves the fake Bot API), a bot's outbound side
against the fake Bot API (relay running), a holder process killed with SIGKILL inside an
at-most-once step, and waiting for the store's clock to pass a lease."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import sqlite3
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner, Result

from telegram_idem._cli import cli
from telegram_idem.backends import Store, outbox_of
from telegram_idem.flood import FloodControl, Limits, Rate
from telegram_idem.outbox import HttpBotAPI, Outbound, Relay

TOKEN = "123456:SECRET-token_value-xyz"
BOT_ID = 123456
STORES = ["sqlite", "postgres", "redis"]
"""The stores an operator's command reads from outside the bot's process."""
UNPACED = Limits(
    global_=Rate(10_000, 1.0, burst=10_000),
    chat=Rate(10_000, 1.0, burst=10_000),
    group=Rate(10_000, 1.0, burst=10_000),
)


def marked(names: list[str]) -> list[Any]:
    """Each store name as a parameter carrying its marker (``-m postgres``)."""
    return [pytest.param(name, marks=getattr(pytest.mark, name)) for name in names]


def url_of(request: pytest.FixtureRequest) -> str:
    """A fresh isolated URL of the store ``request.param`` names (tests/conftest.py's
    ``<store>_url_factory``)."""
    factory = request.getfixturevalue(f"{request.param}_url_factory")
    url: str = factory()
    return existing(url)


def existing(url: str) -> str:
    """``url``, with its SQLite file made (empty) if it is one: the bot has run there
    (the commands refuse a SQLite path with no file, which is most often a typo)."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        sqlite3.connect(parts.path.removeprefix("/")).close()
    return url


async def invoke(*args: str, env: Mapping[str, str] | None = None) -> Result:
    """``telegram-idem ARGS…`` through click's runner, on a thread (its ``asyncio.run``
    cannot run inside the test's loop); ``IDEM_STORE_URL`` is unset unless ``env`` sets
    it."""
    runner = CliRunner()
    environ = {"IDEM_STORE_URL": None, "COLUMNS": "250", **(env or {})}
    return await asyncio.to_thread(runner.invoke, cli, list(args), env=environ)


def as_json(result: Result) -> Any:
    """The command's ``--json`` stdout, decoded (the test fails on anything else)."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return json.loads(result.stdout)


class Bot:
    """A bot process's outbound side, in this process: an ``Outbound`` on ``store`` whose
    relay (running inside ``async with``) sends to the fake Bot API at ``api_url``,
    polling fast."""

    def __init__(self, store: Store, api_url: str) -> None:
        self.api = HttpBotAPI(TOKEN, base_url=api_url, timeout=5.0)
        flood = FloodControl.for_store(store, bot_id=BOT_ID, limits=UNPACED)
        self.relay = Relay(
            outbox_of(store),
            self.api,
            bot_id=BOT_ID,
            flood=flood,
            lease=5.0,
            poll_interval=0.05,
            backoff_base=0.05,
            backoff_max=0.5,
        )
        self.out = Outbound(
            outbox_of(store),
            self.api,
            bot_id=BOT_ID,
            flood=flood,
            relay=self.relay,
        )

    async def __aenter__(self) -> Outbound:
        self.relay.start()
        return self.out

    async def __aexit__(self, *exc: object) -> None:
        await self.relay.stop(grace=1.0)
        await self.api.close()


HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    from telegram_idem import Idem

    url, action, lease = sys.argv[1], sys.argv[2], float(sys.argv[3])

    async def main() -> None:
        idem = Idem(url, lease=lease, heartbeat=False, holder="worker-1")

        async def grant() -> str:
            print("started", flush=True)
            await asyncio.Event().wait()  # killed here, inside the effect
            return "never"

        async def body() -> str:
            return await idem.step("grant", grant, once="at_most")

        await idem.run(action, body)

    asyncio.run(main())
    """
)
"""A holder that starts an at-most-once step and waits inside its effect until killed."""


async def holder_killed_in_effect(url: str, action: str, *, lease: float) -> None:
    """Run :data:`HOLDER` on ``url``, and SIGKILL it once its at-most-once step
    ``grant`` inside action ``action`` started (its ledger row written, its effect
    running): nothing after the kill records an outcome."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HOLDER,
        url,
        action,
        str(lease),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60.0)
        if line.strip() != b"started":
            err = await proc.stderr.read()
            raise AssertionError(f"the holder ended: {err.decode(errors='replace')}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()


async def store_time_passes(store: Store, moment: float) -> None:
    """Return once the store's clock (the server's, for server stores) is past
    ``moment``: a dead holder's lease is over for every reader then."""
    while await store.now() <= moment:
        await asyncio.sleep(0.05)


ROOT = Path(__file__).resolve().parents[2]
SH_BLOCK = re.compile(r"^```sh\n(?P<code>.*?)^```\s*$", re.DOTALL | re.MULTILINE)


def documented_commands(page: str, group: str) -> list[list[str]]:
    """The ``telegram-idem <group> …`` command lines of the ```sh blocks of
    ``docs/<page>``, split as a shell splits them (without ``telegram-idem``)."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    lines: list[list[str]] = []
    for block in SH_BLOCK.finditer(text):
        for line in block["code"].splitlines():
            words = shlex.split(line, comments=True)
            if words[:2] == ["telegram-idem", group]:
                lines.append(words[1:])
    return lines
