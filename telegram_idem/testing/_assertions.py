"""Assertions that read like the property they check, with messages that say what ran.

::

    result = await replayer.concurrent(update, 20)
    assert_ran_once(result, publish_post)           # the handler body ran once
    assert_step_ran_once(result, "commit")          # and its commit step once
    assert_no_update_lost(result)                   # every update finished somewhere
    assert_every_callback_answered(fake_bot_api, result)

Each raises ``AssertionError`` with the replay's counts (:meth:`ReplayResult.describe`)
so a failure shows what did happen.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from telegram_idem.testing._replay import ReplayResult, handler_name

if TYPE_CHECKING:
    from telegram_idem.testing.bot_api import FakeBotAPI

__all__ = [
    "assert_every_callback_answered",
    "assert_no_update_lost",
    "assert_ran",
    "assert_ran_once",
    "assert_step_ran",
    "assert_step_ran_once",
]

Updates = ReplayResult | Iterable[Mapping[str, Any] | int]


def _fail(message: str, result: ReplayResult | None) -> None:
    detail = f"\n{result.describe()}" if result is not None else ""
    raise AssertionError(message + detail)


def assert_ran(result: ReplayResult, handler: str | Callable[..., Any], times: int) -> None:
    """The body of the ``@idempotent`` handler ran exactly ``times`` times.

    Args:
        handler: the handler function, or its ``__qualname__`` (or the last part of it).
        result: what a :class:`Replayer` delivery returned.
        times: how many runs are expected.

    Raises:
        AssertionError: it ran another number of times.
    """
    name = handler_name(handler, result.handler_runs)
    ran = result.handler_runs[name]
    if ran != times:
        hint = "" if result.handler_runs else " (no @idempotent handler ran at all)"
        _fail(f"handler {name!r} ran {ran} time(s), expected {times}{hint}", result)


def assert_ran_once(result: ReplayResult, handler: str | Callable[..., Any]) -> None:
    """The body of the ``@idempotent`` handler ran exactly once.

    Args:
        result: what a :class:`Replayer` delivery returned.
        handler: the handler function, or its ``__qualname__`` (or the last part of it).

    Raises:
        AssertionError: it ran 0 or several times.
    """
    assert_ran(result, handler, 1)


def assert_step_ran(result: ReplayResult, step: str, times: int) -> None:
    """The named step's function ran exactly ``times`` times.

    Args:
        result: what a :class:`Replayer` delivery returned.
        step: the step's name (as given to ``idem.step``).
        times: how many runs are expected.

    Raises:
        AssertionError: it ran another number of times.
    """
    ran = result.step_runs[step]
    if ran != times:
        skipped = result.step_skips[step]
        _fail(
            f"step {step!r} ran {ran} time(s), expected {times} "
            f"(skipped as already done: {skipped})",
            result,
        )


def assert_step_ran_once(result: ReplayResult, step: str) -> None:
    """The named step's function ran exactly once.

    Args:
        result: what a :class:`Replayer` delivery returned.
        step: the step's name.

    Raises:
        AssertionError: it ran 0 or several times.
    """
    assert_step_ran(result, step, 1)


def _updates(updates: Updates) -> list[Mapping[str, Any]]:
    if isinstance(updates, ReplayResult):
        return updates.updates
    return [u for u in updates if isinstance(u, Mapping)]


def _update_ids(updates: Updates) -> list[int]:
    if isinstance(updates, ReplayResult):
        return [int(u["update_id"]) for u in updates.updates]
    return [int(u["update_id"]) if isinstance(u, Mapping) else int(u) for u in updates]


def assert_every_callback_answered(api: FakeBotAPI, updates: Updates) -> None:
    """Every callback query among ``updates`` got a successful ``answerCallbackQuery``
    (Telegram clients show a spinner until then), duplicates included.

    Args:
        api: the FakeBotAPI the bot called.
        updates: updates (dicts) or a :class:`ReplayResult` (its delivered updates);
            those that are not callback queries are ignored.

    Raises:
        AssertionError: some query id was never answered (listed).
    """
    queries = [
        str(u["callback_query"]["id"])
        for u in _updates(updates)
        if isinstance(u.get("callback_query"), Mapping)
    ]
    answered = Counter(api.answered_callback_ids())
    missing = [q for q in queries if not answered[q]]
    if missing:
        _fail(
            f"{len(missing)} of {len(queries)} callback queries never answered: {missing}; "
            f"answered: {sorted(answered)}",
            updates if isinstance(updates, ReplayResult) else None,
        )


def assert_no_update_lost(result: ReplayResult, updates: Updates | None = None) -> None:
    """Every update (default: every update the replay delivered) was processed to the
    end at least once: a run that raised does not count, a later successful re-delivery
    does.

    Args:
        updates: updates (dicts or ids) that must not be lost.
        result: what a :class:`Replayer` delivery returned.

    Raises:
        AssertionError: an update was never processed, or every run of it failed.
    """
    wanted = _update_ids(updates) if updates is not None else None
    lost = result.lost_updates(wanted)
    if lost:
        parts = []
        for uid in lost:
            sent = sum(1 for d in result.deliveries if d.update_id == uid)
            parts.append(
                f"update {uid}: delivered {sent}x, processing started "
                f"{result.update_runs[uid]}x, failed {result.update_failures[uid]}x"
            )
        _fail("updates lost: " + "; ".join(parts), result)


# --------------------------------------------------------------------- what a bot sent
