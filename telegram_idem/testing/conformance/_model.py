"""A reference model of the record state machine, and a store compared with it.

Hypothesis drives the store and the model with the same random operations and clock
moves, and compares every answer. The model (:class:`ClaimTable`) is written from the
claim table of ``docs/design/record.md``, over a dict of plain dicts. It imports nothing
of the library's logic (not :mod:`telegram_idem.machine`, which the memory and SQLite
stores run): a model that shared their code would share their bugs. A store that
disagrees with it on any outcome, token, status, fingerprint, result, attempt count or
time is wrong (or the model is: either way, a bug to look at). A store may purge a record
once its retention has passed, so a claim of an expired key may start the fencing token
again at 1; the model accepts that and follows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from telegram_idem._clock import Clock, ManualClock
from telegram_idem._records import Outcome, Record, Status
from telegram_idem.backends import Store
from telegram_idem.testing.conformance._base import ConformanceBase, UrlFactory

__all__ = ["ClaimTable", "ModelContract", "StoreVersusModel"]

KEYS = st.sampled_from(["idem:1:a:k1", "idem:1:a:k2", "idem:1:u:3"])
FINGERPRINTS = st.sampled_from([None, "fp-a", "fp-b"])
LEASES = st.sampled_from([1.0, 5.0, 30.0])
RETENTIONS = st.sampled_from([30.0, 100.0])
RESULTS = st.sampled_from([b"null", b"0", b'""', b"false", b"{}", b'{"ok":1}'])
STEPS = st.sampled_from([0.5, 1.0, 4.0, 5.0, 29.5, 31.0, 101.0])


class ClaimTable:
    """The record and its state machine (``docs/design/record.md``) over a dict.

    A record: ``status`` (``in_progress`` | ``completed`` | ``failed``), ``token`` (+1 at
    every new claim, takeovers included), ``lease`` and ``expires`` (seconds since the
    epoch), ``fp`` (fingerprint; ``None`` on either side matches anything), ``result``,
    ``attempts``. Only a holder of the current token of a live, in-progress record may
    complete, fail, release or extend it.
    """

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def live(self, key: str, now: float) -> dict[str, Any] | None:
        """The record of ``key`` if its retention has not ended at ``now``, else ``None``.

        Args:
            key: the record's key.
            now: the model's clock, seconds since the epoch.
        """
        row = self.rows.get(key)
        return row if row is not None and row["expires"] > now else None

    def forget(self, key: str) -> None:
        """The store purged the expired record: its token sequence starts again.

        Args:
            key: the record's key.
        """
        self.rows.pop(key, None)

    def claim(
        self, key: str, fp: str | None, now: float, lease: float, retention: float
    ) -> tuple[str, dict[str, Any]]:
        """Claim ``key``: ``(outcome, the record after it)``, the outcome one of
        ``acquired``, ``replay``, ``failed``, ``in_progress``, ``conflict``.

        Args:
            key: the record's key.
            fp: the claimant's fingerprint, or ``None`` (matches any).
            now: the model's clock, seconds since the epoch.
            lease: seconds the acquired lease lasts.
            retention: seconds the record is kept.
        """
        row = self.rows.get(key)
        if row is None or row["expires"] <= now:  # no record, or retention over
            token = row["token"] + 1 if row is not None else 1
            new = dict(
                status="in_progress",
                token=token,
                lease=now + lease,
                expires=now + retention,
                fp=fp,
                result=None,
                attempts=1,
            )
            self.rows[key] = new
            return "acquired", dict(new)
        if fp is not None and row["fp"] is not None and fp != row["fp"]:
            return "conflict", dict(row)
        if row["status"] == "completed":
            return "replay", dict(row)
        if row["status"] == "failed":
            return "failed", dict(row)
        if row["lease"] > now:
            return "in_progress", dict(row)
        row.update(  # takeover of an expired lease: token + 1, one more attempt
            status="in_progress",
            token=row["token"] + 1,
            lease=now + lease,
            expires=max(row["expires"], now + retention),
            fp=fp if fp is not None else row["fp"],
            result=None,
            attempts=row["attempts"] + 1,
        )
        return "acquired", dict(row)

    def _held(self, key: str, token: int, now: float) -> dict[str, Any] | None:
        row = self.live(key, now)
        if row is None or row["status"] != "in_progress" or row["token"] != token:
            return None
        return row

    def complete(self, key: str, token: int, result: bytes, now: float, retention: float) -> bool:
        """Store ``result`` and mark the record completed, if ``token`` holds it.

        Args:
            key: the record's key.
            token: the holder's token.
            result: the result bytes.
            now: the model's clock, seconds since the epoch.
            retention: seconds the completed record is kept, from ``now``.
        """
        row = self._held(key, token, now)
        if row is None:
            return False
        row.update(status="completed", result=result, expires=now + retention)
        return True

    def fail(self, key: str, token: int, error: bytes, now: float, retention: float) -> bool:
        """Store ``error`` and mark the record failed, if ``token`` holds it.

        Args:
            key: the record's key.
            token: the holder's token.
            error: the failure bytes.
            now: the model's clock, seconds since the epoch.
            retention: seconds the failed record is kept, from ``now``.
        """
        row = self._held(key, token, now)
        if row is None:
            return False
        row.update(status="failed", result=error, expires=now + retention)
        return True

    def release(self, key: str, token: int, now: float) -> bool:
        """End the lease (the token stays), if ``token`` holds it.

        Args:
            key: the record's key.
            token: the holder's token.
            now: the model's clock, seconds since the epoch.
        """
        row = self._held(key, token, now)
        if row is None:
            return False
        row.update(lease=now, fp=None)  # the token stays: a zombie never matches again
        return True

    def extend(self, key: str, token: int, now: float, lease: float) -> bool:
        """Move the lease end to ``now + lease``, if ``token`` holds it.

        Args:
            key: the record's key.
            token: the holder's token.
            now: the model's clock, seconds since the epoch.
            lease: seconds from ``now`` the lease ends.
        """
        row = self._held(key, token, now)
        if row is None:
            return False
        row.update(lease=now + lease, expires=max(row["expires"], now + lease))
        return True


STATUSES = {
    "in_progress": Status.IN_PROGRESS,
    "completed": Status.COMPLETED,
    "failed": Status.FAILED,
}
OUTCOMES = {
    "acquired": Outcome.ACQUIRED,
    "replay": Outcome.REPLAY,
    "conflict": Outcome.CONFLICT,
    "failed": Outcome.FAILED,
    "in_progress": Outcome.IN_PROGRESS,
}


def _same(store_record: Record | None, key: str, model: dict[str, Any] | None) -> None:
    if model is None:
        assert store_record is None
        return
    assert store_record is not None
    assert (store_record.key, store_record.status, store_record.fencing_token) == (
        key,
        STATUSES[model["status"]],
        model["token"],
    )
    assert (store_record.fingerprint, store_record.result, store_record.attempts) == (
        model["fp"],
        model["result"],
        model["attempts"],
    )
    assert store_record.lease_expires_at == pytest.approx(model["lease"], abs=1e-3)
    assert store_record.expires_at == pytest.approx(model["expires"], abs=1e-3)


class StoreVersusModel(RuleBasedStateMachine):
    """One example: a fresh store, a fresh model, the same operations on both."""

    url_factory: UrlFactory
    open_store: Callable[[str, Clock | None], Store]

    @initialize()
    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self.store: Store = self.open_store(self.url_factory(), self.clock)
        self.model = ClaimTable()
        self.tokens: dict[str, int] = {}

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.loop.run_until_complete(self.store.close())
            self.loop.close()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    @rule(key=KEYS, fp=FINGERPRINTS, lease=LEASES, retention=RETENTIONS)
    def claim(self, key: str, fp: str | None, lease: float, retention: float) -> None:
        now = self.clock()
        got = self.run(self.store.claim(key, fingerprint=fp, lease=lease, retention=retention))
        if self.model.live(key, now) is None and got.token == 1:
            self.model.forget(key)  # the store purged the expired record: tokens start again
        outcome, row = self.model.claim(key, fp, now, lease, retention)
        assert got.outcome is OUTCOMES[outcome]
        _same(got.record, key, row)
        self.tokens[key] = got.token

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), result=RESULTS, retention=RETENTIONS, stale=st.booleans())
    def complete(self, data: st.DataObject, result: bytes, retention: float, stale: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.tokens)))
        token = self.tokens[key] - (1 if stale else 0)
        expected = self.model.complete(key, token, result, self.clock(), retention)
        assert self.run(self.store.complete(key, token, result, retention=retention)) is expected

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), retention=RETENTIONS)
    def fail(self, data: st.DataObject, retention: float) -> None:
        key = data.draw(st.sampled_from(sorted(self.tokens)))
        token = self.tokens[key]
        expected = self.model.fail(key, token, b'{"type":"E"}', self.clock(), retention)
        got = self.run(self.store.fail(key, token, b'{"type":"E"}', retention=retention))
        assert got is expected

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), stale=st.booleans())
    def release(self, data: st.DataObject, stale: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.tokens)))
        token = self.tokens[key] - (1 if stale else 0)
        expected = self.model.release(key, token, self.clock())
        assert self.run(self.store.release(key, token)) is expected

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), lease=LEASES)
    def extend(self, data: st.DataObject, lease: float) -> None:
        key = data.draw(st.sampled_from(sorted(self.tokens)))
        token = self.tokens[key]
        expected = self.model.extend(key, token, self.clock(), lease)
        assert self.run(self.store.extend(key, token, lease=lease)) is expected

    @rule(seconds=STEPS)
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def records_agree(self) -> None:
        if not hasattr(self, "store"):
            return
        for key in ("idem:1:a:k1", "idem:1:a:k2", "idem:1:u:3"):
            _same(self.run(self.store.get(key)), key, self.model.live(key, self.clock()))


class ModelContract(ConformanceBase):
    """The store agrees with :class:`ClaimTable` on random sequences of claims,
    completions, failures, releases, extensions and clock moves (``model_examples`` of
    them, 25 steps each)."""

    def test_store_agrees_with_the_reference_model(self, store_url_factory: UrlFactory) -> None:
        conformance = self

        class Machine(StoreVersusModel):
            url_factory = staticmethod(store_url_factory)

            def open_store(self, url: str, clock: Clock | None) -> Store:
                return conformance.open_store(url, clock)

        Machine.TestCase.settings = settings(
            max_examples=self.model_examples,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        Machine.TestCase().runTest()
