"""Hypothesis drives each store and a reference model with the same random operations and
clock moves, and compares every answer.

The model is :mod:`telegram_idem.machine` over a dict — the table of design.md §3 as pure
functions. A store that disagrees with it on any outcome, token, status, fingerprint,
result, attempt count or time is wrong (or the model is: either way, a bug to look at).
A store may purge a record once its retention has passed, so a claim of an expired key
may start the fencing token again at 1; the model accepts that and follows.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from services import UrlFactory

from telegram_idem import machine
from telegram_idem.backends import store_from_url
from telegram_idem.backends.base import Store
from telegram_idem.clock import ManualClock
from telegram_idem.records import Record

KEYS = st.sampled_from(["idem:1:a:k1", "idem:1:a:k2", "idem:1:u:3"])
FINGERPRINTS = st.sampled_from([None, "fp-a", "fp-b"])
LEASES = st.sampled_from([1.0, 5.0, 30.0])
RETENTIONS = st.sampled_from([30.0, 100.0])
RESULTS = st.sampled_from([b"null", b"0", b'""', b"false", b"{}", b'{"ok":1}'])
STEPS = st.sampled_from([0.5, 1.0, 4.0, 5.0, 29.5, 31.0, 101.0])


def _same(store_record: Record | None, model: Record | None) -> None:
    if model is None:
        assert store_record is None
        return
    assert store_record is not None
    assert (store_record.key, store_record.status, store_record.fencing_token) == (
        model.key,
        model.status,
        model.fencing_token,
    )
    assert (store_record.fingerprint, store_record.result, store_record.attempts) == (
        model.fingerprint,
        model.result,
        model.attempts,
    )
    assert store_record.lease_expires_at == pytest.approx(model.lease_expires_at, abs=1e-3)
    assert store_record.expires_at == pytest.approx(model.expires_at, abs=1e-3)


class StoreVersusModel(RuleBasedStateMachine):
    """One example: a fresh store, a fresh model, the same operations on both."""

    url_factory: UrlFactory

    @initialize()
    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self.store: Store = store_from_url(self.url_factory(), clock=self.clock)
        self.model: dict[str, Record] = {}
        self.tokens: dict[str, int] = {}

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.loop.run_until_complete(self.store.close())
            self.loop.close()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def _model_update(self, key: str, new: Record | None) -> bool:
        if new is None:
            return False
        self.model[key] = new
        return True

    @rule(key=KEYS, fp=FINGERPRINTS, lease=LEASES, retention=RETENTIONS)
    def claim(self, key: str, fp: str | None, lease: float, retention: float) -> None:
        existing = self.model.get(key)
        got = self.run(self.store.claim(key, fingerprint=fp, lease=lease, retention=retention))
        if not machine.is_live(existing, self.clock()) and got.token == 1:
            existing = None  # the store purged the expired record: tokens start again
        expected, new = machine.decide_claim(
            existing, key=key, fingerprint=fp, now=self.clock(), lease=lease, retention=retention
        )
        self._model_update(key, new)
        assert got.outcome is expected.outcome
        _same(got.record, expected.record)
        self.tokens[key] = got.token

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), result=RESULTS, retention=RETENTIONS, stale=st.booleans())
    def complete(self, data: st.DataObject, result: bytes, retention: float, stale: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.tokens)))
        token = self.tokens[key] - (1 if stale else 0)
        new = machine.do_complete(
            self.model.get(key), token=token, result=result, now=self.clock(), retention=retention
        )
        assert self.run(self.store.complete(key, token, result, retention=retention)) is (
            self._model_update(key, new)
        )

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), retention=RETENTIONS)
    def fail(self, data: st.DataObject, retention: float) -> None:
        key = data.draw(st.sampled_from(sorted(self.tokens)))
        token = self.tokens[key]
        new = machine.do_fail(
            self.model.get(key),
            token=token,
            error=b'{"type":"E"}',
            now=self.clock(),
            retention=retention,
        )
        got = self.run(self.store.fail(key, token, b'{"type":"E"}', retention=retention))
        assert got is self._model_update(key, new)

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), stale=st.booleans())
    def release(self, data: st.DataObject, stale: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.tokens)))
        token = self.tokens[key] - (1 if stale else 0)
        new = machine.do_release(self.model.get(key), token=token, now=self.clock())
        assert self.run(self.store.release(key, token)) is self._model_update(key, new)

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), lease=LEASES)
    def extend(self, data: st.DataObject, lease: float) -> None:
        key = data.draw(st.sampled_from(sorted(self.tokens)))
        token = self.tokens[key]
        new = machine.do_extend(self.model.get(key), token=token, now=self.clock(), lease=lease)
        assert self.run(self.store.extend(key, token, lease=lease)) is self._model_update(key, new)

    @rule(seconds=STEPS)
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def records_agree(self) -> None:
        if not hasattr(self, "store"):
            return
        for key in ("idem:1:a:k1", "idem:1:a:k2", "idem:1:u:3"):
            model = self.model.get(key)
            live = model if machine.is_live(model, self.clock()) else None
            _same(self.run(self.store.get(key)), live)


SLOW_STORES = {"dynamodb": 12}
"""Examples per run for stores whose every request is an HTTP round trip to moto."""


def test_store_agrees_with_the_reference_model(
    store_url_factory: UrlFactory, store_name: str
) -> None:
    class Machine(StoreVersusModel):
        url_factory = staticmethod(store_url_factory)  # type: ignore[assignment]

    Machine.TestCase.settings = settings(
        max_examples=SLOW_STORES.get(store_name, 40),
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    Machine.TestCase().runTest()
