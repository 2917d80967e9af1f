"""The JetStream inbox's own behaviour beyond the contract (tests/stores/test_jetstream_inbox.py
runs the contract): the claim store refusing a duplicate the broker's dedup window no
longer catches, a second message of one entry run once, the redelivery limit, a broker
restart (a private nats-server stopped mid-run), a worker process killed with SIGKILL
while it holds entries, and the webhook + worker end to end on JetStream."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import nats
import pytest
from aiogram import Bot, Dispatcher
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.types import Message
from aiohttp import web
from fixtures_nats import NatsServer, wrap

from telegram_idem import Idem, idempotent
from telegram_idem._clock import ManualClock
from telegram_idem._records import Outcome, Status
from telegram_idem.adapters.aiogram import IdempotencyMiddleware, inbox_dispatch
from telegram_idem.backends import store_from_url
from telegram_idem.backends.nats import JetStreamStore
from telegram_idem.errors import StoreError
from telegram_idem.inbox import EntryStatus, NewEntry
from telegram_idem.inbox._worker import InboxWorker
from telegram_idem.ingress._webhook import WebhookIngress
from telegram_idem.testing._delivery import TelegramDelivery, load_fixture
from telegram_idem.testing._loopback import serve_app
from telegram_idem.testing.bot_api import FakeBotAPI

pytestmark = pytest.mark.nats

RETENTION = 3600.0
LEASE = 30.0
TOKEN = "7000000001:AAjetstream"
SECRET = "jetstream-secret"


def entry(update_id: int, chat: str | None = "chat:1") -> NewEntry:
    payload = json.dumps({"update_id": update_id, "message": {"text": str(update_id)}}).encode()
    return NewEntry(f"idem:7:u:{update_id}", chat, payload)


async def test_a_duplicate_after_the_dedup_window_is_refused_by_the_claim_store(
    idem_nats_url: str, jetstream_stream: str, tmp_path: Path, idem_clock: ManualClock
) -> None:
    store = wrap(
        store_from_url(f"sqlite:///{tmp_path / 'claims.db'}", clock=idem_clock),
        idem_nats_url,
        jetstream_stream,
        duplicate_window=0.2,
    )
    try:
        inbox = store.inbox()
        assert await inbox.admit(entry(1), retention=RETENTION)
        await asyncio.sleep(0.5)  # the broker's window (0.2 s, real time) is over
        nc = await nats.connect(idem_nats_url)
        try:  # the broker alone no longer knows the message id
            ack = await nc.jetstream().publish(
                f"{jetstream_stream}.probe", b"", headers={"Nats-Msg-Id": "7:1"}
            )
            assert not ack.duplicate
        finally:
            await nc.close()
        assert not await inbox.admit(entry(1), retention=RETENTION)  # the claim store says no
        record = await store.get("idem:7:u:1")
        assert record is not None and record.status is Status.COMPLETED
        assert await inbox.depth() == 1
    finally:
        await store.close()


async def test_a_second_message_of_one_entry_runs_once(
    idem_nats_url: str, jetstream_store: JetStreamStore, jetstream_stream: str
) -> None:
    """Published, then the process died before recording the guard; Telegram re-sent it
    after the dedup window: the stream holds two messages of one update."""
    inbox = jetstream_store.inbox()
    assert await inbox.admit(entry(1), retention=RETENTION)
    nc = await nats.connect(idem_nats_url)
    try:
        first = await nc.jetstream().get_msg(jetstream_stream, 1)
        again = await nc.jetstream().publish(
            first.subject or "", first.data or b"", headers=dict(first.headers or {})
        )
        assert again.duplicate  # inside the window the broker drops it itself...
        headers = dict(first.headers or {})
        headers["Nats-Msg-Id"] = "7:1:beyond-the-window"
        await nc.jetstream().publish(first.subject or "", first.data or b"", headers=headers)
    finally:
        await nc.close()
    taken = await inbox.take(lease=LEASE)  # ...beyond it, the inbox runs one of the two
    assert taken is not None and taken.id == "idem:7:u:1"
    assert await inbox.take(lease=LEASE) is None
    assert await inbox.ack(taken)
    assert await inbox.take(lease=LEASE) is None
    assert await inbox.depth() == 0


async def test_the_redelivery_limit_makes_a_dead_letter(
    idem_nats_url: str, jetstream_stream: str, tmp_path: Path, idem_clock: ManualClock
) -> None:
    store = wrap(
        store_from_url(f"sqlite:///{tmp_path / 'claims.db'}", clock=idem_clock),
        idem_nats_url,
        jetstream_stream,
        max_deliver=2,
    )
    try:
        inbox = store.inbox()
        await inbox.admit(entry(1, "chat:a"), retention=RETENTION)
        await inbox.admit(entry(2, "chat:a"), retention=RETENTION)
        for attempt in (1, 2):
            taken = await inbox.take(lease=LEASE)
            assert taken is not None and (taken.id, taken.attempts) == ("idem:7:u:1", attempt)
            if attempt == 1:
                assert await inbox.retry(taken, delay=0, error="boom")
        idem_clock.advance(LEASE + 1)  # the second taker died: its lease ends
        nxt = await inbox.take(lease=LEASE)  # entry 1 is buried, its chat moves on
        assert nxt is not None and nxt.id == "idem:7:u:2"
        [dead] = await inbox.dead_letters()
        assert (dead.id, dead.status, dead.attempts) == ("idem:7:u:1", EntryStatus.DEAD, 2)
        assert dead.last_error is not None and "boom" in dead.last_error
        assert json.loads(dead.payload)["update_id"] == 1
        assert await inbox.redrive(dead.id)
        assert await inbox.ack(nxt)
        back = await inbox.take(lease=LEASE)
        assert back is not None and back.id == dead.id and back.attempts == 1
    finally:
        await store.close()


# ----------------------------------------------------------------- broker restart


async def test_a_broker_restart_loses_nothing_and_runs_each_update_once(
    private_nats: NatsServer, tmp_path: Path
) -> None:
    store = wrap(
        store_from_url(f"sqlite:///{tmp_path / 'claims.db'}"),
        private_nats.url,
        "restart",
        timeout=1.0,
    )
    idem = Idem(store)
    ingress = WebhookIngress(idem, bot_id=7, secret_token=SECRET)
    app = web.Application()
    app.router.add_post("/webhook", ingress.handle)
    runner, base = await serve_app(app)

    async def post(update_id: int) -> int:
        body = json.dumps(
            {
                "update_id": update_id,
                "message": {
                    "message_id": update_id,
                    "date": 0,
                    "chat": {"id": update_id % 3, "type": "private"},
                    "text": "hi",
                },
            }
        )
        headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{base}/webhook", data=body, headers=headers) as resp,
        ):
            return resp.status

    try:
        inbox = store.inbox()
        assert [await post(u) for u in (1, 2, 3)] == [200, 200, 200]
        first = await inbox.take(lease=LEASE)
        assert first is not None
        private_nats.stop()
        assert [await post(u) for u in (4, 5)] == [503, 503]  # not admitted: Telegram re-sends
        with pytest.raises(StoreError):
            await inbox.take(lease=LEASE)
        for u in (4, 5):  # the claims were given back, not left to run out their lease
            record = await store.get(idem.keys.update(7, u))
            assert record is not None and record.lease_expires_at <= await store.now()
        private_nats.start()
        assert [await post(u) for u in (4, 5, 1)] == [200, 200, 200]  # 1: a duplicate
        assert await inbox.ack(first)
        seen = [first.id]
        for _ in range(20):
            taken = await inbox.take(lease=LEASE)
            if taken is None:
                break
            seen.append(taken.id)
            assert await inbox.ack(taken)
        assert sorted(seen) == sorted(idem.keys.update(7, u) for u in (1, 2, 3, 4, 5))
        assert await inbox.depth() == 0
    finally:
        await runner.cleanup()
        await idem.close()


# ----------------------------------------------------------------- consumer kill

_HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    from telegram_idem.backends import store_from_url
    from telegram_idem.backends.nats import with_jetstream_inbox

    async def main() -> None:
        db, nats_url, stream, effects, n = sys.argv[1:6]
        store = with_jetstream_inbox(store_from_url(db), url=nats_url, stream=stream, partitions=4)
        inbox = store.inbox()
        held = 0
        while held < int(n):
            taken = await inbox.take(lease=1.0)
            if taken is None:
                await asyncio.sleep(0.05)
                continue
            claim = await store.claim("effect:" + taken.id, lease=60, retention=3600)
            await store.complete("effect:" + taken.id, claim.token, b"1", retention=3600)
            with open(effects, "a") as f:
                f.write(taken.id + "\\n")
            held += 1
            print("took", taken.id, flush=True)
        await asyncio.sleep(3600)  # holds them, never acks: killed here

    asyncio.run(main())
    """
)


async def test_a_worker_killed_holding_entries_leaves_them_to_another_after_the_lease(
    idem_nats_url: str, jetstream_stream: str, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'claims.db'}"
    effects = tmp_path / "effects.txt"
    store = wrap(store_from_url(db), idem_nats_url, jetstream_stream)
    try:
        inbox = store.inbox()
        for uid in (1, 2, 3):
            assert await inbox.admit(entry(uid, f"chat:{uid}"), retention=RETENTION)
        holder = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _HOLDER,
            db,
            idem_nats_url,
            jetstream_stream,
            str(effects),
            "3",
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        try:
            assert holder.stdout is not None
            took = [(await holder.stdout.readline()).decode().split()[1] for _ in range(3)]
            assert sorted(took) == ["idem:7:u:1", "idem:7:u:2", "idem:7:u:3"]
            assert await inbox.take(lease=LEASE) is None  # all three are held
        finally:
            holder.send_signal(signal.SIGKILL)  # kill -9 while it holds them
            await holder.wait()
        again: list[str] = []
        for _ in range(200):  # their 1 s leases end (real time): each is taken again
            taken = await inbox.take(lease=LEASE)
            if taken is None:
                await asyncio.sleep(0.05)
                continue
            assert taken.attempts == 2
            claim = await store.claim("effect:" + taken.id, lease=60, retention=3600)
            assert claim.outcome is Outcome.REPLAY  # done once already: not done again
            assert await inbox.ack(taken)
            again.append(taken.id)
            if len(again) == 3:
                break
        assert sorted(again) == sorted(took)
        assert sorted(effects.read_text().split()) == sorted(took)  # each effect once
        assert await inbox.depth() == 0
    finally:
        await store.close()


# ----------------------------------------------------------------- end to end


@pytest.fixture
async def jetstream_idem(
    idem_nats_url: str, jetstream_stream: str, tmp_path: Path
) -> AsyncIterator[Idem]:
    guard = Idem(
        wrap(store_from_url(f"sqlite:///{tmp_path / 'bot.db'}"), idem_nats_url, jetstream_stream)
    )
    yield guard
    await guard.close()


async def test_webhook_and_worker_on_jetstream_run_20_deliveries_once(jetstream_idem: Idem) -> None:
    idem = jetstream_idem
    bodies: list[int] = []
    async with FakeBotAPI() as api:
        bot = Bot(TOKEN, session=AiohttpSession(api=TelegramAPIServer.from_base(api.url)))
        dp = Dispatcher()
        dp.update.outer_middleware(IdempotencyMiddleware(idem))

        @dp.message()
        @idempotent(key="post:{chat_id}:{message_id}")
        async def on_message(message: Message) -> int:
            bodies.append(message.message_id)
            return message.message_id

        worker = InboxWorker(idem.store.inbox(), inbox_dispatch(dp, bot), poll_interval=0.01)
        ingress = WebhookIngress(
            idem, bot_id=bot.id, secret_token=SECRET, on_admitted=worker.notify
        )
        app = web.Application()
        app.router.add_post("/webhook", ingress.handle)
        runner, base = await serve_app(app)
        worker.start()
        try:
            async with TelegramDelivery(f"{base}/webhook", secret_token=SECRET) as tg:
                reports = await tg.deliver_concurrently(load_fixture("techpost_command"), 20)
            # A delivery that lands while the first one publishes finds the update's claim
            # in progress (the guard is recorded only after the PubAck): 503, and
            # Telegram's re-send is then a duplicate. Every delivery ends acknowledged.
            assert all(r.statuses[-1] == 200 for r in reports)
            assert all(set(r.statuses) <= {200, 503} for r in reports)
            assert ingress.admitted == 1
            await worker.drain(limit=30)
        finally:
            await worker.stop()
            await runner.cleanup()
            await bot.session.close()
    assert bodies == [4121]
