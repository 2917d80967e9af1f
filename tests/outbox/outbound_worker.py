"""A bot process of the outbound store tests (tests/outbox/test_outbound_stores.py), run as
``python outbound_worker.py <mode> --url STORE --api FAKE_URL ...`` and killed with
SIGKILL by the test:

- ``relay``: a relay on the store's outbox, paced by its flood budget, sending to the fake
  Bot API; prints ``ready`` once it runs, then runs until killed (or SIGTERM);
- ``action``: binds an update and runs an ``@idempotent`` action that makes one
  ``Outbound.call`` (``sendMessage`` to chat 1), prints ``sent <result JSON>`` when the
  call returned (it is delivered and recorded) and then never completes, as an action
  killed before it could finish;
- ``commit``: the bot's own transaction on the store's database (sqlite3 on a SQLite
  file, asyncpg on PostgreSQL ``--dsn``): inserts order 1 into ``--table`` and enqueues
  ``sendMessage`` "order 1 placed" (key ``order:1``) with ``conn=``, commits (or rolls
  back with ``--rollback``), prints ``committed`` / ``rolled back`` and then waits to be
  killed: no relay ever ran in it;
- ``step``: like ``action``, but the call is made inside ``idem.step("announce", ...)``,
  and the process waits to be killed after ``sent`` and before the step returns (so the
  step never records);
- ``pace``: no outbox: paces ``sendMessage`` then ``editMessageText`` of it to the group
  ``--chat`` through FloodControl's default limits on the store's shared budget and sends
  them straight to the fake Bot API, ``--count`` times; prints ``waited <seconds>`` (what
  FloodControl reported) and ``done``.

Settings are short (a lease of ``--lease`` seconds, polls of 50 ms) so a test waits little
for a dead process's lease to end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

from telegram_idem import Idem, bind_update, idempotent
from telegram_idem.backends import store_from_url
from telegram_idem.flood import FloodControl, Limits, Rate
from telegram_idem.outbox import HttpBotAPI, Outbound, Relay
from telegram_idem.outbox._transport import bot_id_of_token

UNPACED = Limits(
    global_=Rate(10_000, 1.0, burst=10_000),
    chat=Rate(10_000, 1.0, burst=10_000),
    group=Rate(10_000, 1.0, burst=10_000),
)
"""Budgets that never make a call wait (the pause gate of a 429 still closes)."""

TELEGRAM: Limits | None = None
"""FloodControl's default (Telegram's guidance with smaller bursts; the fake enforces
``Limits()`` itself)."""


def relay_of(store: Any, args: argparse.Namespace) -> Relay:
    bot_id = bot_id_of_token(args.token)
    limits = TELEGRAM if args.limits == "telegram" else UNPACED
    return Relay(
        store.outbox(),
        HttpBotAPI(args.token, base_url=args.api, timeout=args.timeout),
        bot_id=bot_id,
        flood=FloodControl.for_store(store, bot_id=bot_id, limits=limits),
        lease=args.lease,
        poll_interval=0.05,
        backoff_base=0.05,
        backoff_max=0.5,
        concurrency=args.concurrency,
    )


async def run_relay(args: argparse.Namespace) -> None:
    store = store_from_url(args.url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    relay = relay_of(store, args)
    # No warm-up call of our own: the relay awaits HttpBotAPI.warm() before its first
    # take (aiohttp imported, the session made), so its first requests do not leave late
    # after their flood reservations and arrive bunched up with later ones (a 429).
    async with relay:
        print("ready", flush=True)
        await stop.wait()
    await relay.api.close()  # type: ignore[attr-defined]
    await store.close()


def outbound_of(idem: Idem, relay: Relay) -> Outbound:
    """The action side's sender: its calls go to ``relay``'s outbox and API, keyed by
    ``idem``'s key builder."""
    return Outbound(
        idem.store.outbox(),
        relay.api,
        bot_id=relay.bot_id,
        flood=relay.flood,
        keys=idem.keys,
        relay=relay,
    )


async def run_action(args: argparse.Namespace) -> None:
    idem = Idem(args.url, lease=args.lease)
    relay = relay_of(idem.store, args)
    out = outbound_of(idem, relay)

    @idempotent(key="order:{message_id}")
    async def place_order(update: dict[str, Any]) -> Any:
        message = await out.call("sendMessage", {"chat_id": 1, "text": "order placed"})
        print("sent " + json.dumps(message), flush=True)
        await asyncio.sleep(3600)  # killed here: the action never completes
        return message

    update = json.loads(args.update)
    with bind_update(update, bot_id=relay.bot_id, idem=idem):
        await place_order(update)


async def run_commit(args: argparse.Namespace) -> None:
    store = store_from_url(args.url)
    out = Outbound(store.outbox(), HttpBotAPI(args.token, base_url=args.api), bot_id=123456)
    params = {"chat_id": 1, "text": "order 1 placed"}
    if args.url.startswith("sqlite"):
        import sqlite3
        from urllib.parse import urlsplit

        await store.outbox().counts()  # the store sets its file up
        db = sqlite3.connect(urlsplit(args.url).path, timeout=10.0)
        db.execute(f"CREATE TABLE IF NOT EXISTS {args.table} (id INTEGER PRIMARY KEY)")
        db.commit()
        db.execute(f"INSERT INTO {args.table} VALUES (1)")
        await out.enqueue("sendMessage", params, key="order:1", conn=db)
        db.rollback() if args.rollback else db.commit()
    else:
        import asyncpg

        conn = await asyncpg.connect(args.dsn)
        tx = conn.transaction()
        await tx.start()
        await conn.execute(f"INSERT INTO {args.table} VALUES (1)")
        await out.enqueue("sendMessage", params, key="order:1", conn=conn)
        await (tx.rollback() if args.rollback else tx.commit())
    print("rolled back" if args.rollback else "committed", flush=True)
    await asyncio.sleep(3600)  # killed here


async def run_step(args: argparse.Namespace) -> None:
    idem = Idem(args.url, lease=args.lease)
    relay = relay_of(idem.store, args)
    out = outbound_of(idem, relay)

    async def announce() -> Any:
        message = await out.call("sendMessage", {"chat_id": 1, "text": "order placed"})
        print("sent " + json.dumps(message), flush=True)
        await asyncio.sleep(3600)  # killed here: the step never records
        return message

    @idempotent(key="order:{message_id}")
    async def place_order(update: dict[str, Any]) -> Any:
        return await idem.step("announce", announce)

    update = json.loads(args.update)
    with bind_update(update, bot_id=relay.bot_id, idem=idem):
        await place_order(update)


async def run_pace(args: argparse.Namespace) -> None:
    store = store_from_url(args.url)
    bot_id = bot_id_of_token(args.token)
    flood = FloodControl.for_store(store, bot_id=bot_id)  # Telegram's, with headroom
    api = HttpBotAPI(args.token, base_url=args.api, timeout=args.timeout)
    waited = 0.0
    for i in range(args.count):
        send = {"chat_id": args.chat, "text": f"{args.token[-1]}{i}"}
        waited += await flood.wait_turn("sendMessage", send)
        sent = await api.call("sendMessage", json.dumps(send).encode())
        print(f"answer {sent.error_code or 200}", flush=True)
        edit = {"chat_id": args.chat, "message_id": sent.result["message_id"], "text": "edited"}
        waited += await flood.wait_turn("editMessageText", edit)
        edited = await api.call("editMessageText", json.dumps(edit).encode())
        print(f"answer {edited.error_code or 200}", flush=True)
    print(f"waited {waited}", flush=True)
    print("done", flush=True)
    await api.close()
    await store.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["relay", "action", "commit", "step", "pace"])
    parser.add_argument("--url", required=True, help="the store URL")
    parser.add_argument("--api", required=True, help="the fake Bot API's base URL")
    parser.add_argument("--token", default="123456:SECRET-token_value-xyz")
    parser.add_argument("--lease", type=float, default=1.0, help="seconds")
    parser.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout, seconds")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--limits", choices=["unpaced", "telegram"], default="unpaced")
    parser.add_argument("--table", default="orders", help="the bot's table (mode commit)")
    parser.add_argument("--dsn", default="", help="PostgreSQL DSN (mode commit)")
    parser.add_argument("--rollback", action="store_true", help="roll back (mode commit)")
    parser.add_argument("--chat", type=int, default=-100, help="the group (mode pace)")
    parser.add_argument("--count", type=int, default=1, help="sends and edits (mode pace)")
    parser.add_argument("--update", default="{}", help="the update JSON (mode action)")
    args = parser.parse_args()
    runs = {
        "relay": run_relay,
        "action": run_action,
        "commit": run_commit,
        "step": run_step,
        "pace": run_pace,
    }
    asyncio.run(runs[args.mode](args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
