"""Placeholder: the Redis stores' URL factories (replaced when the store lands)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from services import service_missing


@pytest.fixture
def redis_url_factory() -> Callable[[], str]:
    service_missing("the redis store is not implemented yet")


@pytest.fixture
def redis_cluster_url_factory() -> Callable[[], str]:
    service_missing("the redis store is not implemented yet")
