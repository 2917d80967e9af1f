"""The store contract (docs/design/record.md#the-store-contract).

A store keeps one :class:`~telegram_idem._records.Record` per key and answers each primitive
in one round trip where the store allows. Subclasses implement the ``_``-prefixed
primitives; every public method (and every inbox method) runs them through
:meth:`Store._call`, the one place where a driver's exception becomes a library error:

- ``config_errors`` (wrong password or ACL, no such database, missing privilege…) →
  :class:`~telegram_idem.errors.ConfigurationError`: retrying cannot help;
- ``driver_errors`` (connection refused or lost, DNS failure, timeout, failover…) →
  :class:`~telegram_idem.errors.StoreError`: the store cannot answer now;
- any other exception of the driver (``driver_base``) → :class:`StoreError` too, marked
  *unexpected*: never a raw driver exception, never a decision.

A store refines this by overriding :meth:`Store._translate` (for errors told apart by
their text or code). Every message names the store (its ``repr``: host, database, table,
never a password) and the operation, and carries the driver's own message.

Time belongs to the store: in-process stores take a clock; server stores use the server's
clock, so workers on different machines judge leases by one clock. :meth:`Store.now`
reads that clock, for decisions taken outside a primitive (a lock's ``retry_after``).

Keys: every public method passes its key through
:func:`~telegram_idem._keys.bounded_key`, so a key of any length behaves the same on every
store (a long key is hashed to a bounded one; never a driver's size error).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import ClassVar, TypeVar

from telegram_idem._clock import Clock
from telegram_idem._joined import JoinedRecords
from telegram_idem._keys import bounded_key
from telegram_idem._records import Claim, Record
from telegram_idem.backends import _driver as driver
from telegram_idem.backends import _registry as registry
from telegram_idem.backends._abilities import (
    HasFloodBudget,
    HasInbox,
    HasLedger,
    HasOutbox,
    JoinsTransactions,
    absent,
    missing,
)
from telegram_idem.backends._driver import describe_error
from telegram_idem.errors import ConfigurationError, IdemError
from telegram_idem.flood import FloodBudget
from telegram_idem.inbox import Inbox
from telegram_idem.ledger import Ledger
from telegram_idem.outbox import Outbox

__all__ = ["Store", "describe_error"]

T = TypeVar("T")


class Store(abc.ABC):
    """Async store of idempotency records.

    Every method raises :class:`StoreError` (with ``original`` set) when the store cannot
    answer, and :class:`ConfigurationError` for a mistake no retry can fix (credentials,
    database, privileges, a missing table; see the module docstring); no method ever
    reports an outage as a decision, and no raw driver exception escapes.
    """

    schemes: ClassVar[tuple[str, ...]] = ()
    """URL schemes this class serves. Declaring them registers the class with
    :func:`telegram_idem.backends.store_from_url` (the subclass implements
    :meth:`from_url`), by the class keyword ``class MyStore(Store, schemes=("mystore",))``
    or by setting this attribute in the class body; a scheme already taken by another
    class is a :class:`ConfigurationError` at class creation. A built-in store gets its
    schemes from :data:`telegram_idem.backends._registry.BUILTIN_STORES`."""
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = (OSError,)
    """Driver exceptions meaning "cannot answer now": :class:`StoreError`."""
    config_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    """Driver exceptions meaning a configuration mistake: :class:`ConfigurationError`."""
    driver_base: ClassVar[tuple[type[BaseException], ...]] = ()
    """Every exception class of the driver; one not listed above is an unexpected
    :class:`StoreError`."""

    _nothing_to_translate: ClassVar[bool] = False
    """No driver exception to translate (``driver_errors``, ``config_errors`` and
    ``driver_base`` empty, ``_translate`` not overridden): the public methods run the
    primitive as it is, without :meth:`_call`'s frame (memory's hot path). Set at class
    creation."""

    def __init_subclass__(cls, *, schemes: Sequence[str] | None = None, **kwargs: object) -> None:
        """Register the schemes the class declares (:mod:`telegram_idem.backends._registry`).

        Args:
            schemes: the URL schemes the class serves, as a class keyword; or set
                ``schemes`` in the class body (one of the two).

        Raises:
            ConfigurationError: both forms at once, a malformed scheme, or a scheme that
                another class serves.
        """
        super().__init_subclass__(**kwargs)
        cls._nothing_to_translate = (
            not (cls.driver_errors or cls.config_errors or cls.driver_base)
            and cls._translate.__qualname__ == "Store._translate"  # not overridden
        )
        if schemes is not None and "schemes" in cls.__dict__:
            raise ConfigurationError(
                f"{cls.__qualname__}: declare schemes once (the class keyword or the attribute)"
            )
        declared = schemes if schemes is not None else cls.__dict__.get("schemes")
        served = registry.register(cls, declared)
        if served is not None:
            cls.schemes = served

    def __repr__(self) -> str:
        """The class name; server stores add where they connect (never a password)."""
        return f"{type(self).__name__}()"

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> Store:
        """Make the store from its URL (see each store's module docstring).

        Args:
            url: the store URL.
            clock: seconds since the epoch; ``None`` = the store's own time source
                (the server's clock for server stores, the host's for in-process ones).

        Raises:
            ConfigurationError: a malformed URL or option.
        """
        raise ConfigurationError(f"{cls.__name__} cannot be made from a URL")

    def _call(self, op: str, fn: Callable[[], Awaitable[T]]) -> Awaitable[T]:
        """Run ``fn`` (one primitive) and translate a driver exception it raises (see
        the module docstring): the awaitable of :func:`telegram_idem.backends._driver.call`
        with :meth:`_translate`. Library errors and bugs pass through."""
        return driver.call(op, fn, self._translate)

    def _translate(self, op: str, exc: Exception) -> IdemError | None:
        """The library error for ``exc`` raised by operation ``op``, or ``None`` if ``exc``
        is not the driver's (a bug, or a ``TypeError`` for a bad argument: propagated).

        Override to classify by text or code, then defer to this for the rest.
        """
        errors = driver.DriverErrors(self.driver_errors, self.config_errors, self.driver_base)
        return errors.translate(f"{self!r}.{op}", exc)

    async def claim(
        self, key: str, *, fingerprint: str | None = None, lease: float, retention: float
    ) -> Claim:
        """Claim ``key``: acquire it, or learn why not, in one answer.

        Args:
            key: the idempotency key.
            fingerprint: payload fingerprint to compare with the first claim, or ``None``.
            lease: seconds the lease lasts if acquired (> 0).
            retention: seconds the record is kept if acquired (≥ lease).

        Returns:
            A :class:`Claim` whose outcome follows the table in :mod:`telegram_idem.machine`.

        Raises:
            StoreError: the store could not answer.
            ConfigurationError: ``lease`` or ``retention`` out of range.
        """
        _check_times(lease, retention)
        key = bounded_key(key)
        if self._nothing_to_translate:
            return await self._claim(key, fingerprint, lease, retention)
        return await self._call("claim", lambda: self._claim(key, fingerprint, lease, retention))

    async def claim_many(
        self, keys: Sequence[str], *, lease: float, retention: float
    ) -> list[Claim]:
        """Claim each key (no fingerprints), answers in the order of ``keys``.

        Args:
            keys: the full keys, distinct.
            lease: seconds each acquired claim's lease lasts.
            retention: seconds each record is kept.

        Raises:
            StoreError: the store could not answer.
            ConfigurationError: duplicate keys, or times out of range.
        """
        _check_times(lease, retention)
        if len(set(keys)) != len(keys):
            raise ConfigurationError("claim_many needs distinct keys")
        bounded = [bounded_key(k) for k in keys]
        if self._nothing_to_translate:
            return await self._claim_many(bounded, lease, retention)
        return await self._call("claim_many", lambda: self._claim_many(bounded, lease, retention))

    async def complete(self, key: str, token: int, result: bytes, *, retention: float) -> bool:
        """Store ``result`` and mark the key completed, if ``token`` still holds it.

        Args:
            retention: seconds to keep the completed record, from now.
            key: the full key.
            token: the holder's fencing token (from its :class:`Claim`).
            result: the encoded result, replayed to later claims.

        Returns:
            ``False`` if the record no longer carries ``token`` (the lease was taken over).

        Raises:
            StoreError: the store could not answer.
        """
        key = bounded_key(key)
        if self._nothing_to_translate:
            return await self._complete(key, token, result, retention)
        return await self._call("complete", lambda: self._complete(key, token, result, retention))

    async def fail(self, key: str, token: int, error: bytes, *, retention: float) -> bool:
        """Store a failure for replay (``on_error="store"``), if ``token`` still holds.

        Args:
            key: the full key.
            token: the holder's fencing token.
            error: the encoded failure, replayed as :class:`StoredFailureError`.
            retention: seconds to keep the failed record, from now.

        Returns:
            ``False`` if ``token`` no longer holds the key (nothing written).

        Raises:
            StoreError: the store could not answer.
        """
        key = bounded_key(key)
        if self._nothing_to_translate:
            return await self._fail(key, token, error, retention)
        return await self._call("fail", lambda: self._fail(key, token, error, retention))

    async def release(self, key: str, token: int) -> bool:
        """End the holder's lease so the next claim acquires (token + 1).

        Args:
            key: the full key.
            token: the holder's fencing token.

        Returns:
            ``False`` if ``token`` no longer holds the key.

        Raises:
            StoreError: the store could not answer.
        """
        key = bounded_key(key)
        if self._nothing_to_translate:
            return await self._release(key, token)
        return await self._call("release", lambda: self._release(key, token))

    async def extend(self, key: str, token: int, *, lease: float) -> bool:
        """Heartbeat: move the lease end to now + ``lease`` seconds, if ``token`` holds.

        Args:
            key: the full key.
            token: the holder's fencing token.
            lease: seconds from now the lease ends.

        Returns:
            ``False`` if ``token`` no longer holds the key.

        Raises:
            StoreError: the store could not answer.
        """
        key = bounded_key(key)
        if self._nothing_to_translate:
            return await self._extend(key, token, lease)
        return await self._call("extend", lambda: self._extend(key, token, lease))

    async def get(self, key: str) -> Record | None:
        """The live record of ``key``, or ``None``.

        Args:
            key: the full key.

        Raises:
            StoreError: the store could not answer.
        """
        key = bounded_key(key)
        if self._nothing_to_translate:
            return await self._get(key)
        return await self._call("get", lambda: self._get(key))

    async def now(self) -> float:
        """The store's clock: seconds since the epoch, as the store judges leases.

        The server's clock for server stores (PostgreSQL ``clock_timestamp()``, Redis
        ``TIME``), the store's ``clock`` for in-process stores and DynamoDB (which has no
        server clock). A decision about a record read from the store (is this lease
        over? how long until it is?) compares against this, never the caller's clock.

        Raises:
            StoreError: the store could not answer.
        """
        return await self._call("now", self._now)

    @absent
    def inbox(self) -> Inbox:
        """The durable inbox sharing this store's connection (admission is one
        transaction with the update guard). Stores with an inbox override this (the
        :class:`~telegram_idem.backends._abilities.HasInbox` ability); this base method is
        the stand-in for the others, marked absent, and only raises.

        Raises:
            ConfigurationError: this store has no inbox (the message names the store and
                the ability; :func:`telegram_idem.backends._abilities.inbox_of` raises the
                same).
        """
        raise missing(self, HasInbox)

    @absent
    def outbox(self) -> Outbox:
        """The durable outbox of Bot API calls sharing this store's connection. Stores
        with one override this (:class:`~telegram_idem.backends._abilities.HasOutbox`).

        Raises:
            ConfigurationError: this store has no outbox.
        """
        raise missing(self, HasOutbox)

    @absent
    def flood_budget(self) -> FloodBudget:
        """The flood-control budget kept in this store, shared by every process using
        it. Stores with one override this
        (:class:`~telegram_idem.backends._abilities.HasFloodBudget`).

        Raises:
            ConfigurationError: this store keeps no flood budget.
        """
        raise missing(self, HasFloodBudget)

    @absent
    def ledger(self) -> Ledger:
        """The effect ledger (at-most-once steps and actions) sharing this store's
        connection. Stores with one override this
        (:class:`~telegram_idem.backends._abilities.HasLedger`).

        Raises:
            ConfigurationError: this store has no effect ledger.
        """
        raise missing(self, HasLedger)

    @absent
    def joined(self, conn: object) -> JoinedRecords:
        """The record primitives on the bot's connection ``conn``, inside its open
        transaction (``idem.transaction(conn)``). Stores whose tables live in the bot's
        database override this
        (:class:`~telegram_idem.backends._abilities.JoinsTransactions`).

        Args:
            conn: the bot's own open connection or session (sqlite3 / aiosqlite, asyncpg,
                SQLAlchemy).

        Raises:
            ConfigurationError: this store keeps its records outside the bot's database,
                so it cannot join a transaction there.
        """
        raise missing(self, JoinsTransactions)

    async def close(self) -> None:
        """Release connections. Idempotent."""

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _claim_many(self, keys: Sequence[str], lease: float, retention: float) -> list[Claim]:
        return [await self._claim(k, None, lease, retention) for k in keys]

    async def _now(self) -> float:
        """The store's clock (override: this default is the host's ``time.time``)."""
        return time.time()

    @abc.abstractmethod
    async def _claim(
        self, key: str, fingerprint: str | None, lease: float, retention: float
    ) -> Claim: ...

    @abc.abstractmethod
    async def _complete(self, key: str, token: int, result: bytes, retention: float) -> bool: ...

    @abc.abstractmethod
    async def _fail(self, key: str, token: int, error: bytes, retention: float) -> bool: ...

    @abc.abstractmethod
    async def _release(self, key: str, token: int) -> bool: ...

    @abc.abstractmethod
    async def _extend(self, key: str, token: int, lease: float) -> bool: ...

    @abc.abstractmethod
    async def _get(self, key: str) -> Record | None: ...


def _check_times(lease: float, retention: float) -> None:
    if not lease > 0:
        raise ConfigurationError(f"lease must be > 0 seconds, got {lease}")
    if retention < lease:
        raise ConfigurationError(f"retention ({retention} s) must be ≥ lease ({lease} s)")
