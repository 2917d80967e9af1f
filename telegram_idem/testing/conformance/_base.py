"""The fixtures every conformance class shares, and the one a store's author provides."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import ClassVar

import pytest
import pytest_asyncio

from telegram_idem._clock import Clock, ManualClock
from telegram_idem.backends import Store, store_from_url

__all__ = ["ConformanceBase", "StoreMaker", "UrlFactory"]

UrlFactory = Callable[[], str]
"""Returns a new URL each call, whose store holds no record yet."""
StoreMaker = Callable[[], Awaitable[Store]]
"""Makes another store object (its own connection) on one URL."""


class ConformanceBase:
    """Fixtures of the conformance classes (not collected: its name has no ``Test``).

    A subclass provides ``store_url_factory``; everything else follows from it.

    Attributes:
        shares_state: every store object made from one URL, in this process or another,
            sees the same records (``False`` for ``memory://``: then the tests of
            separate connections use one object, and those of OS processes are
            deselected).
        model_examples: how many random operation sequences the model comparison runs
            (lower it for a store whose every call is slow).
    """

    shares_state: ClassVar[bool] = True
    model_examples: ClassVar[int] = 40

    @pytest.fixture
    def store_url_factory(self) -> UrlFactory:
        """Override: a callable returning a new URL, with no records, on each call (a new
        file, table, key prefix…), cleaned up by the fixture after the test."""
        pytest.fail(
            f"{type(self).__name__} must define a store_url_factory fixture "
            "(a callable returning a new, empty store URL per call)",
            pytrace=False,
        )

    def open_store(self, url: str, clock: Clock | None) -> Store:
        """The store object for ``url`` (override when ``store_from_url`` cannot make it).

        Also called in other OS processes (``clock=None``) on a new instance of the
        class, whose module is imported there.

        Args:
            url: a URL from ``store_url_factory``.
            clock: the test's clock, or ``None`` for the store's own time source.
        """
        return store_from_url(url, clock=clock)

    @pytest.fixture
    def clock(self, idem_clock: ManualClock) -> ManualClock:
        """The plugin's ``idem_clock``: every store of the test runs on it.

        Args:
            idem_clock: the plugin's fixture.
        """
        return idem_clock

    @pytest.fixture
    def store_url(self, store_url_factory: UrlFactory) -> str:
        """One new URL.

        Args:
            store_url_factory: the suite's fixture making new URLs.
        """
        return store_url_factory()

    @pytest_asyncio.fixture
    async def store_factory(self, store_url: str, clock: ManualClock) -> AsyncIterator[StoreMaker]:
        """Makes store objects on ``store_url`` with ``clock``; closes them after.

        Args:
            store_url: the URL (fixture).
            clock: the clock (fixture).
        """
        made: list[Store] = []

        async def make() -> Store:
            store = self.open_store(store_url, clock)
            made.append(store)
            return store

        try:
            yield make
        finally:
            for store in made:
                await store.close()

    @pytest_asyncio.fixture
    async def store(self, store_factory: StoreMaker) -> Store:
        """A store on a new URL, with ``clock``.

        Args:
            store_factory: the fixture making stores.
        """
        return await store_factory()
