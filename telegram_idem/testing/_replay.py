"""Replay: deliver one update many times, the ways Telegram does, and count what ran.

A :class:`Replayer` delivers to a target (aiogram ``(dispatcher, bot)``, a PTB
``Application``, a webhook URL, or an async callable; see
:mod:`telegram_idem.testing._targets`) in one of these modes:

- :meth:`~Replayer.sequential`: the same update N times, one after another;
- :meth:`~Replayer.concurrent`: N times at once (several senders, a retry racing the
  first attempt);
- :meth:`~Replayer.interleaved`: N copies mixed with other updates;
- :meth:`~Replayer.telegram`: as Telegram's webhook sender does: re-sent after a failed
  answer (the handler raised, a non-2xx) or a slow one (no answer within ``timeout``
  seconds: the first attempt keeps running while the re-send arrives);
- :meth:`~Replayer.double_tap`: two callback queries with different ``update_id`` and
  the same message and data.

While it delivers, it records the guards' decision events (:mod:`telegram_idem.testing._decisions`),
so the :class:`ReplayResult` tells how many times each ``@idempotent`` handler body ran
(``acquired`` decisions at the action boundary, by the handler's ``__qualname__``), each
named step ran or was skipped, and each update reached processing::

    result = await Replayer((dp, bot)).concurrent(update, 20)
    assert result.handler_runs["approve"] == 1      # or assert_ran_once(result, approve)

Counts come from the decision events: handler bodies without ``@idempotent`` are not seen
(count those yourself), and a bot in another process decides elsewhere.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from telegram_idem.testing._decisions import BackgroundFailure, Decision, DecisionRecorder
from telegram_idem.testing._payloads import make_double_tap
from telegram_idem.testing._targets import (
    ReplayTarget,
    WebhookAnswerError,
    WebhookTarget,
    as_target,
)

if TYPE_CHECKING:
    from telegram_idem._guard import Idem

__all__ = ["Delivery", "ReplayResult", "Replayer", "handler_name"]

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Delivery:
    """One attempt to deliver one update.

    Attributes:
        update: the update as sent.
        attempt: 1 for the first attempt of a delivery, 2… for Telegram-style re-sends.
        value: what the target answered (handler result, aiogram ``UNHANDLED``, the
            webhook's body text…).
        error: what the attempt raised (the handler's exception, or
            :class:`~telegram_idem.testing._targets.WebhookAnswerError`).
        timed_out: no answer within the replayer's ``timeout``: Telegram re-sent while
            this attempt was still running (its ``value``/``error`` are its final outcome).
        elapsed: seconds the attempt took.
        status: the HTTP status for a webhook target.
    """

    update: Mapping[str, Any]
    attempt: int = 1
    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    elapsed: float = 0.0
    status: int | None = None

    @property
    def update_id(self) -> int:
        """The delivered update's id."""
        return int(self.update["update_id"])

    @property
    def ok(self) -> bool:
        """Telegram would count it as delivered: answered in time, without failing."""
        return self.error is None and not self.timed_out


def handler_name(handler: str | Callable[..., Any], known: Iterable[str] = ()) -> str:
    """The decision-log name of ``handler``.

    A callable gives its ``__qualname__`` (``@idempotent`` keeps the handler's). A string
    is used as is if it is in ``known``; otherwise it may be the last part of exactly one
    known qualified name (``"approve"`` for ``"make_router.<locals>.approve"``).
    """
    if not isinstance(handler, str):
        return str(getattr(handler, "__qualname__", repr(handler)))
    names = set(known)
    if handler in names:
        return handler
    matches = [n for n in names if n.endswith("." + handler)]
    return matches[0] if len(matches) == 1 else handler


@dataclass
class ReplayResult:
    """What a replay delivered and what ran.

    Attributes:
        deliveries: every attempt, in the order they started.
        decisions: every guard decision recorded meanwhile.
        background_failures: updates that failed after a webhook answered 200.
        handler_runs: ``@idempotent`` handler (``__qualname__``) → times its body ran.
        handler_replays: handler → calls answered without running the body (stored
            result replayed, or turned away while another call held the key).
        step_runs: step name → times its function ran.
        step_skips: step name → times a finished step was skipped (result replayed).
        update_runs: ``update_id`` → times processing started (the update guard
            acquired it, or an inbox ingress admitted it; for a target without an update
            guard, every delivery except webhook answers that were not 2xx).
        update_failures: ``update_id`` → attempts that failed (raised, non-2xx, or failed
            in the background).
        updates_dropped: deliveries the update guard dropped as duplicates of a
            completed update.
        updates_deferred: ``update_id`` → deliveries not acknowledged because another
            holder had the update in progress (:mod:`telegram_idem._admission`): Telegram
            re-sends those later; they are neither runs nor failures.
    """

    deliveries: list[Delivery]
    decisions: list[Decision]
    background_failures: list[BackgroundFailure] = field(default_factory=list)
    handler_runs: Counter[str] = field(default_factory=Counter)
    handler_replays: Counter[str] = field(default_factory=Counter)
    step_runs: Counter[str] = field(default_factory=Counter)
    step_skips: Counter[str] = field(default_factory=Counter)
    update_runs: Counter[int] = field(default_factory=Counter)
    update_failures: Counter[int] = field(default_factory=Counter)
    updates_dropped: int = 0
    updates_deferred: Counter[int] = field(default_factory=Counter)

    @property
    def updates_processed(self) -> int:
        """Times any update reached processing (sum of :attr:`update_runs`)."""
        return sum(self.update_runs.values())

    @property
    def updates_turned_away(self) -> int:
        """Deliveries the update guard did not run: dropped as duplicates of a completed
        update, or deferred while another holder had it in progress."""
        return self.updates_dropped + sum(self.updates_deferred.values())

    @property
    def duplicates_absorbed(self) -> int:
        """Deliveries the update guard turned away (:attr:`updates_turned_away`) plus
        handler calls that did not run their body (:attr:`handler_replays`)."""
        return self.updates_turned_away + sum(self.handler_replays.values())

    @property
    def errors(self) -> list[BaseException]:
        """Every exception raised by an attempt or logged by a failed background update."""
        found = [d.error for d in self.deliveries if d.error is not None]
        return found + [f.error for f in self.background_failures]

    @property
    def updates(self) -> list[Mapping[str, Any]]:
        """The distinct updates delivered (first delivery of each ``update_id``)."""
        seen: dict[int, Mapping[str, Any]] = {}
        for delivery in self.deliveries:
            seen.setdefault(delivery.update_id, delivery.update)
        return list(seen.values())

    def runs(self, handler: str | Callable[..., Any]) -> int:
        """Times the body of ``handler`` (a function or its name) ran.

        Args:
            handler: the handler function, or its name.
        """
        return self.handler_runs[handler_name(handler, self.handler_runs)]

    def lost_updates(self, update_ids: Iterable[int] | None = None) -> list[int]:
        """Updates (default: all delivered) whose processing never finished without an
        error: never processed, or every run failed.

        Args:
            update_ids: the updates to look at; ``None``: every update delivered.
        """
        ids = list(update_ids) if update_ids is not None else [u["update_id"] for u in self.updates]
        return [uid for uid in ids if self.update_runs[uid] - self.update_failures[uid] < 1]

    def describe(self) -> str:
        """A few lines for assertion messages: deliveries, handler and step counts."""
        attempts = Counter(d.update_id for d in self.deliveries)
        lines = [
            f"deliveries: {len(self.deliveries)} "
            f"({', '.join(f'update {u} x{n}' for u, n in attempts.items()) or 'none'})",
            f"update runs: {dict(self.update_runs)}; dropped as duplicates: "
            f"{self.updates_dropped}; deferred (in progress elsewhere): "
            f"{dict(self.updates_deferred)}; failures: {dict(self.update_failures)}",
            f"handler runs: {dict(self.handler_runs)}; replays: {dict(self.handler_replays)}",
            f"step runs: {dict(self.step_runs)}; skipped: {dict(self.step_skips)}",
        ]
        for error in self.errors[:3]:
            lines.append(f"error: {type(error).__name__}: {error}")
        return "\n".join(lines)


def _action_calls(decisions: Sequence[Decision]) -> Counter[str]:
    """Handler calls that did not run the body, from the decisions of each (task, key).

    A call logs ``in_progress`` for each poll while another holder runs, then one final
    decision; a ``drop``/``raise`` call logs one ``in_progress`` and stops.
    """
    replays: Counter[str] = Counter()
    waiting: dict[tuple[int | None, str], str] = {}  # open in-progress call → handler
    for d in decisions:
        if d.boundary != "action":
            continue
        name = d.handler or d.key
        slot = (d.task, d.key)
        if d.decision == "in_progress":
            waiting.setdefault(slot, name)
            continue
        waiting.pop(slot, None)  # the open call (if any) ends with this decision
        if d.decision in ("replay", "failed", "conflict"):
            replays[name] += 1
    for _slot, name in waiting.items():  # turned away (drop / raise / wait timed out)
        replays[name] += 1
    return replays


def summarize(
    deliveries: list[Delivery],
    decisions: list[Decision],
    background: list[BackgroundFailure] | None = None,
) -> ReplayResult:
    """Build a :class:`ReplayResult` from attempts and recorded decisions."""
    background = background or []
    result = ReplayResult(deliveries, decisions, background)
    guarded: set[int] = set()
    # A delivery that waits for another holder logs "in_progress" per look, then its
    # answer: only the last update decision of each (task, update) counts.
    waiting: set[tuple[int | None, int]] = set()  # (task, update) answered nothing yet
    for d in decisions:
        name = d.handler or d.key
        if d.boundary == "update" and d.update_id is not None:
            guarded.add(d.update_id)
            if d.decision in ("acquired", "admitted"):  # admitted: into a durable inbox
                result.update_runs[d.update_id] += 1
            slot = (d.task, d.update_id)
            if d.decision == "in_progress":
                waiting.add(slot)
                continue
            waiting.discard(slot)
            if d.decision not in ("acquired", "admitted"):
                result.updates_dropped += 1
        elif d.boundary == "action" and d.decision == "acquired":
            result.handler_runs[name] += 1
        elif d.boundary == "step" and d.decision == "acquired":
            result.step_runs[name] += 1
        elif d.boundary == "step" and d.decision == "replay":
            result.step_skips[name] += 1
    for _task, update_id in waiting:  # not acknowledged: Telegram re-sends it
        result.updates_deferred[update_id] += 1
    result.handler_replays = _action_calls(decisions)
    for delivery in deliveries:
        refused = isinstance(delivery.error, WebhookAnswerError)  # may not have run at all
        if delivery.update_id not in guarded and not refused:
            result.update_runs[delivery.update_id] += 1
        if delivery.error is not None:
            result.update_failures[delivery.update_id] += 1
    # An attempt refused "not yet" (in progress elsewhere) raised or got a non-2xx, but
    # did not fail: it was never run, and Telegram re-sends it.
    for update_id, deferred in result.updates_deferred.items():
        result.update_failures[update_id] = max(result.update_failures[update_id] - deferred, 0)
    # A webhook logs every failure it sees: after its 200 (invisible to HTTP) or before a
    # 500 (already a failed delivery). Per update, the larger count is the failures.
    logged = Counter(f.update_id for f in background if f.update_id is not None)
    for update_id, count in logged.items():
        result.update_failures[update_id] = max(result.update_failures[update_id], count)
    return result


class Replayer:
    """Delivers updates to one target and reports what ran.

    Args:
        target: see :func:`~telegram_idem.testing._targets.as_target`.
        settle: awaited after the deliveries and before counting, for work that goes on
            after the answer (``FastAckWebhook.drain``, an inbox worker…).
        timeout: seconds Telegram waits for an answer in :meth:`telegram` mode.
        retry_delay: seconds between a failed answer and the re-send (:meth:`telegram`).
        max_attempts: most attempts per update in :meth:`telegram` mode.
        guard: for a callable target: wrap it in this :class:`Idem`'s update guard.
        bot_id: for a callable target with a guard: the bot id of the keys.
        secret_token: for a URL target: the webhook's secret token.
        sleep: awaited for ``retry_delay`` (inject to avoid real waiting).

    Raises:
        ValueError: ``timeout`` ≤ 0, ``retry_delay`` < 0 or ``max_attempts`` < 1.
        ConfigurationError, TypeError: see ``as_target``.

    Use as ``async with Replayer(...) as replayer:`` or call :meth:`close`.
    """

    def __init__(
        self,
        target: object,
        *,
        settle: Callable[[], Awaitable[Any]] | None = None,
        timeout: float = 60.0,
        retry_delay: float = 0.0,
        max_attempts: int = 5,
        guard: Idem | None = None,
        bot_id: int | None = None,
        secret_token: str | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if timeout <= 0 or retry_delay < 0 or max_attempts < 1:
            raise ValueError("need timeout > 0 s, retry_delay >= 0 s and max_attempts >= 1")
        self.target: ReplayTarget = as_target(
            target, guard=guard, bot_id=bot_id, secret_token=secret_token
        )
        self.settle = settle
        self.timeout = timeout
        self.retry_delay = retry_delay
        self.max_attempts = max_attempts
        self._sleep = sleep

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the target (sessions, handlers it added). Idempotent."""
        await self.target.close()

    # ------------------------------------------------------------------ plumbing

    async def _send(self, update: Mapping[str, Any], attempt: int = 1) -> Delivery:
        sent = copy.deepcopy(dict(update))
        started = time.perf_counter()
        try:
            value = await self.target.send(copy.deepcopy(sent))
        except Exception as exc:
            status = exc.attempt.status if isinstance(exc, WebhookAnswerError) else None
            return Delivery(sent, attempt, None, exc, False, time.perf_counter() - started, status)
        status = 200 if isinstance(self.target, WebhookTarget) else None
        return Delivery(sent, attempt, value, None, False, time.perf_counter() - started, status)

    async def _record(
        self, updates: Sequence[Mapping[str, Any]], run: Callable[[], Awaitable[list[Delivery]]]
    ) -> ReplayResult:
        for update in updates:
            if not isinstance(update.get("update_id"), int):
                raise ValueError("every update needs an integer update_id")
        with DecisionRecorder({int(u["update_id"]) for u in updates}) as recorder:
            deliveries = await run()
            if self.settle is not None:
                await self.settle()
            await asyncio.sleep(0)
        return summarize(deliveries, recorder.decisions, recorder.background_failures)

    # ------------------------------------------------------------------ modes

    async def deliver(
        self, updates: Sequence[Mapping[str, Any]], *, concurrently: bool = False
    ) -> ReplayResult:
        """Deliver ``updates`` in order, one at a time (or all at once).

        Args:
            updates: the updates, in delivery order.
            concurrently: deliver them all at once (``asyncio.gather``) instead of one after
                another.
        """

        async def run() -> list[Delivery]:
            if concurrently:
                return list(await asyncio.gather(*(self._send(u) for u in updates)))
            return [await self._send(u) for u in updates]

        return await self._record(updates, run)

    async def sequential(self, update: Mapping[str, Any], times: int = 2) -> ReplayResult:
        """Deliver ``update`` ``times`` times, each after the previous answered.

        Args:
            update: the Bot API update.
            times: how many copies (≥ 1).

        Raises:
            ValueError: ``times`` < 1.
        """
        return await self.deliver(_copies(update, times))

    async def concurrent(self, update: Mapping[str, Any], times: int = 2) -> ReplayResult:
        """Deliver ``update`` ``times`` times at once.

        Args:
            update: the Bot API update.
            times: how many copies (≥ 1).

        Raises:
            ValueError: ``times`` < 1.
        """
        return await self.deliver(_copies(update, times), concurrently=True)

    async def interleaved(
        self,
        update: Mapping[str, Any],
        others: Sequence[Mapping[str, Any]],
        times: int = 2,
        *,
        concurrently: bool = False,
    ) -> ReplayResult:
        """Deliver ``times`` copies of ``update`` alternating with ``others``
        (``u, o1, u, o2, u, …``), one at a time or all at once.

        Args:
            update: the update repeated.
            others: the updates delivered between its copies.
            times: how many copies (≥ 1).
            concurrently: deliver them all at once (``asyncio.gather``) instead of one after
                another.

        Raises:
            ValueError: ``times`` < 1.
        """
        copies = _copies(update, times)
        order: list[Mapping[str, Any]] = []
        for i in range(max(len(copies), len(others))):
            order.extend(copies[i : i + 1])
            order.extend(others[i : i + 1])
        return await self.deliver(order, concurrently=concurrently)

    async def double_tap(
        self,
        callback_update: Mapping[str, Any],
        second: Mapping[str, Any] | None = None,
        *,
        concurrently: bool = True,
    ) -> ReplayResult:
        """Deliver a callback query and its second tap (default
        :func:`~telegram_idem.testing.make_double_tap`: ``update_id`` + 1, an id
        :class:`~telegram_idem.testing.UpdateFactory` keeps free), at once by default.

        Args:
            callback_update: the first tap (a callback query update).
            second: the second tap; default :func:`~telegram_idem.testing.make_double_tap`
                of the first.
            concurrently: deliver both at once (default) instead of one after the other.

        Raises:
            ValueError: ``callback_update`` is not a callback query update.
        """
        second = second if second is not None else make_double_tap(callback_update)
        return await self.deliver([callback_update, second], concurrently=concurrently)

    async def telegram(self, update: Mapping[str, Any]) -> ReplayResult:
        """Deliver ``update`` as Telegram does: re-send the same update after a failed
        answer or after ``timeout`` seconds without one, ``retry_delay`` seconds apart,
        until an attempt succeeds or ``max_attempts`` were made. A slow attempt keeps
        running beside its re-send; the result waits for every attempt to finish.

        A webhook target is POSTed to by :class:`~telegram_idem.testing.TelegramDelivery`;
        an in-process target "fails" when it raises.

        Args:
            update: the Bot API update.
        """
        if isinstance(self.target, WebhookTarget):
            return await self._record([update], lambda: self._telegram_http(update))
        return await self._record([update], lambda: self._telegram_local(update))

    async def _telegram_http(self, update: Mapping[str, Any]) -> list[Delivery]:
        assert isinstance(self.target, WebhookTarget)
        report = await self.target.telegram(
            update,
            answer_timeout=self.timeout,
            retry_delay=self.retry_delay,
            max_attempts=self.max_attempts,
            sleep=self._sleep,
        )
        sent = copy.deepcopy(dict(update))
        return [
            Delivery(
                sent,
                a.number,
                a.body,
                None if a.ok else WebhookAnswerError(a),
                a.timed_out,
                a.elapsed,
                a.status,
            )
            for a in report.attempts
        ]

    async def _telegram_local(self, update: Mapping[str, Any]) -> list[Delivery]:
        attempts: list[asyncio.Task[Delivery]] = []
        slow: set[int] = set()
        for number in range(1, self.max_attempts + 1):
            if number > 1:
                await self._sleep(self.retry_delay)
            task = asyncio.ensure_future(self._send(update, number))
            attempts.append(task)
            done, _ = await asyncio.wait({task}, timeout=self.timeout)
            if task not in done:
                slow.add(number)  # Telegram stops waiting and re-sends; this one runs on
                continue
            if task.result().ok:
                break
        finished = await asyncio.gather(*attempts)
        return [dataclasses.replace(d, timed_out=d.attempt in slow) for d in finished]


def _copies(update: Mapping[str, Any], times: int) -> list[Mapping[str, Any]]:
    if times < 1:
        raise ValueError("times must be >= 1")
    return [update] * times
