"""Placeholder: the dynamodb store's URL factory (replaced when the store lands)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from services import service_missing


@pytest.fixture
def dynamodb_url_factory() -> Callable[[], str]:
    service_missing("the dynamodb store is not implemented yet")
