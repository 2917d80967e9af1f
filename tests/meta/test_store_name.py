"""The store under test is read from the fixture parameter, not from the test id: a test
with its own parameters (whose ids come first, or contain "-") still knows its store."""

from __future__ import annotations

import pytest

SCHEMES = {
    "memory": "memory://",
    "sqlite": "sqlite:",
    "postgres": "postgresql:",
    "redis": "redis:",
    "redis-cluster": "redis+cluster:",
    "dynamodb": "dynamodb:",
}


@pytest.fixture(params=["with-dashes", "plain"])
def label(request: pytest.FixtureRequest) -> str:
    """A parametrised fixture requested before the store: its id comes first."""
    return str(request.param)


def test_store_name_matches_the_store_url(label: str, store_name: str, store_url: str) -> None:
    assert store_url.startswith(SCHEMES[store_name]), (store_name, store_url)


@pytest.mark.inbox
def test_the_inbox_marker_keeps_only_inbox_stores(
    label: str, store_name: str, store_url: str
) -> None:
    assert store_name in {"memory", "sqlite", "postgres", "redis", "redis-cluster"}
