"""The bot's own database transaction, joined: record primitives that run on the bot's
connection, inside its open transaction, and the context that tells the guards one is
bound (``async with idem.transaction(conn)``).

This module sits below the guard and the stores: it knows only records and the
connection object the bot handed over.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from telegram_idem._records import Claim

__all__ = ["JoinedRecords", "JoinedTransaction", "bind_transaction", "bound_transaction"]


@runtime_checkable
class JoinedRecords(Protocol):
    """A store's record primitives run on the bot's connection inside the bot's open
    transaction: nothing they write is seen by anyone until the bot commits, and nothing
    survives a rollback. A concurrent claim of the same key from another transaction
    blocks on the key's unique index until this one ends, then sees what it committed.

    Arguments, units and returns are :class:`~telegram_idem.backends._base.Store`'s
    (``claim``, ``complete``, ``fail``, ``release``); times are judged by the database's
    clock inside the transaction. Every method raises
    :class:`~telegram_idem.errors.StoreError` for a driver error (the transaction is then
    usually aborted: the bot's own error handling rolls it back).
    """

    async def claim(
        self, key: str, *, fingerprint: str | None, lease: float, retention: float
    ) -> Claim:
        """Claim ``key`` in the transaction (see ``Store.claim``).

        Args:
            key: the full key.
            fingerprint: the payload fingerprint, or ``None``.
            lease: seconds the acquired lease lasts.
            retention: seconds the record is kept.
        """
        ...

    async def complete(self, key: str, token: int, result: bytes, *, retention: float) -> bool:
        """Complete ``key`` in the transaction (see ``Store.complete``).

        Args:
            key: the full key.
            token: the holder's fencing token.
            result: the encoded result.
            retention: seconds the completed record is kept, from now.
        """
        ...

    async def fail(self, key: str, token: int, error: bytes, *, retention: float) -> bool:
        """Store a failure for ``key`` in the transaction (see ``Store.fail``).

        Args:
            key: the full key.
            token: the holder's fencing token.
            error: the encoded failure.
            retention: seconds the failed record is kept, from now.
        """
        ...

    async def release(self, key: str, token: int) -> bool:
        """Release ``key`` in the transaction (see ``Store.release``).

        Args:
            key: the full key.
            token: the holder's fencing token.
        """
        ...


@dataclass(frozen=True, slots=True)
class JoinedTransaction:
    """The transaction bound by ``idem.transaction(conn)``.

    Attributes:
        store: the store whose records are joined (the guard's ``store``): an action or
            step of a guard on another store does not join.
        conn: the bot's connection object as it was given (asyncpg ``Connection``,
            SQLAlchemy ``AsyncConnection`` / ``AsyncSession``, ``sqlite3.Connection``,
            ``aiosqlite.Connection``); outbox enqueues inside the block use it.
        records: the store's record primitives on ``conn``.
    """

    store: object
    conn: object
    records: JoinedRecords


_joined: ContextVar[JoinedTransaction | None] = ContextVar(
    "telegram_idem_transaction", default=None
)


def bound_transaction() -> JoinedTransaction | None:
    """The joined transaction of this task, or ``None``."""
    return _joined.get()


@contextmanager
def bind_transaction(joined: JoinedTransaction) -> Iterator[JoinedTransaction]:
    """Bind ``joined`` for the ``with`` block (``Idem.transaction`` does)."""
    reset = _joined.set(joined)
    try:
        yield joined
    finally:
        _joined.reset(reset)
