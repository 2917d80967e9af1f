"""The inbox on NATS JetStream (see the package docstring for the design and its costs)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import PubAck

from telegram_idem import _inbox_logic as logic
from telegram_idem._records import Claim, Outcome
from telegram_idem._text import storable_text
from telegram_idem.backends._base import Store
from telegram_idem.backends.nats._connection import DISCOVER_BATCH, JetStreamConnection
from telegram_idem.backends.nats._layout import (
    H_ADMITTED,
    H_ID,
    H_REDRIVE,
    H_UNIT,
    JetStreamLayout,
    message_id,
)
from telegram_idem.backends.nats._state import DONE, State, candidates
from telegram_idem.backends.nats._view import Known, View
from telegram_idem.inbox import EntryStatus, Inbox, InboxEntry, InboxStats, NewEntry, UnitBacklog
from telegram_idem.ledger import check_limit

__all__ = ["JetStreamInbox"]

log = logging.getLogger("telegram_idem.nats")

_CAS = nats.js.errors.KeyWrongLastSequenceError
_BURIED = object()
DISCOVER_WAIT = 1.0
"""Seconds a take waits for another process to finish recording a batch it fetched."""


class JetStreamInbox(Inbox):
    """The durable inbox on a JetStream stream, with the claim store as the update
    guard's source of truth (see :mod:`telegram_idem.backends.nats`).

    Every method raises :class:`~telegram_idem.errors.StoreError` when NATS or the
    claim store cannot answer, and :class:`~telegram_idem.errors.ConfigurationError`
    when NATS refuses the credentials.

    Args:
        store: the claim store (update guards, and the clock leases are judged by).
        connection: the NATS connection and the names of the stream, consumers and
            bucket.
        admit_lease: seconds an admission holds the update's claim while it publishes
            (capped at the retention); a process that dies in between leaves the claim
            to end, then Telegram's re-delivery is admitted.
        max_deliver: takes after which a take makes the entry a dead letter itself
            instead of leasing it again (``None``: no limit here; the worker's
            ``max_attempts`` still applies).
        tombstone_age: seconds an acked entry's tombstone is kept, so a late
            re-delivery of its message (a process that stalled while recording it, a
            re-publish beyond the dedup window) is not run again.

    Raises:
        ValueError: ``max_deliver`` < 1.
    """

    def __init__(
        self,
        store: Store,
        connection: JetStreamConnection,
        *,
        admit_lease: float = 30.0,
        max_deliver: int | None = None,
        tombstone_age: float = 3600.0,
    ) -> None:
        if max_deliver is not None and max_deliver < 1:
            raise ValueError(f"max_deliver must be ≥ 1 or None, got {max_deliver}")
        self._store = store
        self._conn = connection
        self.layout: JetStreamLayout = connection.layout
        self.admit_lease = admit_lease
        self.max_deliver = max_deliver
        self.tombstone_age = tombstone_age
        self._view: View | None = None
        self._discovered = 0
        self._discovering = asyncio.Lock()
        self._trying: set[str] = set()
        self._swept_at = 0.0

    def __repr__(self) -> str:
        return repr(self._conn)

    # ------------------------------------------------------------------ plumbing

    async def _known(self) -> View:
        """The bucket's copy, in sync with the bucket as of now, with every message
        published so far recorded."""
        if self._view is None:
            kv = await self._conn.kv()
            js = await self._conn.js()

            async def last() -> int:
                info = await js.stream_info(self.layout.bucket_stream)
                return int(info.state.last_seq)

            self._view = View(kv, last)
        view = self._view
        await self._discover(view)
        await view.sync()
        return view

    async def _discover(self, view: View) -> None:
        """Record every message the partition consumers have not handed out yet."""
        js = await self._conn.js()
        async with self._discovering:
            last = int((await js.stream_info(self.layout.stream)).state.last_seq)
            if last <= self._discovered:
                return
            parts = range(self.layout.partitions)
            infos = await asyncio.gather(
                *(js.consumer_info(self.layout.stream, self.layout.consumer(p)) for p in parts)
            )
            await asyncio.gather(
                *(self._drain(view, p) for p, i in zip(parts, infos, strict=True) if i.num_pending)
            )
            if await self._others_done(parts):
                self._discovered = last

    async def _others_done(self, parts: range) -> bool:
        """Wait (at most :data:`DISCOVER_WAIT`) until no consumer has a batch out; False
        if one still has (a process that fetched it died: its ack wait ends it)."""
        js = await self._conn.js()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DISCOVER_WAIT
        while True:
            infos = await asyncio.gather(
                *(js.consumer_info(self.layout.stream, self.layout.consumer(p)) for p in parts)
            )
            if not any(i.num_ack_pending or i.num_pending for i in infos):
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.005)

    async def _drain(self, view: View, partition: int) -> None:
        pull = await self._conn.pull(partition)
        while True:
            try:
                msgs = await pull.fetch(DISCOVER_BATCH, timeout=0.5)
            except (nats.errors.TimeoutError, TimeoutError):
                return  # another process fetched them
            for msg in msgs:  # in stream order: the bucket gets a prefix of the partition
                await self._record(view, msg)
            await msgs[-1].ack_sync()  # AckAll: the whole batch
            if len(msgs) < DISCOVER_BATCH:
                return

    async def _record(self, view: View, msg: Msg) -> None:
        """Make the state of a fetched message (once: a re-delivery finds it made)."""
        headers = msg.headers or {}
        seq = msg.metadata.sequence.stream
        if H_ID not in headers or H_UNIT not in headers:
            log.warning("%r: message %d has no %s header: not an entry, skipped", self, seq, H_ID)
            return
        kv = await self._conn.kv()
        admitted = float(headers.get(H_ADMITTED, "0"))
        key = JetStreamLayout.entry_key(headers[H_ID])
        new = State(
            id=headers[H_ID],
            seq=seq,
            unit=headers[H_UNIT],
            status=EntryStatus.PENDING.value,
            available_at=admitted,
            admitted_at=admitted,
        )
        for _ in range(3):
            try:
                view.note(key, await kv.create(key, new.encode()), new)
                return
            except _CAS:
                pass
            try:
                got = await kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                continue  # deleted meanwhile (a swept tombstone): create again
            current = State.decode(got.value or b"{}")
            if current.seq == seq or H_REDRIVE in headers:
                return  # recorded already / the redrive adopts its own message
            if current.status == EntryStatus.PENDING:
                # admitted again (its guard had expired) while it still waited: refreshed
                refreshed = replace(current, attempts=0, admitted_at=admitted)
                with contextlib.suppress(_CAS):
                    rev = await kv.update(key, refreshed.encode(), last=got.revision)
                    view.note(key, rev, refreshed)
            await self._delete_msg(seq)  # a second message of one entry: only one runs
            return

    async def _delete_msg(self, seq: int) -> None:
        js = await self._conn.js()
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_msg(self.layout.stream, seq)

    async def _payload(self, seq: int) -> bytes | None:
        js = await self._conn.js()
        try:
            msg = await js.get_msg(self.layout.stream, seq, direct=True)
        except nats.js.errors.NotFoundError:
            return None
        return msg.data or b""

    async def _write(self, key: str, known: Known, new: State) -> bool:
        """Compare-and-set ``new`` over ``known``; False if the entry changed since."""
        return await self._write_rev(key, known, new) is not None

    async def _write_rev(self, key: str, known: Known, new: State) -> int | None:
        """:meth:`_write`, returning the revision written (``None``: the entry changed)."""
        kv = await self._conn.kv()
        try:
            rev = await kv.update(key, new.encode(), last=known.revision)
        except _CAS:
            return None
        assert self._view is not None
        self._view.note(key, rev, new)
        return rev

    async def _fresh(self, key: str) -> Known | None:
        kv = await self._conn.kv()
        try:
            got = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        if got.value is None or got.revision is None:
            return None
        return Known(got.revision, State.decode(got.value))

    async def _held(
        self, entry: InboxEntry, change: Callable[[State, float], State], op: str
    ) -> bool:
        """Apply ``change`` if ``entry.token`` still holds the entry (one retry on a
        stale copy)."""

        async def run() -> bool:
            if self._view is None:
                await self._known()
            assert self._view is not None
            key = JetStreamLayout.entry_key(entry.id)
            now = await self._store.now()
            known = self._view.known.get(key)
            for fresh in (False, True):
                if fresh:
                    known = await self._fresh(key)
                if known is None or not known.state.held_by(entry.token):
                    continue
                if await self._write(key, known, change(known.state, now)):
                    return True
            return False

        return await self._conn.call(op, run)

    # ------------------------------------------------------------------ admission

    async def admit(self, entry: NewEntry, *, retention: float) -> bool:
        return (await self.admit_many([entry], retention=retention))[0]

    async def admit_many(self, entries: Sequence[NewEntry], *, retention: float) -> list[bool]:
        if not entries:
            return []
        firsts = {e.update_key: i for i, e in reversed(list(enumerate(entries)))}
        unique = [entries[i] for i in sorted(firsts.values())]
        lease = min(self.admit_lease, retention)
        claims, now = await asyncio.gather(
            self._store.claim_many(
                [e.update_key for e in unique], lease=lease, retention=retention
            ),
            self._store.now(),
        )
        won = [(e, c) for e, c in zip(unique, claims, strict=True) if c.outcome is Outcome.ACQUIRED]
        if won:
            await self._publish(won, now, retention)
        admitted = {e.update_key for e, _ in won}
        return [
            e.update_key in admitted and firsts[e.update_key] == i for i, e in enumerate(entries)
        ]

    async def _publish(
        self, won: list[tuple[NewEntry, Claim]], now: float, retention: float
    ) -> None:
        """Publish each claimed entry and wait for its PubAck, then record the guards
        admitted; on a failure, give back the claims not published and raise."""

        async def send() -> list[PubAck | BaseException]:
            js = await self._conn.js()
            futures = []
            for e, _ in won:
                unit = logic.ordering_unit(e)
                futures.append(
                    await js.publish_async(
                        self.layout.subject(e.update_key, unit),
                        e.payload,
                        headers={
                            "Nats-Msg-Id": message_id(e.update_key),
                            H_ID: e.update_key,
                            H_UNIT: unit,
                            H_ADMITTED: repr(now),
                        },
                    )
                )
            timeout = self._conn.settings.timeout
            return list(
                await asyncio.gather(
                    *(asyncio.wait_for(f, timeout) for f in futures), return_exceptions=True
                )
            )

        try:
            acks = await self._conn.call("inbox.admit", send)
        except BaseException:
            await self._give_back([c for _, c in won], [e for e, _ in won])
            raise
        failed = [(e, c) for (e, c), a in zip(won, acks, strict=True) if not isinstance(a, PubAck)]
        sent = [(e, c, a) for (e, c), a in zip(won, acks, strict=True) if isinstance(a, PubAck)]
        dups = [(e, a) for e, _, a in sent if a.duplicate]
        if dups:
            await self._conn.call("inbox.admit", lambda: self._refresh(dups, now))
        await asyncio.gather(
            *(
                self._store.complete(e.update_key, c.token, b"null", retention=retention)
                for e, c, _ in sent
            )
        )
        if failed:
            await self._give_back([c for _, c in failed], [e for e, _ in failed])
            error = next(a for a in acks if not isinstance(a, PubAck))
            assert isinstance(error, BaseException)

            async def reraise() -> None:
                raise error

            await self._conn.call("inbox.admit", reraise)

    async def _give_back(self, claims: list[Claim], entries: list[NewEntry]) -> None:
        """Release claims whose entry was not published, so Telegram's re-delivery is
        admitted at once (if the store cannot answer either, their lease ends them)."""
        for e, c in zip(entries, claims, strict=True):
            try:
                await self._store.release(e.update_key, c.token)
            except Exception as exc:  # the admission's own error is what the caller sees
                log.warning("could not give back the claim of %s: %s", e.update_key, exc)

    async def _refresh(self, dups: list[tuple[NewEntry, PubAck]], now: float) -> None:
        """An update admitted again (its guard had expired) whose message is still
        within the dedup window: its entry, if still pending, counts from now."""
        kv = await self._conn.kv()
        for e, _ in dups:
            key = JetStreamLayout.entry_key(e.update_key)
            known = await self._fresh(key)
            if known is None or known.state.status != EntryStatus.PENDING:
                continue
            refreshed = replace(known.state, attempts=0, admitted_at=now, available_at=now)
            with contextlib.suppress(_CAS):
                rev = await kv.update(key, refreshed.encode(), last=known.revision)
                if self._view is not None:
                    self._view.note(key, rev, refreshed)

    # ------------------------------------------------------------------ workers

    async def take(self, *, lease: float) -> InboxEntry | None:
        async def run() -> InboxEntry | None:
            view, now = await asyncio.gather(self._known(), self._store.now())
            await self._sweep(view, now)
            buried = True
            while buried:  # a head buried by the redelivery limit frees its unit: again
                buried = False
                for state in candidates((k.state for k in view.known.values()), now):
                    key = JetStreamLayout.entry_key(state.id)
                    known = view.known.get(key)
                    if known is None or key in self._trying:
                        continue
                    self._trying.add(key)
                    try:
                        got = await self._lease(key, known, now, lease)
                    finally:
                        self._trying.discard(key)
                    if isinstance(got, InboxEntry):
                        return got
                    if got is _BURIED:
                        buried = True
                        break
            return None

        return await self._conn.call("inbox.take", run)

    async def _lease(
        self, key: str, known: Known, now: float, lease: float
    ) -> InboxEntry | object | None:
        """The entry leased; :data:`_BURIED` if the limit or a lost message buried it
        instead; ``None`` if another taker changed it first."""
        state = known.state
        if self.max_deliver is not None and state.attempts >= self.max_deliver:
            error = f"redelivery limit: taken {state.attempts} times (max_deliver)"
            dead = replace(
                state, status=EntryStatus.DEAD.value, last_error=state.last_error or error
            )
            return _BURIED if await self._write(key, known, dead) else None
        held = state.taken(now, lease)
        rev = await self._write_rev(key, known, held)
        if rev is None:
            return None
        # nats-server before 2.9.21 checks a write's expected revision before it stores
        # it, outside the store's lock (nats-server issue 4320): two takers' concurrent
        # compare-and-sets of one revision can both be accepted, the later overwriting
        # the earlier. Read the entry back: only the taker whose write is the latest holds
        # it (nobody else writes a held entry within its lease).
        fresh = await self._fresh(key)
        if fresh is None or fresh.revision != rev:
            return None
        payload = await self._payload(state.seq)
        if payload is None:
            assert self._view is not None
            current = self._view.known[key]
            gone = replace(
                held,
                status=EntryStatus.DEAD.value,
                last_error="its message is gone from the stream",
            )
            await self._write(key, current, gone)
            return _BURIED
        return held.entry(payload)

    async def _sweep(self, view: View, now: float) -> None:
        """Delete tombstones older than ``tombstone_age`` (at most every tenth of it)."""
        if now - self._swept_at < self.tombstone_age / 10:
            return
        self._swept_at = now
        kv = await self._conn.kv()
        old = [
            (key, k.revision)
            for key, k in list(view.known.items())
            if k.state.status == DONE and k.state.done_at < now - self.tombstone_age
        ]
        for key, revision in old:
            with contextlib.suppress(_CAS):
                await kv.delete(key, last=revision)

    async def ack(self, entry: InboxEntry) -> bool:
        done = await self._held(entry, lambda s, now: s.tombstone(now), "inbox.ack")
        if done:
            await self._conn.call("inbox.ack", lambda: self._delete_msg(entry.seq))
        return done

    async def retry(
        self, entry: InboxEntry, *, delay: float, error: str, refund: bool = False
    ) -> bool:
        def back(s: State, now: float) -> State:
            return replace(
                s,
                status=EntryStatus.PENDING.value,
                attempts=max(s.attempts - 1, 0) if refund else s.attempts,
                available_at=now + delay,
                lease_expires_at=0.0,
                last_error=storable_text(error),
            )

        return await self._held(entry, back, "inbox.retry")

    async def bury(self, entry: InboxEntry, *, error: str) -> bool:
        return await self._held(
            entry,
            lambda s, now: replace(
                s, status=EntryStatus.DEAD.value, last_error=storable_text(error)
            ),
            "inbox.bury",
        )

    async def extend(self, entry: InboxEntry, *, lease: float) -> bool:
        return await self._held(
            entry, lambda s, now: replace(s, lease_expires_at=now + lease), "inbox.extend"
        )

    # ------------------------------------------------------------------ dead letters

    async def redrive(self, entry_id: str) -> bool:
        async def run() -> bool:
            view = await self._known()
            key = JetStreamLayout.entry_key(entry_id)
            known = view.known.get(key)
            if known is None or known.state.status != EntryStatus.DEAD:
                return False
            payload = await self._payload(known.state.seq)
            if payload is None:
                return False
            s = known.state
            js = await self._conn.js()
            ack = await js.publish(
                self.layout.subject(s.id, s.unit),
                payload,
                headers={
                    "Nats-Msg-Id": f"{message_id(s.id)}:r{known.revision}",
                    H_ID: s.id,
                    H_UNIT: s.unit,
                    H_ADMITTED: repr(s.admitted_at),
                    H_REDRIVE: "1",
                },
            )
            now = await self._store.now()
            back = replace(
                s,
                seq=ack.seq,
                status=EntryStatus.PENDING.value,
                attempts=0,
                available_at=now,
                lease_expires_at=0.0,
            )
            if not await self._write(key, known, back):
                await self._delete_msg(ack.seq)
                return False
            await self._delete_msg(s.seq)
            return True

        return await self._conn.call("inbox.redrive", run)

    async def drop(self, entry_id: str) -> bool:
        async def run() -> bool:
            view = await self._known()
            key = JetStreamLayout.entry_key(entry_id)
            known = view.known.get(key)
            if known is None or known.state.status != EntryStatus.DEAD:
                return False
            if not await self._write(key, known, known.state.tombstone(await self._store.now())):
                return False
            await self._delete_msg(known.state.seq)
            return True

        return await self._conn.call("inbox.drop", run)

    # ------------------------------------------------------------------ reads

    async def _states(self) -> list[State]:
        view = await self._known()
        return sorted(
            (k.state for k in view.known.values() if k.state.status != DONE), key=lambda s: s.seq
        )

    async def _with_payloads(self, states: list[State]) -> list[InboxEntry]:
        payloads = await asyncio.gather(*(self._payload(s.seq) for s in states))
        return [s.entry(p or b"") for s, p in zip(states, payloads, strict=True)]

    async def dead_letters(self, *, limit: int = 100) -> list[InboxEntry]:
        return await self.entries(status=EntryStatus.DEAD, limit=limit)

    async def depth(self) -> int:
        async def run() -> int:
            return sum(1 for s in await self._states() if s.live)

        return await self._conn.call("inbox.depth", run)

    async def get(self, entry_id: str) -> InboxEntry | None:
        async def run() -> InboxEntry | None:
            view = await self._known()
            known = view.known.get(JetStreamLayout.entry_key(entry_id))
            if known is None or known.state.status == DONE:
                return None
            return (await self._with_payloads([known.state]))[0]

        return await self._conn.call("inbox.get", run)

    async def entries(
        self,
        *,
        status: EntryStatus | None = None,
        ordering_key: str | None = None,
        limit: int = 100,
    ) -> list[InboxEntry]:
        check_limit(limit)

        async def run() -> list[InboxEntry]:
            chosen = [
                s
                for s in await self._states()
                if (status is None or s.status == status)
                and (ordering_key is None or s.unit == ordering_key)
            ]
            return await self._with_payloads(chosen[:limit])

        return await self._conn.call("inbox.entries", run)

    async def stats(self) -> InboxStats:
        async def run() -> InboxStats:
            states, now = await asyncio.gather(self._states(), self._store.now())
            return logic.stats_of((s.entry() for s in states), now)

        return await self._conn.call("inbox.stats", run)

    async def backlog(self, *, limit: int = 100) -> list[UnitBacklog]:
        check_limit(limit)

        async def run() -> list[UnitBacklog]:
            return logic.backlog_of((s.entry() for s in await self._states()), limit)

        return await self._conn.call("inbox.backlog", run)

    async def close(self) -> None:
        """Stop following the state bucket (the connection is the store's to close)."""
        view, self._view = self._view, None
        if view is not None:
            await view.close()
