"""``telegram-idem outbox``: the durable outbox's calls, seen and settled by an operator.

::

    telegram-idem outbox stats [--bot-id N]                    counts per status, oldest entry per status, parked chats
    telegram-idem outbox list [--status S] [--bot-id N] [--limit N]   entries oldest first
    telegram-idem outbox show KEY                              one entry in full (params and result as JSON)
    telegram-idem outbox redrive (KEY… | --all-dead [--bot-id N] [--batch N])   back to pending
    telegram-idem outbox resolve KEY --result JSON             an unknown call was delivered: record Telegram's answer
    telegram-idem outbox unpark --bot-id N CHAT                a blocked chat's calls back to pending

Every command reads the store from ``--store URL`` (or ``IDEM_STORE_URL``) and prints
JSON with ``--json``. Exit codes (:mod:`telegram_idem._cli._common`): 0 done; 1 a key or
chat is not there or not in a state the command settles; 2 usage (also a ``--result``
that is not JSON or not what the method returns); 3 the store is unreachable; 4 a bad URL
or a store without an outbox (DynamoDB); 130 interrupted (what was redriven stays so).

The outbox contract (``entries``, ``get``, ``counts``, ``parked_units``, ``redrive``,
``resolve``, ``unpark``) is :class:`telegram_idem.outbox.Outbox`; what each status means
and when to resolve or redrive is docs/outbound.md, "Operating it".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click
from rich.console import Group

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
from telegram_idem._cli._settle import (
    JsonText,
    age_text,
    chat_of,
    decode_json,
    json_value,
    ordering_key_of_chat,
    plain,
    result_problem,
)
from telegram_idem.backends import outbox_of
from telegram_idem.outbox import CallStatus, Outbox, OutboxEntry

__all__ = ["outbox"]

F = TypeVar("F", bound=Callable[..., Any])

OPEN_STATUSES = (
    CallStatus.UNKNOWN,
    CallStatus.DEAD,
    CallStatus.PARKED,
    CallStatus.PENDING,
    CallStatus.IN_FLIGHT,
)
"""What ``outbox list`` shows without ``--status``: every entry not settled (delivered and
superseded ones are kept only for replays)."""

ERROR_WIDTH = 60
"""Characters of ``last_error`` a table shows (``--json`` gives it whole)."""

_STATUS_NAMES = [status.value for status in CallStatus]


def _bot_id_option(help_text: str) -> Callable[[F], F]:
    return click.option("--bot-id", "bot_id", type=int, metavar="N", default=None, help=help_text)


def _summary(entry: OutboxEntry, now: float) -> dict[str, Any]:
    """An entry's row in ``list``, as JSON."""
    return {
        "key": entry.key,
        "bot_id": entry.bot_id,
        "method": entry.method,
        "chat": chat_of(entry.ordering_key, entry.key),
        "status": entry.status.value,
        "attempts": entry.attempts,
        "age": max(now - entry.created_at, 0.0),
        "created_at": entry.created_at,
        "last_error": entry.last_error,
    }


def _full(entry: OutboxEntry, now: float) -> dict[str, Any]:
    """Everything about an entry, as JSON (``show``): params and result decoded."""
    return {
        "key": entry.key,
        "bot_id": entry.bot_id,
        "seq": entry.seq,
        "method": entry.method,
        "ordering_key": entry.ordering_key,
        "chat": chat_of(entry.ordering_key, entry.key),
        "status": entry.status.value,
        "policy": entry.policy.value,
        "priority": entry.priority,
        "collapse_key": entry.collapse_key,
        "attempts": entry.attempts,
        "token": entry.token,
        "age": max(now - entry.created_at, 0.0),
        "created_at": entry.created_at,
        "available_at": entry.available_at,
        "lease_expires_at": entry.lease_expires_at,
        "settled_at": entry.settled_at,
        "retention": entry.retention,
        "last_error": entry.last_error,
        "params": decode_json(entry.params),
        "result": decode_json(entry.result),
    }


def _rows(items: Iterable[dict[str, Any]]) -> list[list[object]]:
    return [
        [
            i["key"],
            i["bot_id"],
            i["method"],
            i["chat"],
            i["status"],
            i["attempts"],
            age_text(i["age"]),
            one_line(i["last_error"], ERROR_WIDTH),
        ]
        for i in items
    ]


@click.group()
def outbox() -> None:
    """The outbox: Bot API calls waiting to be sent, unknown (the answer was lost),
    parked (the user blocked the bot) or dead (Telegram refused them), and settling them.

    An unknown call may have reached the user: look for it in the chat, then `resolve`
    it with the message Telegram returned, or `redrive` it to send it again. A dead
    letter carries Telegram's reason: fix the cause, then `redrive`. A parked chat is
    sent to again after `unpark`.
    """


# ---------------------------------------------------------------------- stats


async def _stats(url: str, bot_id: int | None) -> dict[str, Any]:
    async with open_store(url) as store:
        box = outbox_of(store)
        counts = await box.counts(bot_id=bot_id)
        now = await store.now()
        oldest: dict[str, float | None] = {}
        for status in OPEN_STATUSES:
            first = await box.entries(status=status, bot_id=bot_id, limit=1)
            oldest[status.value] = max(now - first[0].created_at, 0.0) if first else None
        parked = await box.parked_units(bot_id=bot_id)
    return {
        "bot_id": bot_id,
        "counts": {status.value: counts.get(status, 0) for status in CallStatus},
        "oldest_age": oldest,
        "parked_chats": [
            {"bot_id": bot, "ordering_key": unit, "chat": unit.removeprefix("chat:")}
            for bot, unit in sorted(parked)
        ],
    }


@outbox.command()
@_bot_id_option("Only this bot's calls (default: every bot in the store).")
@store_option
@json_option
def stats(bot_id: int | None, store_url: str, as_json: bool) -> None:
    """How many calls are in each status (pending, in flight, delivered, superseded,
    unknown, dead, parked), how old the oldest not-settled one of each status is, and the
    parked chats.

    Unknown and dead calls are what needs a person; a growing pending count with an old
    oldest entry means no relay is sending.

    \b
    Example:
      telegram-idem outbox stats --store sqlite:///bot.db
    """
    data = run(lambda: _stats(store_url, bot_id))
    out = Output(as_json)

    def render() -> object:
        rows = [
            [
                status,
                count,
                age_text(age) if (age := data["oldest_age"].get(status)) is not None else "",
            ]
            for status, count in data["counts"].items()
        ]
        counts = table(
            "outbox" + (f" of bot {bot_id}" if bot_id else ""), ["status", "calls", "oldest"], rows
        )
        parked = data["parked_chats"]
        if not parked:
            return counts
        return Group(
            counts,
            table("parked chats", ["bot", "chat"], [[p["bot_id"], p["chat"]] for p in parked]),
        )

    out.show(data, render)


# ----------------------------------------------------------------------- list


async def _list(
    url: str, status: CallStatus | None, bot_id: int | None, limit: int
) -> list[dict[str, Any]]:
    async with open_store(url) as store:
        box = outbox_of(store)
        statuses = (status,) if status is not None else OPEN_STATUSES
        found: list[OutboxEntry] = []
        for one in statuses:
            found.extend(await box.entries(status=one, bot_id=bot_id, limit=limit))
        now = await store.now()
    found.sort(key=lambda e: e.seq)
    return [_summary(e, now) for e in found[:limit]]


@outbox.command(name="list")
@click.option(
    "--status",
    type=click.Choice(_STATUS_NAMES),
    default=None,
    help="Only entries in this status (default: every status not settled: unknown, dead, "
    "parked, pending and in_flight).",
)
@_bot_id_option("Only this bot's calls (default: every bot in the store).")
@limit_option("At most this many entries.")
@store_option
@json_option
def list_(
    status: str | None, bot_id: int | None, limit: int, store_url: str, as_json: bool
) -> None:
    """The outbox's calls, oldest first: key, bot, method, chat, status, attempts, age
    (since it was enqueued) and the last error (truncated; whole with --json).

    Give a key to `outbox show` for its params, or to `resolve` / `redrive`.

    \b
    Example:
      telegram-idem outbox list --status unknown --store sqlite:///bot.db
    """
    wanted = CallStatus(status) if status is not None else None
    items = run(lambda: _list(store_url, wanted, bot_id, limit))
    out = Output(as_json)
    columns = ["key", "bot", "method", "chat", "status", "attempts", "age", "last error"]
    empty = "no entries" + (f" in status {status}" if status else " to settle")
    out.show(
        items, lambda: table(None, columns, _rows(items), whole=["key"]) if items else plain(empty)
    )


# ----------------------------------------------------------------------- show


async def _show(url: str, key: str) -> dict[str, Any] | None:
    async with open_store(url) as store:
        entry = await outbox_of(store).get(key)
        now = await store.now()
    return None if entry is None else _full(entry, now)


@outbox.command()
@click.argument("key")
@store_option
@json_option
def show(key: str, store_url: str, as_json: bool) -> None:
    """One outbox entry in full: its status, attempts, times (seconds since the epoch,
    store clock), policy, last error, and its params and result decoded as JSON.

    Exit status 1 when there is no entry under KEY.

    \b
    Example:
      telegram-idem outbox show 'idem:7000000001:o:receipt:42' --store sqlite:///bot.db
    """
    data = run(lambda: _show(store_url, key))
    if data is None:
        fail(f"no outbox entry under {key!r}", Exit.PROBLEM)
    out = Output(as_json)

    def render() -> object:
        rows: list[list[object]] = []
        for name, value in data.items():
            if name in ("params", "result"):
                value = json.dumps(value, ensure_ascii=False, indent=2)
            elif name == "age":
                value = age_text(value)
            rows.append([name, value])
        return table(None, ["field", "value"], rows)

    out.show(data, render)


# -------------------------------------------------------------------- redrive


async def _redrive_keys(url: str, keys: tuple[str, ...]) -> dict[str, Any]:
    redriven: list[str] = []
    refused: list[dict[str, str]] = []
    async with open_store(url) as store:
        box = outbox_of(store)
        for key in keys:
            if await box.redrive(key):
                redriven.append(key)
                continue
            entry = await box.get(key)
            reason = (
                "no outbox entry under it"
                if entry is None
                else f"it is {entry.status.value}: only dead, unknown and parked calls are redriven"
            )
            refused.append({"key": key, "reason": reason})
    return {"redriven": redriven, "refused": refused}


async def _redrive_dead(url: str, bot_id: int | None, batch: int, out: Output) -> dict[str, Any]:
    done = 0
    async with open_store(url) as store:
        box = outbox_of(store)
        total = (await box.counts(bot_id=bot_id)).get(CallStatus.DEAD, 0)
        out.note(f"redriving {total} dead letter{'s' if total != 1 else ''}")
        seen: set[str] = set()
        try:
            with progress(enabled=not out.as_json) as bar:
                task = bar.add_task("redrive", total=total)
                while done < total:
                    fresh = await _fresh_dead(box, bot_id, batch, seen)
                    if not fresh:
                        break  # none left (a relay may have sent or buried some again)
                    for entry in fresh:
                        seen.add(entry.key)
                        if await box.redrive(entry.key):
                            done += 1
                            bar.advance(task)
        except (asyncio.CancelledError, KeyboardInterrupt):
            out.note(
                f"stopped after {done} of {total}: those are pending again, the rest stay dead"
            )
            raise
    return {"redriven": done, "dead_before": total}


async def _fresh_dead(
    box: Outbox, bot_id: int | None, batch: int, seen: set[str]
) -> list[OutboxEntry]:
    """The next dead entries not redriven by this run (a redriven entry that died again
    has a newer ``seq``, so it sorts after the ones still to do)."""
    entries = await box.entries(status=CallStatus.DEAD, bot_id=bot_id, limit=batch + len(seen))
    return [e for e in entries if e.key not in seen][:batch]


@outbox.command()
@click.argument("keys", nargs=-1, metavar="[KEY]...")
@click.option(
    "--all-dead",
    is_flag=True,
    help="Every dead letter (of --bot-id, or of every bot), in batches, with a progress bar.",
)
@_bot_id_option("With --all-dead: only this bot's dead letters.")
@batch_option("With --all-dead: entries read per round trip.")
@store_option
@json_option
def redrive(
    keys: tuple[str, ...],
    all_dead: bool,
    bot_id: int | None,
    batch: int,
    store_url: str,
    as_json: bool,
) -> None:
    """Put dead, unknown or parked calls back to pending, at the back of their chat
    (attempts reset): a running relay sends them.

    Redrive an unknown call only when it did NOT reach the user (else `resolve` it): it
    is sent again. A parked chat stays parked for later calls until `unpark`.

    Exit status 1 when a KEY has no entry or is not dead, unknown or parked (the others
    are redriven); 130 when Ctrl-C stopped --all-dead (what was redriven stays so).

    \b
    Examples:
      telegram-idem outbox redrive 'idem:7000000001:o:hello:1' --store sqlite:///bot.db
      telegram-idem outbox redrive --all-dead --bot-id 7000000001 --store sqlite:///bot.db
    """
    if bool(keys) == all_dead:
        raise click.UsageError("give KEY... or --all-dead (one of them)")
    if bot_id is not None and not all_dead:
        raise click.UsageError("--bot-id goes with --all-dead (a KEY names its bot)")
    out = Output(as_json)
    if all_dead:
        dead = run(lambda: _redrive_dead(store_url, bot_id, batch, out))
        out.show(dead, lambda: plain(f"redriven: {dead['redriven']} dead letters back to pending"))
        return
    data = run(lambda: _redrive_keys(store_url, keys))
    out.show(
        data,
        lambda: plain(
            "\n".join(
                [f"redriven: {key}" for key in data["redriven"]]
                + [f"not redriven: {r['key']}: {r['reason']}" for r in data["refused"]]
            )
        ),
    )
    if data["refused"]:
        raise SystemExit(int(Exit.PROBLEM))


# -------------------------------------------------------------------- resolve


async def _resolve(url: str, key: str, given: JsonText) -> tuple[Exit, str]:
    async with open_store(url) as store:
        box = outbox_of(store)
        entry = await box.get(key)
        if entry is None:
            return Exit.PROBLEM, f"no outbox entry under {key!r}"
        if entry.status is not CallStatus.UNKNOWN:
            return Exit.PROBLEM, (
                f"{key!r} is {entry.status.value}, not unknown: only a call whose answer was "
                "lost is resolved" + _hint(entry.status)
            )
        params = decode_json(entry.params)
        problem = result_problem(
            entry.method, params if isinstance(params, dict) else {}, given.value
        )
        if problem is not None:
            return Exit.USAGE, f"--result: {problem}"
        data = json.dumps(given.value, separators=(",", ":"), ensure_ascii=True).encode()
        if not await box.resolve(key, result=data):
            return Exit.PROBLEM, f"{key!r} is no longer unknown (settled meanwhile)"
    return Exit.OK, f"resolved: {key} delivered ({entry.method}); replays answer with the result"


def _hint(status: CallStatus) -> str:
    if status in (CallStatus.DEAD, CallStatus.PARKED):
        return f" (a {status.value} call is sent again with `outbox redrive`)"
    return ""


@outbox.command()
@click.argument("key")
@click.option(
    "--result",
    "given",
    callback=json_value,
    required=True,
    metavar="JSON",
    help="What Telegram returned: for sendMessage and the other send… methods the whole "
    'Message, e.g. \'{"message_id": 7, "date": 1700000000, "chat": {"id": 42, "type": '
    '"private"}, "text": "Your receipt"}\'; for most other methods true.',
)
@store_option
@json_option
def resolve(key: str, given: JsonText, store_url: str, as_json: bool) -> None:
    """Settle the unknown call KEY as delivered: Telegram applied it and answered
    --result (found in the chat). The code that made the call, and every replay of its
    key, gets this result as Telegram's answer, so it must be what the method returns:
    a Message (message_id, date, chat with id and type; the chat the call went to) for
    the send… methods, forwardMessage and the edits, a MessageId for copyMessage.

    A resolution is final. When the message cannot be rebuilt, `redrive` the call (it is
    sent again) or leave it unknown.

    Exit status 1 when KEY has no entry or is not unknown (a dead or parked call is
    redriven instead); 2 when --result is not JSON or not what the method returns.

    \b
    Example:
      telegram-idem outbox resolve 'idem:7000000001:o:receipt:42' --store sqlite:///bot.db \\
        --result '{"message_id": 7, "date": 1700000000, "chat": {"id": 42, "type": "private"}}'
    """
    code, line = run(lambda: _resolve(store_url, key, given))
    if code is not Exit.OK:
        fail(line, code)
    out = Output(as_json)
    out.show({"key": key, "resolved": True}, lambda: plain(line))


# --------------------------------------------------------------------- unpark


async def _unpark(url: str, bot_id: int, unit: str) -> int | None:
    async with open_store(url) as store:
        box = outbox_of(store)
        if (bot_id, unit) not in await box.parked_units(bot_id=bot_id):
            return None
        return await box.unpark(bot_id=bot_id, ordering_key=unit)


@outbox.command()
@click.option("--bot-id", "bot_id", type=int, required=True, metavar="N", help="The bot.")
@click.argument("chat")
@store_option
@json_option
def unpark(bot_id: int, chat: str, store_url: str, as_json: bool) -> None:
    """The user unblocked the bot in CHAT: clear the chat's parked mark and put its
    parked calls back to pending, in their order (a running relay sends them).

    CHAT is a chat id (42, -1001234567890), a @channelusername, or an ordering key as
    `outbox stats` lists it (chat:42). Exit status 1 when the chat is not parked.

    \b
    Example:
      telegram-idem outbox unpark --bot-id 7000000001 42 --store sqlite:///bot.db
    """
    unit = ordering_key_of_chat(chat)
    count = run(lambda: _unpark(store_url, bot_id, unit))
    if count is None:
        fail(f"{unit} of bot {bot_id} is not parked", Exit.PROBLEM)
    out = Output(as_json)
    out.show(
        {"bot_id": bot_id, "ordering_key": unit, "unparked": count},
        lambda: plain(
            f"unparked {unit} of bot {bot_id}: {count} call{'s' if count != 1 else ''} "
            "back to pending"
        ),
    )
