"""Fixtures of the store commands' tests (``check``, ``inspect``, ``purge``): a fresh
store URL per test on each real store (``storecli_url``, parametrised over SQLite,
PostgreSQL and Redis), records written into it and read back (``storecli_seed``,
``storecli_get``), the command run through click's runner with stdout and stderr apart
(``storecli_invoke``), the installed ``telegram-idem`` script (``storecli_script``), a
loopback port nothing listens on (``storecli_closed_port``), and a third-party store
with none of the commands' abilities (``storecli-plain://``, :class:`PlainStore`).

The names start with ``storecli_``: other command tests share this folder.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from services import UrlFactory

from telegram_idem import machine
from telegram_idem._cli import cli
from telegram_idem._clock import Clock
from telegram_idem._records import Claim, Record
from telegram_idem.backends import Store, store_from_url

STORECLI_STORES = ("sqlite", "postgres", "redis")
"""The stores every command is run against."""

Seed = Callable[..., None]
Invoke = Callable[..., Result]
Get = Callable[[str, str], Record | None]


class PlainStore(Store, schemes=("storecli-plain",)):
    """A third-party store with the record primitives only (records in a dict): no
    ``records``/``delete_records``, no ``health``, no ``purge``; ``storecli-plain://``."""

    driver_errors = ()

    def __init__(self, clock: Clock = time.time) -> None:
        self.clock = clock
        self.rows: dict[str, Record] = {}

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> PlainStore:
        return cls(clock or time.time)

    def _apply(self, key: str, step: Callable[[Record | None, float], Record | None]) -> bool:
        new = step(self.rows.get(key), self.clock())
        if new is not None:
            self.rows[key] = new
        return new is not None

    async def _claim(
        self, key: str, fingerprint: str | None, lease: float, retention: float
    ) -> Claim:
        claim, new = machine.decide_claim(
            self.rows.get(key),
            key=key,
            fingerprint=fingerprint,
            now=self.clock(),
            lease=lease,
            retention=retention,
        )
        if new is not None:
            self.rows[key] = new
        return claim

    async def _complete(self, key: str, token: int, result: bytes, retention: float) -> bool:
        return self._apply(
            key,
            lambda r, now: machine.do_complete(
                r, token=token, result=result, now=now, retention=retention
            ),
        )

    async def _fail(self, key: str, token: int, error: bytes, retention: float) -> bool:
        return self._apply(
            key,
            lambda r, now: machine.do_fail(
                r, token=token, error=error, now=now, retention=retention
            ),
        )

    async def _release(self, key: str, token: int) -> bool:
        return self._apply(key, lambda r, now: machine.do_release(r, token=token, now=now))

    async def _extend(self, key: str, token: int, lease: float) -> bool:
        return self._apply(
            key, lambda r, now: machine.do_extend(r, token=token, now=now, lease=lease)
        )

    async def _get(self, key: str) -> Record | None:
        record = self.rows.get(key)
        return record if machine.is_live(record, self.clock()) else None


@pytest.fixture(params=[pytest.param(n, marks=getattr(pytest.mark, n)) for n in STORECLI_STORES])
def storecli_store_name(request: pytest.FixtureRequest) -> str:
    """The store under test: ``sqlite``, ``postgres`` or ``redis`` (each test carries
    that store's marker, so ``-m redis`` selects it)."""
    name: str = request.param
    return name


@pytest.fixture
def storecli_url(storecli_store_name: str, request: pytest.FixtureRequest) -> str:
    """A fresh, isolated URL of the store under test (its own SQLite file, PostgreSQL
    table prefix, already migrated, or Redis key prefix), removed after the test. The
    SQLite file does not exist until something opens it (``storecli_seed`` does)."""
    factory: UrlFactory = request.getfixturevalue(f"{storecli_store_name}_url_factory")
    return factory()


@pytest.fixture
def storecli_seed() -> Seed:
    """``seed(url, keys, *, complete=True, result=b"hello", fingerprint=None,
    retention=3600.0, lease=60.0, age=0.0)``: claim each key on the store at ``url``
    (and complete it with ``result`` unless ``complete=False``), by a clock ``age``
    seconds in the past (``age > retention``: records already past retention, without
    waiting). With no keys it only opens the store (an SQLite file is created)."""

    def seed(
        url: str,
        keys: Sequence[str],
        *,
        complete: bool = True,
        result: bytes = b"hello",
        fingerprint: str | None = None,
        retention: float = 3600.0,
        lease: float = 60.0,
        age: float = 0.0,
    ) -> None:
        async def main() -> None:
            clock = (lambda: time.time() - age) if age else None
            store = store_from_url(url, clock=clock)
            try:
                await store.get("storecli:open")
                for key in keys:
                    claim = await store.claim(
                        key, fingerprint=fingerprint, lease=lease, retention=retention
                    )
                    if complete:
                        await store.complete(key, claim.token, result, retention=retention)
            finally:
                await store.close()

        asyncio.run(main())

    return seed


@pytest.fixture
def storecli_get() -> Get:
    """``get(url, key)``: the live record of ``key`` in the store at ``url`` (its own
    ``get``, not the commands' abilities), or ``None``."""

    def get(url: str, key: str) -> Record | None:
        async def main() -> Record | None:
            store = store_from_url(url)
            try:
                return await store.get(key)
            finally:
                await store.close()

        return asyncio.run(main())

    return get


@pytest.fixture
def storecli_invoke(monkeypatch: pytest.MonkeyPatch) -> Invoke:
    """``invoke(args, *, env=None, input=None)``: run ``telegram-idem <args>`` in this
    process with click's runner (stdout and stderr apart: ``result.stdout``,
    ``result.stderr``), ``IDEM_STORE_URL`` unset unless ``env`` sets it."""
    monkeypatch.delenv("IDEM_STORE_URL", raising=False)

    def invoke(
        args: Sequence[str], *, env: Mapping[str, str] | None = None, input: str | None = None
    ) -> Result:
        return CliRunner().invoke(cli, list(args), env=dict(env or {}), input=input)

    return invoke


@pytest.fixture
def storecli_script() -> str:
    """The installed ``telegram-idem`` console script (beside this Python)."""
    beside = Path(sys.executable).parent / "telegram-idem"
    found = str(beside) if beside.exists() else shutil.which("telegram-idem")
    if found is None:
        pytest.fail("the telegram-idem script is not installed (pip install -e .)")
    return found


@pytest.fixture
def storecli_closed_port() -> int:
    """A loopback TCP port nothing listens on (bound, then released: connecting to it
    is refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
