"""NATS JetStream for the tests of the JetStream inbox: the server the plugin's
``idem_nats_url`` finds, a stream name per test (deleted at teardown), and the
conformance classes' store maker (a claim store wrapped by ``with_jetstream_inbox``)."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import nats
import nats.js.errors
import pytest
from services import load_services_script

from telegram_idem._clock import ManualClock
from telegram_idem.backends import Store, store_from_url
from telegram_idem.backends.nats import JetStreamStore, with_jetstream_inbox
from telegram_idem.testing._stores import nats_answers

__all__ = [
    "NatsServer",
    "delete_streams",
    "jetstream_streams",
    "private_nats",
    "stream_for",
    "wrap",
]


def stream_for(claim_url: str, tag: str) -> str:
    """The stream every store made on ``claim_url`` shares (one per URL, like its
    records): ``idemtest_<tag>_<hash of the URL>``."""
    return f"idemtest_{tag}_{hashlib.sha256(claim_url.encode()).hexdigest()[:12]}"


def wrap(store: Store, nats_url: str, stream: str, **options: object) -> JetStreamStore:
    """``store`` with a JetStream inbox on ``stream`` (tests' defaults: 4 partitions)."""
    options.setdefault("partitions", 4)
    return with_jetstream_inbox(store, url=nats_url, stream=stream, **options)  # type: ignore[arg-type]


async def delete_streams(nats_url: str, streams: list[str]) -> None:
    """Delete each stream and its state bucket (missing ones are skipped)."""
    nc = await nats.connect(nats_url, connect_timeout=2, max_reconnect_attempts=0)
    try:
        js = nc.jetstream()
        for name in streams:
            for s in (name, f"KV_{name}_state"):
                try:
                    await js.delete_stream(s)
                except nats.js.errors.NotFoundError:
                    pass
    finally:
        await nc.close()


@pytest.fixture
def jetstream_streams(idem_nats_url: str) -> Iterator[list[str]]:
    """Stream names a test makes; each is deleted (with its bucket) at teardown."""
    made: list[str] = []
    yield made
    if made:
        asyncio.run(delete_streams(idem_nats_url, made))


@pytest.fixture
def jetstream_stream(jetstream_streams: list[str]) -> str:
    """One new stream name, deleted at teardown."""
    name = f"idemtest_{secrets.token_hex(6)}"
    jetstream_streams.append(name)
    return name


@pytest.fixture
async def jetstream_store(
    idem_nats_url: str,
    jetstream_stream: str,
    sqlite_url_factory: Callable[[], str],
    idem_clock: ManualClock,
) -> AsyncIterator[JetStreamStore]:
    """A SQLite claim store on the test's clock with a JetStream inbox."""
    store = wrap(
        store_from_url(sqlite_url_factory(), clock=idem_clock), idem_nats_url, jetstream_stream
    )
    yield store
    await store.close()


class NatsServer:
    """A private ``nats-server -js`` on a free loopback port, its JetStream store in
    ``directory``: stopped and started again on the same port and store (a broker
    restart), killed at the end.

    Args:
        directory: where the server keeps its streams and its log.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = load_services_script().free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it and wait (≤ 20 s) until it greets."""
        program = shutil.which("nats-server")
        if program is None:
            pytest.skip("nats-server is not installed")
        with (self.directory / "nats.log").open("ab") as log:
            self._proc = subprocess.Popen(
                [
                    program,
                    "-js",
                    "-a",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-sd",
                    str(self.directory),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        for _ in range(400):
            if nats_answers(self.url, 0.2):
                return
            time.sleep(0.05)
        raise RuntimeError(f"nats-server on {self.port} did not start")

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL after 10 s) and wait until it is gone."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A started :class:`NatsServer` of this test only."""
    server = NatsServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
