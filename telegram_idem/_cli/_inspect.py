"""``telegram-idem inspect KEY`` / ``inspect --prefix P``: idempotency records as stored."""

from __future__ import annotations

import click

from telegram_idem._cli._common import (
    Exit,
    Output,
    json_option,
    limit_option,
    open_store,
    run,
    store_option,
)
from telegram_idem._cli._record_rows import one_record_table, record_json, records_table
from telegram_idem.backends import as_browsable

__all__ = ["inspect"]


async def _one(url: str, key: str, out: Output) -> Exit:
    async with open_store(url) as store:
        record = await store.get(key)
        now = await store.now()
    if record is None:
        out.show({"key": key, "found": False}, lambda: f"no record for key {key!r}")
        return Exit.PROBLEM
    data = {"found": True, **record_json(record, now)}
    out.show(data, lambda: one_record_table(record, now))
    return Exit.OK


async def _many(url: str, prefix: str, limit: int, out: Output) -> Exit:
    async with open_store(url) as store:
        records = await as_browsable(store).records(prefix=prefix, limit=limit)
        now = await store.now()
        name = repr(store)
    data = {
        "prefix": prefix,
        "limit": limit,
        "truncated": len(records) == limit,
        "records": [record_json(r, now) for r in records],
    }
    noun = "record" if len(records) == 1 else "records"
    title = f"{len(records)} {noun} under {prefix!r} in {name}"
    if len(records) == limit:
        title += f" (the first {limit}: raise --limit for more)"
    out.show(data, lambda: records_table(title, records, now))
    return Exit.OK


@click.command()
@click.argument("key", required=False)
@click.option("--prefix", metavar="P", help="Every live record whose key starts with P.")
@limit_option("Most records --prefix lists (the first in key order).")
@store_option
@json_option
def inspect(key: str | None, prefix: str | None, limit: int, store_url: str, as_json: bool) -> None:
    """Show the record of KEY, or the records under a prefix.

    Shows the idempotency record of KEY, or the records whose key starts with P
    (--prefix P). One row per record, judged by the store's clock: key (as stored: a key over 1024
    bytes, or with a lone surrogate or NUL, is kept as its first 200 bytes, ":h:" and a
    hash), status (in_progress, completed, failed), fencing token (+1 at every claim
    that acquired the key), lease left (s; "-" once settled), retention left (s: the
    record, and the duplicate protection it gives, ends then), attempts (how many times
    the key was acquired), fingerprint (of the payload first claimed, or "-") and
    result size (bytes of the stored result or failure; "-" while in progress).

    in_progress with 0 lease left is a claim nobody holds: its holder died, or it was
    released (a body that raised a not-applied error, or was cancelled, gives its claim
    back this way); the next claim takes it over either way (a takeover: the fencing
    token goes up). A live holder shows lease left > 0.

    --prefix lists the live records in key order, at most --limit of them; it needs a
    store with the Browsable ability (memory, SQLite, PostgreSQL, Redis, DynamoDB;
    Redis scans its whole keyspace with SCAN, DynamoDB its whole table). The prefix is never a pattern: %, _, * and ? match
    themselves. --json prints {"found": ..., <the fields>} for KEY, {"prefix", "limit",
    "truncated", "records": [...]} for --prefix (times as lease_left_s,
    retention_left_s; result_bytes).

    Exit status: 0 shown, 1 KEY has no live record, 2 usage (give KEY or --prefix, not
    both), 3 store unreachable, 4 bad URL or a store that cannot list by prefix.

    Examples:

    \b
        telegram-idem inspect --store sqlite:///bot.db 'idem:123456:u:987654'
        telegram-idem inspect --store "$IDEM_STORE_URL" --prefix 'idem:123456:a:' --json
    """
    if (key is None) == (prefix is None):
        raise click.UsageError("give KEY or --prefix P (one of them)")
    out = Output(as_json)
    if key is not None:
        code = run(lambda: _one(store_url, key, out))
    else:
        assert prefix is not None
        code = run(lambda: _many(store_url, prefix, limit, out))
    raise SystemExit(int(code))
