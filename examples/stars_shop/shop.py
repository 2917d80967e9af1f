"""What every handler of the shop is given (as ``shop``, from the dispatcher's data)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from telegram_idem import Idem
from telegram_idem.outbox import Outbound

__all__ = ["Shop"]


@dataclass(frozen=True)
class Shop:
    """The shop's resources.

    Attributes:
        idem: the idempotency guard, on ``sqlite:///<file>``.
        outbound: durable Bot API calls, in the same store (the receipts' outbox).
        db: sessions of the bot's own database, ``sqlite+aiosqlite:///<file>``: the same
            file, so one transaction holds the shop's writes and the guard's records.
        admins: user ids allowed ``/unresolved`` and ``/resolve``.
    """

    idem: Idem
    outbound: Outbound
    db: async_sessionmaker[AsyncSession]
    admins: frozenset[int] = frozenset()
