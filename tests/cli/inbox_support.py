"""Helpers of tests/cli/test_inbox_cli.py: updates admitted the way the webhook ingress
admits them, an inbox worker run until an event, and the command run in-process.

Each helper that touches a store opens its own (``Idem(url)``) and closes it: the command
under test opens the store again from its URL, as an operator's shell would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from click.testing import CliRunner, Result

from telegram_idem import Idem
from telegram_idem._admission import Admission
from telegram_idem._cli import cli
from telegram_idem.inbox import Inbox, InboxWorker, new_entry

__all__ = ["BOT_ID", "admit", "entry_id", "invoke", "message", "run_worker", "with_inbox"]

BOT_ID = 7
"""The bot every test's updates are for."""


def message(update_id: int, chat: int, text: str = "hi") -> dict[str, Any]:
    """A message update of ``chat``."""
    return {
        "update_id": update_id,
        "message": {
            "message_id": update_id,
            "date": 1_700_000_000,
            "chat": {"id": chat, "type": "private"},
            "text": text,
        },
    }


def entry_id(update_id: int) -> str:
    """The inbox entry id (the update guard key) of ``update_id``."""
    return f"idem:{BOT_ID}:u:{update_id}"


def invoke(*args: str, input: str | None = None) -> Result:
    """``telegram-idem ARGS`` in this process (click's runner: stdout and stderr apart)."""
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


async def _admit(url: str, updates: Sequence[dict[str, Any]]) -> list[Admission]:
    idem = Idem(url)
    try:
        entries = [new_entry(idem, u, bot_id=BOT_ID) for u in updates]
        got = await idem.admit_to_inbox(entries, updates, bot_id=BOT_ID)
        return [a.outcome for a in got]
    finally:
        await idem.store.close()


def admit(url: str, *updates: dict[str, Any]) -> list[Admission]:
    """Admit ``updates`` as the webhook ingress does (``Idem.admit_to_inbox``)."""
    return asyncio.run(_admit(url, updates))


def with_inbox(url: str, body: Callable[[Inbox], Awaitable[Any]]) -> Any:
    """``await body(inbox)`` on a store opened from ``url``, closed after."""

    async def main() -> Any:
        idem = Idem(url)
        try:
            return await body(idem.store.inbox())
        finally:
            await idem.store.close()

    return asyncio.run(main())


def run_worker(
    url: str, dispatch: Callable[[dict[str, Any]], Awaitable[None]], **options: Any
) -> int:
    """An :class:`InboxWorker` with ``dispatch`` processes what is takeable, one entry at
    a time (``run_once``: take, dispatch, then ack, retry or bury), until nothing is;
    returns how many entries it took."""

    async def main() -> int:
        idem = Idem(url)
        try:
            worker = InboxWorker(idem.store.inbox(), dispatch, concurrency=1, **options)
            taken = 0
            while await worker.run_once():
                taken += 1
            return taken
        finally:
            await idem.store.close()

    return asyncio.run(main())
