"""The relay: takes outbox entries with a lease, sends each once, records its outcome.

Many chats run in parallel (``concurrency`` tasks); the outbox lets one entry per chat be
in flight, in enqueue order, so a chat's calls keep their order under retries. Each
answer is classified (:func:`~telegram_idem.outbox._calls.classify`) and recorded:

| outcome | recorded as |
|---|---|
| delivered | ``deliver(result)`` |
| already done ("message is not modified", ...) | ``deliver(true)`` |
| 429 | the bot's pause gate closed for ``retry_after`` (every process), ``retry`` after it; not a failed attempt |
| migrated to a supergroup | ``retry`` at once with the new ``chat_id``, ordered as ``chat:<new>`` |
| expired, permanent 4xx | ``settle(DEAD)``, error ``"<error_code>: <description>"`` |
| 403 blocked | ``park``: the chat's calls wait until it is unparked |
| ambiguous (5xx, :class:`AmbiguousCall`) | policy ``resend``: ``retry`` with backoff; ``hold``: ``settle(UNKNOWN)`` |
| not sent (:class:`CallNotSent`) | ``retry`` with backoff |
| stored params that are not a JSON object | ``settle(DEAD)``, error ``"stored params are not a JSON object"``, before any flood or transport work |
| an unexpected exception before the request (flood control failed on it) | ``settle(DEAD)``, error naming the exception's type: not sent, redrivable |
| an unexpected exception once the request may have been written (raised by the transport, or reading its answer) | ambiguous: the policy decides, as above |

**An unexpected exception never ends a take loop.** One that no rule classifies (a bug,
data a store was given past :class:`~telegram_idem.outbox._base.NewCall`'s check, a
transport that raises something else than the two classes of
:mod:`~telegram_idem.outbox._failures`) is logged once at ERROR with its traceback (the
entry's method and key, never its params) and settles the entry by the rows above; one
the store's outbox raises while recording (a bug in it) leaves the entry to its next take,
as a :class:`StoreError` does; one met while looking for entries is logged once per run of
them and looked past with the outage backoff. The loop goes on with the next entry, so
the other chats' calls are sent.

Backoff is ``backoff_base * 2**(failures-1)`` seconds, at most ``backoff_max``; after
``max_attempts`` failed attempts the entry is a dead letter, so a poison call never
blocks its chat forever. A lease heartbeat runs while a call is in flight.

**Takes that recorded nothing.** Every outcome a relay records carries its attempt in
``last_error`` (``"attempt <n> (<failures> failed): ..."``), so the next taker can tell
whether the previous take ended with a record. One that did not (the relay died, or was
cancelled, between the take and its record) may have sent the call: a ``hold`` entry
then becomes ``UNKNOWN`` without calling the API; a ``resend`` entry counts the lost
take as a failed attempt and is sent again. A relay never holds an entry while it waits
for the flood budget longer than a moment (:data:`HELD_WAIT`, 50 ms, or ``lease / 3`` if
less): it hands the entry back with a record and a delay, so only a death in that moment or
in the instant between the reservation and the request can make a call that was never sent
unknown. (It used to hold waits up to 1 s: under a chat's 1 message/s pacing nearly every
held call sat in that window, and a ``kill -9`` made them all unknown.)

**A store outage while recording.** The outcome of a call (Telegram's answer above all)
is known only to the relay that sent it, so a record the store cannot take is retried with
backoff for up to ``lease`` seconds, fenced by the entry's token: a short outage ends with
the call delivered, not unknown. Past that, one ERROR line says what Telegram answered (a
Message's ``message_id`` and chat) and the next take decides. Flood control that cannot
answer before the request hands the entry back with a record, not sent.

Log lines (logger ``telegram_idem.outbox``) name the effect key and the method, never the
token; a store outage is one ERROR line when it starts, one more at most every
``outage_log_interval`` seconds while it lasts (with the failed takes of all the relay's
loops), one INFO line when it ends; every outcome is also a decision event (boundary
``"outbox"``, ``handler`` the method; :mod:`telegram_idem.events`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from telegram_idem._heartbeat import heartbeat
from telegram_idem._outage import OutageLog
from telegram_idem.errors import StoreError
from telegram_idem.events import emit_decision
from telegram_idem.flood import FloodControl
from telegram_idem.outbox._base import (
    AmbiguousPolicy,
    CallStatus,
    Outbox,
    OutboxEntry,
    json_object,
)
from telegram_idem.outbox._calls import Answer, OutcomeClass, Verdict, classify, encode_params
from telegram_idem.outbox._failures import AmbiguousCall, CallNotSent

if TYPE_CHECKING:
    from telegram_idem.outbox._transport import BotAPI

__all__ = ["Relay", "redactor_of"]

HELD_WAIT = 0.05
"""Seconds a relay waits for the flood budget while holding an entry; a longer wait hands
the entry back (with a record and the delay) so a relay that dies meanwhile leaves a call
known to be unsent, not unknown."""

log = logging.getLogger("telegram_idem.outbox")

_TAG = re.compile(r"^attempt (\d+) \((\d+) failed\): ")


def _history(entry: OutboxEntry) -> tuple[int, int]:
    """``(attempt, failures)`` of the last recorded outcome, ``(0, 0)`` for none (or one
    from before a redrive, which reset the attempts)."""
    match = _TAG.match(entry.last_error or "")
    if match is None:
        return 0, 0
    attempt, failed = int(match[1]), int(match[2])
    return (0, 0) if attempt >= entry.attempts else (attempt, failed)


def redactor_of(api: object) -> Callable[[str], str]:
    """The token mask of a transport (``HttpBotAPI.redact``), or text unchanged for a
    transport that knows no token: what every text the outbound side records, logs or
    raises from a transport goes through.

    Args:
        api: the transport (a ``BotAPI``).
    """
    redact = getattr(api, "redact", None)
    return redact if callable(redact) else _unchanged


def _unchanged(text: str) -> str:
    return text


def _tag(entry: OutboxEntry, failed: int) -> str:
    """The head of every outcome this take records (``"attempt <n> (<failures> failed): "``),
    what :func:`_history` reads back."""
    return f"attempt {entry.attempts} ({failed} failed): "


def _reason(entry: OutboxEntry, exc: Exception) -> str:
    """A transport failure's text as recorded: without the ``"<method>: "`` the transport
    starts it with (the entry has its method; every listing shows it beside the error)."""
    text = str(exc)
    return text.removeprefix(f"{entry.method}: ") or text


NOT_AN_OBJECT = "stored params are not a JSON object"
"""The dead letter of an entry whose stored params no Bot API call can carry (written
past :class:`~telegram_idem.outbox._base.NewCall`'s check: an older version, a store
edited by hand)."""


def _unexpected(
    entry: OutboxEntry,
    where: str,
    exc: BaseException,
    redact: Callable[[str], str],
) -> None:
    """One ERROR line, with the traceback, for an exception no rule classifies: the
    entry's method and key name it, never its params; the traceback is formatted here and
    passed through ``redact`` (the transport's token mask), since an exception's text may
    quote the request URL, which holds the token."""
    trace = "".join(traceback.format_exception(exc))
    log.error(
        "outbox %s %s: unexpected %s in %s\n%s",
        entry.method,
        entry.key,
        type(exc).__name__,
        where,
        redact(trace),
    )


def _maybe_sent(exc: BaseException) -> str:
    """The recorded text of an unexpected error met once the request may have been
    written: only its type (its text may quote the request)."""
    return f"unexpected {type(exc).__name__} once the request may have been written"


def _accepted(answer: Answer | None, key: str) -> str:
    """What an operator needs to settle a delivered call nobody could record: the
    ``telegram-idem outbox resolve`` line with Telegram's result (a Message's
    ``message_id``, ``date`` and ``chat``: the fields resolve checks)."""
    if answer is None or not answer.ok:
        return ""
    result = answer.result
    chat = result.get("chat") if isinstance(result, dict) else None
    if isinstance(result, dict) and "message_id" in result and isinstance(chat, dict):
        kept: Any = {  # a Message: what resolve checks, not the text sent
            "message_id": result["message_id"],
            "date": result.get("date"),
            "chat": {k: chat.get(k) for k in ("id", "type")},
        }
    else:  # True, a MessageId, ...
        kept = result
    shown = json.dumps(kept)
    if len(shown) > 1000:
        return (
            "; Telegram accepted it (its result is too long to log: find the message in the chat)"
        )
    return (
        f"; Telegram accepted it: settle it with telegram-idem outbox resolve '{key}' "
        f"--result '{shown}'"
    )


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True).encode("ascii")


class Relay:
    """Sends one bot's outbox entries (see the module docstring).

    Args:
        outbox: the store's outbox.
        api: the Bot API transport (:class:`~telegram_idem.outbox._transport.HttpBotAPI`).
        bot_id: whose entries it takes.
        flood: flood control; ``None`` paces nothing (a 429 still delays the entry).
        lease: seconds a taken entry is held; a heartbeat extends it every ``lease / 3``.
        concurrency: entries sent at once (different chats).
        poll_interval: seconds between looks when nothing is takeable (or :meth:`notify`).
        max_attempts: failed attempts before a dead letter (429s and migrations do not
            count).
        backoff_base: seconds before the first retry of a failed call; each further
            retry waits twice as long.
        backoff_max: seconds the retry delay grows to at most.
        shutdown_grace: seconds in-flight calls may take to finish when the relay stops.
        outage_log_interval: seconds between two "outbox still unavailable" lines while
            the store cannot answer (the outage's first line and its end are logged once).

    Raises:
        ValueError: ``lease``, ``poll_interval``, ``backoff_base`` or
            ``outage_log_interval`` not > 0,
            ``concurrency`` or ``max_attempts`` < 1.
    """

    def __init__(
        self,
        outbox: Outbox,
        api: BotAPI,
        *,
        bot_id: int,
        flood: FloodControl | None = None,
        lease: float = 30.0,
        concurrency: int = 8,
        poll_interval: float = 0.2,
        max_attempts: int = 10,
        backoff_base: float = 1.0,
        backoff_max: float = 60.0,
        shutdown_grace: float = 10.0,
        outage_log_interval: float = 60.0,
    ) -> None:
        if not (lease > 0 and poll_interval > 0 and backoff_base > 0 and outage_log_interval > 0):
            raise ValueError(
                "lease, poll_interval, backoff_base and outage_log_interval must be > 0 seconds"
            )
        if concurrency < 1 or max_attempts < 1:
            raise ValueError("concurrency and max_attempts must be ≥ 1")
        self.outbox = outbox
        self.api = api
        self.bot_id = bot_id
        self.flood = flood
        self.lease = lease
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.shutdown_grace = shutdown_grace
        self._wake = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._busy: set[asyncio.Task[Any]] = set()
        self._warm = False
        self._outage = OutageLog(log, "outbox", every=outage_log_interval)
        self._faulty = False
        """Whether the loops' looks for entries fail with something else than an outage."""

    def __repr__(self) -> str:
        return f"Relay(bot_id={self.bot_id}, outbox={type(self.outbox).__name__})"

    @property
    def _redactor(self) -> Callable[[str], str]:
        """The transport's token mask (``HttpBotAPI.redact``; unchanged text without one)."""
        return redactor_of(self.api)

    def backoff(self, failures: int) -> float:
        """Seconds before the attempt after ``failures`` failed ones.

        Args:
            failures: the failed attempts so far.
        """
        return float(min(self.backoff_base * 2 ** max(failures - 1, 0), self.backoff_max))

    def notify(self) -> None:
        """Wake idle relay tasks now (something was enqueued)."""
        self._wake.set()

    # ------------------------------------------------------------------ one entry

    async def deliver(self, entry: OutboxEntry) -> OutboxEntry:
        """Send one taken entry and record its outcome (the module docstring's table).

        Args:
            entry: an entry this relay took (its ``token`` holds it).

        Returns:
            The entry as stored afterwards (as given, if the store no longer has it).

        An exception no rule classifies settles the entry instead of escaping (the
        module docstring): a dead letter if it was met before the request (its params,
        flood control), the entry's policy if the request may have been written.

        A store that cannot answer while the outcome is recorded is retried with
        backoff for up to ``lease`` seconds (the outcome, Telegram's answer above all, is
        known only here); flood control that cannot answer before the request hands the
        entry back, not sent.

        Raises:
            StoreError: the store could not record the outcome for ``lease`` seconds (the
                entry's lease runs out and the next take decides, as for a relay that
                died). A store's outbox that fails otherwise (a bug in it) propagates
                likewise.
        """
        recorded, failed = _history(entry)
        lost = entry.attempts - 1 - recorded
        if lost > 0:
            if entry.policy is AmbiguousPolicy.HOLD:
                error = (
                    f"taken again after {lost} take(s) that recorded no outcome: the call "
                    "may have been sent (policy hold)"
                )
                return await self._settle(entry, CallStatus.UNKNOWN, error, "unknown", 0.0)
            failed += lost
        if failed >= self.max_attempts:
            error = f"{failed} failed attempts ({entry.attempts} takes): {entry.last_error}"
            return await self._settle(entry, CallStatus.DEAD, error, "dead", 0.0)
        params = json_object(entry.params)
        if params is None:  # written past NewCall's check: no attempt could ever send it
            log.error("outbox %s %s: %s", entry.method, entry.key, NOT_AN_OBJECT)
            return await self._settle(entry, CallStatus.DEAD, NOT_AN_OBJECT, "dead", 0.0)
        with heartbeat(
            lambda: self.outbox.extend(entry, lease=self.lease),
            interval=self.lease / 3,
            name=f"outbox call {entry.key}",
        ):
            if self.flood is not None:
                try:
                    wait = await self._flood_turn(entry, params)
                except StoreError as exc:  # not sent: hand it back with a record, or the
                    # next take would count a take that recorded nothing (hold: unknown)
                    text = f"not sent: flood control could not answer: {exc}"
                    return await self._hand_back(
                        entry, failed, self.backoff(1), text, "not_sent", logging.WARNING
                    )
                except Exception as exc:  # a flood rule that fails on this call: not sent
                    _unexpected(entry, "flood control", exc, self._redactor)
                    error = (
                        f"not sent: unexpected {type(exc).__name__} in flood control (the "
                        "relay's log has the traceback); redrive it once that is fixed"
                    )
                    return await self._settle(entry, CallStatus.DEAD, error, "dead", 0.0)
                if wait > 0:  # a long wait: hand it back with a record, nothing was sent
                    text = f"waiting {wait:.2f} s for the flood budget"
                    return await self._hand_back(
                        entry, failed, wait, text, "flood_wait", logging.DEBUG
                    )
            started = time.monotonic()
            answer: Answer | None = None
            result = b"null"
            try:
                answer = await self.api.call(entry.method, entry.params)
            except CallNotSent as exc:
                verdict = Verdict(OutcomeClass.NOT_SENT, description=_reason(entry, exc))
            except AmbiguousCall as exc:
                verdict = Verdict(OutcomeClass.AMBIGUOUS, description=_reason(entry, exc))
            except Exception as exc:  # a transport bug: it may have been sent
                _unexpected(entry, "the Bot API transport", exc, self._redactor)
                verdict = Verdict(OutcomeClass.AMBIGUOUS, description=_maybe_sent(exc))
            else:
                try:  # a BotAPI's answer that is not an Answer, or a result JSON cannot hold
                    verdict = classify(answer)
                    if verdict.outcome is OutcomeClass.DELIVERED:
                        result = _json(answer.result)
                except Exception as exc:
                    _unexpected(entry, "reading the Bot API's answer", exc, self._redactor)
                    answer = None
                    verdict = Verdict(OutcomeClass.AMBIGUOUS, description=_maybe_sent(exc))
            elapsed = (time.monotonic() - started) * 1000
            return await self._record(entry, params, answer, verdict, failed, elapsed, result)

    async def _flood_turn(self, entry: OutboxEntry, params: dict[str, Any]) -> float:
        """Reserve the entry's budgets, waiting here while the wait is a moment (at most
        :data:`HELD_WAIT`, or ``lease / 3``); a longer wait is returned, to hand the entry
        back with a record: a relay that died while holding an entry it had not sent would
        make a ``hold`` call unknown."""
        assert self.flood is not None
        await self._ready()
        short = min(HELD_WAIT, self.lease / 3)
        waited = 0.0
        while True:
            wait = await self.flood.try_turn(entry.method, params, priority=entry.priority)
            if wait <= 0 or wait > short:
                if waited > 0:
                    self.flood.note_wait(entry.method, params, waited)
                return wait
            await asyncio.sleep(wait)
            waited += wait

    async def _hand_back(
        self, entry: OutboxEntry, failed: int, delay: float, text: str, decision: str, level: int
    ) -> OutboxEntry:
        """Give an entry that was not sent back to its chat, takeable in ``delay``
        seconds, with a record of this take (so its next take does not count it as one
        that may have sent it)."""
        error = _tag(entry, failed) + text
        ok = await self._write(
            entry, decision, lambda: self.outbox.retry(entry, delay=delay, error=error)
        )
        return await self._done(entry, ok, decision, 0.0, level, text)

    async def _ready(self) -> None:
        """Await the transport's ``warm()`` once, if it has one (``HttpBotAPI.warm``):
        before the first take (:meth:`run`) and the first reservation, so set-up paid in
        the first calls neither lands between a reservation and its request (the calls
        would reach Telegram bunched up, over its limits) nor holds a taken entry."""
        if not self._warm:
            warm = getattr(self.api, "warm", None)
            if callable(warm):
                await warm()
            self._warm = True

    async def _record(
        self,
        entry: OutboxEntry,
        params: dict[str, Any],
        answer: Answer | None,
        verdict: Verdict,
        failed: int,
        elapsed_ms: float,
        result: bytes,
    ) -> OutboxEntry:
        outcome = verdict.outcome
        code = answer.error_code if answer is not None else None
        # Telegram's description may quote a URL of the call (a local Bot API server
        # does): recorded, logged and listed, so never with the token.
        text = self._redactor(verdict.description)
        if outcome is OutcomeClass.DELIVERED:
            ok = await self._write(
                entry, "delivered", lambda: self.outbox.deliver(entry, result=result), answer
            )
            return await self._done(entry, ok, "delivered", elapsed_ms, logging.DEBUG, "")
        if outcome is OutcomeClass.ALREADY_DONE:
            ok = await self._write(
                entry, "already_done", lambda: self.outbox.deliver(entry, result=b"true"), answer
            )
            return await self._done(entry, ok, "already_done", elapsed_ms, logging.INFO, text)
        tag = _tag(entry, failed)
        if outcome is OutcomeClass.RETRY:
            delay = verdict.retry_after or 1.0
            if self.flood is not None:
                await self.flood.retry_after(delay, method=entry.method)
            error = f"{tag}{code}: {text}"
            ok = await self._write(
                entry, "flood_wait", lambda: self.outbox.retry(entry, delay=delay, error=error)
            )
            return await self._done(entry, ok, "flood_wait", elapsed_ms, logging.WARNING, text)
        if outcome is OutcomeClass.MIGRATE:
            new = verdict.migrate_to_chat_id
            params["chat_id"] = new
            moved = encode_params(params)
            ok = await self._write(
                entry,
                "migrated",
                lambda: self.outbox.retry(
                    entry,
                    delay=0.0,
                    error=f"{tag}migrated to chat {new}: {text}",
                    params=moved,
                    ordering_key=f"chat:{new}",
                ),
            )
            return await self._done(entry, ok, "migrated", elapsed_ms, logging.INFO, text)
        if outcome in (OutcomeClass.EXPIRED, OutcomeClass.PERMANENT):
            return await self._settle(entry, CallStatus.DEAD, f"{code}: {text}", "dead", elapsed_ms)
        if outcome is OutcomeClass.BLOCKED:
            # Tagged like a retry: unpark keeps the attempts, so the next taker must see
            # that this take recorded its outcome (else a hold call would turn unknown).
            error = f"{tag}{code}: {text}"
            ok = await self._write(entry, "parked", lambda: self.outbox.park(entry, error=error))
            return await self._done(entry, ok, "parked", elapsed_ms, logging.WARNING, text)
        if outcome is OutcomeClass.AMBIGUOUS and entry.policy is AmbiguousPolicy.HOLD:
            return await self._settle(entry, CallStatus.UNKNOWN, text, "unknown", elapsed_ms)
        failed += 1  # not sent, or ambiguous under policy resend
        if failed >= self.max_attempts:
            error = f"{failed} failed attempts: {text}"
            return await self._settle(entry, CallStatus.DEAD, error, "dead", elapsed_ms)
        delay = self.backoff(failed)
        decision = "resend" if outcome is OutcomeClass.AMBIGUOUS else "not_sent"
        tag = _tag(entry, failed)
        error = f"{tag}{text}"
        ok = await self._write(
            entry, decision, lambda: self.outbox.retry(entry, delay=delay, error=error)
        )
        return await self._done(entry, ok, decision, elapsed_ms, logging.WARNING, text)

    async def _settle(
        self,
        entry: OutboxEntry,
        status: CallStatus,
        error: str,
        decision: str,
        elapsed_ms: float,
    ) -> OutboxEntry:
        assert status in (CallStatus.DEAD, CallStatus.UNKNOWN)
        ok = await self._write(
            entry, decision, lambda: self.outbox.settle(entry, status=status, error=error)
        )
        return await self._done(entry, ok, decision, elapsed_ms, logging.WARNING, error)

    async def _done(
        self,
        entry: OutboxEntry,
        ok: bool,
        decision: str,
        elapsed_ms: float,
        level: int,
        detail: str,
    ) -> OutboxEntry:
        if not ok:
            log.warning(
                "outbox %s %s: %s, but its lease was taken over before it was recorded",
                entry.method,
                entry.key,
                decision,
            )
        else:
            log.log(level, "outbox %s %s: %s %s", entry.method, entry.key, decision, detail)
            emit_decision(
                boundary="outbox",
                key=entry.key,
                decision=decision,
                update=None,
                handler=entry.method,
                fencing_token=entry.token,
                elapsed_ms=elapsed_ms,
                bot_id=self.bot_id,
            )
        try:
            stored = await self.outbox.get(entry.key)
        except StoreError:  # recorded: only the read-back failed
            return entry
        return stored if stored is not None else entry

    async def _write(
        self,
        entry: OutboxEntry,
        decision: str,
        write: Callable[[], Awaitable[bool]],
        answer: Answer | None = None,
    ) -> bool:
        """Record an outcome with ``write``, retrying a :class:`StoreError` with backoff
        for up to ``lease`` seconds: the outcome (Telegram's answer, above all) is known
        only here, and a record that waits out a short outage keeps a delivered call
        from becoming unknown, or a call handed back from becoming unknown or being sent
        again. The write stays fenced by the entry's token: once another relay took the
        entry over, it does nothing (``False``). Still failing at the end, it logs what
        was known (for a delivered call, its ``message_id``: what an operator needs to
        ``telegram-idem outbox resolve`` it) and raises.

        Raises:
            StoreError: the store did not answer for ``lease`` seconds.
        """
        deadline = time.monotonic() + self.lease
        pause = min(0.05, self.lease / 10)
        while True:
            try:
                return await write()
            except StoreError as exc:
                if time.monotonic() + pause >= deadline:
                    log.error(
                        "outbox %s %s: %s, but the outbox could not record it for %.0f s "
                        "(%s); the entry's lease decides at its next take (policy %s)%s",
                        entry.method,
                        entry.key,
                        decision,
                        self.lease,
                        exc,
                        entry.policy.value,
                        _accepted(answer, entry.key),
                    )
                    raise
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)

    async def deliver_unit(
        self, ordering_key: str, *, until_key: str | None = None
    ) -> OutboxEntry | None:
        """Deliver the heads of one chat now, oldest first (a sender delivering its own
        call: the chat's earlier calls go first, as they must).

        Args:
            ordering_key: the chat (``"chat:<id>"``), or a call's own key.
            until_key: stop once this entry was taken and recorded (following it to
                its new chat if it migrated); ``None``: until nothing is takeable.

        Returns:
            ``until_key``'s entry as recorded, or ``None`` if it was not taken here (its
            chat's head is in flight elsewhere, or waits for a retry).

        Raises:
            StoreError: the store could not answer.
        """
        unit = ordering_key
        for _ in range(4 * self.max_attempts + 16):  # bounded: each take records
            entry = await self.outbox.take(bot_id=self.bot_id, lease=self.lease, ordering_key=unit)
            if entry is None:
                return None
            done = await self.deliver(entry)
            if until_key is None or entry.key != until_key:
                continue
            if done.status is CallStatus.PENDING and done.ordering_key != unit:
                unit = done.ordering_key  # migrated: deliver it in its new chat
                continue
            return done
        return None

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``work`` as a task the relay owns: kept referenced until done, and given
        the shutdown grace when the relay stops (a sender that stops waiting leaves its
        delivery here).

        Args:
            work: the coroutine to run.
        """
        task = asyncio.ensure_future(work)
        self._busy.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._busy.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("outbox delivery task ended with %r", type(task.exception()).__name__)

    # ------------------------------------------------------------------ the loop

    async def _take(self) -> OutboxEntry | None:
        # A take cancelled mid-flight (shutdown) may still commit: hand the entry back
        # with a record, so its next taker does not count it as a lost take.
        taking = asyncio.ensure_future(self.outbox.take(bot_id=self.bot_id, lease=self.lease))
        try:
            return await asyncio.shield(taking)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                taken = await taking
                if taken is not None:
                    _, failed = _history(taken)
                    await self.outbox.retry(
                        taken,
                        delay=0.0,
                        error=f"attempt {taken.attempts} ({failed} failed): relay stopped "
                        "before sending",
                    )
            raise

    async def _loop(self) -> None:
        outages = 0
        while True:
            self._wake.clear()
            try:
                paused = await self.flood.paused_for() if self.flood is not None else 0.0
                entry = None if paused > 0 else await self._take()
            except Exception as exc:  # an outage, or a bug: the loop waits and looks again
                outages += 1  # this loop's, for its backoff; the log counts all loops'
                delay = min(self.poll_interval * 2 ** min(outages - 1, 16), self.backoff_max)
                if isinstance(exc, StoreError):
                    self._outage.failed(exc)
                elif not self._faulty:
                    self._faulty = True  # once per run of them, not once per loop and look
                    log.error(
                        "outbox: unexpected %s looking for entries to send (not a store "
                        "outage: flood control or the store's outbox failed); looking "
                        "again with backoff",
                        type(exc).__name__,
                        exc_info=exc,
                    )
                await asyncio.sleep(delay)
                continue
            outages = 0
            self._outage.succeeded()
            if self._faulty:
                self._faulty = False
                log.info("outbox: looking for entries to send works again")
            if paused > 0:
                await asyncio.sleep(min(paused, self.lease))
                continue
            if entry is None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_interval):
                        await self._wake.wait()
                continue
            task = self.spawn(self.deliver(entry))
            try:
                await asyncio.shield(task)
            except StoreError as exc:
                log.error("outbox %s %s: outcome not recorded: %s", entry.method, entry.key, exc)
            except Exception as exc:  # the store's outbox failed otherwise: a bug in it
                _unexpected(
                    entry, "recording its outcome (the next take decides it)", exc, self._redactor
                )
            self._wake.set()  # there may be more: let idle siblings look too

    async def run(self) -> None:
        """Send entries until cancelled (``concurrency`` tasks).

        Raises:
            RuntimeError: the relay is running already.
        """
        await self._ready()
        loops = [asyncio.create_task(self._loop()) for _ in range(self.concurrency)]
        try:
            await asyncio.gather(*loops)
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    @property
    def running(self) -> bool:
        """Whether the background relay started by ``async with`` / :meth:`start` runs."""
        return self._runner is not None and not self._runner.done()

    def start(self) -> None:
        """Run :meth:`run` in the background (not a coroutine).

        Raises:
            RuntimeError: it is running already, or no event loop is running.
        """
        if self.running:
            raise RuntimeError("this Relay is running already: start it once")
        self._runner = asyncio.get_running_loop().create_task(self.run())

    async def stop(self, *, grace: float | None = None) -> None:
        """Stop taking entries; calls in flight get ``grace`` seconds (default
        ``shutdown_grace``) to finish, then are cancelled (their entries are decided by
        their next take, see the module docstring). Stopping a stopped relay does
        nothing.

        Args:
            grace: seconds calls in flight may take to finish; ``None``: ``shutdown_grace``.
        """
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        busy = [t for t in self._busy if not t.done()]
        if busy:
            await asyncio.wait(busy, timeout=self.shutdown_grace if grace is None else grace)
        for task in busy:
            task.cancel()
        await asyncio.gather(*busy, return_exceptions=True)

    async def __aenter__(self) -> Self:
        """:meth:`start`."""
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """:meth:`stop`."""
        await self.stop()
