"""getUpdates ingress: claim each batch in one round trip, write it to the inbox, then
advance the offset.

Telegram keeps an update until a getUpdates call with a higher ``offset`` confirms it
(Bot API, ``getUpdates``). Admitting the batch *before* asking for the next offset means a
crash between fetch and processing loses nothing (the batch is re-fetched), and the
re-fetched batch duplicates nothing (the update guard knows its ids).

An update in progress elsewhere — another shape sharing the store (``FastAckWebhook``,
the PTB processor) claimed it and may have died, e.g. the replica this one replaces —
is never confirmed while that claim's lease lives: the offset stays at it, and each poll
(``error_delay`` doubling to ``error_delay_max`` apart) retries its admission, which
takes the claim over once the lease has ended. The updates after it in the batch are
admitted meanwhile (re-fetched, they are duplicates). A holder that keeps renewing its
lease past ``not_yet_wait`` is alive: the offset then moves on, logged at ERROR.

Several replicas may poll one bot when each is given ``leader=``
(:class:`~telegram_idem.ingress._leader.LeaderLease`): exactly one of them, the holder
of a fenced lease in the shared store, calls ``getUpdates``; the others stand by and
take over when it stops or dies, resuming from the offset it stored
(:mod:`telegram_idem.ingress._leader`).

One bad item never stalls polling: something in a batch that is not an update, or that
cannot be encoded, is admitted as a rejected entry
(:func:`~telegram_idem.inbox._entries.rejected_entry`) that the worker dead-letters at
once, and the offset moves past it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from telegram_idem._admission import Admission
from telegram_idem._guard import Idem
from telegram_idem._ordering import Ordering
from telegram_idem._updates import validate_update
from telegram_idem.errors import StoreError
from telegram_idem.flood import retry_after_of
from telegram_idem.inbox import NewEntry, new_entry, rejected_entry
from telegram_idem.ingress._leader import LeaderLease, Leadership, NotLeaderError, wait_or_stop

__all__ = ["GetUpdates", "PollingIngress"]

log = logging.getLogger("telegram_idem.ingress")

GetUpdates = Callable[[int | None, int, float], Awaitable[list[dict[str, Any]]]]
"""``(offset, limit, timeout_seconds) -> updates`` as Bot API dicts."""


class PollingIngress:
    """Long polling into the inbox.

    Args:
        idem: the guard; its store must have an inbox (memory, SQLite, PostgreSQL,
            Redis).
        get_updates: one ``getUpdates`` call, ``async (offset: int | None, limit: int,
            timeout: float) -> list[dict]`` returning Bot API update dicts:
            ``aiogram_get_updates(bot)`` (aiogram) or ``ptb_get_updates(bot)`` (PTB).
        bot_id: the bot polled (``bot.id``).
        limit: updates per batch (1–100, Bot API ``getUpdates``).
        poll_timeout: seconds of long polling per ``getUpdates`` call.
        error_delay: seconds to wait after the first failed fetch or store outage; the
            wait doubles with each further failure in a row, up to ``error_delay_max``.
        error_delay_max: seconds, the longest wait between failed polls.
        error_log_interval: seconds between the "still failing" lines while failures
            go on (one line when they start, one when a poll succeeds again).
        on_admitted: called (no arguments) after a batch admitted anything (e.g.
            ``worker.notify``); ``None``: nothing is called.
        ordering: how entries are ordered (default: chat, split by business connection
            and forum topic; callback queries in their own lane) —
            :class:`~telegram_idem._ordering.Ordering`.
        not_yet_wait: seconds an update in progress elsewhere (another shape sharing
            the store holds its claim, e.g. a replica being replaced) holds the offset
            back before the offset moves past it anyway; default two of ``idem``'s
            leases, so a dead holder's lease has ended and the update is admitted by
            takeover first. Each poll meanwhile retries its admission.
        leader: share the polling of ``bot_id`` with other replicas on the same store:
            only the holder of the lease polls (:class:`~telegram_idem.ingress._leader.LeaderLease`);
            ``None`` (default): this process polls unconditionally (run one replica).

    Raises:
        ConfigurationError: ``idem``'s store has no inbox; with ``leader``, a store
            without an effect ledger, or timings where ``poll_timeout + renew_every +
            margin`` exceeds the lease.
    """

    def __init__(
        self,
        idem: Idem,
        get_updates: GetUpdates,
        *,
        bot_id: int,
        limit: int = 100,
        poll_timeout: float = 25.0,
        error_delay: float = 1.0,
        error_delay_max: float = 30.0,
        error_log_interval: float = 60.0,
        on_admitted: Callable[[], None] | None = None,
        ordering: Ordering | None = None,
        not_yet_wait: float | None = None,
        leader: LeaderLease | None = None,
    ) -> None:
        self.idem = idem
        self.inbox = idem.store.inbox()
        if leader is not None:
            leader.check(poll_timeout)
        self.leadership = (
            Leadership(idem, bot_id=bot_id, config=leader) if leader is not None else None
        )
        """This replica's side of the leader lease, or ``None`` without ``leader``."""
        self.get_updates = get_updates
        self.bot_id = bot_id
        self.limit = limit
        self.poll_timeout = poll_timeout
        self.error_delay = error_delay
        self.error_delay_max = error_delay_max
        self.error_log_interval = error_log_interval
        self.failing_since: float | None = None
        """When the current run of failed polls began (``time.time()``), or ``None``."""
        self._failures = 0
        self._last_failure_log = 0.0
        self.on_admitted = on_admitted
        self.ordering = ordering
        self.not_yet_wait = 2 * idem.lease if not_yet_wait is None else not_yet_wait
        self.held_since: dict[int, float] = {}
        """Updates in progress elsewhere that hold the offset back: id → when first
        found held (``idem.clock()``)."""
        self._held_polls = 0
        self.offset: int | None = None
        self.admitted = 0
        self.duplicates = 0
        self.not_yet = 0
        self.rejected = 0

    async def poll_once(self) -> int:
        """Fetch one batch, admit it, advance the offset; returns updates fetched.

        An item that is not an update (no integer ``update_id``) or cannot be encoded is
        admitted as a rejected entry (a dead letter at its first take, logged at ERROR);
        the offset moves past every integer ``update_id`` of the batch, except that it
        stays at the smallest update in progress elsewhere (see the module docstring).

        With ``leader``, a replica that is not the leader tries once to become it, and
        returns 0 without polling if it could not.

        Raises:
            StoreError: the batch could not be admitted (the offset did not move), or
                the lease could not be looked at.
            Exception: whatever ``get_updates`` raised.
        """
        lead = self.leadership
        if lead is not None and not lead.leading and not await self._lead_once():
            return 0
        try:
            return await self._admit(await self._fetch())
        except NotLeaderError:
            return 0

    async def _fetch(self) -> list[Any]:
        lead = self.leadership
        if lead is None:
            return await self.get_updates(self.offset, self.limit, self.poll_timeout)
        # The offset is stored before it is passed: a later leader resumes at or above
        # every offset this one passed, so offsets never move back across leaders.
        if not await lead.write_offset(self.offset):
            raise NotLeaderError("the offset write was refused")
        deadline = lead.deadline(self.poll_timeout)  # checked right before the call
        loop = asyncio.get_running_loop()
        cut = asyncio.timeout_at(loop.time() + (deadline - time.monotonic()))
        try:
            async with cut:
                return await self.get_updates(self.offset, self.limit, self.poll_timeout)
        except TimeoutError:
            if cut.expired():  # e.g. the process was paused past its lease
                raise NotLeaderError("the long poll reached the end of the lease") from None
            raise

    async def _lead_once(self) -> bool:
        """Try once to become the leader; on success resume from the stored offset."""
        lead = self.leadership
        assert lead is not None
        if await lead.try_acquire() is not None:
            return False
        stored = lead.stored_offset
        if stored is not None and (self.offset is None or stored > self.offset):
            self.offset = stored
        return True

    async def _wait_for_lead(self, stopping: asyncio.Future[Any]) -> bool:
        """Stand by until this replica leads (``True``) or ``stop`` is set (``False``)."""
        lead = self.leadership
        assert lead is not None
        while not stopping.done():
            try:
                wait = await lead.try_acquire()
            except StoreError as exc:
                self._failed(f"store outage: the poll leader lease cannot be read: {exc}")
                await self._pause(stopping)
                continue
            self._recovered()
            if wait is None:
                stored = lead.stored_offset
                if stored is not None and (self.offset is None or stored > self.offset):
                    self.offset = stored
                return True
            await wait_or_stop(stopping, wait)
        return False

    async def _not_leading(self, stopping: asyncio.Future[Any]) -> None:
        """After a refused poll: wait for a renewal while the lease may still be
        renewed; give the leadership up once the lease has surely ended."""
        lead = self.leadership
        assert lead is not None
        if not lead.leading:
            return
        if time.monotonic() >= lead.valid_until:
            lead.lose("the lease ended without a renewal")
            return
        await wait_or_stop(stopping, lead.config.renew_seconds)

    async def _admit(self, batch: list[Any]) -> int:
        """Admit ``batch``, then move the offset past it; returns its length."""
        if not batch:
            return 0
        entries = [self._entry(item) for item in batch]
        admissions = await self.idem.admit_to_inbox(
            [e for e, _ in entries], [u for _, u in entries], bot_id=self.bot_id, inbox=self.inbox
        )
        outcomes = [a.outcome for a in admissions]
        for a in admissions:
            if a.outcome is Admission.UNAVAILABLE:  # not admitted (or not told apart)
                assert a.error is not None
                raise a.error  # the offset stays: the batch is fetched again
        admitted = outcomes.count(Admission.RUN)
        self.admitted += admitted
        self.duplicates += outcomes.count(Admission.DUPLICATE)
        self.not_yet += outcomes.count(Admission.NOT_YET)
        ids = [_update_id(item) for item in batch]
        held = self._held_elsewhere(
            [uid for uid, o in zip(ids, outcomes, strict=True) if o is Admission.NOT_YET]
        )
        known = [i for i in ids if i is not None]
        if held is not None:
            # Not past it: getUpdates confirms every update below the offset.
            self.offset = max(held, self.offset or 0)
        elif known:
            self.offset = max(max(known) + 1, self.offset or 0)
        else:
            log.error("a getUpdates batch without any integer update_id: offset kept")
        if admitted and self.on_admitted is not None:
            self.on_admitted()
        return len(batch)

    def _held_elsewhere(self, not_yet: list[int | None]) -> int | None:
        """The smallest update id the offset must stay at, or ``None``.

        ``not_yet`` are the batch's updates in progress elsewhere. Each is waited for
        (the offset kept at it, its admission retried at every poll) from the first poll
        that found it held until ``not_yet_wait`` seconds later; then the offset moves
        past it, logged at ERROR.
        """
        now = self.idem.clock()
        # Each such admission is logged (WARNING) by Idem.admit_to_inbox.
        since = {uid: self.held_since.get(uid, now) for uid in not_yet if uid is not None}
        waiting = {}
        for uid, first in since.items():
            if now - first < self.not_yet_wait:
                waiting[uid] = first
            else:
                log.error(
                    "update %s is still in progress elsewhere after %.0f s (its holder "
                    "keeps renewing its lease): the offset moves past it, so only that "
                    "holder can still process it",
                    uid,
                    now - first,
                )
        self.held_since = waiting
        if not waiting:
            self._held_polls = 0
            return None
        self._held_polls += 1
        return min(waiting)

    def hold_delay(self) -> float:
        """Seconds to wait before polling again while an update is held elsewhere:
        ``error_delay`` doubling with each such poll, up to ``error_delay_max``."""
        exponent = max(self._held_polls - 1, 0)
        return float(min(self.error_delay * 2.0 ** min(exponent, 30), self.error_delay_max))

    def _entry(self, item: object) -> tuple[NewEntry, dict[str, Any] | None]:
        try:
            update = validate_update(item)
            return new_entry(self.idem, update, bot_id=self.bot_id, ordering=self.ordering), update
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.error(
                "update %s rejected (kept as a dead letter, offset moves on): %s",
                _update_id(item),
                error,
            )
            self.rejected += 1
            return rejected_entry(self.idem, item, bot_id=self.bot_id, error=error), None

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set.

        Stopping is prompt: a long poll in flight when ``stop`` is set is cancelled at
        once (not waited out for up to ``poll_timeout`` seconds), and so is the
        ``error_delay`` pause. Nothing is lost by it: Telegram keeps an update until a
        later ``getUpdates`` confirms it with a higher ``offset`` (Bot API,
        ``getUpdates``), and the offset moves only after a batch is admitted, so a batch
        fetched but not admitted is sent again at the next poll. A batch that has
        arrived when ``stop`` is set is still admitted before ``run`` returns.

        With ``leader``, the replica stands by until it holds the lease, polls only
        while its lease lasts each long poll plus the margin, stores each offset before
        passing it, stops polling the moment it loses the lease (a long poll in flight
        is cancelled) and stands by again; when ``stop`` is set it releases the lease,
        after its last long poll ended, so a standby takes over at its next look.

        While an update is held elsewhere (the offset kept at it), the next poll waits
        :meth:`hold_delay` seconds.
        A failed fetch or a store outage (the batch not admitted, offset kept) is retried
        with backoff (``error_delay`` doubling to ``error_delay_max``), logged once when
        failures start, once per ``error_log_interval`` while they go on, and once when a
        poll succeeds again.
        Cancelling ``run`` cancels the poll in flight too.

        Args:
            stop: set it to stop polling (e.g. from a signal handler).
        """
        stopping = asyncio.ensure_future(stop.wait())
        fetch: asyncio.Future[list[Any]] | None = None
        lost: asyncio.Future[Any] | None = None
        lead = self.leadership
        try:
            while not stop.is_set():
                if lead is not None and not lead.leading:
                    if not await self._wait_for_lead(stopping):
                        return
                fetch = asyncio.ensure_future(self._fetch())
                waits: set[asyncio.Future[Any]] = {fetch, stopping}
                if lead is not None:
                    lost = asyncio.ensure_future(lead.lost.wait())
                    waits.add(lost)
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if lost is not None:
                    lost.cancel()
                if not fetch.done():
                    if stop.is_set():
                        return  # stopped mid-poll: the finally clause cancels the fetch
                    await _cancel(fetch)  # the lease was lost: no answer of it is used
                    continue
                try:
                    await self._admit(fetch.result())
                except NotLeaderError:
                    await self._not_leading(stopping)
                except StoreError as exc:
                    self._failed(f"store outage: batch not admitted, offset kept: {exc}")
                    await self._pause(stopping)
                except Exception as exc:
                    self._failed(f"getUpdates failed: {type(exc).__name__}: {exc}")
                    # A 429 says how long to wait (Bot API, ResponseParameters.retry_after):
                    # never poll again sooner than that, whatever the backoff says.
                    await self._pause(stopping, at_least=retry_after_of(exc) or 0.0)
                else:
                    self._recovered()
                    if self.held_since:
                        await asyncio.wait({stopping}, timeout=self.hold_delay())
        finally:
            stopping.cancel()
            if lost is not None:
                lost.cancel()
            if fetch is not None and not fetch.done():
                await _cancel(fetch)
            if lead is not None:
                await lead.step_down()  # after the fetch ended: no overlap with the next

    def _failed(self, what: str) -> None:
        """Count a failed poll; log when failures start and once per interval after."""
        self._failures += 1
        now = time.time()
        if self.failing_since is None:
            self.failing_since = now
            self._last_failure_log = now
            log.warning("%s (retrying with backoff)", what)
        elif now - self._last_failure_log >= self.error_log_interval:
            self._last_failure_log = now
            log.warning(
                "still failing since %s (%d polls): %s",
                time.strftime("%H:%M:%S", time.localtime(self.failing_since)),
                self._failures,
                what,
            )

    def _recovered(self) -> None:
        if self.failing_since is not None:
            log.warning(
                "polling works again after %.1f s (%d failed polls)",
                time.time() - self.failing_since,
                self._failures,
            )
        self.failing_since = None
        self._failures = 0

    def retry_delay(self) -> float:
        """Seconds to wait after the current run of failed polls."""
        exponent = max(self._failures - 1, 0)
        return float(min(self.error_delay * 2.0 ** min(exponent, 30), self.error_delay_max))

    async def _pause(self, stopping: asyncio.Future[Any], *, at_least: float = 0.0) -> None:
        """Wait :meth:`retry_delay` seconds (at least ``at_least`` seconds: a 429's
        ``retry_after``), or less if ``stop`` is set meanwhile."""
        await asyncio.wait({stopping}, timeout=max(self.retry_delay(), at_least))


async def _cancel(fetch: asyncio.Future[Any]) -> None:
    """Cancel ``fetch`` and let it end (its ``CancelledError`` is its own; a batch it
    fetched is never admitted, and fetched again)."""
    fetch.cancel()
    await asyncio.wait({fetch})
    if not fetch.cancelled():
        fetch.exception()


def _update_id(item: object) -> int | None:
    uid = item.get("update_id") if isinstance(item, dict) else None
    return uid if isinstance(uid, int) and not isinstance(uid, bool) else None
