"""``telegram-idem check [URL]``: can the bot use this store, and what is wrong if not."""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import click
from rich.console import Group
from rich.text import Text

from telegram_idem._cli._common import (
    Exit,
    Output,
    json_option,
    open_store,
    redact_text,
    run,
    store_argument,
    table,
)
from telegram_idem.backends import Migratable, Store, StoreHealth, as_checkable

__all__ = ["CLOCK_TOLERANCE_MS", "check", "probe"]

SAMPLES = 5
"""Round trips measured (a ``get`` of a key that does not exist, each)."""

CLOCK_TOLERANCE_MS = 1000.0
"""A clock offset beyond this (after the round trip's own uncertainty) is a problem."""


@dataclass
class Probe:
    """What ``check`` found: the store's health, and the round trip and clock offset
    measured (``None`` when not measured: tables missing)."""

    store: str
    health: StoreHealth
    migratable: bool
    round_trip_ms: float | None = None
    clock_offset_ms: float | None = None
    clock_uncertainty_ms: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """``"ok"`` or what is wrong, in one line."""
        return "ok" if not self.problems else "; ".join(self.problems)

    def as_json(self) -> dict[str, Any]:
        health = self.health
        return {
            "store": self.store,
            "server": health.server,
            "compared": health.compared,
            "schema_version": health.schema_version,
            "tables": {
                "expected": list(health.expected),
                "found": list(health.found),
                "missing": list(health.missing),
            },
            "round_trip_ms": self.round_trip_ms,
            "clock_offset_ms": self.clock_offset_ms,
            "clock_uncertainty_ms": self.clock_uncertainty_ms,
            "problems": self.problems,
            "ok": not self.problems,
            "verdict": self.verdict,
        }


async def _measure(store: Store, probe: Probe) -> None:
    """The median of :data:`SAMPLES` ``get`` round trips, and the store's clock minus
    this host's at the midpoint of the fastest ``now()`` round trip."""
    missing_key = f"telegram-idem:check:{uuid.uuid4().hex}"
    trips: list[float] = []
    for _ in range(SAMPLES):
        start = time.perf_counter()
        await store.get(missing_key)
        trips.append((time.perf_counter() - start) * 1000)
    best: tuple[float, float] | None = None
    for _ in range(SAMPLES):
        before = time.time()
        store_now = await store.now()
        after = time.time()
        trip = (after - before) * 1000
        offset = (store_now - (before + after) / 2) * 1000
        if best is None or trip < best[0]:
            best = (trip, offset)
    assert best is not None
    probe.round_trip_ms = round(statistics.median(trips), 3)
    probe.clock_offset_ms = round(best[1], 3)
    probe.clock_uncertainty_ms = round(best[0] / 2, 3)
    if abs(best[1]) > CLOCK_TOLERANCE_MS + best[0] / 2:
        probe.problems.append(
            f"clock offset {best[1]:+.0f} ms (store − this host): fix the clocks (NTP)"
        )


async def probe(url: str) -> Probe:
    """Check the store at ``url``: its health, then (when it found nothing wrong) the
    round trip and the clock offset.

    Raises:
        ConfigurationError: a bad URL, a missing driver, or a store without ``health()``.
        StoreError: the store could not be reached.
    """
    async with open_store(url, must_exist=False) as store:
        health = await as_checkable(store).health()
        found = Probe(repr(store), health, isinstance(store, Migratable))
        if health.missing:
            if health.problems:  # they say why (a file that does not exist…)
                found.problems.extend(health.problems)
            else:
                hint = (
                    "run telegram-idem migrate URL"
                    if found.migratable
                    else "the store creates them on first use"
                )
                found.problems.append(f"tables missing: {', '.join(health.missing)} ({hint})")
            return found
        found.problems.extend(health.problems)
        if not health.problems:  # a store with a problem may fail, or set itself up
            await _measure(store, found)
        return found


def _render(found: Probe) -> object:
    health = found.health
    rows: list[tuple[str, object]] = [
        ("store", found.store),
        ("server", health.server),
        ("compared", health.compared),
    ]
    if health.schema_version is not None:
        rows.append(("schema version", health.schema_version))
    if health.expected:
        rows.append(("tables found", f"{len(health.found)} of {len(health.expected)}"))
        if health.missing:
            rows.append(("tables missing", ", ".join(health.missing)))
    if found.round_trip_ms is not None:
        rows.append(("round trip (ms, median)", f"{found.round_trip_ms:.2f}"))
    if found.clock_offset_ms is not None:
        rows.append(
            (
                "clock offset (ms, store − host)",
                f"{found.clock_offset_ms:+.2f} ± {found.clock_uncertainty_ms:.2f}",
            )
        )
    return Group(table(None, ("check", "value"), rows), Text(redact_text(found.verdict)))


@click.command()
@store_argument
@json_option
def check(store_url: str, as_json: bool) -> None:
    """Check a store: tables, server, round trip, clock.

    Checks the store at URL (default: $IDEM_STORE_URL) and says in one line what is
    wrong, or "ok". Rows: store (host, database, table or key prefix; never a password), server (name
    and version), compared (what the check compares: tables and their columns for SQL
    stores; for DynamoDB the table's key schema, TTL and ledger index; Redis has no
    tables, so its version and maxmemory-policy), schema version
    (when the store keeps one), tables found (n of m) and tables missing, round trip
    (ms: the median of 5 reads of a key that does not exist), clock offset (ms: the
    store's clock minus this host's, at the midpoint of the fastest of 5 clock reads,
    ± half that round trip); then one line, the verdict: "ok", or the problems joined
    by "; ", e.g. "tables missing: idem_records, … (run telegram-idem migrate URL)".
    A clock offset beyond 1 s (past the round trip's uncertainty) is a problem too.
    The round trip and clock are measured only when nothing else is wrong. Nothing is created or changed
    (an SQLite file that does not exist is reported, not made).

    --json prints {"store", "server", "compared", "schema_version", "tables":
    {"expected", "found", "missing"}, "round_trip_ms", "clock_offset_ms",
    "clock_uncertainty_ms", "problems", "ok", "verdict"}.

    Exit status: 0 ok, 1 a problem found (the verdict says which), 3 store unreachable,
    4 bad URL, missing driver, or a store without a health check (the Checkable
    ability: every built-in store has it).

    Examples:

    \b
        telegram-idem check 'postgresql://bot@db/bot?table_prefix=idem'
        IDEM_STORE_URL=sqlite:///bot.db telegram-idem check --json
    """
    out = Output(as_json)
    found = run(lambda: probe(store_url))
    out.show(found.as_json(), lambda: _render(found))
    raise SystemExit(int(Exit.OK if not found.problems else Exit.PROBLEM))
