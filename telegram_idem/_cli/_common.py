"""What every ``telegram-idem`` command shares: the store URL, ``--json``, exit codes,
output, progress bars, Ctrl-C, and keeping secrets out of what is printed.

Exit codes (the same for every command, so scripts can trust them):

| code | meaning |
|---|---|
| 0 | done; the answer is the good one (``check`` found nothing wrong, a key exists…) |
| 1 | done, and the answer is a problem: ``check`` found one, a key or entry is not there, ``replay`` had failed deliveries, ``unresolved`` listed something |
| 2 | usage: a missing or bad argument (click's own code) |
| 3 | the store (or the Bot API, or the webhook) could not be reached or did not answer |
| 4 | configuration: a bad store URL, a missing driver, or the store lacks what the command needs |
| 130 | interrupted (Ctrl-C): stopped cleanly, what was done is kept |
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from enum import IntEnum
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlsplit

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from telegram_idem.backends import Store, store_from_url
from telegram_idem.errors import ConfigurationError, StoreError

__all__ = [
    "STORE_ENV",
    "Exit",
    "Output",
    "as_mapping",
    "check_http_url",
    "fail",
    "json_option",
    "limit_option",
    "one_line",
    "open_store",
    "progress",
    "redact_text",
    "run",
    "store_argument",
    "store_option",
    "table",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

STORE_ENV = "IDEM_STORE_URL"
"""The environment variable every command reads the store URL from when none is given."""


class Exit(IntEnum):
    """The exit codes of every command (the module docstring's table)."""

    OK = 0
    PROBLEM = 1
    USAGE = 2
    UNREACHABLE = 3
    CONFIGURATION = 4
    INTERRUPTED = 130


_TOKEN = re.compile(r"(?<!\d)\d{5,}(?::|%(?:25)*3[aA])[A-Za-z0-9_-]{30,}(?![A-Za-z0-9_-])")
"""A Bot API token (``<bot id>:<secret>``), wherever it appears (URLs, error text), also
right after ``/bot`` in a Bot API URL (no word boundary there), and with its ``:``
percent-encoded (``%3A``, ``%253A``: a download URL inside another URL)."""
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/\s:@]*:)(?P<pw>[^@/\s]+)(?P<at>@)")


def redact_text(text: str) -> str:
    """``text`` with every bot token replaced by ``<token>`` and every URL password by
    ``***``: the one filter between a command and what it prints."""
    text = _TOKEN.sub("<token>", text)
    return _URL_PASSWORD.sub(r"\g<head>***\g<at>", text)


def one_line(text: str | None, width: int) -> str:
    """``text`` redacted (:func:`redact_text`), on one line, at most ``width`` characters
    (``…`` when cut). Redacted before it is cut: a token cut short would no longer look
    like one, and the table's own redaction would print its start.

    Args:
        text: any text, or ``None`` (an empty cell).
        width: the most characters shown.
    """
    line = " ".join(redact_text(text or "").split())
    return line if len(line) <= width else line[: width - 1] + "…"


_PIPED_WIDTH = 1000
"""Columns a table may use when stdout is not a terminal (and ``COLUMNS`` is unset)."""

_MESSAGE_CHARS = 500
"""The most characters of an error line: a 100 000-character key is not echoed whole."""


def _bounded(line: str) -> str:
    if len(line) <= _MESSAGE_CHARS:
        return line
    return f"{line[:_MESSAGE_CHARS]}… ({len(line) - _MESSAGE_CHARS} more characters)"


_JSON_PRINTED = "telegram_idem.json_printed"
"""``click.Context.meta`` key: the command printed its JSON document."""


def fail(message: str, code: Exit) -> NoReturn:
    """Print ``error: <message>`` (redacted, one line) on stderr and exit with ``code``.

    Under ``--json`` stdout still gets its one JSON document: ``{"error": <message>,
    "exit_code": <code>}`` (unless the command printed its own already), so a script
    reading stdout never meets an empty answer."""
    line = _bounded(" ".join(redact_text(message).split()))
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.params.get("as_json") and not ctx.meta.get(_JSON_PRINTED):
        click.echo(json.dumps({"error": line, "exit_code": int(code)}, ensure_ascii=False))
    click.echo(f"error: {line}", err=True)
    sys.exit(int(code))


def check_http_url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A click callback: ``value`` if it is an ``http://`` or ``https://`` URL with a host
    (Bot API "setWebhook" wants HTTPS; a local Bot API server or a test takes HTTP).

    Raises:
        click.BadParameter: it is not (exit 2).
    """
    try:
        parts = urlsplit(value)
        host = parts.hostname
    except ValueError:  # e.g. an unclosed "[" of an IPv6 address
        host = None
    if not host or parts.scheme not in ("http", "https"):
        raise click.BadParameter(
            "an http:// or https:// URL with a host, e.g. https://bot.example.com/webhook"
        )
    return value


def store_option(func: F) -> F:
    """``--store URL`` (or ``IDEM_STORE_URL``), required, given to the command as
    ``store_url``."""
    return click.option(
        "--store",
        "store_url",
        envvar=STORE_ENV,
        required=True,
        metavar="URL",
        help=f"Store URL (default: ${STORE_ENV}), e.g. sqlite:///bot.db, "
        "postgresql://bot@db/bot, redis://localhost:6379/0.",
    )(func)


def store_argument(func: F) -> F:
    """A positional ``URL`` (or ``IDEM_STORE_URL``), given to the command as ``store_url``."""
    return click.argument("store_url", metavar="URL", envvar=STORE_ENV, required=True)(func)


def limit_option(help: str, *, default: int = 100) -> Callable[[F], F]:
    """``--limit N`` (an integer ≥ 1, ``default`` when absent), given as ``limit``."""
    return click.option(
        "--limit",
        type=click.IntRange(min=1),
        default=default,
        show_default=True,
        metavar="N",
        help=help,
    )


def batch_option(help: str, *, default: int = 100) -> Callable[[F], F]:
    """``--batch N`` (an integer ≥ 1, ``default`` when absent), given as ``batch``: how many
    items one round trip of a long run reads or changes."""
    return click.option(
        "--batch",
        type=click.IntRange(min=1),
        default=default,
        show_default=True,
        metavar="N",
        help=help,
    )


def json_option(func: F) -> F:
    """``--json``: print one JSON document on stdout instead of tables (given as
    ``as_json``)."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Print JSON for scripts instead of tables."
    )(func)


@asynccontextmanager
async def open_store(
    url: str, *, allow_memory: bool = False, must_exist: bool = True
) -> AsyncIterator[Store]:
    """The store at ``url``, closed on the way out (also on Ctrl-C).

    Args:
        url: the store URL.
        allow_memory: accept ``memory://`` (a store that lives in one process, so a
            command run from outside sees an empty one); refused by default.
        must_exist: refuse a ``sqlite:///`` URL whose file does not exist, instead of
            creating an empty store there (a mistyped path would show an empty inbox).

    Raises:
        ConfigurationError: a bad URL, a missing driver, ``memory://`` where it is not
            allowed, or a SQLite file that does not exist (exit 4 through :func:`run`).
    """
    scheme = urlsplit(url).scheme.lower()
    if not allow_memory and scheme == "memory":
        raise ConfigurationError(
            "memory:// lives inside one process: a command run from outside sees an empty "
            "store (give the bot's SQLite, PostgreSQL, Redis or DynamoDB URL)"
        )
    store = store_from_url(url)
    try:
        path = getattr(store, "path", None)
        if must_exist and scheme == "sqlite" and isinstance(path, str):
            if path != ":memory:" and not os.path.exists(path):  # noqa: ASYNC240 (one stat)
                raise ConfigurationError(
                    f"no SQLite file at {path} (is the path right? the bot creates it on "
                    "first use; `telegram-idem check URL` reports on it)"
                )
        yield store
    finally:
        await store.close()


def run(main: Callable[[], Awaitable[T]]) -> T:
    """Run a command's coroutine, turning failures into the exit codes of this module:
    :class:`~telegram_idem.errors.StoreError` and connection errors → 3,
    :class:`~telegram_idem.errors.ConfigurationError` → 4, Ctrl-C → 130 (after the
    coroutine's ``finally`` blocks ran: stores are closed, a batch in flight finishes or
    rolls back). Every message is redacted."""
    try:
        return asyncio.run(_main(main))
    except KeyboardInterrupt:
        fail("interrupted: stopped; what was done is kept", Exit.INTERRUPTED)
    except ConfigurationError as exc:
        fail(str(exc), Exit.CONFIGURATION)
    except (StoreError, OSError, TimeoutError) as exc:
        fail(str(exc) or type(exc).__name__, Exit.UNREACHABLE)


async def _main(main: Callable[[], Awaitable[T]]) -> T:
    return await main()


class Output:
    """Where a command's answer goes: a rich table (or lines) for people on stdout, or
    one JSON document for scripts (``--json``). Notes for people go to stderr, so a
    script's stdout is the JSON alone."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.console = Console(soft_wrap=True)
        if not self.console.is_terminal and "COLUMNS" not in os.environ:
            # Piped into a file or another program: no terminal's width to fit, and a key
            # or entry id split over lines could not be copied back out.
            self.console = Console(soft_wrap=True, width=_PIPED_WIDTH)
        self.err = Console(stderr=True, soft_wrap=True)

    def json(self, data: object) -> None:
        """Print ``data`` as JSON (keys in order, non-JSON values as text), redacted."""
        ctx = click.get_current_context(silent=True)
        if ctx is not None:
            ctx.meta[_JSON_PRINTED] = True
        click.echo(redact_text(json.dumps(data, default=str, ensure_ascii=False, indent=2)))

    def show(self, data: object, render: Callable[[], object]) -> None:
        """``data`` as JSON with ``--json``, else what ``render()`` returns (a rich
        renderable or text), printed on stdout."""
        if self.as_json:
            self.json(data)
        else:
            shown = render()
            if isinstance(shown, str):
                shown = redact_text(shown)
            self.console.print(shown)

    def note(self, text: str) -> None:
        """A line for people on stderr (never in ``--json`` output)."""
        self.err.print(redact_text(text), markup=False, highlight=False)


def table(
    title: str | None,
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    whole: Collection[str] = (),
) -> Table:
    """A rich table of ``rows`` under ``columns``; cells are shown as plain text (no rich
    markup or ``:emoji:`` codes: a key such as ``…:o:receipt:1`` is shown as it is),
    redacted, and a cell too wide for the terminal is folded onto more lines, never cut.

    Args:
        title: shown above the table, or ``None``.
        columns: the column names.
        rows: the cells of each row (``None`` is shown empty).
        whole: names of columns kept on one line (keys people copy): they are as wide as
            their widest cell, the other columns give way.
    """
    cells = [
        [Text(redact_text("" if cell is None else str(cell)), overflow="fold") for cell in row]
        for row in rows
    ]
    out = Table(title=title, title_justify="left")
    for n, name in enumerate(columns):
        widest = max((len(row[n].plain) for row in cells if n < len(row)), default=0)
        out.add_column(name, min_width=max(widest, len(name)) if name in whole else None)
    for row in cells:
        out.add_row(*row)
    return out


def progress(*, enabled: bool = True) -> Progress:
    """A progress bar on stderr (``with progress() as bar: task = bar.add_task(...)``);
    shown only when stderr is a terminal and ``enabled`` (off under ``--json``), so
    scripts and logs get no escape codes."""
    console = Console(stderr=True)
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not (enabled and console.is_terminal),
    )


def as_mapping(obj: object) -> Mapping[str, Any]:
    """A dataclass's fields (or a mapping) as a plain dict for ``--json``."""
    if isinstance(obj, Mapping):
        return dict(obj)
    slots = getattr(type(obj), "__dataclass_fields__", None)
    if slots is None:
        raise TypeError(f"not a dataclass: {type(obj).__name__}")
    return {name: getattr(obj, name) for name in slots}
