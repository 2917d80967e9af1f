"""One idempotency record as ``inspect`` shows it: the columns of its table and the
fields of its ``--json``, judged by the store's clock."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from telegram_idem._cli._common import table
from telegram_idem._records import Record, Status

__all__ = ["COLUMNS", "one_record_table", "record_json", "record_row", "records_table"]

COLUMNS = (
    "key",
    "status",
    "fencing token",
    "lease left (s)",
    "retention left (s)",
    "attempts",
    "fingerprint",
    "result size (bytes)",
)
"""The table's columns, in order (``record_row`` gives the cells)."""


def _left(until: float, now: float) -> float:
    return round(max(0.0, until - now), 3)


def record_json(record: Record, now: float) -> dict[str, Any]:
    """``record`` as ``--json`` shows it: ``key``, ``status``, ``fencing_token``,
    ``lease_left_s`` (seconds, ``null`` unless in progress), ``retention_left_s``
    (seconds), ``attempts``, ``fingerprint`` (or ``null``), ``result_bytes`` (``null``
    while in progress), plus ``lease_expires_at`` and ``expires_at`` (seconds since the
    epoch). ``now``: the store's clock."""
    in_progress = record.status is Status.IN_PROGRESS
    return {
        "key": record.key,
        "status": record.status.value,
        "fencing_token": record.fencing_token,
        "lease_left_s": _left(record.lease_expires_at, now) if in_progress else None,
        "retention_left_s": _left(record.expires_at, now),
        "attempts": record.attempts,
        "fingerprint": record.fingerprint,
        "result_bytes": None if record.result is None else len(record.result),
        "lease_expires_at": record.lease_expires_at,
        "expires_at": record.expires_at,
    }


def record_row(record: Record, now: float) -> list[object]:
    """The cells of ``record`` under :data:`COLUMNS` (``-`` where there is nothing:
    no lease once settled, no fingerprint, no result yet)."""
    data = record_json(record, now)
    return [
        data["key"],
        data["status"],
        data["fencing_token"],
        "-" if data["lease_left_s"] is None else f"{data['lease_left_s']:.1f}",
        f"{data['retention_left_s']:.1f}",
        data["attempts"],
        data["fingerprint"] or "-",
        "-" if data["result_bytes"] is None else data["result_bytes"],
    ]


def records_table(title: str | None, records: list[Record], now: float) -> Table:
    """The records under :data:`COLUMNS`, one row each, made to fit a narrow terminal:
    every cell but the key's is kept whole (headers fold instead), keys fold onto more
    lines, and fingerprints are cut to their first 8 characters (``--json`` has them
    whole)."""
    rows = [record_row(r, now) for r in records]
    for row in rows:
        fp = str(row[6])
        row[6] = fp if len(fp) <= 9 else fp[:8] + "…"
    out = table(title, COLUMNS, rows)
    for i, column in enumerate(out.columns):
        column.overflow = "fold"
        if i:
            column.min_width = max([3, *(len(str(row[i])) for row in rows)])
    return out


def one_record_table(record: Record, now: float) -> Table:
    """One record as a two-column table (field, value) in :data:`COLUMNS` order."""
    out = table(None, ("field", "value"), zip(COLUMNS, record_row(record, now), strict=True))
    out.columns[0].no_wrap = True
    out.columns[1].overflow = "fold"
    return out
