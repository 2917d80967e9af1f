"""The records table's SQL: one statement per primitive (docs/store-postgres.md).

Every statement fixes "now" once, in the ``c`` CTE: the server's clock
(:data:`SERVER_NOW`), or the store's clock sent as a parameter (its index is in
:data:`_STATEMENTS`). :func:`build_records_sql` fills in the table and the clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from telegram_idem._records import Record, Status
from telegram_idem.backends.postgres._schema import COLUMNS

__all__ = ["NOW_CTE", "SERVER_NOW", "build_records_sql", "now_placeholder", "record_of"]

SERVER_NOW = "extract(epoch FROM clock_timestamp())"
"""The server's clock in seconds since the epoch, as SQL (read once per statement)."""

NOW_CTE = "WITH c AS MATERIALIZED (SELECT {now}::float8 AS now)"
"""The CTE that fixes "now" once per statement; ``{now}`` is filled by
:func:`now_placeholder`."""


def now_placeholder(server_clock: bool, index: int) -> str:
    """What ``{now}`` becomes: :data:`SERVER_NOW`, or the parameter ``$<index>`` that
    carries the store's clock."""
    return SERVER_NOW if server_clock else f"${index}"


def render_statements(
    statements: Mapping[str, tuple[str, int]], *, server_clock: bool, fields: Mapping[str, str]
) -> dict[str, str]:
    """Each template of ``statements`` (name → (template, index of its "now" parameter))
    with ``{now}`` filled (:func:`now_placeholder`), then each ``{field}`` of ``fields``
    (table and column lists)."""
    out = {}
    for name, (template, now_index) in statements.items():
        text = template.replace("{now}", now_placeholder(server_clock, now_index))
        for field, value in fields.items():
            text = text.replace("{" + field + "}", value)
        out[name] = text
    return out


_COLS = ", ".join(COLUMNS)
_RCOLS = ", ".join(f"r.{c}" for c in COLUMNS)

# The claim. ``c`` fixes "now" once for the whole statement. ``up`` inserts a new record,
# or, on a key conflict, overwrites the existing one only when it may be acquired:
# retention over (a fresh record, token + 1), or in progress with its lease over and no
# fingerprint mismatch (a takeover: token + 1, attempts + 1, retention kept if longer).
# When ``up`` wrote nothing, ``old`` (the row as of the statement's snapshot) comes back
# instead, and Python decides replay / conflict / in progress / failed from it with
# ``machine.decide_claim``. The ON CONFLICT branch locks the row, so two concurrent
# claims of one key serialise there and at most one writes. A key whose snapshot row is
# live and not acquirable (a duplicate: replay, in progress, conflict, failed) is not
# inserted at all, so a duplicate is a read: no row lock, no WAL, no commit flush.
_CLAIM_UPSERT = """
  INSERT INTO {table} AS r ({cols})
  SELECT k.key, 'in_progress', 1, c.now + {lease}, c.now + {retention}, {fp}, NULL, 1
  FROM {source}
  WHERE NOT EXISTS (
    SELECT 1 FROM old o
    WHERE o.key = k.key AND o.expires_at > c.now
      AND NOT (o.status = 'in_progress' AND o.lease_expires_at <= c.now
               AND (o.fingerprint IS NULL OR {fp} IS NULL OR o.fingerprint = {fp})))
  ON CONFLICT (key) DO UPDATE SET
    status = 'in_progress',
    fencing_token = r.fencing_token + 1,
    lease_expires_at = excluded.lease_expires_at,
    expires_at = CASE WHEN r.expires_at <= (SELECT now FROM c) THEN excluded.expires_at
                      ELSE greatest(r.expires_at, excluded.expires_at) END,
    fingerprint = CASE WHEN r.expires_at <= (SELECT now FROM c) THEN excluded.fingerprint
                       ELSE coalesce(excluded.fingerprint, r.fingerprint) END,
    result = NULL,
    attempts = CASE WHEN r.expires_at <= (SELECT now FROM c) THEN 1
                    ELSE r.attempts + 1 END
  WHERE r.expires_at <= (SELECT now FROM c)
     OR (r.status = 'in_progress'
         AND r.lease_expires_at <= (SELECT now FROM c)
         AND (r.fingerprint IS NULL OR excluded.fingerprint IS NULL
              OR r.fingerprint = excluded.fingerprint))
  RETURNING {rcols}"""

_CLAIM = (
    (
        NOW_CTE
        + """,
old AS (SELECT {cols} FROM {table} WHERE key = $1::text),
up AS ("""
        + _CLAIM_UPSERT.replace("{source}", "(SELECT $1::text AS key) AS k, c").replace(
            "{fp}", "$2::text"
        )
        + """
)
SELECT true AS written, up.*, (SELECT now FROM c) AS now FROM up
UNION ALL
SELECT false, old.*, (SELECT now FROM c) FROM old WHERE NOT EXISTS (SELECT 1 FROM up)"""
    )
    .replace("{lease}", "$3::float8")
    .replace("{retention}", "$4::float8")
)

_CLAIM_MANY = (
    (
        NOW_CTE
        + """,
old AS (SELECT {cols} FROM {table} WHERE key = ANY($1::text[])),
up AS ("""
        + _CLAIM_UPSERT.replace(
            "{source}", "(SELECT key FROM unnest($1::text[]) AS u(key) ORDER BY key) AS k, c"
        ).replace("{fp}", "NULL::text")
        + """
)
SELECT true AS written, up.*, (SELECT now FROM c) AS now FROM up
UNION ALL
SELECT false, old.*, (SELECT now FROM c) FROM old
WHERE old.key NOT IN (SELECT key FROM up)"""
    )
    .replace("{lease}", "$2::float8")
    .replace("{retention}", "$3::float8")
)

_UPDATE = (
    NOW_CTE
    + """
UPDATE {table} AS r SET {set}
FROM c
WHERE r.key = $1 AND r.fencing_token = $2 AND r.status = 'in_progress' AND r.expires_at > c.now
RETURNING 1"""
)

_COMPLETE = _UPDATE.replace(
    "{set}", "status = 'completed', result = $3, expires_at = c.now + $4::float8"
)
_FAIL = _UPDATE.replace("{set}", "status = 'failed', result = $3, expires_at = c.now + $4::float8")
_RELEASE = _UPDATE.replace("{set}", "lease_expires_at = c.now, fingerprint = NULL")
_EXTEND = _UPDATE.replace(
    "{set}",
    "lease_expires_at = c.now + $3::float8, "
    "expires_at = greatest(r.expires_at, c.now + $3::float8)",
)
_NOW = NOW_CTE + "\n"
_GET = _NOW + "SELECT {cols} FROM {table} WHERE key = $1 AND expires_at > (SELECT now FROM c)"
# "now" comes from ``c`` (an InitPlan, one value) so the expires_at index can serve the scan.
# FOR UPDATE re-checks the expiry on the newest row version and keeps the rows locked
# until the DELETE ends, so the outer DELETE needs no second expiry test. ``= ANY(ARRAY(…))``
# (rather than ``IN (…)``) makes the planner look the chosen keys up in the primary key
# instead of hash-joining them against the whole table.
_PURGE = (
    _NOW
    + """DELETE FROM {table} WHERE key = ANY(ARRAY(
  SELECT key FROM {table} WHERE expires_at <= (SELECT now FROM c)
  LIMIT $1 FOR UPDATE SKIP LOCKED
))"""
)

# (template, index of the "now" parameter when a clock is given)
_STATEMENTS: dict[str, tuple[str, int]] = {
    "claim": (_CLAIM, 5),
    "claim_many": (_CLAIM_MANY, 4),
    "complete": (_COMPLETE, 5),
    "fail": (_FAIL, 5),
    "release": (_RELEASE, 3),
    "extend": (_EXTEND, 4),
    "get": (_GET, 2),
    "purge": (_PURGE, 2),
}


def build_records_sql(table: str, *, server_clock: bool) -> dict[str, str]:
    """The records statements for ``table``, by primitive name (``claim``,
    ``claim_many``, ``complete``, ``fail``, ``release``, ``extend``, ``get``, ``purge``).

    With ``server_clock`` every statement reads the server's clock; otherwise "now" is
    the last parameter.
    """
    return render_statements(
        _STATEMENTS,
        server_clock=server_clock,
        fields={"table": table, "cols": _COLS, "rcols": _RCOLS},
    )


def record_of(row: Any) -> Record:
    """The :class:`~telegram_idem._records.Record` of a records-table row (an asyncpg
    ``Record`` or any mapping with the table's column names)."""
    return Record(
        key=row["key"],
        status=Status(row["status"]),
        fencing_token=row["fencing_token"],
        lease_expires_at=row["lease_expires_at"],
        expires_at=row["expires_at"],
        fingerprint=row["fingerprint"],
        result=row["result"],
        attempts=row["attempts"],
    )
