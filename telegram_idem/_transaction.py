"""``async with idem.transaction(conn)``: actions and steps recorded inside the bot's own
database transaction (the claim, the completion and a step's record commit or roll back
with the bot's writes and its outbox entries).

Skeleton of the contract; the implementation is being written.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from telegram_idem._joined import JoinedTransaction

if TYPE_CHECKING:
    from telegram_idem._guard import Idem

__all__ = ["run_joined", "transaction"]

T = TypeVar("T")


@asynccontextmanager
async def transaction(idem: Idem, conn: object) -> AsyncIterator[JoinedTransaction]:
    """:meth:`telegram_idem.Idem.transaction`."""
    raise NotImplementedError("idem.transaction is being written")
    yield  # pragma: no cover


async def run_joined(
    idem: Idem,
    joined: JoinedTransaction,
    key: str,
    fn: Callable[[], Awaitable[T]],
    *,
    fingerprint: str | None,
    on_error: Literal["release", "store"],
    lease: float,
    retention: float,
    handler: str | None,
    boundary: Literal["action", "step"],
    options: Any = None,
) -> T:
    """:meth:`telegram_idem.Idem.run` for a key whose store is joined to the bound
    transaction."""
    raise NotImplementedError("joined runs are being written")
