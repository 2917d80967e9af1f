"""``telegram-idem purge --expired`` / ``purge --prefix P``: delete records in batches."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import click

from telegram_idem._cli._common import (
    Exit,
    Output,
    batch_option,
    json_option,
    open_store,
    progress,
    run,
    store_option,
)
from telegram_idem.backends import Browsable, Purgeable, as_browsable, as_purgeable

__all__ = ["EXPIRES_ITSELF", "purge"]

EXPIRES_ITSELF = {
    "telegram_idem.backends.redis": "Redis forgets each record when its retention ends (PEXPIRE)",
    "telegram_idem.backends.dynamodb": "DynamoDB deletes records past retention itself "
    "(its TTL attribute exp; reads ignore them meanwhile)",
}
"""Stores that expire records themselves, by the module of their class: ``purge
--expired`` has nothing to do there (exit 0 with this line)."""


def _plural(n: int) -> str:
    return f"{n} record" if n == 1 else f"{n} records"


def _stopped(deleted: int, out: Output) -> None:
    """Say how many were deleted before Ctrl-C: a line for people, and under ``--json``
    the command's one document, ``{"deleted": n, "interrupted": true}``."""
    out.note(f"interrupted: {_plural(deleted)} deleted before the stop")
    if out.as_json:
        out.json({"deleted": deleted, "interrupted": True})


async def _batches(
    step: Callable[[], Awaitable[int]], total: int | None, what: str, out: Output
) -> int:
    """``step()`` until it deletes nothing, a progress bar advancing by what each
    deleted. Ctrl-C stops between batches: a batch in flight is let finish (it commits
    whole) and counted, no other starts, and the count so far is printed before the
    interruption goes on (exit 130)."""
    deleted = 0
    current = asyncio.current_task()
    with progress(enabled=not out.as_json) as bar:
        task = bar.add_task(what, total=total)
        while True:
            if current is not None and current.cancelling():
                _stopped(deleted, out)
                raise asyncio.CancelledError
            batch = asyncio.ensure_future(step())
            try:
                n = await asyncio.shield(batch)
            except asyncio.CancelledError:
                n = await _finish(batch)
                _stopped(deleted + n, out)
                raise
            if n == 0:
                break
            deleted += n
            bar.update(task, advance=n, total=max(total or 0, deleted))
    return deleted


async def _finish(batch: asyncio.Future[int]) -> int:
    """What the batch in flight deleted, once it is done (0 if it failed)."""
    try:
        return await batch
    except Exception:
        return 0


async def _expired(url: str, dry_run: bool, out: Output) -> Exit:
    async with open_store(url) as store:
        why = EXPIRES_ITSELF.get(type(store).__module__)
        if why is not None and not isinstance(store, Purgeable):
            out.show(
                {"expired": True, "dry_run": dry_run, "deleted": 0, "expires_itself": True},
                lambda: f"nothing to purge: {why}",
            )
            return Exit.OK
        purgeable = as_purgeable(store)
        if dry_run:
            counted = await as_browsable(store).count_records(prefix="", expired=True)
            out.show(
                {"expired": True, "dry_run": True, "would_delete": counted},
                lambda: f"dry run: {_plural(counted)} past retention would be deleted",
            )
            return Exit.OK
        total = (
            await store.count_records(prefix="", expired=True)
            if isinstance(store, Browsable)
            else None
        )
        deleted = await _batches(purgeable.purge, total, "purging expired records", out)
    out.show(
        {"expired": True, "dry_run": False, "deleted": deleted},
        lambda: f"deleted {_plural(deleted)} past retention",
    )
    return Exit.OK


async def _prefix(url: str, prefix: str, dry_run: bool, yes: bool, batch: int, out: Output) -> Exit:
    async with open_store(url) as store:
        browsable = as_browsable(store)
        count = await browsable.count_records(prefix=prefix)
        base = {"prefix": prefix, "dry_run": dry_run}
        if dry_run:
            out.show(
                {**base, "would_delete": count},
                lambda: f"dry run: {_plural(count)} under {prefix!r} would be deleted",
            )
            return Exit.OK
        if count == 0:
            out.show(
                {**base, "deleted": 0},
                lambda: f"no record under {prefix!r}: nothing to delete",
            )
            return Exit.OK
        if not yes and not click.confirm(
            f"delete {_plural(count)} whose key starts with {prefix!r} from {store!r}? "
            "(a deleted update guard lets a duplicate of its update run again)",
            err=True,
        ):
            out.note("nothing deleted")
            return Exit.PROBLEM
        deleted = await _batches(
            lambda: browsable.delete_records(prefix=prefix, limit=batch),
            count,
            f"deleting records under {prefix!r}",
            out,
        )
    out.show(
        {**base, "deleted": deleted},
        lambda: f"deleted {_plural(deleted)} whose key starts with {prefix!r}",
    )
    return Exit.OK


@click.command()
@click.option("--expired", is_flag=True, help="Delete the records past their retention.")
@click.option("--prefix", metavar="P", help="Delete the records whose key starts with P.")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--yes", is_flag=True, help="Do not ask before deleting by --prefix.")
@batch_option("Records deleted per batch (--prefix).", default=1000)
@store_option
@json_option
def purge(
    expired: bool,
    prefix: str | None,
    dry_run: bool,
    yes: bool,
    batch: int,
    store_url: str,
    as_json: bool,
) -> None:
    """Delete expired records, or records by key prefix.

    Deletes the records past their retention (--expired) or those whose key starts
    with P (--prefix P), in batches, with a progress bar on a terminal, and prints how
    many.

    --expired runs the store's purge() (the Purgeable ability: SQLite, PostgreSQL) until
    a batch deletes nothing. Redis and DynamoDB forget expired records themselves: the
    command says so and exits 0. --dry-run counts the records past retention instead.

    --prefix P deletes every stored record whose key starts with P, live ones too (the
    Browsable ability: memory, SQLite, PostgreSQL, Redis, DynamoDB), --batch records per batch,
    after asking for confirmation unless --yes (the question goes to stderr). Deleting
    a live update guard (idem:<bot id>:u:<update id>) lets a duplicate of that update
    run again: it is for tests, tenants and cleaning up after a key layout change. P is
    never a pattern (%, _, * and ? match themselves); --dry-run counts and deletes
    nothing.

    Ctrl-C stops between batches: a batch in flight commits or rolls back whole, what
    was deleted stays deleted, and the count so far is printed (exit 130). --json prints
    {"deleted": n} (or {"would_delete": n} with --dry-run) with "expired" or "prefix"
    and "dry_run".

    Exit status: 0 done (or nothing to do), 1 confirmation declined, 2 usage (give
    --expired or --prefix, not both), 3 store unreachable, 4 bad URL or a store without
    the ability, 130 interrupted.

    Examples:

    \b
        telegram-idem purge --store sqlite:///bot.db --expired
        telegram-idem purge --store "$IDEM_STORE_URL" --prefix 'test:' --dry-run
        telegram-idem purge --store redis://localhost:6379/0 --prefix 'idem:42:a:' --yes
    """
    if expired == (prefix is not None):
        raise click.UsageError("give --expired or --prefix P (one of them)")
    if prefix == "":
        raise click.UsageError(
            "an empty --prefix is every record in the store, live update guards included; "
            "give the prefix of what to delete (e.g. 'idem:42:a:')"
        )
    out = Output(as_json)
    if prefix is None:
        code = run(lambda: _expired(store_url, dry_run, out))
    else:
        code = run(lambda: _prefix(store_url, prefix, dry_run, yes, batch, out))
    raise SystemExit(int(code))
