"""``telegram-idem inbox stats|list|show|redrive|drop``: the durable inbox, for operators.

What a bot's inbox holds, read and repaired from outside the bot (cli_spec: the agreed
shape of every command):

- ``stats``: entries per status (pending, in flight, dead), how long the oldest of each
  has waited, and the ordering units (chats) with the most live entries;
- ``list``: entries oldest first, by status and chat, each with a one-line summary of its
  update (update id, type, chat);
- ``show``: one entry in full, its payload as JSON;
- ``redrive``: dead letters back to pending (``--all``: every dead letter, in batches,
  with a progress bar; Ctrl-C stops after the batch in hand);
- ``drop``: dead letters deleted for good (asks first unless ``--yes``); their update
  guard records stay, so a redelivery of the update is still a duplicate.

Every command takes ``--store URL`` (or ``$IDEM_STORE_URL``) and ``--json``; exit codes
are :class:`~telegram_idem._cli._common.Exit`'s: 1 when an entry named is not there (or
not a dead letter), 3 for an unreachable store, 4 for a bad URL or a store without an
inbox (DynamoDB), 130 when interrupted.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import click
from rich.console import Group
from rich.table import Table
from rich.text import Text

from telegram_idem._cli._common import (
    Exit,
    Output,
    batch_option,
    fail,
    json_option,
    limit_option,
    one_line,
    open_store,
    progress,
    run,
    store_option,
    table,
)
from telegram_idem.backends import inbox_of
from telegram_idem.inbox import EntryStatus, Inbox, InboxEntry, InboxStats, UnitBacklog

__all__ = ["chat_key", "entry_json", "inbox", "summary"]

_STATUS_CHOICE = click.Choice([s.value for s in EntryStatus])
_SUMMARY_WIDTH = 60
"""Most characters of an update's summary or last error in ``list``'s table."""


def chat_key(chat: str) -> str:
    """``--chat``'s value as an ordering key: a chat id (``42``, ``-100123``) becomes
    ``chat:<id>``; anything else (``chat:42``, ``user:7``, an entry id) is used as is."""
    text = chat.strip()
    body = text[1:] if text.startswith("-") else text
    return f"chat:{int(text)}" if body.isdigit() else text


def _payload(entry: InboxEntry) -> object:
    """The entry's payload as JSON, or as text when it is not JSON."""
    try:
        return json.loads(entry.payload)
    except (UnicodeDecodeError, ValueError):
        return entry.payload.decode("utf-8", errors="replace")


def summary(entry: InboxEntry) -> dict[str, Any]:
    """What ``list`` shows of an update: ``update_id``, its ``type`` (the update's one
    field besides ``update_id``, e.g. ``message``, ``callback_query``) and ``chat`` (the
    id of the chat it came from, when it names one); ``None`` where the payload says
    nothing (a rejected update)."""
    body = _payload(entry)
    if not isinstance(body, Mapping):
        return {"update_id": None, "type": None, "chat": None}
    kinds = [k for k in body if k != "update_id"]
    kind = kinds[0] if kinds else None
    chat = None
    inner = body.get(kind) if kind else None
    if isinstance(inner, Mapping):
        holder = inner.get("message") if kind == "callback_query" else inner
        found = holder.get("chat") if isinstance(holder, Mapping) else None
        if isinstance(found, Mapping):
            chat = found.get("id")
    return {"update_id": body.get("update_id"), "type": kind, "chat": chat}


def _when(seconds: float) -> str | None:
    """Seconds since the epoch as ISO 8601 UTC, or ``None`` for ``0`` (not recorded)."""
    if seconds <= 0:
        return None
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="seconds")


def _age(seconds: float) -> str:
    """A duration for people: ``42s``, ``3m05s``, ``2h10m``, ``4d03h``."""
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def entry_json(entry: InboxEntry, *, payload: bool) -> dict[str, Any]:
    """An entry for ``--json``: its fields (times as seconds since the epoch and as ISO
    8601 UTC), the update's :func:`summary`, and with ``payload`` the payload as JSON."""
    out: dict[str, Any] = {
        "id": entry.id,
        "seq": entry.seq,
        "status": entry.status.value,
        "ordering_key": entry.ordering_key,
        "attempts": entry.attempts,
        "token": entry.token,
        "admitted_at": entry.admitted_at or None,
        "admitted": _when(entry.admitted_at),
        "available_at": entry.available_at,
        "lease_expires_at": entry.lease_expires_at or None,
        "last_error": entry.last_error,
        "update": summary(entry),
    }
    if payload:
        out["payload"] = _payload(entry)
    return out


# ----------------------------------------------------------------- the group


@click.group()
def inbox() -> None:
    """The durable inbox: what is waiting, in flight or dead, and the dead letters'
    repair (redrive, drop).

    Entries are named by their id, the update guard key of their update
    (<prefix>:<bot_id>:u:<update_id>, e.g. idem:123456:u:9001), as "list" shows it.
    Every command reads the store URL from --store or $IDEM_STORE_URL.
    """


# ----------------------------------------------------------------- stats


def _stats_json(stats: InboxStats, units: Sequence[UnitBacklog]) -> dict[str, Any]:
    return {
        "counts": {s.value: stats.counts.get(s, 0) for s in EntryStatus},
        "oldest_age_seconds": {
            s.value: round(stats.oldest_age(s), 3) for s in stats.oldest_admitted_at
        },
        "oldest_admitted_at": {s.value: a for s, a in stats.oldest_admitted_at.items()},
        "now": stats.now,
        "backlog": [
            {
                "ordering_key": u.ordering_key,
                "pending": u.pending,
                "in_flight": u.in_flight,
                "oldest_age_seconds": round(max(stats.now - u.oldest_admitted_at, 0.0), 3),
            }
            for u in units
        ],
    }


def _stats_render(stats: InboxStats, units: Sequence[UnitBacklog]) -> object:
    def oldest(s: EntryStatus) -> str:
        return _age(stats.oldest_age(s)) if s in stats.oldest_admitted_at else "-"

    counts = table(
        "inbox",
        ["status", "entries", "oldest waiting"],
        [(s.value, stats.counts.get(s, 0), oldest(s)) for s in EntryStatus],
    )
    if not units:
        dead = stats.counts.get(EntryStatus.DEAD, 0)
        tail = f" ({dead} dead letters: inbox list --status dead)" if dead else ""
        return Group(counts, f"no pending or in-flight entries: no chat is waiting{tail}")
    rows = [
        (u.ordering_key, u.pending, u.in_flight, _age(stats.now - u.oldest_admitted_at))
        for u in units
    ]
    busiest = table("most live entries", ["unit", "pending", "in flight", "oldest"], rows)
    return Group(counts, busiest)


@inbox.command(name="stats")
@store_option
@json_option
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="How many ordering units (chats) with the most live entries to list.",
)
def stats_command(store_url: str, as_json: bool, top: int) -> None:
    """Entries per status (pending, in flight, dead), how long the oldest of each has
    waited since admission, and the chats with the most live entries.

    Exit status 0 (also for an empty inbox).

    Example: telegram-idem inbox stats --store sqlite:///bot.db
    """

    async def main() -> tuple[InboxStats, list[UnitBacklog]]:
        async with open_store(store_url) as store:
            box = inbox_of(store)
            return await box.stats(), await box.backlog(limit=top)

    stats, units = run(main)
    Output(as_json).show(_stats_json(stats, units), lambda: _stats_render(stats, units))


# ----------------------------------------------------------------- list


@inbox.command(name="list")
@store_option
@json_option
@click.option("--status", type=_STATUS_CHOICE, default=None, help="Only entries in this status.")
@click.option(
    "--chat",
    metavar="CHAT",
    default=None,
    help="Only this chat's entries: a chat id (42, -100123) or an ordering key "
    "(chat:42, user:7, or an entry id for an update without a chat).",
)
@limit_option("Most entries to list.", default=50)
def list_command(
    store_url: str, as_json: bool, status: str | None, chat: str | None, limit: int
) -> None:
    """Entries oldest first (admission order), each with its update's id, type and chat
    and its last error, cut to one line ("show ENTRY_ID" prints one in full).

    Exit status 0, also when nothing is listed.

    Example: telegram-idem inbox list --status dead --store redis://localhost:6379/0
    """
    wanted = None if status is None else EntryStatus(status)
    unit = None if chat is None else chat_key(chat)

    async def main() -> list[InboxEntry]:
        async with open_store(store_url) as store:
            return await inbox_of(store).entries(status=wanted, ordering_key=unit, limit=limit)

    got = run(main)
    out = Output(as_json)

    def render() -> object:
        if not got:
            return "no entries"
        now = time.time()
        rows = []
        for e in got:
            s = summary(e)
            update = f"{s['update_id']} {s['type'] or '?'}" + (
                f" chat {s['chat']}" if s["chat"] is not None else ""
            )
            age = _age(now - e.admitted_at) if e.admitted_at > 0 else "?"
            rows.append(
                (
                    e.id,
                    e.status.value,
                    e.ordering_key,
                    e.attempts,
                    age,
                    one_line(update, _SUMMARY_WIDTH),
                    one_line(e.last_error, _SUMMARY_WIDTH),
                )
            )
        columns = ["id", "status", "unit", "attempts", "age", "update", "last error"]
        return table(None, columns, rows)

    out.show([entry_json(e, payload=False) for e in got], render)
    if len(got) == limit and not as_json:
        out.note(f"(the first {limit}; --limit shows more)")


# ----------------------------------------------------------------- show


@inbox.command(name="show")
@store_option
@json_option
@click.argument("entry_id", metavar="ENTRY_ID")
def show_command(store_url: str, as_json: bool, entry_id: str) -> None:
    """One entry in full: status, attempts, times, last error, and its payload (the
    update as admitted) as JSON.

    Exit status 1 if there is no entry ENTRY_ID (acked entries are gone).

    Example: telegram-idem inbox show 'idem:123456:u:9001' --store sqlite:///bot.db
    """

    async def main() -> InboxEntry | None:
        async with open_store(store_url) as store:
            return await inbox_of(store).get(entry_id)

    got = run(main)
    if got is None:
        fail(f"no inbox entry {entry_id!r} (acked entries are removed)", Exit.PROBLEM)
    data = entry_json(got, payload=True)

    def render() -> object:
        fields = [
            ("id", got.id),
            ("status", got.status.value),
            ("unit", got.ordering_key),
            ("attempts", got.attempts),
            ("admitted", data["admitted"] or "unknown (before it was recorded)"),
        ]
        if got.status is EntryStatus.IN_FLIGHT:
            fields.append(("lease ends", _when(got.lease_expires_at)))
        if got.status is EntryStatus.PENDING and got.available_at > time.time():
            fields.append(("retry at", _when(got.available_at)))
        body = json.dumps(data["payload"], indent=2, ensure_ascii=False)
        # Plain text, never cropped to the terminal: the error and payload are copyable.
        parts: list[Table | Text] = [table(None, ["field", "value"], fields)]
        if got.last_error:
            parts.append(Text(f"last error: {got.last_error}"))
        parts += [Text("payload:"), Text(body)]
        return Group(*parts)

    Output(as_json).show(data, render)


# ----------------------------------------------------------------- redrive


async def _each(
    ids: Sequence[str], act: Callable[[Inbox, str], Any], store_url: str
) -> dict[str, bool]:
    async with open_store(store_url) as store:
        box = inbox_of(store)
        return {i: bool(await act(box, i)) for i in dict.fromkeys(ids)}


class _Stop:
    """Ctrl-C (SIGINT) during a long run: remembered, so the batch in hand finishes and
    the run stops before the next one (a second Ctrl-C interrupts at once)."""

    def __init__(self, note: Callable[[str], None]) -> None:
        self.requested = False
        self._note = note
        self._loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> _Stop:
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGINT, self._request)
            self._loop = loop
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            self._loop = None
        return self

    def _request(self) -> None:
        self.requested = True
        self._note("stopping after this batch (Ctrl-C again to stop at once)")
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGINT)  # the next one interrupts

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGINT)


async def _redrive_all(store_url: str, batch: int, out: Output) -> tuple[int, int, bool]:
    """Redrive every dead letter that was there at the start, ``batch`` at a time.

    Returns:
        (redriven, dead letters at the start, stopped by Ctrl-C).
    """
    async with open_store(store_url) as store:
        box = inbox_of(store)
        total = (await box.stats()).counts.get(EntryStatus.DEAD, 0)
        done = 0
        seen: set[str] = set()  # a letter buried again during the run is not redriven twice
        with progress(enabled=not out.as_json) as bar, _Stop(out.note) as stop:
            task = bar.add_task("redriving dead letters", total=total)
            while done < total and not stop.requested:
                page = await box.entries(status=EntryStatus.DEAD, limit=batch + len(seen))
                todo = [e for e in page if e.id not in seen][: min(batch, total - done)]
                if not todo:
                    break
                for e in todo:
                    seen.add(e.id)
                    if await box.redrive(e.id):
                        done += 1
                        bar.advance(task)
                if bar.disable:
                    out.note(f"redriven {done} of {total}")
        return done, total, stop.requested


@inbox.command(name="redrive")
@store_option
@json_option
@click.argument("entry_ids", metavar="[ENTRY_ID]...", nargs=-1)
@click.option(
    "--all",
    "redrive_all",
    is_flag=True,
    help="Every dead letter there is when the command starts, in batches, with a "
    "progress bar; Ctrl-C stops after the batch in hand (what was redriven stays so).",
)
@batch_option("Dead letters per batch with --all.")
def redrive_command(
    store_url: str, as_json: bool, entry_ids: tuple[str, ...], redrive_all: bool, batch: int
) -> None:
    """Put dead letters back to pending: each at the tail of its chat, attempts reset, so
    the bot's inbox worker processes it again (fix the cause first).

    Give ENTRY_IDs (as "list --status dead" shows them) or --all.
    Exit status 1 if an ENTRY_ID is not a dead letter (nothing is done to it), 130 if
    Ctrl-C stopped --all.

    Example: telegram-idem inbox redrive --all --store postgresql://bot@db/bot
    """
    out = Output(as_json)
    if redrive_all == bool(entry_ids):
        raise click.UsageError("give ENTRY_IDs or --all (not both)")
    if redrive_all:
        done, total, stopped = run(lambda: _redrive_all(store_url, batch, out))
        out.show(
            {"redriven": done, "dead_at_start": total, "interrupted": stopped},
            lambda: f"redriven {done} of {total} dead letters",
        )
        if stopped:
            out.note("interrupted: stopped after a batch; what was redriven stays redriven")
            sys.exit(int(Exit.INTERRUPTED))
        return
    answers = run(lambda: _each(entry_ids, lambda box, i: box.redrive(i), store_url))
    _report(out, answers, "redriven", "not a dead letter (nothing done)")


def _report(out: Output, answers: Mapping[str, bool], yes: str, no: str) -> None:
    out.show(
        {
            "done": [i for i, ok in answers.items() if ok],
            "not_done": [i for i, ok in answers.items() if not ok],
        },
        lambda: "\n".join(f"{i}: {yes if ok else no}" for i, ok in answers.items()),
    )
    if not all(answers.values()):
        sys.exit(int(Exit.PROBLEM))


# ----------------------------------------------------------------- drop


@inbox.command(name="drop")
@store_option
@json_option
@click.argument("entry_ids", metavar="ENTRY_ID...", nargs=-1, required=True)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def drop_command(store_url: str, as_json: bool, entry_ids: tuple[str, ...], yes: bool) -> None:
    """Delete dead letters for good (asks first unless --yes). Their update guard records
    stay: should Telegram deliver the update again, it is still refused as a duplicate.

    Only dead letters are dropped; a pending or in-flight entry is left alone.
    Exit status 1 if an ENTRY_ID is not a dead letter, or if you answer no.

    Example: telegram-idem inbox drop 'idem:123456:u:9001' --yes --store sqlite:///bot.db
    """
    out = Output(as_json)
    if not yes:
        noun = "dead letter" if len(entry_ids) == 1 else f"{len(entry_ids)} dead letters"
        if not click.confirm(f"Drop {noun} for good?", default=False, err=True):
            fail("nothing dropped", Exit.PROBLEM)
    answers = run(lambda: _each(entry_ids, lambda box, i: box.drop(i), store_url))
    _report(out, answers, "dropped", "not a dead letter (nothing done)")
