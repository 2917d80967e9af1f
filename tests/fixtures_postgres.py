"""The PostgreSQL store's URL factory: a fresh table prefix per call, dropped at teardown.

Each URL is ``POSTGRES_URL`` (tests/services.py) plus ``table_prefix=t<random hex>``; the
table is made by :func:`telegram_idem.backends.postgres.migrate` before the URL is
handed out, and dropped when the test ends. The fixture is synchronous (the async
``store_factory`` fixture calls it while its event loop runs), so the few async calls it
needs run on a short-lived loop in a helper thread.

``private_postgres`` (import ``private_postgres_fixture`` to use it) is a PostgreSQL server of the test's own (``initdb`` into a
temporary directory, a free loopback port), for tests that stop and start a server:
the machine's shared server is never stopped, since other test runs use it meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
from services import POSTGRES_URL, load_services_script, service_missing

T = TypeVar("T")

_reachable: dict[str, str | None] = {}  # base URL → None if reachable, else the reason


def run_sync(coro_fn: Callable[[], Coroutine[Any, Any, T]], timeout: float = 30.0) -> T:
    """Run ``coro_fn()`` to completion on a new event loop in a helper thread.

    Works whether or not the calling thread is running an event loop.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro_fn())
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, name="postgres-fixture", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"postgres fixture call took more than {timeout} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def postgres_reachable_or_missing(base: str = POSTGRES_URL) -> None:
    """Skip (or fail under IDEM_REQUIRE_SERVICES=1) unless asyncpg can connect to ``base``."""
    if base not in _reachable:
        try:
            import asyncpg
        except ImportError:
            _reachable[base] = "asyncpg is not installed (pip install 'telegram-idem[postgres]')"
        else:

            async def probe() -> None:
                conn = await asyncpg.connect(base, timeout=3.0)
                await conn.close()

            try:
                run_sync(probe, timeout=10.0)
                _reachable[base] = None
            except Exception as exc:
                _reachable[base] = f"PostgreSQL at {_safe(base)} is unreachable: {exc!r}"
    reason = _reachable[base]
    if reason is not None:
        service_missing(reason)


def _safe(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 5432}{parts.path}"


def with_option(url: str, option: str) -> str:
    """``url`` with ``option`` (``name=value``) appended to its query."""
    return f"{url}{'&' if urlsplit(url).query else '?'}{option}"


async def drop_tables(base: str, prefixes: list[str]) -> None:
    """Drop the tables of ``prefixes`` (if they exist)."""
    import asyncpg

    from telegram_idem.backends.postgres import drop_ddl

    conn = await asyncpg.connect(base, timeout=10.0)
    try:
        for prefix in prefixes:
            for statement in drop_ddl(prefix):
                await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture
def postgres_url_factory() -> Iterator[Callable[[], str]]:
    """A new, migrated, isolated PostgreSQL store URL per call (own table prefix)."""
    postgres_reachable_or_missing()
    from telegram_idem.backends.postgres import migrate

    prefixes: list[str] = []

    def make() -> str:
        prefix = f"t{secrets.token_hex(6)}"
        prefixes.append(prefix)
        run_sync(lambda: migrate(POSTGRES_URL, table_prefix=prefix))
        return with_option(POSTGRES_URL, f"table_prefix={prefix}")

    yield make
    if prefixes:
        run_sync(lambda: drop_tables(POSTGRES_URL, prefixes))


@dataclass
class PrivatePostgres:
    """A PostgreSQL server only this test uses: data, socket and log under ``directory``,
    listening on 127.0.0.1:``port``, user ``postgres`` with trust authentication."""

    directory: Path
    port: int

    @property
    def url(self) -> str:
        """``postgresql://postgres@127.0.0.1:<port>/postgres``."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        """Start it (again); returns once it accepts connections."""
        load_services_script().start_postgres_server(self.directory, self.port)

    def stop(self) -> None:
        """Stop it at once (``pg_ctl stop -m immediate``): every connection is cut."""
        load_services_script().stop_postgres_server(self.directory)

    def remove(self) -> None:
        """Stop it if it runs and delete its directory."""
        try:
            self.stop()
        except Exception:
            self._kill_postmaster()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _kill_postmaster(self) -> None:
        pidfile = self.directory / "data" / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().split("\n", 1)[0])
            os.kill(pid, signal.SIGQUIT)  # the postmaster's immediate shutdown
        except (OSError, ValueError):
            pass


@pytest.fixture(name="private_postgres")
def private_postgres_fixture() -> Iterator[PrivatePostgres]:
    """A running private PostgreSQL (about a second to make); removed at teardown.

    Skips (fails under ``IDEM_REQUIRE_SERVICES=1``) when it cannot start here: no server
    binaries, root without a ``postgres`` user, or ``initdb``/``pg_ctl`` failing.
    """
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        service_missing("asyncpg is not installed (pip install 'telegram-idem[postgres]')")
    module = load_services_script()
    directory = Path(tempfile.mkdtemp(prefix="idem-postgres-test-"))
    server = PrivatePostgres(directory, module.free_port())
    try:
        server.start()
    except module.ServiceError as exc:
        server.remove()
        service_missing(f"a private PostgreSQL could not start: {exc}")
    try:
        yield server
    finally:
        server.remove()
