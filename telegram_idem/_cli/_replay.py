"""``telegram-idem replay FILE… --url URL``: deliver recorded updates to a webhook the way
Telegram does, and say what came back.

Every file is read and checked first (:mod:`telegram_idem._cli._update_files`); one bad
entry refuses the whole run with exit 2 and sends nothing. Each update is then POSTed by
:class:`telegram_idem._delivery.TelegramDelivery` as Telegram's webhook sender does (Bot
API "setWebhook"): the Update as a JSON body, ``X-Telegram-Bot-Api-Secret-Token`` when a
secret is given, and the same bytes re-sent when the answer is not a 2xx or does not come
within ``--timeout`` seconds, at most ``--resend`` times, the first re-send after
:data:`RETRY_DELAY` seconds and each next one twice as late (at most
:data:`MAX_RETRY_DELAY`). ``--concurrency 1`` (the default) keeps one update in flight at
a time, in file order, as Telegram does for one bot (the next update waits for the
previous one's answer); more puts that many in flight at once, as a webhook with
``max_connections`` > 1 sees.

The summary: updates read, sent, answered 2xx, re-sends, failed (never answered 2xx),
the count of each answer (HTTP status, ``timeout``, ``no connection``) and the p50/p99 of
the answered attempts' time in milliseconds. Exit 0 when every update got a 2xx, 1 when
one never did, 3 when the URL could not be reached at all (no attempt got any answer),
130 on Ctrl-C: the requests in flight are cancelled and the summary of what was sent is
printed first.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import click

from telegram_idem._cli._common import (
    Exit,
    Output,
    check_http_url,
    fail,
    json_option,
    progress,
    redact_text,
    run,
    table,
)
from telegram_idem._cli._update_files import Recorded, UpdateFileError, read_update_files
from telegram_idem._delivery import DeliveryReport, TelegramDelivery
from telegram_idem._webhook_secret import check_secret_token
from telegram_idem.errors import ConfigurationError

__all__ = [
    "MAX_RETRY_DELAY",
    "RETRY_DELAY",
    "SECRET_ENV",
    "ReplaySummary",
    "percentile",
    "replay",
    "replay_updates",
]

SECRET_ENV = "WEBHOOK_SECRET"
"""The environment variable ``--secret`` is read from when not given."""
RETRY_DELAY = 0.5
"""Seconds before the first re-send of an update."""
MAX_RETRY_DELAY = 8.0
"""The longest wait between two re-sends of one update, in seconds (each wait doubles)."""


@dataclass(slots=True)
class ReplaySummary:
    """What a replay did.

    Attributes:
        url: where the updates were POSTed.
        updates: updates read from the files.
        sent: updates whose delivery finished (answered 2xx, or every attempt failed).
        answered_2xx: updates that got a 2xx answer.
        resends: re-sends, over every update.
        failed: sent updates that never got a 2xx answer.
        failed_update_ids: their ``update_id``, in the order they finished.
        statuses: answers per kind over every attempt: the HTTP status as text, or
            ``"timeout"``, or ``"no connection"``.
        p50_ms, p99_ms: percentiles of the answered attempts' time (milliseconds), or
            ``None`` when none was answered.
        in_flight: updates whose delivery Ctrl-C cancelled (their answer is unknown).
        not_sent: updates never sent (after Ctrl-C, or when the URL was unreachable).
        interrupted: the run was stopped by Ctrl-C.
        unreachable: why no attempt reached the URL, or ``None``.
    """

    url: str
    updates: int
    sent: int = 0
    answered_2xx: int = 0
    resends: int = 0
    failed: int = 0
    failed_update_ids: list[int] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    p50_ms: float | None = None
    p99_ms: float | None = None
    in_flight: int = 0
    not_sent: int = 0
    interrupted: bool = False
    unreachable: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The summary as one JSON object (the ``--json`` output)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile ``fraction`` (0 < fraction <= 1) of ``values``, or
    ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


class _Run:
    """The state of one replay: the updates left, what finished, and when to stop."""

    def __init__(self, entries: Sequence[Recorded], url: str) -> None:
        self.pending: Iterator[Recorded] = iter(entries)
        self.summary = ReplaySummary(url=url, updates=len(entries))
        self.statuses: Counter[str] = Counter()
        self.elapsed: list[float] = []
        self.started = 0
        self.answered_any = False
        self.stop = False

    def take(self) -> Recorded | None:
        if self.stop:
            return None
        entry = next(self.pending, None)
        if entry is not None:
            self.started += 1
        return entry

    def finished(self, report: DeliveryReport) -> None:
        summary = self.summary
        summary.sent += 1
        summary.resends += report.retries
        for attempt in report.attempts:
            if attempt.status is not None:
                self.answered_any = True
                self.statuses[str(attempt.status)] += 1
                self.elapsed.append(attempt.elapsed)
            elif attempt.timed_out:
                self.answered_any = True  # the connection was made: the URL is there
                self.statuses["timeout"] += 1
            else:
                self.statuses["no connection"] += 1
        if report.delivered:
            summary.answered_2xx += 1
            return
        summary.failed += 1
        summary.failed_update_ids.append(report.update_id)
        if not self.answered_any:
            last = report.attempts[-1].error if report.attempts else None
            summary.unreachable = last or "no answer"
            self.stop = True

    def close(self, *, interrupted: bool) -> ReplaySummary:
        summary = self.summary
        summary.interrupted = interrupted
        summary.in_flight = self.started - summary.sent
        summary.not_sent = summary.updates - self.started
        summary.statuses = dict(sorted(self.statuses.items()))
        summary.p50_ms = _ms(percentile(self.elapsed, 0.50))
        summary.p99_ms = _ms(percentile(self.elapsed, 0.99))
        if summary.unreachable is not None and self.answered_any:
            summary.unreachable = None  # another update in flight got through
        return summary


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


async def replay_updates(
    entries: Sequence[Recorded],
    *,
    url: str,
    secret_token: str | None = None,
    concurrency: int = 1,
    resend: int = 3,
    attempt_timeout: float = 10.0,
    on_finished: Callable[[DeliveryReport], None] | None = None,
    on_stopped: Callable[[ReplaySummary], None] | None = None,
) -> ReplaySummary:
    """POST ``entries`` to ``url`` like Telegram; return the summary.

    Args:
        entries: the updates, in the order they are taken (:func:`read_update_files`).
        url: the webhook URL.
        secret_token: sent as ``X-Telegram-Bot-Api-Secret-Token``, or ``None``.
        concurrency: updates in flight at once (>= 1; 1 keeps file order).
        resend: re-sends at most per update after the first attempt (>= 0).
        attempt_timeout: seconds an attempt waits for an answer (> 0).
        on_finished: called with each update's report as its delivery finishes.
        on_stopped: called with the summary when the run is cancelled (Ctrl-C), after the
            requests in flight were cancelled and before the cancellation propagates.

    Raises:
        ValueError: a bad ``secret_token``, ``concurrency``, ``resend`` or
            ``attempt_timeout``.
        asyncio.CancelledError: the run was cancelled (``on_stopped`` saw the summary).
    """
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if resend < 0:
        raise ValueError("resend must be >= 0")
    state = _Run(entries, url)
    async with TelegramDelivery(
        url,
        secret_token=secret_token,
        timeout=attempt_timeout,
        retry_delay=RETRY_DELAY,
        backoff=2.0,
        max_retry_delay=MAX_RETRY_DELAY,
        max_attempts=resend + 1,
    ) as sender:

        async def worker() -> None:
            while (entry := state.take()) is not None:
                report = await sender.deliver(entry.update)
                state.finished(report)
                if on_finished is not None:
                    on_finished(report)

        tasks = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(entries)))]
        try:
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            summary = state.close(interrupted=True)
            if on_stopped is not None:
                on_stopped(summary)
            raise
    return state.close(interrupted=False)


def _render(summary: ReplaySummary) -> object:
    statuses = ", ".join(f"{name}: {count}" for name, count in summary.statuses.items())
    rows: list[tuple[str, object]] = [
        ("updates", summary.updates),
        ("sent", summary.sent),
        ("answered 2xx", summary.answered_2xx),
        ("re-sends", summary.resends),
        ("failed (never 2xx)", summary.failed),
        ("answers", statuses or "none"),
        ("p50 ms", "-" if summary.p50_ms is None else summary.p50_ms),
        ("p99 ms", "-" if summary.p99_ms is None else summary.p99_ms),
    ]
    if summary.interrupted or summary.in_flight:
        rows.append(("cancelled in flight", summary.in_flight))
    if summary.not_sent:
        rows.append(("not sent", summary.not_sent))
    title = f"replay to {redact_text(summary.url)}" + (
        " (interrupted)" if summary.interrupted else ""
    )
    return table(title, ["", "count"], rows)


def _check_secret(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    try:
        return check_secret_token(value or None)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command()
@click.argument(
    "files",
    nargs=-1,
    required=True,
    metavar="FILE…",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
)
@click.option(
    "--url",
    required=True,
    metavar="URL",
    callback=check_http_url,
    help="The webhook to POST to, e.g. http://127.0.0.1:8080/webhook.",
)
@click.option(
    "--secret",
    envvar=SECRET_ENV,
    show_envvar=True,
    metavar="S",
    callback=_check_secret,
    help="Sent as X-Telegram-Bot-Api-Secret-Token (the secret_token given to setWebhook; "
    "1-256 of A-Z a-z 0-9 _ -).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    metavar="N",
    help="Updates in flight at once. 1 is Telegram's order for one bot: each update waits "
    "for the previous one's answer; more is a webhook with max_connections > 1.",
)
@click.option(
    "--resend",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    metavar="N",
    help="Re-sends at most per update when the answer is not a 2xx or does not come in "
    f"time (waits {RETRY_DELAY:g} s, then twice as long each time, at most "
    f"{MAX_RETRY_DELAY:g} s).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="How long an attempt waits for an answer before it counts as failed and is "
    "re-sent (Telegram waits about 60 s).",
)
@json_option
def replay(
    files: tuple[str, ...],
    url: str,
    secret: str | None,
    concurrency: int,
    resend: int,
    timeout: float,
    as_json: bool,
) -> None:
    """POST recorded updates in FILE… to a webhook the way Telegram does.

    A FILE holds one update (a JSON object), a JSON array of updates, or JSON Lines (one
    update per line); - reads standard input. Every file is checked before anything is
    sent: an entry that is not JSON or has no integer update_id stops the run (exit 2,
    naming the file, line and column). A file given twice is sent twice, which is how to
    check that the bot handles a duplicate once.

    Each update is POSTed as a JSON body with the X-Telegram-Bot-Api-Secret-Token header
    (--secret or $WEBHOOK_SECRET) and re-sent, byte for byte, when the answer is not a
    2xx or does not come within --timeout. A progress bar runs on a terminal; Ctrl-C
    cancels the requests in flight and prints the summary of what was sent (exit 130).

    The summary: updates, sent, answered 2xx, re-sends, failed (never answered 2xx), the
    count of each answer (HTTP status, timeout, no connection), p50/p99 ms. Exit 0 when
    every update was answered 2xx, 1 when one never was, 3 when the URL could not be
    reached at all.

    \b
    Example:
      telegram-idem replay updates.jsonl --url http://127.0.0.1:8080/webhook \\
        --secret "$WEBHOOK_SECRET" --resend 5
    """
    try:
        entries = read_update_files(files)
    except UpdateFileError as exc:
        fail(str(exc), Exit.USAGE)
    out = Output(as_json)

    def show(summary: ReplaySummary) -> None:
        out.show(summary.as_json(), lambda: _render(summary))

    async def main() -> ReplaySummary:
        with progress(enabled=not as_json) as bar:
            task = bar.add_task("replaying", total=len(entries))
            return await replay_updates(
                entries,
                url=url,
                secret_token=secret,
                concurrency=concurrency,
                resend=resend,
                attempt_timeout=timeout,
                on_finished=lambda report: bar.advance(task),
                on_stopped=show,
            )

    summary = run(main)
    show(summary)
    if summary.unreachable is not None:
        fail(f"could not reach {url}: {summary.unreachable}", Exit.UNREACHABLE)
    if summary.failed:
        shown = ", ".join(str(i) for i in summary.failed_update_ids[:10])
        more = "…" if len(summary.failed_update_ids) > 10 else ""
        fail(
            f"{summary.failed} of {summary.updates} updates were never answered 2xx "
            f"(update_id {shown}{more})",
            Exit.PROBLEM,
        )
