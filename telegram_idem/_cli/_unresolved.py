"""``telegram-idem unresolved``: what may or may not have happened, and settling it.

::

    telegram-idem unresolved list [--prefix P | --bot-id N [--key-prefix NS]] [--limit N]
    telegram-idem unresolved resolve KEY (--result JSON | --not-applied) [--retention SECONDS]

``list`` is :meth:`telegram_idem.Idem.unresolved` (at-most-once steps and actions whose
outcome nobody recorded, and the outbox's unknown sends, oldest first) and
:meth:`~telegram_idem.Idem.oldest_unresolved_age`; ``resolve`` is
:meth:`telegram_idem.Idem.resolve`, run by an :class:`~telegram_idem.Idem` over the store
of ``--store URL`` (or ``IDEM_STORE_URL``). See docs/effects.md, "Unknown outcomes".

Where a bot's keys are: the store URL selects the store and its namespace (the SQLite
file, PostgreSQL ``?table_prefix=``, Redis ``?key_prefix=``); inside it, every key the
guard writes starts with its :class:`~telegram_idem.KeyBuilder` ``prefix`` (``"idem"``
unless the bot set ``Idem(keys=KeyBuilder(prefix=...))``) and the bot id
(``idem:<bot id>:…``). ``list`` shows every namespace unless ``--prefix`` (any key
prefix) or ``--bot-id`` (with ``--key-prefix``) narrows it; ``resolve`` takes the full
key ``list`` shows. A result given as JSON is stored as the guard stores results (its
default :class:`~telegram_idem.JsonCodec`), so a bot with a codec of its own must resolve
through its own ``Idem``.

Exit codes (:mod:`telegram_idem._cli._common`): ``list`` 1 when it listed anything and 0
when nothing is unresolved (an alert check); ``resolve`` 0 settled, 1 nothing to settle
under the key (never unknown, settled or completed already, or still running under a live
lease), 2 usage (neither or both of ``--result`` and ``--not-applied``, a result that is
not JSON, or not what a send's method returns); 3 unreachable; 4 a bad URL or a store
with neither an effect ledger nor an outbox.
"""

from __future__ import annotations

from typing import Any

import click

from telegram_idem import Idem, KeyBuilder, ResolveError
from telegram_idem._cli._common import (
    Exit,
    Output,
    as_mapping,
    fail,
    json_option,
    limit_option,
    one_line,
    open_store,
    run,
    store_option,
    table,
)
from telegram_idem._cli._settle import (
    JsonText,
    age_text,
    decode_json,
    json_value,
    plain,
    result_problem,
)
from telegram_idem.backends import Store, has_ledger, has_outbox, outbox_of
from telegram_idem.errors import ConfigurationError
from telegram_idem.outbox import CallStatus

__all__ = ["unresolved"]

DEFAULT_KEY_PREFIX = KeyBuilder().prefix
"""The guard's key namespace unless the bot gave ``KeyBuilder(prefix=...)``."""

DETAIL_WIDTH = 50
"""Characters of ``detail`` a table shows (``--json`` gives it whole)."""


def _guard(store: Store, retention: float) -> Idem:
    """A guard over ``store`` for reconciliation (no heartbeat: it holds nothing long).

    Raises:
        ConfigurationError: the store has neither an effect ledger nor an outbox, so
            nothing can be unresolved in it.
    """
    if not has_ledger(store) and not has_outbox(store):
        raise ConfigurationError(
            f"{type(store).__name__} has neither an effect ledger nor an outbox: nothing in "
            "it can be unresolved"
        )
    return Idem(
        store,
        heartbeat=False,
        action_retention=retention,
        holder="telegram-idem-cli",
    )


@click.group()
def unresolved() -> None:
    """Effects that may or may not have happened: at-most-once steps and actions whose
    holder failed ambiguously or died, and outbox sends whose answer was lost. Nothing
    runs them again by itself until someone resolves them.

    Find out what happened (ask the provider, look in the chat), then `resolve` the key:
    with --result when it took effect (the next run replays it), with --not-applied when
    it did not (the next run runs it).
    """


# ----------------------------------------------------------------------- list


async def _list(url: str, prefix: str, limit: int) -> list[dict[str, Any]]:
    async with open_store(url) as store:
        idem = _guard(store, 24 * 3600.0)
        items = await idem.unresolved(prefix=prefix, limit=limit)
    return [dict(as_mapping(item)) for item in items]


def _prefix(prefix: str | None, bot_id: int | None, key_prefix: str | None) -> str:
    if prefix is not None and (bot_id is not None or key_prefix is not None):
        raise click.UsageError("--prefix is a whole key prefix: give it, or --bot-id/--key-prefix")
    if prefix is not None:
        return prefix
    if bot_id is not None:
        return f"{key_prefix or DEFAULT_KEY_PREFIX}:{bot_id}:"
    return f"{key_prefix}:" if key_prefix is not None else ""


@unresolved.command(name="list")
@click.option(
    "--prefix",
    metavar="P",
    default=None,
    help="Only keys that start with P (an action's key: it and its steps and sends).",
)
@click.option(
    "--bot-id",
    "bot_id",
    type=int,
    metavar="N",
    default=None,
    help="Only this bot's keys (<key-prefix>:<N>:…).",
)
@click.option(
    "--key-prefix",
    "key_prefix",
    metavar="NS",
    default=None,
    help="The bot's KeyBuilder prefix (Idem(keys=KeyBuilder(prefix=NS)); the default "
    "namespace is 'idem'): only keys in it.",
)
@limit_option("At most this many, oldest first.")
@store_option
@json_option
def list_(
    prefix: str | None,
    bot_id: int | None,
    key_prefix: str | None,
    limit: int,
    store_url: str,
    as_json: bool,
) -> None:
    """The unresolved steps, actions and sends, oldest first: key, kind (step, action,
    send), state (unknown, or started: its holder stopped and nobody met it since), age
    (store clock), holder, attempts and what is known (the ambiguous error; a send's
    method and last error); then the age of the oldest.

    Exit status 1 when anything is listed, 0 when nothing is unresolved: usable as an
    alert check (cron, a Kubernetes probe, Nagios).

    \b
    Example:
      telegram-idem unresolved list --bot-id 7000000001 --store sqlite:///bot.db
    """
    wanted = _prefix(prefix, bot_id, key_prefix)
    items = run(lambda: _list(store_url, wanted, limit))
    oldest = items[0]["age"] if items else None
    out = Output(as_json)
    columns = ["key", "kind", "state", "age", "holder", "attempts", "detail"]
    rows = [
        [
            i["key"],
            i["kind"],
            i["state"],
            age_text(i["age"]),
            i["holder"],
            i["attempts"],
            one_line(i["detail"], DETAIL_WIDTH),
        ]
        for i in items
    ]
    out.show(
        {"count": len(items), "oldest_age": oldest, "items": items},
        lambda: (
            table(None, columns, rows, whole=["key"]) if items else plain("nothing is unresolved")
        ),
    )
    if oldest is not None:
        if not as_json:
            noun = "effect" if len(items) == 1 else "effects"
            out.console.print(
                f"{len(items)} unresolved {noun}; the oldest started {age_text(oldest)} ago",
                markup=False,
                highlight=False,
            )
        raise SystemExit(int(Exit.PROBLEM))


# -------------------------------------------------------------------- resolve


async def _resolve(
    url: str, key: str, given: JsonText | None, retention: float
) -> tuple[Exit, str, str]:
    async with open_store(url) as store:
        idem = _guard(store, retention)
        kind = "step" if ":s:" in key else "action"
        if has_outbox(store):
            entry = await outbox_of(store).get(key)
            if entry is not None and entry.status is CallStatus.UNKNOWN:
                kind = "send"
                params = decode_json(entry.params)
                if given is not None:
                    problem = result_problem(
                        entry.method, params if isinstance(params, dict) else {}, given.value
                    )
                    if problem is not None:
                        return Exit.USAGE, f"--result: {problem}", kind
        try:
            if given is None:
                await idem.resolve(key, not_applied=True)
            else:
                await idem.resolve(key, result=given.value)
        except ResolveError as exc:
            return Exit.PROBLEM, str(exc), kind
    if given is None:
        then = "it goes back to be sent" if kind == "send" else "the next run runs it"
        return Exit.OK, f"resolved: {key} did not happen; {then}", kind
    return Exit.OK, f"resolved: {key} took effect; the next run replays the result", kind


@unresolved.command()
@click.argument("key")
@click.option(
    "--result",
    "given",
    callback=json_value,
    default=None,
    metavar="JSON",
    help="It took effect, with this result (JSON; stored as the guard stores results, "
    "replayed by the next run: a step's action gets it as the step's result). For a "
    "send: what Telegram returned (a whole Message for the send… methods).",
)
@click.option(
    "--not-applied",
    "not_applied",
    is_flag=True,
    help="It did not take effect: the next run runs it (a send goes back to be sent).",
)
@click.option(
    "--retention",
    type=click.FloatRange(min=1.0),
    default=24 * 3600.0,
    show_default=True,
    metavar="SECONDS",
    help="How long the resolved result is kept for replays: the bot's Idem(action_retention=...).",
)
@store_option
@json_option
def resolve(
    key: str,
    given: JsonText | None,
    not_applied: bool,
    retention: float,
    store_url: str,
    as_json: bool,
) -> None:
    """Settle the unresolved KEY (as `unresolved list` shows it): it took effect with
    --result, or it did not (--not-applied). Exactly one of them.

    Fenced like the library's own Idem.resolve: the resolver claims the key first, so a
    holder that wakes up late cannot overwrite the resolution, and the first resolution
    stands. Exit status 1 when KEY has nothing to settle (never unknown, settled or
    completed already, or still running under a live lease).

    \b
    Examples:
      telegram-idem unresolved resolve 'idem:7000000001:a:grant:42:s:grant' --result '"granted"'
      telegram-idem unresolved resolve 'idem:7000000001:a:refund:9' --not-applied
    """
    if (given is None) == (not not_applied):
        raise click.UsageError("give exactly one of --result JSON or --not-applied")
    code, line, kind = run(lambda: _resolve(store_url, key, given, retention))
    if code is not Exit.OK:
        fail(line, code)
    Output(as_json).show(
        {"key": key, "kind": kind, "resolved": "not_applied" if not_applied else "applied"},
        lambda: plain(line),
    )
