"""Fixtures of the blog bot tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from examples.blog_bot.tests.blog_harness import Harness, running_blog


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    """The blog bot serving its webhook on loopback, with a fresh database and repository."""
    async with running_blog(tmp_path) as h:
        yield h
