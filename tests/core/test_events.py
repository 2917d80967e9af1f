"""Decision events: every guard decision reaches every subscribed hook, from one place;
the ``telegram_idem.decisions`` log record is the default subscriber; a hook that raises
never breaks a decision."""

from __future__ import annotations

import logging

import pytest

from telegram_idem import (
    ConflictError,
    DecisionEvent,
    Idem,
    ManualClock,
    Store,
    bind_update,
    subscribe,
)
from telegram_idem.events import emit, listening
from telegram_idem.testing._delivery import load_fixture

BOT = 7000000001


@pytest.fixture
def idem(store: Store, clock: ManualClock) -> Idem:
    return Idem(store, clock=clock, heartbeat=False)


async def test_a_hook_sees_every_decision_with_its_fields(idem: Idem) -> None:
    seen: list[DecisionEvent] = []
    update = load_fixture("group_command_with_botname")
    key = idem.keys.action(BOT, "draft:88")

    async def draft() -> str:
        return "draft"

    with subscribe(seen.append):
        admitted = await idem.admit(update, bot_id=BOT)

        async def handle() -> None:
            await idem.run(key, draft, handler="draft_handler", fingerprint="a")
            with pytest.raises(ConflictError):
                await idem.run(key, draft, handler="draft_handler", fingerprint="b")
            async with idem.chat_lock():
                pass

        await admitted.run(handle)
    got = [(e.boundary, e.decision) for e in seen]
    assert got == [
        ("update", "acquired"),
        ("action", "acquired"),
        ("action", "conflict"),
        ("lock", "acquired"),
    ]
    first, action = seen[0], seen[1]
    assert first == DecisionEvent(
        boundary="update",
        decision="acquired",
        key=idem.keys.update(BOT, 734519020),
        update_id=734519020,
        chat_id=-1001234567890,
        user_id=5550002002,
        handler=None,
        fencing_token=1,
        elapsed_ms=first.elapsed_ms,
        bot_id=BOT,
    )
    assert first.elapsed_ms >= 0
    assert (action.key, action.handler, action.bot_id, action.update_id) == (
        key,
        "draft_handler",
        BOT,
        734519020,
    )
    assert [e.level for e in seen] == [logging.INFO, logging.INFO, logging.WARNING, logging.INFO]


async def test_unsubscribing_stops_the_events(idem: Idem) -> None:
    seen: list[DecisionEvent] = []

    async def work() -> int:
        return 1

    unsubscribe = subscribe(seen.append)
    await idem.run("idem:1:a:job", work)
    unsubscribe()
    unsubscribe()  # twice: nothing happens
    await idem.run("idem:1:a:job", work)
    assert [e.decision for e in seen] == ["acquired"]


async def test_hooks_run_in_subscription_order_and_a_raising_one_breaks_nothing(
    idem: Idem, caplog: pytest.LogCaptureFixture
) -> None:
    order: list[str] = []

    def broken(event: DecisionEvent) -> None:
        order.append("broken")
        raise RuntimeError("metrics backend down")

    def after(event: DecisionEvent) -> None:
        order.append(f"after:{event.decision}")

    async def work() -> str:
        return "result"

    caplog.set_level(logging.INFO)
    with subscribe(broken), subscribe(after):
        assert await idem.run("idem:1:a:job", work) == "result"  # the decision stands
        assert await idem.run("idem:1:a:job", work) == "result"  # replayed
    assert order == ["broken", "after:acquired", "broken", "after:replay"]
    failures = [r for r in caplog.records if r.name == "telegram_idem.events"]
    assert len(failures) == 1  # logged once, not per event
    assert failures[0].levelno == logging.ERROR and failures[0].exc_info is not None
    # the default subscriber still wrote each record
    records = [r for r in caplog.records if r.name == "telegram_idem.decisions"]
    assert [r.decision for r in records] == ["acquired", "replay"]  # type: ignore[attr-defined]


async def test_a_hook_subscribed_again_after_failing_is_reported_again(
    idem: Idem, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(event: DecisionEvent) -> None:
        raise RuntimeError("down")

    async def work() -> int:
        return 1

    caplog.set_level(logging.ERROR, logger="telegram_idem.events")
    for _ in range(2):
        with subscribe(broken):
            await idem.run("idem:1:a:job", work)
    assert len([r for r in caplog.records if r.name == "telegram_idem.events"]) == 2


async def test_the_log_record_is_written_without_any_hook(
    idem: Idem, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="telegram_idem.decisions")
    with bind_update(load_fixture("techpost_command"), bot_id=BOT, idem=idem):

        async def work() -> int:
            return 1

        await idem.run("idem:1:a:job", work, handler="job")
    (record,) = [r for r in caplog.records if r.name == "telegram_idem.decisions"]
    assert (record.boundary, record.decision, record.handler) == ("action", "acquired", "job")  # type: ignore[attr-defined]
    assert record.getMessage() == "action acquired idem:1:a:job"


def test_nobody_listens_when_no_hook_and_the_log_is_off() -> None:
    logger = logging.getLogger("telegram_idem.decisions")
    saved = logger.level
    logger.setLevel(logging.ERROR)
    try:
        assert not listening(logging.INFO)
        with subscribe(lambda event: None):
            assert listening(logging.INFO)
        assert not listening(logging.INFO)
    finally:
        logger.setLevel(saved)


def test_emit_gives_an_event_to_the_hooks_as_it_is() -> None:
    event = DecisionEvent(boundary="lock", decision="held", key="idem:1:l:x")
    seen: list[DecisionEvent] = []
    with subscribe(seen.append):
        emit(event)
    assert seen == [event]
    with pytest.raises(AttributeError):
        event.decision = "acquired"  # type: ignore[misc]  # frozen
