"""The ``telegram-idem`` command (needs ``pip install 'telegram-idem[cli]'``).

::

    telegram-idem migrate STORE_URL

``migrate`` creates what a store needs before its first use, idempotently, and names
every table it made or found: for ``postgresql://…?table_prefix=…`` the records and
inbox tables (``<prefix>_records`` and ``<prefix>_inbox``) and their indexes; for
``dynamodb://<table>?region=…`` the table (partition key ``pk``, on-demand billing) with
TTL enabled on ``exp``. Stores that create their own structures (``memory://``,
``sqlite:///…``, ``redis://…``) need nothing, and it says so. Any store with the
:class:`~telegram_idem.backends._abilities.Migratable` ability (a ``migrate()`` coroutine
method) is migrated the same way. Exit status 0 on success, 1 on
a bad URL, bad credentials or an unreachable store (the message says which; it never
shows a password).
"""

from __future__ import annotations

import asyncio

import click

from telegram_idem.backends import Migratable, store_from_url
from telegram_idem.errors import ConfigurationError, StoreError

__all__ = ["cli", "main"]


@click.group(name="telegram-idem")
@click.version_option(package_name="telegram-idem", prog_name="telegram-idem")
def cli() -> None:
    """Idempotency for Telegram bots: store administration."""


async def _migrate(url: str) -> str:
    store = store_from_url(url)
    try:
        if not isinstance(store, Migratable):
            scheme = url.split(":", 1)[0]
            return f"{scheme}:// creates its own storage on first use: nothing to migrate"
        created = await store.migrate()
        tables = _tables_of(store)
        if not tables:
            return f"migrated {store!r}"
        state = "created" if created is True else "ready"
        noun = "table" if len(tables) == 1 else "tables"
        return f"{state}: {noun} {' and '.join(tables)} ({store!r})"
    finally:
        await store.close()


def _tables_of(store: object) -> list[str]:
    """Every table ``migrate()`` made or found: the store's ``table`` and, for a store
    with a durable inbox in a table of its own, its ``inbox_table``."""
    names = [getattr(store, attr, None) for attr in ("table", "inbox_table")]
    return [name for name in names if isinstance(name, str)]


@cli.command()
@click.argument("store_url")
def migrate(store_url: str) -> None:
    """Create the tables STORE_URL's store needs (idempotent).

    Example: telegram-idem migrate 'postgresql://bot@db/bot?table_prefix=idem'
    """
    try:
        message = asyncio.run(_migrate(store_url))
    except (ConfigurationError, StoreError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(message)


def main() -> None:
    """Console-script entry point."""
    cli()
