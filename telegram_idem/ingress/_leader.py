"""A fenced leader lease for long polling: one replica of a bot runs ``getUpdates``.

Telegram serves one long poll per bot at a time: a second concurrent ``getUpdates``
ends the first with 409 "Conflict: terminated by other getUpdates request" (Bot API,
``getUpdates``). Replicas that share a store therefore elect one *leader* per bot:

- **The lease** is a lock in the store (:func:`telegram_idem._locks.acquire_lock`,
  key ``{prefix}:{bot_id}:l:poll-leader``): a record in progress whose lease the leader
  renews every ``renew_every`` seconds (:func:`telegram_idem._heartbeat.heartbeat`,
  ``Store.extend`` fenced by the leader's token). A replica that cannot get it stands
  by and looks again when the holder's lease would end (``retry_after``, by the store's
  clock), at most ``check_every`` seconds apart; when the leader dies (``kill -9``) its
  lease ends at most ``lease`` seconds after its last renewal and a standby takes it
  over (fencing token + 1).
- **Before every** ``getUpdates`` the leader checks that its last renewal succeeded and
  that its lease, as it knows it (the send time of the last renewal that succeeded
  plus ``lease``, a lower bound of the store's lease end), lasts the long poll plus
  ``margin``; the call is cancelled at that lease end less ``margin / 2`` at the latest.
  A replica whose renewal was refused (another one took the lease over) or whose
  offset write was refused stops at once and never polls with that token again.
- **The offset** (the next ``offset`` the leader will pass) is written before it is
  passed, in the store's effect ledger row at the lease's key
  (:meth:`telegram_idem.ledger.Ledger.mark_unknown`: a write with a fencing token older
  than the row's is refused, so a stale leader's write never lands). A new leader
  resumes from it, so the offsets passed to ``getUpdates`` never move back across
  leaders. The row is not an effect: :meth:`telegram_idem.Idem.unresolved` skips it.

Admission is as without a leader: a batch is admitted before the offset moves past it,
so nothing is lost when a leader dies between fetching and admitting (the next leader
fetches the batch again and the update guard drops what was admitted).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from contextlib import ExitStack
from dataclasses import dataclass

from telegram_idem._guard import Idem, default_holder
from telegram_idem._heartbeat import heartbeat
from telegram_idem._locks import POLL_LEADER, acquire_lock
from telegram_idem.backends import ledger_of
from telegram_idem.errors import ConfigurationError, LockHeldError, StoreError
from telegram_idem.events import emit_decision
from telegram_idem.ledger import Ledger, LedgerEntry, LedgerState

__all__ = ["LeaderLease", "Leadership"]

log = logging.getLogger("telegram_idem.ingress")


@dataclass(frozen=True, slots=True)
class LeaderLease:
    """How the replicas of one bot share its long polling (give it to
    :class:`~telegram_idem.ingress.PollingIngress` as ``leader=``).

    Timings, in seconds; the rule ``poll_timeout + renew_every + margin <= lease`` is
    checked when the ingress is made, so a leader whose renewals land always has lease
    left for its next long poll.

    Attributes:
        lease: seconds the leader's lease lasts after its last renewal: a standby takes
            over at most this long after a dead leader's last renewal.
        renew_every: seconds between renewals (default ``lease / 8``).
        margin: seconds of lease a long poll must leave unused (default ``lease / 8``):
            room for the network and for clock drift between the host and the store.
        check_every: seconds at most between a standby's looks at the lease (default
            ``lease / 4``); a standby also looks when the holder's lease would end.
        holder: this replica's name in logs and in the stored offset (default
            ``"<hostname>:<pid>"``, read when it becomes leader, as ``Idem(holder=)``).
        retention: seconds the lease record is kept after its last acquisition, so
            fencing tokens keep rising across leaders (default 30 days).
    """

    lease: float = 40.0
    renew_every: float | None = None
    margin: float | None = None
    check_every: float | None = None
    holder: str | None = None
    retention: float = 30 * 24 * 3600.0

    @property
    def renew_seconds(self) -> float:
        """``renew_every``, or ``lease / 8``."""
        return self.renew_every if self.renew_every is not None else self.lease / 8

    @property
    def margin_seconds(self) -> float:
        """``margin``, or ``lease / 8``."""
        return self.margin if self.margin is not None else self.lease / 8

    @property
    def check_seconds(self) -> float:
        """``check_every``, or ``lease / 4``."""
        return self.check_every if self.check_every is not None else self.lease / 4

    def check(self, poll_timeout: float) -> None:
        """Refuse timings that could let a long poll outlive the lease.

        Args:
            poll_timeout: seconds of long polling per ``getUpdates`` call.

        Raises:
            ConfigurationError: a timing not finite or not > 0 (``poll_timeout`` may be
                0), or ``poll_timeout + renew_every + margin > lease``.
        """
        times = {
            "lease": self.lease,
            "renew_every": self.renew_seconds,
            "margin": self.margin_seconds,
            "check_every": self.check_seconds,
        }
        for name, value in times.items():
            if not (math.isfinite(value) and value > 0):
                raise ConfigurationError(f"LeaderLease {name} must be > 0 seconds, got {value}")
        if not (math.isfinite(poll_timeout) and poll_timeout >= 0):
            raise ConfigurationError(f"poll_timeout must be ≥ 0 seconds, got {poll_timeout}")
        if self.retention < self.lease:
            raise ConfigurationError(
                f"LeaderLease retention ({self.retention} s) must be ≥ lease ({self.lease} s)"
            )
        need = poll_timeout + self.renew_seconds + self.margin_seconds
        if need > self.lease:
            raise ConfigurationError(
                f"poll_timeout ({poll_timeout} s) + renew_every ({self.renew_seconds} s) + "
                f"margin ({self.margin_seconds} s) = {need} s exceeds the leader lease "
                f"({self.lease} s): a long poll could outlive the lease and meet the next "
                "leader's (409 Conflict); lower poll_timeout or lengthen the lease"
            )


class NotLeaderError(Exception):
    """This replica may not call ``getUpdates`` now (it lost the lease, or its lease
    would end during the long poll)."""


class Leadership:
    """One replica's side of the lease of one bot: acquire, renew, check, write the
    offset. Made by :class:`~telegram_idem.ingress.PollingIngress`.

    Args:
        idem: the guard; its store keeps the lease and (its effect ledger) the offset.
        bot_id: the bot polled.
        config: the timings.

    Raises:
        ConfigurationError: the store has no effect ledger (the offset's home).
    """

    def __init__(self, idem: Idem, *, bot_id: int, config: LeaderLease) -> None:
        self.idem = idem
        self.store = idem.store
        self.ledger: Ledger = ledger_of(idem.store)
        self.bot_id = bot_id
        self.config = config
        self.key = idem.keys.lock(bot_id, POLL_LEADER)
        self.token: int | None = None
        """The fencing token while leader, else ``None``."""
        self.stored_offset: int | None = None
        """The offset last read or written in the store (while leader)."""
        self.valid_until = 0.0
        """``time.monotonic()`` by which the lease has surely not ended (while leader)."""
        self.renewed = False
        """Whether the last renewal succeeded."""
        self.lost = asyncio.Event()
        """Set when the lease or an offset write was refused (until the next term)."""
        self.terms = 0
        """How many times this replica became leader."""
        self._beat: ExitStack | None = None
        self._standing_by = False

    @property
    def holder(self) -> str:
        """This replica's name (``config.holder`` or ``"<hostname>:<pid>"``)."""
        return self.config.holder or default_holder()

    @property
    def leading(self) -> bool:
        """Whether this replica holds the lease (as far as it knows)."""
        return self.token is not None and not self.lost.is_set()

    # ------------------------------------------------------------------ terms

    async def try_acquire(self) -> float | None:
        """Try once to become leader.

        Returns:
            ``None`` if this replica is the leader now (the offset to resume from is
            :attr:`stored_offset`); otherwise seconds to wait before trying again.

        Raises:
            StoreError: the store could not answer.
        """
        cfg = self.config
        sent = time.monotonic()
        try:
            claim = await acquire_lock(
                self.store, self.key, ttl=cfg.lease, retention=cfg.retention, owner=None
            )
        except LockHeldError as exc:
            if not self._standing_by:
                self._standing_by = True
                token = exc.record.fencing_token if exc.record else None
                log.info(
                    "poll leader of bot %s: %s standing by (%s leads, token %s)",
                    self.bot_id,
                    self.holder,
                    await self._leader_name(),
                    token,
                )
                self._emit("standby", token)
            return max(min(cfg.check_seconds, exc.retry_after + 0.01), 0.01)
        self.token = claim.token
        self.valid_until = sent + cfg.lease
        self.renewed = True
        self.lost = asyncio.Event()
        try:
            self.stored_offset = await self._open_cursor(claim.token)
        except BaseException:
            await self._give_up()
            raise
        if self.lost.is_set():  # refused: a newer leader already wrote the row
            self.token = None
            return cfg.check_seconds
        self.terms += 1
        self._standing_by = False
        self._beat = ExitStack()
        self._beat.enter_context(
            heartbeat(self._renew, interval=cfg.renew_seconds, name=self.key, enabled=True)
        )
        log.warning(
            "poll leader of bot %s: %s became leader (token %s), resuming at offset %s",
            self.bot_id,
            self.holder,
            claim.token,
            self.stored_offset,
        )
        self._emit("acquired", claim.token)
        return None

    async def step_down(self) -> None:
        """Stop renewing and release the lease (a clean stop: a standby takes over at
        its next look, not after the lease). Never raises for a store that cannot
        answer (the lease then simply ends)."""
        token = self.token
        await self._give_up()
        if token is not None and not self.lost.is_set():
            try:
                await self.store.release(self.key, token)
            except StoreError as exc:
                log.warning("poll leader of bot %s: release failed: %s", self.bot_id, exc)
            log.info("poll leader of bot %s: %s stepped down", self.bot_id, self.holder)
            self._emit("released", token)

    async def _give_up(self) -> None:
        if self._beat is not None:
            self._beat.close()
            self._beat = None
        self.token = None

    def lose(self, why: str) -> None:
        """Leave the leadership now: no more ``getUpdates`` with this token.

        Args:
            why: what happened, for the log.
        """
        if self.token is None or self.lost.is_set():
            return
        token = self.token
        self.lost.set()
        if self._beat is not None:
            self._beat.close()
            self._beat = None
        self.token = None
        log.error("poll leader of bot %s: %s lost leadership: %s", self.bot_id, self.holder, why)
        self._emit("lost", token)

    async def _renew(self) -> bool:
        token = self.token
        if token is None:
            return False
        sent = time.monotonic()
        try:
            held = await self.store.extend(self.key, token, lease=self.config.lease)
        except Exception:
            self.renewed = False  # no new long poll until a renewal lands again
            raise  # the heartbeat logs it and tries again at the next beat
        if token != self.token:
            return False
        if not held:
            self.lose("the lease was taken over (renewal refused)")
            return False
        self.valid_until = sent + self.config.lease
        self.renewed = True
        return True

    # ------------------------------------------------------------------ polls

    def deadline(self, poll_timeout: float) -> float:
        """The ``time.monotonic()`` by which a long poll of ``poll_timeout`` seconds
        starting now must have ended.

        Args:
            poll_timeout: the long poll's seconds.

        Raises:
            NotLeaderError: not the leader, the last renewal failed, or the lease (as
                known) would end before the poll plus ``margin``.
        """
        if not self.leading:
            raise NotLeaderError("not the poll leader")
        if not self.renewed:
            raise NotLeaderError("the last lease renewal failed")
        left = self.valid_until - time.monotonic()
        margin = self.config.margin_seconds
        if left < poll_timeout + margin:
            raise NotLeaderError(f"the lease ends in {left:.2f} s, before the long poll")
        return self.valid_until - margin / 2

    async def write_offset(self, offset: int | None) -> bool:
        """Store ``offset`` as the next one to pass, fenced by this leader's token.

        Args:
            offset: the offset (``None`` writes nothing).

        Returns:
            ``False`` if the write was refused (a newer leader wrote the row: this
            replica lost the leadership) or this replica is not the leader.

        Raises:
            StoreError: the store could not answer (nothing known to be written).
        """
        token = self.token
        if token is None or self.lost.is_set():
            return False
        if offset is None or offset == self.stored_offset:
            return True
        row = await self.ledger.mark_unknown(self.key, token=token, detail=self._detail(offset))
        if row is None or row.token != token or row.state is not LedgerState.UNKNOWN:
            self.lose(f"offset write refused (the row carries token {_token_of(row)})")
            return False
        self.stored_offset = offset
        return True

    # ------------------------------------------------------------------ cursor

    def _detail(self, offset: int | None) -> str:
        return json.dumps({"offset": offset, "holder": self.holder}, separators=(",", ":"))

    async def _open_cursor(self, token: int) -> int | None:
        """The stored offset, after making the row this term's (token ``token``).

        A row with a newer token means the lease record was forgotten and its tokens
        restarted (no leader for ``retention``): it is replaced, its offset kept.
        """
        row = await self.ledger.get(self.key)
        if row is None:
            row = await self.ledger.start(self.key, token=token, holder=self.holder)
            if row is None:
                return None  # a new row: nothing stored yet
        offset = _offset_of(row)
        if row.token > token or row.state is LedgerState.SETTLED:
            await self.ledger.finish(self.key, token=row.token)
            if await self.ledger.start(self.key, token=token, holder=self.holder) is not None:
                self.lose("another replica rewrote the offset row")
                return None
        written = await self.ledger.mark_unknown(self.key, token=token, detail=self._detail(offset))
        if written is None or written.token != token:
            self.lose(f"offset row refused token {token} (it carries {_token_of(written)})")
        return offset

    async def _leader_name(self) -> str:
        """Who wrote the offset last (the leader, as a rule), for the standby's log."""
        try:
            row = await self.ledger.get(self.key)
        except StoreError:
            return "another replica"
        try:
            holder = json.loads(row.detail).get("holder") if row is not None else None
        except (ValueError, AttributeError):
            holder = None
        return holder if isinstance(holder, str) else "another replica"

    async def read_offset(self) -> int | None:
        """The stored offset (the next one to pass), or ``None`` when none is.

        Raises:
            StoreError: the store could not answer.
        """
        row = await self.ledger.get(self.key)
        return _offset_of(row) if row is not None else None

    def _emit(self, decision: str, token: int | None) -> None:
        emit_decision(
            boundary="lock",
            key=self.key,
            decision=decision,
            update=None,
            handler="poll-leader",
            fencing_token=token,
            bot_id=self.bot_id,
        )


def _offset_of(row: LedgerEntry) -> int | None:
    try:
        offset = json.loads(row.detail).get("offset")
    except (ValueError, AttributeError):
        return None
    return offset if isinstance(offset, int) and not isinstance(offset, bool) else None


def _token_of(row: LedgerEntry | None) -> str:
    return str(row.token) if row is not None else "none: the row is gone"


async def wait_or_stop(stopping: asyncio.Future[object], seconds: float) -> None:
    """Wait ``seconds``, or less if ``stopping`` completes."""
    await asyncio.wait({stopping}, timeout=seconds)
