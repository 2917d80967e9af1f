"""A process's first ``SQLiteOutbox.enqueue_in`` inside the bot's transaction does not
wait on the store's thread once the store is in use: that thread may be queued behind
claims waiting for the very write lock the bot's transaction holds (found by
``examples/stars_shop``: two processes stalled for several ``busy_timeout`` in a row)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiosqlite

from telegram_idem.backends import store_from_url
from telegram_idem.backends.sqlite import SQLiteStore
from telegram_idem.outbox import AmbiguousPolicy, NewCall


async def test_the_first_enqueue_in_does_not_queue_behind_the_stores_thread(
    tmp_path: Path,
) -> None:
    path = tmp_path / "bot.db"
    store = store_from_url(f"sqlite:///{path}?busy_timeout=3")
    assert isinstance(store, SQLiteStore)
    try:
        await store.claim("warm", fingerprint=None, lease=30, retention=60)  # store in use
        outbox = store.outbox()
        async with aiosqlite.connect(path, timeout=5) as conn:
            await conn.execute("BEGIN IMMEDIATE")  # the bot's transaction: the write lock
            # Another update's claim now waits for that lock on the store's only thread.
            waiting = asyncio.create_task(
                store.claim("other", fingerprint=None, lease=30, retention=60)
            )
            await asyncio.sleep(0.2)
            call = NewCall(
                key="k:o:receipt",
                bot_id=1,
                method="sendMessage",
                params=b'{"chat_id":1,"text":"receipt"}',
                ordering_key="chat:1",
                collapse_key=None,
                policy=AmbiguousPolicy.HOLD,
                priority=0,
                retention=60.0,
            )
            started = time.monotonic()
            await asyncio.wait_for(outbox.enqueue_in(conn, call), timeout=2)
            took = time.monotonic() - started
            await conn.commit()
        await waiting  # the lock is free: the other claim goes through
        assert took < 1, f"enqueue_in waited {took:.2f} s behind the store's thread"
        entry = await outbox.get("k:o:receipt")
        assert entry is not None
    finally:
        await store.close()
