"""What a store can do beyond the record primitives, declared as protocols.

Every :class:`~telegram_idem.backends._base.Store` claims, completes, fails, releases,
extends and gets. Some can do more; each such ability is a ``runtime_checkable``
:class:`~typing.Protocol`, so a third-party store has it by having the method (no base
class to inherit, nothing to register):

| protocol | method | built-in stores that have it |
|---|---|---|
| :class:`HasInbox` | ``inbox() -> Inbox`` | memory, SQLite, PostgreSQL, Redis |
| :class:`HasOutbox` | ``outbox() -> Outbox`` | memory, SQLite, PostgreSQL, Redis |
| :class:`HasFloodBudget` | ``flood_budget() -> FloodBudget`` | memory, SQLite, PostgreSQL, Redis |
| :class:`HasLedger` | ``ledger() -> Ledger`` | memory, SQLite, PostgreSQL, Redis, DynamoDB |
| :class:`JoinsTransactions` | ``joined(conn) -> JoinedRecords`` | SQLite, PostgreSQL |
| :class:`Migratable` | ``async migrate() -> bool \\| None`` | PostgreSQL, DynamoDB |
| :class:`Purgeable` | ``async purge() -> int`` | SQLite, PostgreSQL |
| :class:`Browsable` | ``async records(*, prefix, limit)``, ``async count_records(*, prefix, expired)``, ``async delete_records(*, prefix, limit)`` | memory, SQLite, PostgreSQL, Redis, DynamoDB |
| :class:`Checkable` | ``async health() -> StoreHealth`` | memory, SQLite, PostgreSQL, Redis, DynamoDB |

Ask through the helpers (:func:`has_inbox`, :func:`inbox_of`, :func:`as_migratable`,
:func:`as_purgeable`, :func:`as_browsable`, :func:`as_checkable`): each answers for any
object, and the ``as_``/``_of`` ones raise a
:class:`~telegram_idem.errors.ConfigurationError` naming the store and the ability when
it is absent. :class:`Browsable` and :class:`Checkable` are what ``telegram-idem
inspect --prefix``, ``purge --prefix`` and ``check`` need; their answer to ``health()``
is a :class:`~telegram_idem.backends.StoreHealth`.

``Store.inbox()`` stays on the base class (``idem.store.inbox()`` is how a bot reaches its
inbox), so every store has an ``inbox`` attribute and ``isinstance(store, HasInbox)`` is
true of each of them; the base's method is marked :func:`absent` and only raises the
error of :func:`missing`, the one :func:`inbox_of` raises. :func:`has_inbox` is the
question to ask: true exactly when ``store.inbox()`` returns an inbox.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar, runtime_checkable

from telegram_idem._joined import JoinedRecords
from telegram_idem._records import Record
from telegram_idem.backends._health import StoreHealth
from telegram_idem.errors import ConfigurationError
from telegram_idem.flood import FloodBudget
from telegram_idem.inbox import Inbox
from telegram_idem.ledger import Ledger
from telegram_idem.outbox import Outbox

__all__ = [
    "Browsable",
    "Checkable",
    "HasFloodBudget",
    "HasInbox",
    "HasLedger",
    "HasOutbox",
    "JoinsTransactions",
    "Migratable",
    "Purgeable",
    "absent",
    "as_browsable",
    "as_checkable",
    "as_migratable",
    "as_purgeable",
    "flood_budget_of",
    "has_flood_budget",
    "has_inbox",
    "has_ledger",
    "has_outbox",
    "inbox_of",
    "joined_of",
    "joins_transactions",
    "ledger_of",
    "missing",
    "outbox_of",
]

F = TypeVar("F", bound=Callable[..., object])

_ABSENT = "__telegram_idem_absent_ability__"
"""Attribute set on a method by :func:`absent`."""


@runtime_checkable
class HasInbox(Protocol):
    """A store with a durable inbox beside its records (admission is one transaction
    with the update guard)."""

    def inbox(self) -> Inbox:
        """The store's inbox (the same object on every call)."""
        ...


@runtime_checkable
class HasOutbox(Protocol):
    """A store with a durable outbox of Bot API calls beside its records."""

    def outbox(self) -> Outbox:
        """The store's outbox (the same object on every call)."""
        ...


@runtime_checkable
class HasFloodBudget(Protocol):
    """A store that keeps flood-control budgets shared by every process using it."""

    def flood_budget(self) -> FloodBudget:
        """The store's flood budget (the same object on every call)."""
        ...


@runtime_checkable
class HasLedger(Protocol):
    """A store with an effect ledger beside its records (at-most-once steps and actions,
    ``Idem.unresolved`` / ``Idem.resolve``)."""

    def ledger(self) -> Ledger:
        """The store's ledger (the same object on every call)."""
        ...


@runtime_checkable
class JoinsTransactions(Protocol):
    """A store whose records live in a database the bot writes too, so that a claim and
    its completion can be written inside the bot's own transaction
    (``async with idem.transaction(conn)``)."""

    def joined(self, conn: object) -> JoinedRecords:
        """The record primitives on ``conn``, inside its open transaction.

        Args:
            conn: the bot's own open connection or session (sqlite3 / aiosqlite, asyncpg,
                SQLAlchemy).

        Raises:
            ConfigurationError: ``conn`` is of a kind the store cannot join, or is
                connected to another database than the store's.
        """
        ...


@runtime_checkable
class Migratable(Protocol):
    """A store whose tables are created ahead of use (``telegram-idem migrate URL``)."""

    async def migrate(self) -> bool | None:
        """Create what the store needs, idempotently.

        Returns:
            ``True`` if something was created, ``False`` if everything was there, ``None``
            if the store does not say.

        Raises:
            StoreError: the store could not answer.
            ConfigurationError: credentials or privileges do not allow it.
        """
        ...


@runtime_checkable
class Purgeable(Protocol):
    """A store that deletes records past their retention on request (beside its own
    periodic purge)."""

    async def purge(self) -> int:
        """Delete one batch of expired records now.

        Returns:
            How many records were deleted.

        Raises:
            StoreError: the store could not answer.
        """
        ...


@runtime_checkable
class Browsable(Protocol):
    """A store whose records can be listed, counted and deleted by key prefix
    (``telegram-idem inspect --prefix`` and ``purge --prefix``).

    Keys are compared as stored: a long or odd key is stored bounded
    (:func:`telegram_idem._keys.bounded_key`: a readable head of at most 200 bytes,
    ``":h:"`` and a hash), and the prefix is spelled the same way
    (:func:`telegram_idem.backends._browse.stored_prefix`), so a prefix longer than
    that head matches only keys stored whole. No prefix is ever read as a pattern
    (``%``, ``_``, ``*``, ``?``, ``[`` match themselves).
    """

    async def records(self, *, prefix: str, limit: int = 100) -> list[Record]:
        """The live records (retention not over) whose key starts with ``prefix``.

        Args:
            prefix: the start of the keys (``""``: every record).
            limit: most records returned (≥ 1).

        Returns:
            At most ``limit`` records, in key order (the store's order of text: code
            points for SQLite, memory and Redis, the database's collation for
            PostgreSQL); the first ``limit`` of that order.

        Raises:
            ConfigurationError: ``limit`` < 1.
            StoreError: the store could not answer.
        """
        ...

    async def count_records(self, *, prefix: str, expired: bool = False) -> int:
        """How many records :meth:`delete_records` would delete for ``prefix`` (every
        stored record under it, live or past retention), or with ``expired`` only
        those past retention (what ``purge()`` deletes).

        Args:
            prefix: the key prefix (``""``: every key).
            expired: count only the records past retention.

        Raises:
            StoreError: the store could not answer.
        """
        ...

    async def delete_records(self, *, prefix: str, limit: int = 1000) -> int:
        """Delete one batch of the stored records whose key starts with ``prefix``
        (live ones too: their keys can be acquired again at once, so a duplicate of
        an update whose guard is deleted runs again). Call it until it returns 0.

        Args:
            prefix: the start of the keys (``""``: every record).
            limit: most records deleted by this call (≥ 1).

        Returns:
            How many records were deleted.

        Raises:
            ConfigurationError: ``limit`` < 1.
            StoreError: the store could not answer.
        """
        ...


@runtime_checkable
class Checkable(Protocol):
    """A store that checks itself: server and version, its tables, what is wrong
    (``telegram-idem check``)."""

    async def health(self) -> StoreHealth:
        """Look at the store and say what is wrong; creates and changes nothing.

        Returns:
            The :class:`~telegram_idem.backends.StoreHealth`: missing tables and
            wrong settings are answered as problems, not raised.

        Raises:
            StoreError: the store could not be reached.
            ConfigurationError: credentials, database or privileges are wrong.
        """
        ...


_WHAT: dict[type, str] = {
    HasInbox: "inbox",
    HasOutbox: "outbox",
    HasFloodBudget: "flood budget",
    HasLedger: "effect ledger",
    JoinsTransactions: "way to join your database transaction (its records live elsewhere)",
    Migratable: "migrate()",
    Purgeable: "purge()",
    Browsable: "way to list or delete records by key prefix",
    Checkable: "health check",
}
"""How :func:`missing` names each ability."""


def absent(method: F) -> F:
    """Mark ``method`` as a base class's stand-in that only raises: a class whose method
    is marked does not have the ability (see :func:`has_inbox`)."""
    setattr(method, _ABSENT, True)
    return method


def missing(store: object, ability: type) -> ConfigurationError:
    """The error for ``store`` lacking ``ability`` (one of this module's protocols),
    to raise: ``"<repr(store)> has no <ability> (the <Ability> ability of telegram_idem.backends)"``
    (the public module that exports the protocols and helpers).

    The store is shown by its ``repr`` (which, for every store, never shows a password).
    """
    what = _WHAT.get(ability, ability.__name__)
    return ConfigurationError(
        f"{store!r} has no {what} (the {ability.__name__} ability of telegram_idem.backends)"
    )


def _has(store: object, ability: type, name: str) -> bool:
    if not isinstance(store, ability):
        return False
    return not getattr(getattr(type(store), name, None), _ABSENT, False)


def has_inbox(store: object) -> bool:
    """True if ``store.inbox()`` returns an inbox: ``store`` is a :class:`HasInbox` whose
    ``inbox`` is not a stand-in marked :func:`absent` (the base ``Store.inbox``).

    Args:
        store: any object (a store, or not).
    """
    return _has(store, HasInbox, "inbox")


def has_outbox(store: object) -> bool:
    """True if ``store.outbox()`` returns an outbox (as :func:`has_inbox`).

    Args:
        store: any object (a store, or not).
    """
    return _has(store, HasOutbox, "outbox")


def has_flood_budget(store: object) -> bool:
    """True if ``store.flood_budget()`` returns a budget (as :func:`has_inbox`).

    Args:
        store: any object (a store, or not).
    """
    return _has(store, HasFloodBudget, "flood_budget")


def has_ledger(store: object) -> bool:
    """True if ``store.ledger()`` returns a ledger (as :func:`has_inbox`).

    Args:
        store: any object (a store, or not).
    """
    return _has(store, HasLedger, "ledger")


def joins_transactions(store: object) -> bool:
    """True if ``store.joined(conn)`` can join a transaction (as :func:`has_inbox`).

    Args:
        store: any object (a store, or not).
    """
    return _has(store, JoinsTransactions, "joined")


def ledger_of(store: object) -> Ledger:
    """``store.ledger()``, asked through :class:`HasLedger`.

    Args:
        store: any object (a store, or not).

    Raises:
        ConfigurationError: ``store`` has no effect ledger (the message names it).
    """
    if not has_ledger(store):
        raise missing(store, HasLedger)
    assert isinstance(store, HasLedger)
    return store.ledger()


def joined_of(store: object, conn: object) -> JoinedRecords:
    """``store.joined(conn)``, asked through :class:`JoinsTransactions`.

    Args:
        store: any object (a store, or not).
        conn: the bot's own open connection or session.

    Raises:
        ConfigurationError: ``store`` cannot join a transaction (its records live
            outside the bot's database), or cannot join this ``conn``.
    """
    if not joins_transactions(store):
        raise missing(store, JoinsTransactions)
    assert isinstance(store, JoinsTransactions)
    return store.joined(conn)


def outbox_of(store: object) -> Outbox:
    """``store.outbox()``, asked through :class:`HasOutbox`.

    Args:
        store: any object (a store, or not).

    Raises:
        ConfigurationError: ``store`` has no outbox (the message names it and the ability).
    """
    if not has_outbox(store):
        raise missing(store, HasOutbox)
    assert isinstance(store, HasOutbox)
    return store.outbox()


def flood_budget_of(store: object) -> FloodBudget:
    """``store.flood_budget()``, asked through :class:`HasFloodBudget`.

    Args:
        store: any object (a store, or not).

    Raises:
        ConfigurationError: ``store`` keeps no flood budget (the message names it).
    """
    if not has_flood_budget(store):
        raise missing(store, HasFloodBudget)
    assert isinstance(store, HasFloodBudget)
    return store.flood_budget()


def inbox_of(store: object) -> Inbox:
    """``store.inbox()``, asked through :class:`HasInbox`.

    Args:
        store: any object (a store, or not).

    Raises:
        ConfigurationError: ``store`` has no inbox (the message names it and the ability).
    """
    if not has_inbox(store):
        raise missing(store, HasInbox)
    assert isinstance(store, HasInbox)
    return store.inbox()


def as_migratable(store: object) -> Migratable:
    """``store`` as a :class:`Migratable`.

    Args:
        store: any object (a store, or not).

    Raises:
        ConfigurationError: ``store`` has no ``migrate()`` (the message names it).
    """
    if not isinstance(store, Migratable):
        raise missing(store, Migratable)
    return store


def as_purgeable(store: object) -> Purgeable:
    """``store`` as a :class:`Purgeable`.

    Args:
        store: any object (a store, or not).

    Raises:
        ConfigurationError: ``store`` has no ``purge()`` (the message names it).
    """
    if not isinstance(store, Purgeable):
        raise missing(store, Purgeable)
    return store


def as_browsable(store: object) -> Browsable:
    """``store`` as a :class:`Browsable`.

    Args:
        store: any object (a store, or not).

    Raises:
        ConfigurationError: ``store`` cannot list or delete records by key prefix (the
            message names it and the ability).
    """
    if not isinstance(store, Browsable):
        raise missing(store, Browsable)
    return store


def as_checkable(store: object) -> Checkable:
    """``store`` as a :class:`Checkable`.

    Args:
        store: any object (a store, or not).

    Raises:
        ConfigurationError: ``store`` has no ``health()`` (the message names it).
    """
    if not isinstance(store, Checkable):
        raise missing(store, Checkable)
    return store
