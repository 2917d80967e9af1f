"""Fixtures of the metrics tests: a fresh Prometheus registry per test, a store URL of
each store the storms run on, and a Redis URL whose port nothing listens on."""

from __future__ import annotations

import socket

import pytest
from prometheus_client import CollectorRegistry


@pytest.fixture
def registry() -> CollectorRegistry:
    """A registry of the test's own (never the process-wide default)."""
    return CollectorRegistry()


@pytest.fixture(params=["sqlite", "redis"])
def storm_url(request: pytest.FixtureRequest) -> str:
    """A fresh, isolated URL of SQLite (a new file) or Redis (a new key prefix)."""
    factory = request.getfixturevalue(f"{request.param}_url_factory")
    url = factory()
    assert isinstance(url, str)
    return url


@pytest.fixture
def closed_port() -> int:
    """A loopback port that was free a moment ago and that nothing listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
