"""The DynamoDB store's endpoint and URL factory for the test suite.

The endpoint is the ``endpoint_url`` of the plugin's DynamoDB URL (``--idem-dynamodb-url``
/ ``IDEM_DYNAMODB_URL`` / ``idem_dynamodb_url``) if one is set, else
(:func:`start_session_moto`, through the ``pytest_idem_server_url`` hook of
tests/conftest.py) a moto server started once per session on a free loopback port, in a
thread of the test process: moto in server mode, a real HTTP endpoint that aiobotocore
talks to over TCP, never moto's in-process mocks. It is stopped (its socket closed) at
the end of the session.

moto's DynamoDB backend takes no lock: two conditional writes of one item that arrive at
once can both pass their condition (measured: 2 of 50 concurrent ``attribute_not_exists``
puts succeeded). DynamoDB itself applies conditional writes of one item atomically, so the
server here runs one request at a time behind a lock, with the HTTP side still threaded,
and counts the requests it receives per operation (``MotoServer.requests``).

``dynamodb_url_factory`` (the plugin's :class:`~telegram_idem.testing._stores.IsolatedUrls`)
returns a callable making a new table name per call, ``dynamodb://t<hex>?…&create_table=1``
on that endpoint; every table made is deleted at teardown.
"""

from __future__ import annotations

import secrets
import socket
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from services import ServiceUnavailable, UrlFactory, server_url, service_missing

from telegram_idem.testing.plugin import isolated_urls

REGION = "us-east-1"
DUMMY_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Serialised:
    """WSGI wrapper: one request at a time into moto (DynamoDB's per-item atomicity), and
    a count of requests per DynamoDB operation (``X-Amz-Target``)."""

    def __init__(self, app: Any, requests: Counter[str]) -> None:
        self.app = app
        self.requests = requests
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        target = str(environ.get("HTTP_X_AMZ_TARGET", "")).rpartition(".")[2]
        with self.lock:
            self.requests[target or environ.get("PATH_INFO", "?")] += 1
            # consume the body inside the lock: the app may produce it lazily
            result = self.app(environ, start_response)
            try:
                return [b"".join(result)]
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()


@dataclass
class MotoServer:
    """A moto server on ``127.0.0.1:port`` (``port=0``: a free one) in a daemon thread."""

    port: int = 0
    requests: Counter[str] = field(default_factory=Counter)
    _server: Any = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoServer:
        """Listen and serve. Returns ``self``."""
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        class Quiet(MotoRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass

        app = _Serialised(DomainDispatcherApplication(create_backend_app), self.requests)
        self._server = make_server(
            "127.0.0.1", self.port, app, threaded=True, request_handler=Quiet
        )
        self.port = int(self._server.server_port)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"moto-{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket: new connections are refused."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None


@dataclass
class DynamoDBEndpoint:
    """Where the tests find DynamoDB; ``server`` is ``None`` for an external endpoint."""

    url: str
    server: MotoServer | None = None


_SESSION_MOTO: list[MotoServer] = []
"""The moto server :func:`start_session_moto` started, if it did."""


def boto3_client(endpoint_url: str) -> Any:
    """A synchronous boto3 DynamoDB client for setup and inspection (dummy credentials)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "dynamodb",
        region_name=REGION,
        endpoint_url=endpoint_url,
        config=Config(connect_timeout=2, read_timeout=10, retries={"total_max_attempts": 2}),
        **DUMMY_CREDENTIALS,
    )


def start_session_moto(config: pytest.Config) -> str:
    """Start the session's moto server (stopped when the session ends); a store URL on it,
    ``dynamodb://idem_test?endpoint_url=…&region=us-east-1``.

    Raises:
        ServiceUnavailable: moto[server] is not installed.
    """
    try:
        import moto.moto_server.werkzeug_app  # noqa: F401
    except ImportError as exc:
        raise ServiceUnavailable(f"moto[server] is not installed ({exc})") from exc
    server = MotoServer().start()
    _SESSION_MOTO[:] = [server]

    def stop() -> None:
        server.stop()
        _SESSION_MOTO.clear()

    config.add_cleanup(stop)
    return f"dynamodb://idem_test?endpoint_url={server.url}&region={REGION}"


def dynamodb_endpoint_for(config: pytest.Config) -> DynamoDBEndpoint:
    """The session's endpoint: the ``endpoint_url`` of the plugin's DynamoDB URL, with the
    moto server object when it is the session's own.

    Skips (or fails when stores are required) when there is no DynamoDB, or its URL names
    no endpoint; a configured endpoint is checked once with ``ListTables``.
    """
    url = server_url("dynamodb")
    endpoint = dict(parse_qsl(urlsplit(url).query)).get("endpoint_url", "")
    if not endpoint:
        service_missing(f"the DynamoDB URL {url!r} names no endpoint_url (the tests need one)")
    own = [s for s in _SESSION_MOTO if s.url == endpoint]
    if not own and endpoint not in _CHECKED:
        try:
            boto3_client(endpoint).list_tables(Limit=1)
        except Exception as exc:
            pytest.fail(f"no DynamoDB answers at {endpoint}: {exc}", pytrace=False)
        _CHECKED.add(endpoint)
    return DynamoDBEndpoint(endpoint, own[0] if own else None)


_CHECKED: set[str] = set()


def dynamodb_url(endpoint_url: str, table: str | None = None, **options: str) -> str:
    """A store URL for ``table`` (new name if ``None``) with ``create_table=1``."""
    query = {"region": REGION, "endpoint_url": endpoint_url, "create_table": "1", **options}
    name = table or f"t{secrets.token_hex(6)}"
    return f"dynamodb://{name}?" + "&".join(f"{k}={v}" for k, v in query.items())


def table_of(url: str) -> str:
    """The table name of a ``dynamodb://`` URL."""
    return url.split("://", 1)[1].split("?", 1)[0]


def delete_tables(endpoint_url: str, tables: Iterable[str]) -> None:
    """Delete each table that exists (best effort: the endpoint may be gone)."""
    tables = list(tables)
    if not tables:
        return
    try:
        client = boto3_client(endpoint_url)
        for table in tables:
            try:
                client.delete_table(TableName=table)
            except client.exceptions.ResourceNotFoundException:
                pass
    except Exception:  # teardown must not mask the test's own outcome
        pass


@pytest.fixture
def dynamodb_endpoint(request: pytest.FixtureRequest) -> DynamoDBEndpoint:
    """The session's DynamoDB endpoint (moto server unless configured)."""
    return dynamodb_endpoint_for(request.config)


@pytest.fixture
def dynamodb_url_factory(pytestconfig: pytest.Config, tmp_path: Path) -> Iterator[UrlFactory]:
    """A new table per call: ``dynamodb://t<hex>?…&create_table=1`` on the session's
    endpoint; every table made is deleted at teardown (best effort)."""
    urls = isolated_urls(pytestconfig, "dynamodb", tmp_path)
    try:
        yield urls
    finally:
        urls.close()
