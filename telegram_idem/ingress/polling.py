"""getUpdates ingress: claim each batch in one round trip, write it to the inbox, then
advance the offset.

Telegram keeps an update until a getUpdates call with a higher ``offset`` confirms it
(Bot API, ``getUpdates``). Admitting the batch *before* asking for the next offset means a
crash between fetch and processing loses nothing (the batch is re-fetched), and the
re-fetched batch duplicates nothing (the update guard knows its ids).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from telegram_idem.errors import StoreError
from telegram_idem.guard import Idem
from telegram_idem.ingress.webhook import new_entry
from telegram_idem.logs import log_decision
from telegram_idem.updates import validate_update

__all__ = ["GetUpdates", "PollingIngress"]

log = logging.getLogger("telegram_idem.ingress")

GetUpdates = Callable[[int | None, int, float], Awaitable[list[dict[str, Any]]]]
"""``(offset, limit, timeout_seconds) -> updates`` as Bot API dicts."""


class PollingIngress:
    """Long polling into the inbox.

    Args:
        idem: the guard; its store must have an inbox.
        get_updates: fetches a batch (e.g. ``aiogram_get_updates(bot)``).
        bot_id: the bot polled.
        limit: updates per batch (1–100, Bot API ``getUpdates``).
        poll_timeout: seconds of long polling per call.
        error_delay: seconds to wait after a failed fetch or store outage.
        on_admitted: called after a batch admitted anything (e.g. ``worker.notify``).
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
        on_admitted: Callable[[], None] | None = None,
    ) -> None:
        self.idem = idem
        self.inbox = idem.store.inbox()
        self.get_updates = get_updates
        self.bot_id = bot_id
        self.limit = limit
        self.poll_timeout = poll_timeout
        self.error_delay = error_delay
        self.on_admitted = on_admitted
        self.offset: int | None = None
        self.admitted = 0
        self.duplicates = 0

    async def poll_once(self) -> int:
        """Fetch one batch, admit it, advance the offset; returns updates fetched.

        Raises:
            StoreError: the batch could not be admitted (the offset did not move).
            Exception: whatever ``get_updates`` raised.
        """
        batch = await self.get_updates(self.offset, self.limit, self.poll_timeout)
        if not batch:
            return 0
        updates = [validate_update(u) for u in batch]
        entries = [new_entry(self.idem, u, bot_id=self.bot_id) for u in updates]
        results = await self.inbox.admit_many(entries, retention=self.idem.update_retention)
        for update, entry, fresh in zip(updates, entries, results, strict=True):
            log_decision(
                boundary="update",
                key=entry.update_key,
                decision="admitted" if fresh else "duplicate",
                update=update,
            )
        admitted = sum(results)
        self.admitted += admitted
        self.duplicates += len(results) - admitted
        self.offset = max(u["update_id"] for u in updates) + 1
        if admitted and self.on_admitted is not None:
            self.on_admitted()
        return len(updates)

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set; errors wait ``error_delay`` and try again."""
        while not stop.is_set():
            try:
                await self.poll_once()
            except StoreError:
                log.warning("store outage: batch not admitted; offset kept", exc_info=True)
                await asyncio.sleep(self.error_delay)
            except Exception:
                log.warning("getUpdates failed", exc_info=True)
                await asyncio.sleep(self.error_delay)
