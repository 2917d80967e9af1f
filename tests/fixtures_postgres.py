"""The PostgreSQL store's URL factory, the server found without configuration, and a
private server.

``postgres_url_factory`` is the plugin's :class:`~telegram_idem.testing._stores.IsolatedUrls`:
each URL is the server's plus ``table_prefix=t<random hex>``, its tables made by the
store's ``migrate()`` before the URL is handed out and dropped when the test ends.
The server is the plugin's (``--idem-postgres-url`` / ``IDEM_POSTGRES_URL`` /
``idem_postgres_url``), else :func:`find_postgres` (``tests/services.py``).

``private_postgres`` (import ``private_postgres_fixture`` to use it) is a PostgreSQL server of the test's own (``initdb`` into a
temporary directory, a free loopback port), for tests that stop and start a server:
the machine's shared server is never stopped, since other test runs use it meanwhile.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from services import (
    DEFAULT_POSTGRES_URL,
    ServiceUnavailable,
    UrlFactory,
    load_services_script,
    server_url,
    service_missing,
)

from telegram_idem.testing._stores import run_in_thread as run_sync
from telegram_idem.testing.plugin import isolated_urls

__all__ = [
    "PrivatePostgres",
    "drop_tables",
    "find_postgres",
    "postgres_reachable_or_missing",
    "postgres_url_factory",
    "private_postgres_fixture",
    "run_sync",
    "with_option",
]


def find_postgres() -> str:
    """``DEFAULT_POSTGRES_URL`` if asyncpg is installed and the server answers.

    Raises:
        ServiceUnavailable: it does not (the message says why).
    """
    try:
        import asyncpg
    except ImportError:
        raise ServiceUnavailable(
            "asyncpg is not installed (pip install 'telegram-idem[postgres]')"
        ) from None

    async def probe() -> None:
        conn = await asyncpg.connect(DEFAULT_POSTGRES_URL, timeout=3.0)
        await conn.close()

    try:
        run_sync(probe, timeout=10.0)
    except Exception as exc:
        raise ServiceUnavailable(
            f"PostgreSQL at {_safe(DEFAULT_POSTGRES_URL)} is unreachable: {exc!r}"
        ) from exc
    return DEFAULT_POSTGRES_URL


def postgres_reachable_or_missing() -> None:
    """Skip (or fail when stores are required) unless the suite has a PostgreSQL."""
    server_url("postgres")


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
def postgres_url_factory(pytestconfig: pytest.Config, tmp_path: Path) -> Iterator[UrlFactory]:
    """A new, migrated, isolated PostgreSQL store URL per call (own table prefix)."""
    urls = isolated_urls(pytestconfig, "postgres", tmp_path)
    try:
        yield urls
    finally:
        urls.close()


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

    Skips (fails when stores are required) when it cannot start here: no server
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
