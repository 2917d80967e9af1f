"""Several replicas polling one bot: a fenced leader lease lets exactly one call
``getUpdates`` (the fake answers 409 to two at once, as Telegram does), another takes
over when the leader stops, and the stored offset never moves back across leaders."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from poll_replica import http_get_updates
from store_proxy import Proxy

from telegram_idem import ConfigurationError, Idem, KeyBuilder
from telegram_idem._clock import ManualClock
from telegram_idem.backends import Store, ledger_of
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.ingress import LeaderLease, PollingIngress
from telegram_idem.ingress._leader import Leadership, NotLeaderError
from telegram_idem.testing._factories import UpdateFactory
from telegram_idem.testing.bot_api import FakeBotAPI

TOKEN = "7000000002:AAleader"
BOT = 7000000002
LEASE = LeaderLease(lease=2.0, renew_every=0.25, margin=0.5, check_every=0.25)
BOUND = 30.0
"""How long a test waits for a condition (a hang guard, not a speed check)."""


async def until(condition: Any, bound: float = BOUND) -> None:
    async with asyncio.timeout(bound):
        while not condition():
            await asyncio.sleep(0.02)


def polls(api: FakeBotAPI) -> list[tuple[str, int | None]]:
    """``(replica, offset)`` of every getUpdates the fake received, in arrival order."""
    return [
        (str(c.params.get("replica")), c.params.get("offset"))
        for c in api.calls
        if c.method.lower() == "getupdates"
    ]


def assert_offsets_never_move_back(offsets: list[int | None]) -> None:
    seen = [o for o in offsets if o is not None]
    assert seen == sorted(seen), seen
    first = next((i for i, o in enumerate(offsets) if o is not None), len(offsets))
    assert None not in offsets[first:], "a leader resumed without the stored offset"


# ------------------------------------------------------------------ configuration


def test_a_long_poll_that_could_outlive_the_lease_is_refused() -> None:
    idem = Idem(MemoryStore())
    with pytest.raises(ConfigurationError, match="exceeds the leader lease"):
        PollingIngress(idem, _never, bot_id=BOT, poll_timeout=25.0, leader=LeaderLease(lease=30))
    with pytest.raises(ConfigurationError, match="must be > 0"):
        PollingIngress(idem, _never, bot_id=BOT, leader=LeaderLease(lease=40, renew_every=0))
    PollingIngress(
        idem, _never, bot_id=BOT, poll_timeout=25.0, leader=LeaderLease()
    )  # defaults fit


async def _never(offset: int | None, limit: int, timeout: float) -> list[dict[str, Any]]:  # noqa: ASYNC109
    raise AssertionError("not called")


# ------------------------------------------------------------------ the fence, every store


async def test_a_stale_leader_can_neither_write_the_offset_nor_poll(
    store_factory: Any, clock: ManualClock
) -> None:
    """A leader whose lease ended and was taken over (it was paused: its clock and its
    renewals stood still) is refused: its renewal, its offset write, its next poll."""
    store: Store = await store_factory()  # one store object: the memory store's records
    a = Leadership(Idem(store), bot_id=BOT, config=LeaderLease(lease=10, holder="a"))
    b = Leadership(Idem(store), bot_id=BOT, config=LeaderLease(lease=10, holder="b"))
    assert await a.try_acquire() is None
    assert await b.try_acquire() is not None  # b stands by
    assert await a.write_offset(100)
    clock.advance(11)  # a paused past its lease: no renewal landed
    assert await b.try_acquire() is None  # takeover
    assert b.token is not None and a.token is not None and b.token > a.token
    assert b.stored_offset == 100  # b resumes where a stopped
    assert await b.write_offset(120)

    assert not await a.write_offset(105)  # the stale write is refused ...
    assert not a.leading  # ... and a knows it lost
    with pytest.raises(NotLeaderError):
        a.deadline(0.5)  # no getUpdates with that token again
    assert await b.read_offset() == 120  # the stored offset did not move back
    assert await a.read_offset() == 120
    assert b.leading
    await b.step_down()


async def test_a_leader_whose_lease_was_taken_over_learns_it_at_its_next_renewal(
    store_factory: Any, clock: ManualClock
) -> None:
    store: Store = await store_factory()
    a = Leadership(Idem(store), bot_id=BOT, config=LeaderLease(lease=10))
    b = Leadership(Idem(store), bot_id=BOT, config=LeaderLease(lease=10))
    assert await a.try_acquire() is None
    clock.advance(11)
    assert await b.try_acquire() is None
    assert not await a._renew()
    assert a.lost.is_set()
    with pytest.raises(NotLeaderError):
        a.deadline(0.0)
    await b.step_down()


@pytest.mark.inbox
async def test_a_standby_poll_once_does_not_poll(store_factory: Any, clock: ManualClock) -> None:
    store: Store = await store_factory()
    holder = Leadership(Idem(store), bot_id=BOT, config=LEASE)
    assert await holder.try_acquire() is None
    called: list[int | None] = []

    async def get_updates(offset: int | None, limit: int, timeout: float) -> list[Any]:  # noqa: ASYNC109
        called.append(offset)
        return []

    standby = PollingIngress(Idem(store), get_updates, bot_id=BOT, poll_timeout=0.5, leader=LEASE)
    assert await standby.poll_once() == 0
    assert called == []  # it never called getUpdates
    await holder.step_down()
    assert await standby.poll_once() == 0  # it leads now, and polls
    assert called == [None]
    assert standby.leadership is not None
    await standby.leadership.step_down()


@pytest.mark.inbox
async def test_the_offset_row_is_not_an_unresolved_effect(
    store_factory: Any, clock: ManualClock
) -> None:
    idem = Idem(await store_factory())
    lead = Leadership(idem, bot_id=BOT, config=LEASE)
    assert await lead.try_acquire() is None
    assert await lead.write_offset(7)
    assert (await ledger_of(idem.store).get(lead.key)) is not None
    assert await idem.unresolved() == []
    assert await idem.oldest_unresolved_age() is None


# ------------------------------------------------------------------ replicas in one process


@pytest.fixture
async def shared(tmp_path: Path) -> AsyncIterator[str]:
    yield f"sqlite:///{tmp_path / 'shared.db'}"


async def _replicas(
    url: str, api: FakeBotAPI, session: aiohttp.ClientSession, names: list[str], leader: bool
) -> dict[str, tuple[PollingIngress, asyncio.Event, asyncio.Task[None]]]:
    running = {}
    for name in names:
        idem = Idem(url, keys=KeyBuilder("leader-test"))
        polling = PollingIngress(
            idem,
            http_get_updates(session, api.url, TOKEN, name),
            bot_id=BOT,
            poll_timeout=0.5,
            error_delay=0.05,
            error_delay_max=0.2,
            leader=LeaderLease(lease=2.0, renew_every=0.25, margin=0.5, holder=name)
            if leader
            else None,
        )
        stop = asyncio.Event()
        running[name] = (polling, stop, asyncio.create_task(polling.run(stop)))
    return running


async def _admitted_ids(url: str) -> Counter[int]:
    idem = Idem(url, keys=KeyBuilder("leader-test"))
    try:
        entries = await idem.store.inbox().entries(limit=10_000)
        return Counter(json.loads(e.payload)["update_id"] for e in entries)
    finally:
        await idem.close()


async def test_three_replicas_one_polls_and_another_takes_over_when_it_stops(
    shared: str,
) -> None:
    factory = UpdateFactory()
    async with FakeBotAPI() as api, aiohttp.ClientSession() as session:
        replicas = await _replicas(shared, api, session, ["r1", "r2", "r3"], leader=True)
        try:
            first = [factory.message(f"m{i}") for i in range(20)]
            for update in first:
                api.queue_update(update)
            await until(lambda: any(p.admitted >= 20 for p, _, _ in replicas.values()))
            leaders = {name for name, _ in polls(api)}
            assert len(leaders) == 1, leaders  # one replica polled, the others stood by
            (leader,) = leaders
            _, stop, task = replicas[leader]
            stop.set()
            await task  # a clean stop releases the lease
            second = [factory.message(f"n{i}") for i in range(20)]
            for update in second:
                api.queue_update(update)
            await until(lambda: sum(p.admitted for p, _, _ in replicas.values()) >= 40)
            after = {name for name, _ in polls(api)} - {leader}
            assert len(after) == 1, after  # exactly one took over
        finally:
            for _, stop, _task in replicas.values():
                stop.set()
            await asyncio.gather(*(t for _, _, t in replicas.values()))
        assert api.poll_conflicts == 0
        assert_offsets_never_move_back([o for _, o in polls(api)])
    counts = await _admitted_ids(shared)
    expected = {u["update_id"] for u in first + second}
    assert set(counts) == expected and set(counts.values()) == {1}


async def test_without_the_lease_two_replicas_meet_409_conflicts(shared: str) -> None:
    """The check above can fail: replicas that poll unconditionally end each other's
    long polls, as on Telegram."""
    async with FakeBotAPI() as api, aiohttp.ClientSession() as session:
        replicas = await _replicas(shared, api, session, ["r1", "r2"], leader=False)
        try:
            await until(lambda: api.poll_conflicts > 0)
        finally:
            for _, stop, _task in replicas.values():
                stop.set()
            await asyncio.gather(*(t for _, _, t in replicas.values()))


async def test_a_leader_cut_off_from_the_store_stops_polling_and_a_standby_takes_over(
    redis_url_factory: Any,
) -> None:
    """The leader's renewals fail (its connection to the store is cut): it makes no
    new ``getUpdates`` from its first failed renewal on; its lease ends and the standby
    (still connected) takes over; back online, the old leader learns it lost."""
    url = redis_url_factory()
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    proxy = Proxy(parts.hostname, parts.port)
    await proxy.start()
    cut_url = url.replace(parts.netloc, f"127.0.0.1:{proxy.port}", 1)
    cut_url += ("&" if "?" in cut_url else "?") + "socket_timeout=0.3&socket_connect_timeout=0.3"
    lease = LeaderLease(lease=2.0, renew_every=0.25, margin=0.5, check_every=0.25)
    async with FakeBotAPI() as api, aiohttp.ClientSession() as session:
        a = PollingIngress(
            Idem(cut_url, keys=KeyBuilder("cut")),
            http_get_updates(session, api.url, TOKEN, "a"),
            bot_id=BOT,
            poll_timeout=0.5,
            error_delay=0.05,
            error_delay_max=0.2,
            leader=lease,
        )
        b = PollingIngress(
            Idem(url, keys=KeyBuilder("cut")),
            http_get_updates(session, api.url, TOKEN, "b"),
            bot_id=BOT,
            poll_timeout=0.5,
            error_delay=0.05,
            error_delay_max=0.2,
            leader=lease,
        )
        stop_a, stop_b = asyncio.Event(), asyncio.Event()
        task_a = asyncio.create_task(a.run(stop_a))
        await until(lambda: ("a", None) in polls(api))
        task_b = asyncio.create_task(b.run(stop_b))
        try:
            await asyncio.sleep(0.5)  # b stands by a while
            assert {name for name, _ in polls(api)} == {"a"}
            await proxy.cut()
            assert a.leadership is not None
            await until(lambda: not a.leadership.renewed)
            polled_by_a = sum(1 for name, _ in polls(api) if name == "a")
            await until(lambda: any(name == "b" for name, _ in polls(api)))  # takeover
            await proxy.start()  # restored on the same port
            await until(lambda: a.leadership.lost.is_set())
            api.queue_update(UpdateFactory().message("after"))
            await until(lambda: b.admitted >= 1)
            assert sum(1 for name, _ in polls(api) if name == "a") == polled_by_a
        finally:
            stop_a.set()
            stop_b.set()
            await asyncio.gather(task_a, task_b)
            await a.idem.close()
            await b.idem.close()
            await proxy.cut()
        assert api.poll_conflicts == 0
        assert_offsets_never_move_back([o for _, o in polls(api)])
