"""The browsing and health contract, for stores with the
:class:`~telegram_idem.backends.Browsable` and :class:`~telegram_idem.backends.Checkable`
abilities (``telegram-idem inspect --prefix``, ``purge --prefix``, ``check``): records
listed live and in key order by a prefix that is never a pattern, counted and deleted
in batches exactly under their prefix, odd and huge prefixes answered, and a health
check that finds a fresh store's tables.

Time moves with the test's ``ManualClock``; nothing sleeps.
"""

from __future__ import annotations

from typing import ClassVar

import pytest

from telegram_idem._clock import ManualClock
from telegram_idem._keys import bounded_key
from telegram_idem.backends import Browsable, Store, as_browsable, as_checkable
from telegram_idem.errors import ConfigurationError
from telegram_idem.testing.conformance._base import ConformanceBase
from telegram_idem.testing.conformance._payloads import ODD_TEXTS

__all__ = ["BrowseContract"]

LEASE = 30.0
RETENTION = 3600.0
WILD = ["%", "_", "*", "?", "[a]", "\\", "^", "\\%", "{", "}"]
"""Characters SQL ``LIKE`` or Redis glob patterns would read as patterns or escapes."""


async def _put(store: Store, *keys: str, retention: float = RETENTION) -> None:
    """Claim each key and complete it with ``b"r"``."""
    for key in keys:
        claim = await store.claim(key, lease=LEASE, retention=retention)
        await store.complete(key, claim.token, b"r", retention=retention)


async def _keys(browsable: Browsable, prefix: str, limit: int = 1000) -> list[str]:
    return [r.key for r in await browsable.records(prefix=prefix, limit=limit)]


class BrowseContract(ConformanceBase):
    """``records``, ``count_records``, ``delete_records`` and ``health`` (see the module
    docstring).

    Attributes:
        counts_expired: ``count_records(expired=True)`` counts the records past retention
            that the store still holds (``False`` for a store that forgets them itself,
            like Redis, which answers 0).
    """

    counts_expired: ClassVar[bool] = True

    @pytest.fixture
    def browsable(self, store: Store) -> Browsable:
        """``store`` as a :class:`~telegram_idem.backends.Browsable`."""
        return as_browsable(store)

    @pytest.mark.asyncio
    async def test_an_empty_store_lists_counts_and_deletes_nothing(
        self, browsable: Browsable
    ) -> None:
        assert await browsable.records(prefix="") == []
        assert await browsable.records(prefix="idem:") == []
        assert await browsable.count_records(prefix="") == 0
        assert await browsable.count_records(prefix="", expired=True) == 0
        assert await browsable.delete_records(prefix="") == 0

    @pytest.mark.asyncio
    async def test_records_are_the_live_ones_under_the_prefix_in_key_order(
        self, store: Store, browsable: Browsable
    ) -> None:
        await _put(store, "p:c", "p:a", "p:b", "q:a", "p", "pz:a")
        listed = await browsable.records(prefix="p:")
        assert [r.key for r in listed] == ["p:a", "p:b", "p:c"]
        first = listed[0]
        assert (first.result, first.attempts, first.fencing_token) == (b"r", 1, 1)
        assert await _keys(browsable, "p:", limit=2) == ["p:a", "p:b"]
        assert await _keys(browsable, "") == ["p", "p:a", "p:b", "p:c", "pz:a", "q:a"]
        assert await _keys(browsable, "p:a") == ["p:a"]
        assert await _keys(browsable, "r") == []

    @pytest.mark.asyncio
    async def test_records_past_retention_are_not_listed_but_are_counted_and_deleted(
        self, store: Store, browsable: Browsable, clock: ManualClock
    ) -> None:
        await _put(store, "e:short", retention=LEASE)
        await _put(store, "e:long")
        clock.advance(LEASE + 1)
        assert await _keys(browsable, "e:") == ["e:long"]
        assert await browsable.count_records(prefix="e:") == 2
        if self.counts_expired:
            assert await browsable.count_records(prefix="e:", expired=True) == 1
            assert await browsable.count_records(prefix="x", expired=True) == 0
        else:
            assert await browsable.count_records(prefix="e:", expired=True) == 0
        assert await browsable.delete_records(prefix="e:") == 2
        assert await browsable.count_records(prefix="e:") == 0

    @pytest.mark.asyncio
    @pytest.mark.parametrize("wild", WILD)
    async def test_a_prefix_is_never_a_pattern(
        self, store: Store, browsable: Browsable, wild: str
    ) -> None:
        literal = f"w:{wild}"
        await _put(store, f"{literal}:1", "w:x:1", "w:ab:1", "w:\\:1", "w::1", "w:a:1")
        assert await _keys(browsable, literal) == [f"{literal}:1"]
        assert await browsable.count_records(prefix=literal) == 1
        assert await browsable.delete_records(prefix=literal) == 1
        remaining = {"w:x:1", "w:ab:1", "w:\\:1", "w::1", "w:a:1"} - {f"{literal}:1"}
        assert set(await _keys(browsable, "w:")) == remaining

    @pytest.mark.asyncio
    async def test_odd_texts_and_huge_prefixes_are_answered(
        self, store: Store, browsable: Browsable
    ) -> None:
        keys = [f"o:{text}:1" for text in ODD_TEXTS]
        await _put(store, *keys)
        for key in keys:
            prefix = key[:-2]
            stored = bounded_key(key)
            assert await _keys(browsable, prefix) == [stored], repr(prefix)
            assert await browsable.count_records(prefix=prefix) == 1
        huge = "o:" + "é" * 50_000
        assert await browsable.records(prefix=huge) == []
        assert await browsable.count_records(prefix=huge) == 0
        assert await browsable.delete_records(prefix=huge) == 0
        assert await browsable.count_records(prefix="o:") == len(keys)

    @pytest.mark.asyncio
    async def test_a_long_key_is_found_by_the_start_of_its_stored_head(
        self, store: Store, browsable: Browsable
    ) -> None:
        key = "l:" + "k" * 3000
        await _put(store, key)
        assert await _keys(browsable, "l:kkk") == [bounded_key(key)]
        assert await browsable.delete_records(prefix="l:") == 1
        assert await store.get(key) is None

    @pytest.mark.asyncio
    async def test_delete_removes_exactly_the_prefix_in_batches(
        self, store: Store, browsable: Browsable
    ) -> None:
        doomed = [f"d:{i:03}" for i in range(25)]
        kept = ["d", "dd:1", "e:1", "c:1", "D:1"]
        await _put(store, *doomed, *kept)
        batches = []
        while n := await browsable.delete_records(prefix="d:", limit=10):
            batches.append(n)
        assert batches == [10, 10, 5]
        assert await browsable.count_records(prefix="d:") == 0
        for key in doomed:
            assert await store.get(key) is None
        for key in kept:
            assert await store.get(key) is not None, key
        again = await store.claim(doomed[0], lease=LEASE, retention=RETENTION)
        assert again.outcome.value == "acquired"

    @pytest.mark.asyncio
    @pytest.mark.parametrize("limit", [0, -1])
    async def test_a_limit_below_one_is_refused(self, browsable: Browsable, limit: int) -> None:
        with pytest.raises(ConfigurationError):
            await browsable.records(prefix="", limit=limit)
        with pytest.raises(ConfigurationError):
            await browsable.delete_records(prefix="", limit=limit)

    @pytest.mark.asyncio
    async def test_health_of_a_fresh_store_finds_what_it_expects(self, store: Store) -> None:
        await _put(store, "h:1")  # a store that creates its tables on first use has them
        health = await as_checkable(store).health()
        assert health.server and health.compared
        assert health.found == health.expected
        assert health.missing == ()
        assert health.problems == ()
        assert health.ok
