"""URL factories of the in-process stores (``memory://``, ``sqlite://``), like the server
stores' in tests/fixtures_postgres.py and tests/fixtures_redis.py; tests/conftest.py
registers them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from services import UrlFactory

from telegram_idem.testing.plugin import isolated_urls


@pytest.fixture
def memory_url_factory(pytestconfig: pytest.Config, tmp_path: Path) -> Iterator[UrlFactory]:
    """``memory://``: every store made from it is a separate, empty store."""
    urls = isolated_urls(pytestconfig, "memory", tmp_path)
    yield urls
    urls.close()


@pytest.fixture
def sqlite_url_factory(pytestconfig: pytest.Config, tmp_path: Path) -> Iterator[UrlFactory]:
    """A new SQLite file per call."""
    urls = isolated_urls(pytestconfig, "sqlite", tmp_path)
    yield urls
    urls.close()
