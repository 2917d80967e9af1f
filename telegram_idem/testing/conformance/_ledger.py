"""The effect-ledger contract, for stores that keep one (the rules of
:class:`~telegram_idem.ledger.Ledger`): a row written once, made unknown and settled
under fencing tokens, removed only by its token, listed oldest first by prefix and state,
never expiring, kept byte for byte, and one row however many holders race."""

from __future__ import annotations

import asyncio

import pytest

from telegram_idem._clock import ManualClock
from telegram_idem._keys import bounded_key
from telegram_idem.backends import Store, ledger_of
from telegram_idem.ledger import Ledger, LedgerState, storable_text
from telegram_idem.testing.conformance._base import ConformanceBase, StoreMaker
from telegram_idem.testing.conformance._payloads import ODD_PAYLOADS, ODD_TEXTS

__all__ = ["LedgerContract"]

KEY = "idem:7:a:pay:42:s:charge"


class LedgerContract(ConformanceBase):
    """The ledger of ``store.ledger()`` (see the module docstring)."""

    @pytest.fixture
    def ledger(self, store: Store) -> Ledger:
        """The ledger of ``store`` (through :func:`~telegram_idem.backends.ledger_of`)."""
        return ledger_of(store)

    @pytest.mark.asyncio
    async def test_start_writes_one_started_row_and_then_answers_it(
        self, ledger: Ledger, clock: ManualClock
    ) -> None:
        assert await ledger.get(KEY) is None
        assert await ledger.start(KEY, token=3, holder="host-a:1") is None
        row = await ledger.get(KEY)
        assert row is not None
        assert (row.key, row.state, row.token, row.holder, row.attempts) == (
            KEY,
            LedgerState.STARTED,
            3,
            "host-a:1",
            1,
        )
        assert (row.detail, row.result, row.not_applied) == ("", None, False)
        clock.advance(5)
        again = await ledger.start(KEY, token=4, holder="host-b:2")
        assert again == row  # answered unchanged: the second holder must not run it
        assert await ledger.get(KEY) == row

    @pytest.mark.asyncio
    async def test_mark_unknown_takes_the_finders_token_and_counts_attempts(
        self, ledger: Ledger, clock: ManualClock
    ) -> None:
        assert await ledger.mark_unknown(KEY, token=9, detail="x") is None  # no row
        await ledger.start(KEY, token=3, holder="h:1")
        started = await ledger.get(KEY)
        assert started is not None
        clock.advance(60)
        row = await ledger.mark_unknown(KEY, token=4, detail="found by h:2")
        assert row is not None and row.state is LedgerState.UNKNOWN
        assert (row.token, row.attempts, row.detail) == (4, 2, "found by h:2")
        assert (row.started_at, row.holder) == (started.started_at, "h:1")
        assert row.updated_at >= started.updated_at + 59
        again = await ledger.mark_unknown(KEY, token=5, detail="again")
        assert again is not None and (again.token, again.attempts) == (5, 3)
        stale = await ledger.mark_unknown(KEY, token=4, detail="late holder")
        assert stale == again  # an older token changes nothing
        assert await ledger.get(KEY) == again

    @pytest.mark.asyncio
    async def test_settle_once_with_a_result_and_a_resolution_stands(self, ledger: Ledger) -> None:
        assert not await ledger.settle(KEY, token=1, result=b"r", not_applied=False)  # no row
        await ledger.start(KEY, token=1, holder="h:1")
        await ledger.mark_unknown(KEY, token=2, detail="lost")
        assert await ledger.settle(KEY, token=3, result=b'{"ok":1}', not_applied=False)
        row = await ledger.get(KEY)
        assert row is not None and row.state is LedgerState.SETTLED
        assert (row.token, row.result, row.not_applied, row.attempts) == (3, b'{"ok":1}', False, 2)
        assert not await ledger.settle(KEY, token=4, result=None, not_applied=True)
        assert await ledger.mark_unknown(KEY, token=9, detail="late") == row
        assert await ledger.start(KEY, token=9, holder="h:9") == row
        assert await ledger.get(KEY) == row

    @pytest.mark.asyncio
    async def test_settle_not_applied_from_started(self, ledger: Ledger) -> None:
        await ledger.start(KEY, token=1, holder="h:1")
        assert await ledger.settle(KEY, token=2, result=None, not_applied=True)
        row = await ledger.get(KEY)
        assert row is not None and row.state is LedgerState.SETTLED
        assert (row.result, row.not_applied, row.token) == (None, True, 2)

    @pytest.mark.asyncio
    async def test_settle_needs_exactly_one_resolution(self, ledger: Ledger) -> None:
        await ledger.start(KEY, token=1, holder="h:1")
        with pytest.raises(ValueError):
            await ledger.settle(KEY, token=2, result=None, not_applied=False)
        with pytest.raises(ValueError):
            await ledger.settle(KEY, token=2, result=b"x", not_applied=True)
        row = await ledger.get(KEY)
        assert row is not None and row.state is LedgerState.STARTED

    @pytest.mark.asyncio
    async def test_finish_is_fenced_by_the_rows_token(self, ledger: Ledger) -> None:
        assert not await ledger.finish(KEY, token=1)
        await ledger.start(KEY, token=1, holder="h:1")
        await ledger.mark_unknown(KEY, token=2, detail="found")
        assert not await ledger.finish(KEY, token=1)  # the late holder
        assert await ledger.get(KEY) is not None
        await ledger.settle(KEY, token=3, result=b"1", not_applied=False)
        assert not await ledger.finish(KEY, token=2)
        assert await ledger.finish(KEY, token=3)
        assert await ledger.get(KEY) is None
        assert not await ledger.finish(KEY, token=3)
        assert await ledger.start(KEY, token=4, holder="h:4") is None  # a new row

    @pytest.mark.asyncio
    async def test_entries_oldest_first_by_state_and_prefix(
        self, ledger: Ledger, clock: ManualClock
    ) -> None:
        keys = ["idem:7:a:b%_:s:3", "idem:7:a:b%_:s:1", "idem:7:a:bz:s:2", "other:1"]
        for n, key in enumerate(keys):
            await ledger.start(key, token=n + 1, holder="h")
            clock.advance(1)
        await ledger.mark_unknown(keys[1], token=10, detail="d")
        await ledger.settle(keys[2], token=11, result=None, not_applied=True)
        listed = await ledger.entries()
        assert [e.key for e in listed] == [keys[0], keys[1], keys[3]]
        unknown = await ledger.entries(states=[LedgerState.UNKNOWN])
        assert [e.key for e in unknown] == [keys[1]]
        every = list(LedgerState)
        assert [e.key for e in await ledger.entries(states=every)] == keys
        assert [e.key for e in await ledger.entries(states=every, prefix="idem:7:a:b%_")] == [
            keys[0],
            keys[1],
        ]  # % and _ are characters, not patterns
        assert [e.key for e in await ledger.entries(states=every, limit=2)] == keys[:2]
        assert await ledger.entries(states=every, prefix="nothing") == []
        with pytest.raises(ValueError):
            await ledger.entries(limit=0)

    @pytest.mark.asyncio
    async def test_rows_never_expire(self, ledger: Ledger, clock: ManualClock) -> None:
        await ledger.start(KEY, token=1, holder="h:1")
        clock.advance(400 * 24 * 3600)
        row = await ledger.get(KEY)
        assert row is not None and row.state is LedgerState.STARTED
        assert [e.key for e in await ledger.entries()] == [KEY]

    @pytest.mark.asyncio
    async def test_odd_keys_holders_and_result_bytes_are_kept_exactly(self, ledger: Ledger) -> None:
        for n, text in enumerate(ODD_TEXTS):
            key = f"idem:7:a:{text}"
            assert await ledger.start(key, token=1, holder=text) is None
            payload = ODD_PAYLOADS[n % len(ODD_PAYLOADS)]
            assert await ledger.settle(key, token=2, result=payload, not_applied=False)
            row = await ledger.get(key)
            assert row is not None
            assert (row.key, row.holder, row.result) == (
                bounded_key(key),
                storable_text(text),
                payload,
            )
            if storable_text(text) == text:
                assert row.holder == text  # kept exactly when it can be
            unknown = await ledger.mark_unknown(key, token=3, detail=text)
            assert unknown is not None  # settled: unchanged
            assert unknown.detail == ""
        await ledger.start("idem:7:a:detail", token=1, holder="h")
        for text in ODD_TEXTS:
            row = await ledger.mark_unknown("idem:7:a:detail", token=2, detail=text)
            assert row is not None and row.detail == storable_text(text)
        huge = "idem:7:a:" + "k" * 5000
        assert await ledger.start(huge, token=1, holder="h") is None
        assert await ledger.start(huge, token=2, holder="h") is not None
        assert await ledger.finish(huge, token=1)

    @pytest.mark.asyncio
    async def test_many_racing_starts_write_one_row(
        self, store: Store, store_factory: StoreMaker
    ) -> None:
        stores = [store] + ([await store_factory() for _ in range(3)] if self.shares_state else [])
        ledgers = [ledger_of(s) for s in stores]
        answers = await asyncio.gather(
            *(ledgers[n % len(ledgers)].start(KEY, token=n + 1, holder=f"h:{n}") for n in range(24))
        )
        assert sum(a is None for a in answers) == 1
        winner = next(n for n, a in enumerate(answers) if a is None)
        row = await ledgers[-1].get(KEY)
        assert row is not None and (row.token, row.holder) == (winner + 1, f"h:{winner}")
        assert all(a == row for a in answers if a is not None)

    @pytest.mark.asyncio
    async def test_store_objects_of_one_url_share_the_ledger(
        self, store: Store, store_factory: StoreMaker
    ) -> None:
        other = ledger_of(await store_factory())
        await ledger_of(store).start(KEY, token=1, holder="h:1")
        if not self.shares_state:  # each object keeps its own, as the class declares
            assert await other.get(KEY) is None
            return
        row = await other.get(KEY)
        assert row is not None and row.holder == "h:1"
        assert await other.finish(KEY, token=1)
        assert await ledger_of(store).get(KEY) is None
