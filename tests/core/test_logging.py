"""One structured log record per guard decision (logger ``telegram_idem.decisions``)."""

from __future__ import annotations

import logging

import pytest

from telegram_idem import ConflictError, Idem, LockHeldError, ManualClock, Store, bind_update
from telegram_idem.testing._delivery import load_fixture

BOT = 7000000001
FIELDS = (
    "key",
    "update_id",
    "chat_id",
    "user_id",
    "handler",
    "decision",
    "fencing_token",
    "elapsed_ms",
)


@pytest.fixture
def idem(store: Store, clock: ManualClock) -> Idem:
    return Idem(store, clock=clock, heartbeat=False)


def decisions(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "telegram_idem.decisions"]


def fields(record: logging.LogRecord) -> dict[str, object]:
    return {f: getattr(record, f) for f in FIELDS}


async def test_update_guard_logs_each_decision(
    idem: Idem, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="telegram_idem.decisions")
    update = load_fixture("callback_delete")

    async def call() -> None:
        return None

    await (await idem.admit(update, bot_id=BOT)).run(call)
    await idem.admit(update, bot_id=BOT)  # a duplicate
    records = decisions(caplog)
    assert len(records) == 2
    first, second = (fields(r) for r in records)
    key = idem.keys.update(BOT, 734519010)
    assert first == {
        "key": key,
        "update_id": 734519010,
        "chat_id": 5550001001,
        "user_id": 5550001001,
        "handler": None,
        "decision": "acquired",
        "fencing_token": 1,
        "elapsed_ms": first["elapsed_ms"],
    }
    assert second["decision"] == "replay"
    assert second["key"] == key
    for r in records:
        assert isinstance(r.elapsed_ms, float) and r.elapsed_ms >= 0  # type: ignore[attr-defined]
        assert r.boundary == "update"  # type: ignore[attr-defined]
        assert r.levelno == logging.INFO


async def test_action_decisions_carry_the_bound_update(
    idem: Idem, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="telegram_idem.decisions")
    update = load_fixture("group_command_with_botname")
    key = idem.keys.action(BOT, "draft:88")

    async def draft() -> str:
        return "draft"

    with bind_update(update, bot_id=BOT, idem=idem):
        await idem.run(key, draft, handler="draft_handler", fingerprint="a")
        await idem.run(key, draft, handler="draft_handler", fingerprint="a")
        with pytest.raises(ConflictError):
            await idem.run(key, draft, handler="draft_handler", fingerprint="b")
    records = decisions(caplog)
    assert [r.decision for r in records] == ["acquired", "replay", "conflict"]  # type: ignore[attr-defined]
    for r in records:
        f = fields(r)
        assert f["key"] == key
        assert (f["update_id"], f["chat_id"], f["user_id"]) == (
            734519020,
            -1001234567890,
            5550002002,
        )
        assert f["handler"] == "draft_handler"
        assert f["fencing_token"] == 1
        assert r.boundary == "action"  # type: ignore[attr-defined]
    assert [r.levelno for r in records] == [logging.INFO, logging.INFO, logging.WARNING]


async def test_unbound_action_logs_null_update_fields(
    idem: Idem, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="telegram_idem.decisions")

    async def work() -> int:
        return 1

    await idem.run("idem:1:a:job", work)
    (record,) = decisions(caplog)
    f = fields(record)
    assert (f["update_id"], f["chat_id"], f["user_id"]) == (None, None, None)
    assert f["decision"] == "acquired" and f["key"] == "idem:1:a:job"


async def test_steps_and_locks_log_their_decisions(
    idem: Idem, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="telegram_idem.decisions")
    update = load_fixture("techpost_no_title")

    async def title() -> str:
        return "t"

    async def action() -> str:
        return await idem.step("title", title)

    with bind_update(update, bot_id=BOT, idem=idem):
        async with idem.chat_lock():
            with pytest.raises(LockHeldError):
                async with idem.chat_lock():
                    pass
            await idem.run(idem.keys.action(BOT, "techpost:4122"), action)
    records = decisions(caplog)
    got = [(r.boundary, r.decision) for r in records]  # type: ignore[attr-defined]
    assert got == [
        ("lock", "acquired"),
        ("lock", "held"),
        ("action", "acquired"),
        ("step", "acquired"),
    ]
    step = records[-1]
    assert step.handler == "title"  # type: ignore[attr-defined]
    assert step.key == idem.keys.action(BOT, "techpost:4122") + ":s:title"  # type: ignore[attr-defined]
    for r in records:
        assert r.update_id == 734519002  # type: ignore[attr-defined]
        assert r.chat_id == 5550001001  # type: ignore[attr-defined]
        for name in FIELDS:
            assert hasattr(r, name), name


async def test_nothing_is_logged_when_the_logger_is_off(
    idem: Idem, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="telegram_idem.decisions")

    async def work() -> int:
        return 1

    await idem.run("idem:1:a:job", work)
    await idem.run("idem:1:a:job", work)
    assert decisions(caplog) == []
