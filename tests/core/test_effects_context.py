"""The effect context: a stable idempotency key (the same for every attempt and every
worker) and the current fencing token, given to a step (``context=True``) and read with
``effect_context()``."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from telegram_idem import (
    AmbiguousEffectError,
    ConfigurationError,
    EffectContext,
    Idem,
    LostClaimError,
    ManualClock,
    NotAppliedError,
    Store,
    UnknownOutcomeError,
    effect_context,
    store_from_url,
)
from telegram_idem._context import idempotency_key_of

KEY = "idem:7000000001:a:buy:charge-1"
LEASE = 30.0
PROVIDER_KEY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@pytest.fixture(params=["memory", "sqlite"])
async def store(
    request: pytest.FixtureRequest, clock: ManualClock, tmp_path: Path
) -> AsyncIterator[Store]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'idem.db'}"
    made = store_from_url(url, clock=clock)
    yield made
    await made.close()


@pytest.fixture
def idem(store: Store, clock: ManualClock) -> Idem:
    return Idem(store, clock=clock, heartbeat=False, lease=LEASE)


class Provider:
    """A payment provider that honours an ``Idempotency-Key`` (as Stripe's API does): a
    repeated key returns the first charge instead of charging again."""

    def __init__(self) -> None:
        self.charges: dict[str, int] = {}
        self.lose_answer = 0

    async def charge(self, amount: int, *, idempotency_key: str) -> str:
        assert PROVIDER_KEY.match(idempotency_key)
        self.charges.setdefault(idempotency_key, amount)
        if self.lose_answer:
            self.lose_answer -= 1
            raise AmbiguousEffectError("timed out after the request was sent")
        return f"ch_{idempotency_key[:8]}"


async def test_a_step_gets_its_context(idem: Idem) -> None:
    seen: list[EffectContext] = []

    async def charge(ctx: EffectContext, amount: int, *, currency: str) -> str:
        seen.append(ctx)
        assert effect_context() is ctx
        return f"{amount} {currency}"

    async def action() -> str:
        return await idem.step("charge", charge, 50, currency="XTR", context=True, once="at_most")

    assert await idem.run(KEY, action) == "50 XTR"
    [ctx] = seen
    step_key = idem.keys.step(KEY, "charge")
    record = await idem.store.get(step_key)
    assert record is not None
    assert ctx.key == step_key
    assert ctx.name == "charge"
    assert ctx.once == "at_most"
    assert ctx.attempt == 1
    assert ctx.fencing_token == record.fencing_token
    assert PROVIDER_KEY.match(ctx.idempotency_key) and len(ctx.idempotency_key) <= 64
    assert ctx.idempotency_key == idempotency_key_of(step_key)


async def test_the_idempotency_key_is_stable_across_attempts(idem: Idem) -> None:
    seen: list[EffectContext] = []

    async def charge(ctx: EffectContext) -> str:
        seen.append(ctx)
        if len(seen) == 1:
            raise NotAppliedError("provider unavailable")
        return "charged"

    async def action() -> str:
        return await idem.step("charge", charge, context=True)

    with pytest.raises(NotAppliedError):
        await idem.run(KEY, action)
    assert await idem.run(KEY, action) == "charged"
    first, second = seen
    assert first.idempotency_key == second.idempotency_key
    assert (first.attempt, second.attempt) == (1, 2)
    assert second.fencing_token > first.fencing_token


async def test_a_provider_keyed_by_it_charges_once_across_retries(idem: Idem) -> None:
    provider = Provider()
    provider.lose_answer = 1  # the first answer is lost: at least once runs it again

    async def charge(ctx: EffectContext) -> str:
        return await provider.charge(50, idempotency_key=ctx.idempotency_key)

    async def action() -> str:
        return await idem.step("charge", charge, context=True)

    with pytest.raises(AmbiguousEffectError):
        await idem.run(KEY, action)
    charge_id = await idem.run(KEY, action)
    assert charge_id.startswith("ch_")
    assert len(provider.charges) == 1  # one charge, whatever the retries


async def test_the_same_key_on_another_worker(tmp_path: Path, clock: ManualClock) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    seen: list[EffectContext] = []

    async def charge(ctx: EffectContext) -> str:
        seen.append(ctx)
        if len(seen) == 1:
            raise NotAppliedError("worker a gives up")
        return "charged"

    a = Idem(url, clock=clock, heartbeat=False, holder="a")
    b = Idem(url, clock=clock, heartbeat=False, holder="b")
    try:
        for worker in (a, b):

            async def action(worker: Idem = worker) -> str:
                return await worker.step("charge", charge, context=True)

            try:
                await worker.run(KEY, action)
            except NotAppliedError:
                pass
    finally:
        await a.close()
        await b.close()
    first, second = seen
    assert first.idempotency_key == second.idempotency_key
    assert second.fencing_token > first.fencing_token


async def test_a_takeover_gets_a_new_fencing_token(idem: Idem, clock: ManualClock) -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    tokens: list[int] = []

    async def work() -> str:
        tokens.append(effect_context().fencing_token)
        if len(tokens) == 1:
            started.set()
            await release.wait()
        return "done"

    slow = asyncio.create_task(idem.run(KEY, work))
    await started.wait()
    clock.advance(LEASE + 1)
    assert await idem.run(KEY, work) == "done"
    release.set()
    with pytest.raises(LostClaimError):
        await slow
    assert tokens[1] > tokens[0]


async def test_effect_context_is_the_innermost(idem: Idem) -> None:
    names: list[str] = []

    async def inner() -> None:
        names.append(effect_context().name)

    async def action() -> None:
        names.append(effect_context().name)
        await idem.step("grant", inner)
        names.append(effect_context().name)

    await idem.run(KEY, action, handler="buy")
    assert names == ["buy", "grant", "buy"]
    with pytest.raises(ConfigurationError, match="effect_context"):
        effect_context()


async def test_an_action_context_names_its_key_when_it_has_no_handler(idem: Idem) -> None:
    async def action() -> EffectContext:
        return effect_context()

    seen: list[EffectContext] = []

    async def record() -> str:
        seen.append(await action())
        return "ok"

    await idem.run(KEY, record, once="at_most")
    [ctx] = seen
    assert ctx.name == KEY and ctx.key == KEY and ctx.once == "at_most"


async def test_an_unknown_step_keeps_its_key_for_the_operator(
    idem: Idem, clock: ManualClock
) -> None:
    async def charge(ctx: EffectContext) -> str:
        raise AmbiguousEffectError(f"lost answer for {ctx.idempotency_key}")

    async def action() -> str:
        return await idem.step("charge", charge, context=True, once="at_most")

    with pytest.raises(UnknownOutcomeError) as caught:
        await idem.run(KEY, action)
    step_key = idem.keys.step(KEY, "charge")
    assert caught.value.key == step_key
    assert idempotency_key_of(step_key) in str(caught.value)
