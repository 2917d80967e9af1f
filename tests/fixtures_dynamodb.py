"""The DynamoDB store's endpoint and URL factory for the test suite.

The endpoint is ``IDEM_TEST_DYNAMODB_ENDPOINT`` (tests/services.py) if set, else a moto
server started once per session on a free loopback port, in a thread of the test process:
moto in server mode, a real HTTP endpoint that aiobotocore talks to over TCP, never moto's
in-process mocks. It is stopped (its socket closed) at the end of the session.

moto's DynamoDB backend takes no lock: two conditional writes of one item that arrive at
once can both pass their condition (measured: 2 of 50 concurrent ``attribute_not_exists``
puts succeeded). DynamoDB itself applies conditional writes of one item atomically, so the
server here runs one request at a time behind a lock, with the HTTP side still threaded,
and counts the requests it receives per operation (``MotoServer.requests``).

``dynamodb_url_factory`` returns a callable making a new table name per call,
``dynamodb://t<hex>?region=us-east-1&endpoint_url=…&create_table=1``; every table made
is deleted at teardown.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from services import DYNAMODB_ENDPOINT, service_missing

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


_ENDPOINT: DynamoDBEndpoint | None = None
_MISSING: str | None = None


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


def dynamodb_endpoint_for(config: pytest.Config) -> DynamoDBEndpoint:
    """The session's endpoint, started on first use and stopped when the session ends.

    Skips (or fails under ``IDEM_REQUIRE_SERVICES=1``) when neither an external endpoint
    answers nor moto[server] is installed.
    """
    global _ENDPOINT, _MISSING
    if _ENDPOINT is not None:
        return _ENDPOINT
    if _MISSING is not None:  # probed once per session
        service_missing(_MISSING)
    if DYNAMODB_ENDPOINT:
        try:
            boto3_client(DYNAMODB_ENDPOINT).list_tables(Limit=1)
        except Exception as exc:
            _MISSING = f"no DynamoDB at IDEM_TEST_DYNAMODB_ENDPOINT={DYNAMODB_ENDPOINT}: {exc}"
            service_missing(_MISSING)
        _ENDPOINT = DynamoDBEndpoint(DYNAMODB_ENDPOINT)
        return _ENDPOINT
    try:
        import moto.moto_server.werkzeug_app  # noqa: F401
    except ImportError as exc:
        _MISSING = f"moto[server] is not installed ({exc})"
        service_missing(_MISSING)
    server = MotoServer().start()
    _ENDPOINT = DynamoDBEndpoint(server.url, server)

    def stop() -> None:
        global _ENDPOINT
        server.stop()
        _ENDPOINT = None

    config.add_cleanup(stop)
    return _ENDPOINT


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
        if os.environ.get("IDEM_TEST_DEBUG"):
            raise


@pytest.fixture
def dynamodb_endpoint(request: pytest.FixtureRequest) -> DynamoDBEndpoint:
    """The session's DynamoDB endpoint (moto server unless configured)."""
    return dynamodb_endpoint_for(request.config)


@pytest.fixture
def dynamodb_url_factory(request: pytest.FixtureRequest) -> Iterator[Callable[[], str]]:
    """A new table per call: ``dynamodb://t<hex>?region=…&endpoint_url=…&create_table=1``."""
    endpoint = dynamodb_endpoint_for(request.config)
    made: list[str] = []

    def make() -> str:
        url = dynamodb_url(endpoint.url)
        made.append(table_of(url))
        return url

    yield make
    delete_tables(endpoint.url, made)
