"""``telegram-idem migrate URL``: create what a store needs before its first use.

``migrate`` creates what a store needs, idempotently, and names every table it made or
found: for ``postgresql://…?table_prefix=…`` the records, inbox, outbox, parked-chats,
flood-budget and effect-ledger tables (``<prefix>_records``, ``<prefix>_inbox``,
``<prefix>_outbox``, ``<prefix>_outbox_parked``, ``<prefix>_flood`` and
``<prefix>_ledger``) and their indexes; for ``dynamodb://<table>?region=…`` the table
(partition key ``pk``, on-demand billing) with TTL enabled on ``exp``. Stores that create
their own structures (``memory://``, ``sqlite:///…``, ``redis://…``) need nothing, and it
says so. Any store with the :class:`~telegram_idem.backends.Migratable` ability (a
``migrate()`` coroutine method) is migrated the same way. Exit status 0 on success, 3 for
an unreachable store or bad credentials, 4 for a bad URL (the message says which; it never
shows a password).
"""

from __future__ import annotations

import click

from telegram_idem._cli._common import open_store, run, store_argument
from telegram_idem.backends import Migratable

__all__ = ["migrate", "tables_of"]


async def _migrate(url: str) -> str:
    async with open_store(url, allow_memory=True, must_exist=False) as store:
        if not isinstance(store, Migratable):
            scheme = url.split(":", 1)[0]
            return f"{scheme}:// creates its own storage on first use: nothing to migrate"
        created = await store.migrate()
        tables = tables_of(store)
        if not tables:
            return f"migrated {store!r}"
        state = "created" if created is True else "ready"
        noun = "table" if len(tables) == 1 else "tables"
        return f"{state}: {noun} {_listed(tables)} ({store!r})"


_TABLE_ATTRS = (
    "table",
    "inbox_table",
    "outbox_table",
    "outbox_parked_table",
    "flood_table",
    "ledger_table",
)
"""Where a store names the tables ``migrate()`` makes: its records ``table``, and the
tables of its inbox, outbox (with its parked chats), flood budgets and effect ledger, on
the store or on the ``connection`` its abilities share."""


def tables_of(store: object) -> list[str]:
    """Every table ``migrate()`` made or found, in :data:`_TABLE_ATTRS` order, each once."""
    holders = (store, getattr(store, "connection", None))
    names: list[str] = []
    for attr in _TABLE_ATTRS:
        for holder in holders:
            name = getattr(holder, attr, None)
            if isinstance(name, str) and name not in names:
                names.append(name)
                break
    return names


def _listed(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


@click.command()
@store_argument
def migrate(store_url: str) -> None:
    """Create the tables URL's store needs (idempotent).

    Example: telegram-idem migrate 'postgresql://bot@db/bot?table_prefix=idem'
    """
    click.echo(run(lambda: _migrate(store_url)))
