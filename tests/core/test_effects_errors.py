"""Error classes (telegram_idem/_effects.py): what a failure means, decided by markers,
then the run's lists, then the library's and the frameworks' Bot API errors (the real
aiogram and python-telegram-bot exception classes), then ``on_error``; and what each
meaning does to the record under both ``once`` policies."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiogram.exceptions as ag
import pytest
import telegram.error as ptb
from aiogram.methods import SendMessage

from telegram_idem import (
    AmbiguousEffectError,
    ChatParkedError,
    ConfigurationError,
    DeliveryTimeoutError,
    Idem,
    ManualClock,
    NotAppliedError,
    PermanentEffectError,
    SendFailedError,
    Status,
    Store,
    StoredFailureError,
    UnknownOutcomeError,
    store_from_url,
)
from telegram_idem._effects import AT_LEAST, EffectPolicy, Meaning, classify, effect_policy
from telegram_idem.outbox import AmbiguousCall, CallNotSent

KEY = "idem:7000000001:a:send:1"
METHOD = SendMessage(chat_id=1, text="hi")

AT_MOST = EffectPolicy(once="at_most")

NOT_APPLIED, PERMANENT, AMBIGUOUS = Meaning.NOT_APPLIED, Meaning.PERMANENT, Meaning.AMBIGUOUS


def framework_errors() -> list[tuple[BaseException, Meaning]]:
    return [
        (ag.TelegramRetryAfter(method=METHOD, message="flood", retry_after=3), NOT_APPLIED),
        (
            ag.TelegramMigrateToChat(method=METHOD, message="m", migrate_to_chat_id=-100),
            NOT_APPLIED,
        ),
        (ag.TelegramBadRequest(method=METHOD, message="chat not found"), PERMANENT),
        (ag.TelegramForbiddenError(method=METHOD, message="bot was blocked"), PERMANENT),
        (ag.TelegramNotFound(method=METHOD, message="not found"), PERMANENT),
        (ag.TelegramUnauthorizedError(method=METHOD, message="unauthorized"), PERMANENT),
        (ag.TelegramConflictError(method=METHOD, message="conflict"), PERMANENT),
        (ag.TelegramEntityTooLarge(method=METHOD, message="too large"), PERMANENT),
        (ag.TelegramNetworkError(method=METHOD, message="reset"), AMBIGUOUS),
        (ag.TelegramServerError(method=METHOD, message="502"), AMBIGUOUS),
        (ag.RestartingTelegram(method=METHOD, message="restarting"), AMBIGUOUS),
        (ptb.RetryAfter(5), NOT_APPLIED),
        (ptb.ChatMigrated(-100), NOT_APPLIED),
        (ptb.BadRequest("message is not modified"), PERMANENT),
        (ptb.Forbidden("bot was blocked"), PERMANENT),
        (ptb.InvalidToken(), PERMANENT),
        (ptb.Conflict("terminated by other getUpdates"), PERMANENT),
        (ptb.TimedOut(), AMBIGUOUS),
        (ptb.NetworkError("connection reset"), AMBIGUOUS),
    ]


def library_errors() -> list[tuple[BaseException, Meaning]]:
    return [
        (CallNotSent("refused", method="sendMessage"), NOT_APPLIED),
        (DeliveryTimeoutError("waited 5 s", key="k"), NOT_APPLIED),
        (SendFailedError("400", key="k", error_code=400), NOT_APPLIED),
        (ChatParkedError("403", key="k", error_code=403), NOT_APPLIED),
        (AmbiguousCall("no answer", method="sendMessage"), AMBIGUOUS),
        (UnknownOutcomeError("held", key="k"), AMBIGUOUS),
    ]


@pytest.mark.parametrize(("exc", "meaning"), framework_errors() + library_errors())
@pytest.mark.parametrize("policy", [AT_LEAST, AT_MOST], ids=["at_least", "at_most"])
def test_known_errors_have_their_meaning(
    exc: BaseException, meaning: Meaning, policy: EffectPolicy
) -> None:
    assert classify(exc, policy) is meaning


def test_the_frameworks_are_matched_by_name_in_the_mro() -> None:
    class MyBadRequest(ag.TelegramBadRequest):
        pass

    assert classify(MyBadRequest(method=METHOD, message="x"), AT_MOST) is PERMANENT
    # PTB's BadRequest is a NetworkError: the nearest class decides.
    assert ptb.NetworkError in type(ptb.BadRequest("x")).__mro__
    assert classify(ptb.BadRequest("x"), AT_MOST) is PERMANENT

    class TelegramBadRequest(Exception):  # same name, another module: not aiogram's
        pass

    assert classify(TelegramBadRequest(), AT_LEAST) is NOT_APPLIED


def test_markers_win_over_lists_and_lists_over_known_errors() -> None:
    policy = effect_policy(permanent=(NotAppliedError, TimeoutError), not_applied=(ptb.TimedOut,))
    assert classify(NotAppliedError("x"), policy) is NOT_APPLIED
    assert classify(AmbiguousEffectError("x"), policy) is AMBIGUOUS
    assert classify(PermanentEffectError("x"), AT_LEAST) is PERMANENT
    assert classify(TimeoutError(), policy) is PERMANENT
    assert classify(ptb.TimedOut(), policy) is NOT_APPLIED  # listed beats known


def test_the_nearest_listed_class_wins() -> None:
    policy = effect_policy(not_applied=(ConnectionRefusedError,), ambiguous=(OSError,))
    assert classify(ConnectionRefusedError(), policy) is NOT_APPLIED
    assert classify(ConnectionResetError(), policy) is AMBIGUOUS
    assert classify(ValueError(), policy) is NOT_APPLIED  # unlisted, at least once


def test_unlisted_errors_follow_on_error_and_once() -> None:
    assert classify(ValueError(), AT_LEAST) is NOT_APPLIED
    assert classify(ValueError(), AT_MOST) is AMBIGUOUS
    assert classify(ValueError(), effect_policy(on_error="store")) is PERMANENT
    assert classify(ValueError(), effect_policy(once="at_most", on_error="store")) is PERMANENT


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"permanent": (ValueError,), "ambiguous": (ValueError,)},
            "both permanent= and ambiguous=",
        ),
        ({"not_applied": ("ValueError",)}, "exception classes"),
        ({"ambiguous": "ValueError"}, "tuple of exception classes"),
        ({"permanent": (int,)}, "exception classes"),
        ({"on_error": "ignore"}, "on_error must be"),
        ({"once": "exactly"}, "once must be"),
    ],
)
def test_bad_policies_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        effect_policy(**kwargs)


def test_one_class_is_a_list_of_one() -> None:
    assert effect_policy(permanent=KeyError).permanent == (KeyError,)


# ------------------------------------------------------------ behaviour


@pytest.fixture(params=["memory", "sqlite"])
async def idem(
    request: pytest.FixtureRequest, clock: ManualClock, tmp_path: Path
) -> AsyncIterator[Idem]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'idem.db'}"
    store: Store = store_from_url(url, clock=clock)
    yield Idem(store, clock=clock, heartbeat=False, lease=30.0)
    await store.close()


def raising(exc: BaseException) -> Any:
    async def effect() -> str:
        raise exc

    return effect


async def ok() -> str:
    return "sent"


async def test_a_permanent_bot_api_error_is_stored_under_at_least(idem: Idem) -> None:
    blocked = ag.TelegramForbiddenError(method=METHOD, message="bot was blocked by the user")
    with pytest.raises(ag.TelegramForbiddenError):
        await idem.run(KEY, raising(blocked))
    with pytest.raises(StoredFailureError) as caught:
        await idem.run(KEY, ok)
    assert caught.value.error_type == "TelegramForbiddenError"


async def test_an_ambiguous_bot_api_error_releases_under_at_least(idem: Idem) -> None:
    with pytest.raises(ptb.TimedOut):
        await idem.run(KEY, raising(ptb.TimedOut()))
    assert await idem.run(KEY, ok) == "sent"


async def test_an_ambiguous_bot_api_error_is_unknown_under_at_most(idem: Idem) -> None:
    reset = ag.TelegramNetworkError(method=METHOD, message="connection reset")
    with pytest.raises(UnknownOutcomeError, match="TelegramNetworkError"):
        await idem.run(KEY, raising(reset), once="at_most")
    with pytest.raises(UnknownOutcomeError):
        await idem.run(KEY, ok, once="at_most")


async def test_a_not_applied_bot_api_error_releases_under_at_most(idem: Idem) -> None:
    flood = ptb.RetryAfter(3)
    with pytest.raises(ptb.RetryAfter):
        await idem.run(KEY, raising(flood), once="at_most")
    assert await idem.run(KEY, ok, once="at_most") == "sent"
    record = await idem.store.get(KEY)
    assert record is not None and record.status is Status.COMPLETED


async def test_lists_on_a_step(idem: Idem) -> None:
    async def action() -> str:
        return await idem.step("charge", raising(LookupError("sku")), permanent=(LookupError,))

    with pytest.raises(LookupError):
        await idem.run(KEY, action)
    step_key = idem.keys.step(KEY, "charge")
    record = await idem.store.get(step_key)
    assert record is not None and record.status is Status.FAILED
