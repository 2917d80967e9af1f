"""A claim store with a JetStream inbox: everything but ``inbox()`` is the claim store's."""

from __future__ import annotations

from collections.abc import Sequence

from telegram_idem._clock import Clock
from telegram_idem._records import Claim, Record
from telegram_idem.backends._base import Store
from telegram_idem.backends.nats._connection import JetStreamConnection, JetStreamSettings
from telegram_idem.backends.nats._inbox import JetStreamInbox
from telegram_idem.backends.nats._layout import JetStreamLayout
from telegram_idem.flood import FloodBudget
from telegram_idem.inbox import Inbox
from telegram_idem.ledger import Ledger
from telegram_idem.outbox import Outbox

__all__ = ["JetStreamStore", "with_jetstream_inbox"]


class JetStreamStore(Store):
    """``store`` with its inbox on NATS JetStream.

    Records, the clock, the outbox, the flood budget and the effect ledger are
    ``store``'s (calls pass through unchanged, errors included); :meth:`inbox` is the
    :class:`~telegram_idem.backends.nats.JetStreamInbox`, whose update guards are
    ``store``'s records. Closing closes both.

    Args:
        store: the claim store (SQLite, PostgreSQL, Redis…).
        inbox: the JetStream inbox over ``store``.
        connection: the inbox's NATS connection (closed with the store).
    """

    def __init__(
        self, store: Store, inbox: JetStreamInbox, connection: JetStreamConnection
    ) -> None:
        self.store = store
        self._inbox = inbox
        self._connection = connection

    def __repr__(self) -> str:
        return f"JetStreamStore({self.store!r}, {self._inbox!r})"

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> Store:
        """Not made from one URL: use :func:`with_jetstream_inbox`.

        Args:
            url: any URL.
            clock: unused.

        Raises:
            ConfigurationError: always.
        """
        return super().from_url(url, clock=clock)

    def inbox(self) -> Inbox:
        """The JetStream inbox (the same object on every call)."""
        return self._inbox

    def outbox(self) -> Outbox:
        """The claim store's outbox.

        Raises:
            ConfigurationError: the claim store has no outbox.
        """
        return self.store.outbox()

    def flood_budget(self) -> FloodBudget:
        """The claim store's flood budget.

        Raises:
            ConfigurationError: the claim store keeps no flood budget.
        """
        return self.store.flood_budget()

    def ledger(self) -> Ledger:
        """The claim store's effect ledger.

        Raises:
            ConfigurationError: the claim store has no effect ledger.
        """
        return self.store.ledger()

    async def close(self) -> None:
        """Close the inbox's watcher, the NATS connection and the claim store."""
        try:
            await self._inbox.close()
            await self._connection.close()
        finally:
            await self.store.close()

    async def _claim(
        self, key: str, fingerprint: str | None, lease: float, retention: float
    ) -> Claim:
        return await self.store.claim(
            key, fingerprint=fingerprint, lease=lease, retention=retention
        )

    async def _claim_many(self, keys: Sequence[str], lease: float, retention: float) -> list[Claim]:
        return await self.store.claim_many(keys, lease=lease, retention=retention)

    async def _complete(self, key: str, token: int, result: bytes, retention: float) -> bool:
        return await self.store.complete(key, token, result, retention=retention)

    async def _fail(self, key: str, token: int, error: bytes, retention: float) -> bool:
        return await self.store.fail(key, token, error, retention=retention)

    async def _release(self, key: str, token: int) -> bool:
        return await self.store.release(key, token)

    async def _extend(self, key: str, token: int, lease: float) -> bool:
        return await self.store.extend(key, token, lease=lease)

    async def _get(self, key: str) -> Record | None:
        return await self.store.get(key)

    async def _now(self) -> float:
        return await self.store.now()


def with_jetstream_inbox(
    store: Store,
    *,
    url: str = "nats://127.0.0.1:4222",
    stream: str = "idem_inbox",
    partitions: int = 16,
    max_deliver: int | None = None,
    duplicate_window: float = 120.0,
    admit_lease: float = 30.0,
    discover_ack_wait: float = 30.0,
    tombstone_age: float = 3600.0,
    timeout: float = 5.0,
) -> JetStreamStore:
    """``store`` whose ``inbox()`` is a JetStream inbox on ``url``; everything else is
    ``store``'s. Connects on first use (the stream, its partition consumers and the
    state bucket are made then if missing).

    Args:
        store: the claim store: the update guards' source of truth (24 h), and the clock.
        url: the NATS server (``nats://host:port``; several comma-separated).
        stream: the entry stream's name (1-64 letters, digits, ``_``, ``-``); the state
            bucket is ``<stream>_state``, the consumers ``<stream>_p<partition>``.
        partitions: subjects ``<stream>.<bot_id>.<0..partitions-1>``, one durable
            consumer each; an ordering unit always hashes onto the same one.
        max_deliver: takes after which the inbox itself makes an entry a dead letter
            (``None``: leave it to the worker's ``max_attempts``).
        duplicate_window: seconds the stream drops a repeated ``Nats-Msg-Id`` (used only
            when the stream is made; an existing stream keeps its own).
        admit_lease: seconds an admission holds the update's claim while publishing.
        discover_ack_wait: seconds before a partition consumer re-delivers a batch whose
            recording process died.
        tombstone_age: seconds an acked entry's tombstone is kept (≥ the dedup window).
        timeout: seconds one NATS request waits before :class:`StoreError`.

    Raises:
        ConfigurationError: a stream name or a partition count out of range.
        ValueError: ``max_deliver`` < 1.
    """
    connection = JetStreamConnection(
        JetStreamSettings(
            url=url,
            layout=JetStreamLayout(stream, partitions),
            duplicate_window=duplicate_window,
            discover_ack_wait=discover_ack_wait,
            timeout=timeout,
        )
    )
    inbox = JetStreamInbox(
        store,
        connection,
        admit_lease=admit_lease,
        max_deliver=max_deliver,
        tombstone_age=tombstone_age,
    )
    return JetStreamStore(store, inbox, connection)
