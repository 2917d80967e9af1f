"""The inbox's SQL (:class:`~telegram_idem.backends.postgres.PostgresInbox`): the table
``<table_prefix>_inbox`` beside ``<table_prefix>_records``, one SQL statement per call.

**Admission** is one statement, so one transaction and one round trip: it upserts the
update guard record with the records table's claim rules (acquire if absent, past its
retention, or in progress with its lease over; written at once as completed with result
``null``, exactly :func:`telegram_idem._inbox_logic.admitted_record`), and inserts the
inbox entry only for the records it wrote. A duplicate writes nothing. ``admit_many``
is the same statement over ``unnest`` of the batch.

**Take** is one statement: ``UPDATE … FROM (SELECT … the oldest takeable head … LIMIT 1
FOR UPDATE SKIP LOCKED) RETURNING …``, giving token + 1 and attempts + 1. A head is the
entry with the smallest live ``seq`` of its ordering key; it is takeable when pending and
due, or in flight with its lease over. Entries of "busy" keys (one of their entries in
flight under a live lease, or waiting for a retry) are skipped first with one hash lookup
each, so a poll does not probe the head index for every entry queued behind a busy chat.

``ack`` / ``retry`` / ``bury`` / ``extend`` are one statement each, matching
``id``, ``token`` and ``status = 'in_flight'``.

Concurrency (READ COMMITTED, every call one autocommit statement)
-----------------------------------------------------------------

*One entry is never taken twice.* The head is picked with ``FOR UPDATE SKIP LOCKED``: a
head another taker has locked is skipped, and a head another taker updated and committed
after this statement's snapshot is locked in its newest version and its own conditions
(status, lease, due time) are re-checked on that version (PostgreSQL's EvalPlanQual), so
an entry just taken (``in_flight``, lease in the future), acked (deleted) or buried
(``dead``) is passed over.

*Two entries of one ordering key are never in flight at once.* The "head" test (``seq``
is the smallest live ``seq`` of its key) reads the statement's snapshot, not the newest
rows, and no lock taken inside one statement can refresh that snapshot. This is why a
transaction-level advisory lock on ``hashtext(ordering_key)`` *in take* would not help:
a taker that waited for it still decides on a snapshot older than the taker it waited
for. Instead, the snapshot is made trustworthy by the one invariant the head rule needs:

    for each ordering key, an entry with a smaller ``seq`` is visible to every snapshot
    that sees an entry with a larger one.

Given it, if taker C sees Y as the head of its key, every entry X of that key with a
smaller ``seq`` is already dead or deleted in C's snapshot. Neither comes back to life
with that ``seq`` (redrive and re-admission give a new one), so no other taker can hold
X in flight while C holds Y. Rows only
leave the live set (ack deletes, bury marks dead) or change status in place (take,
retry, extend), and none of those can break the invariant. Only the writers that give
an entry a ``seq`` could break it, because sequence numbers are handed out before
commit: two admissions of one chat could commit in the opposite order of their ``seq``,
and a taker in between would take the later entry first, then a second taker would take
the earlier one while the first is still in flight. So admission and redrive take a
**transaction-level advisory lock per ordering key**
(``pg_advisory_xact_lock(hashtext(<inbox table>), hashtext(ordering_key))``) before
drawing a ``seq``, and hold it until they commit: per key, ``seq`` order is commit order.
PostgreSQL marks a transaction committed before it releases its locks, so the next
writer of the key draws its ``seq`` only after the previous entry is visible.

Consequences:

- a batch locks its ordering keys in ``hashtext`` order (so two batches cannot
  deadlock), then upserts the records in key order, then inserts the entries in batch
  order (so ``seq`` follows the batch within a chat);
- admissions of one chat wait for each other for the length of one statement; different
  chats do not (two keys whose ``hashtext`` collides share a lock, which only costs
  waiting);
- ``redrive`` puts a dead letter back at the **tail** of its ordering key (a fresh
  ``seq``), not at its old place: at its old place it would become the head of a chat
  that may have a later entry in flight. (The in-process stores keep the old ``seq``.)
- a re-admission of an id whose entry still exists (its update guard record's retention
  ran out first) replaces the entry, at the tail, keeping its ``token`` so a worker
  still holding the old entry cannot ack the new one.

Every statement reads "now" once from the ``c`` CTE: the server's clock, or the store's
clock sent as the last parameter (see :mod:`telegram_idem.backends.postgres._sql`).
"""

from __future__ import annotations

from telegram_idem.backends.postgres._schema import INBOX_COLUMNS
from telegram_idem.backends.postgres._sql import NOW_CTE, render_statements

__all__ = ["build_inbox_sql"]

_ENTRY_COLS = ", ".join(INBOX_COLUMNS)
_T_COLS = ", ".join(f"t.{c}" for c in INBOX_COLUMNS)
_NOW = NOW_CTE

# Admission. ``src`` is the batch (id, ordering key, payload, position). ``locks`` takes
# the per-ordering-key advisory locks in hashtext order; ``up`` cannot start before it
# is complete (its WHERE holds an InitPlan over ``locks``), and ``ins`` draws its seqs
# only from rows ``up`` wrote, so every seq is drawn under its key's lock. ``up`` is the
# records claim with fingerprint NULL, writing the record completed with result 'null'
# (logic.admitted_record); its ON CONFLICT branch locks the row and re-checks the WHERE on
# the newest version, so of concurrent admissions of one update exactly one writes.
_ADMIT = (
    _NOW
    + """,
src AS MATERIALIZED ({source}),
locks AS MATERIALIZED (
  SELECT count(pg_advisory_xact_lock(hashtext('{inbox}'), k.h)) AS n
  FROM (SELECT DISTINCT hashtext(s.ordering_key) AS h FROM src s ORDER BY h) AS k
),
up AS (
  INSERT INTO {records} AS r
    (key, status, fencing_token, lease_expires_at, expires_at, fingerprint, result, attempts)
  SELECT s.id, 'completed', 1, c.now + $4::float8, c.now + $4::float8, NULL,
         convert_to('null', 'UTF8'), 1
  FROM (SELECT id FROM src ORDER BY id) AS s, c
  WHERE (SELECT n FROM locks) >= 0
  ON CONFLICT (key) DO UPDATE SET
    status = 'completed',
    fencing_token = r.fencing_token + 1,
    lease_expires_at = excluded.lease_expires_at,
    expires_at = excluded.expires_at,
    fingerprint = CASE WHEN r.expires_at <= (SELECT now FROM c) THEN NULL
                       ELSE r.fingerprint END,
    result = excluded.result,
    attempts = CASE WHEN r.expires_at <= (SELECT now FROM c) THEN 1
                    ELSE r.attempts + 1 END
  WHERE r.expires_at <= (SELECT now FROM c)
     OR (r.status = 'in_progress' AND r.lease_expires_at <= (SELECT now FROM c))
  RETURNING r.key
),
ins AS (
  INSERT INTO {inbox} AS i
    (id, ordering_key, payload, status, attempts, token, available_at, lease_expires_at,
     last_error, admitted_at)
  SELECT w.id, w.ordering_key, w.payload, 'pending', 0, 0, c.now, 0, NULL, c.now
  FROM (SELECT s.id, s.ordering_key, s.payload FROM src s JOIN up ON up.key = s.id
        ORDER BY s.ord) AS w, c
  ON CONFLICT (id) DO UPDATE SET
    seq = excluded.seq,
    ordering_key = excluded.ordering_key,
    payload = excluded.payload,
    status = 'pending',
    attempts = 0,
    available_at = excluded.available_at,
    lease_expires_at = 0,
    last_error = NULL,
    admitted_at = excluded.admitted_at
  RETURNING i.id
)
SELECT id FROM ins"""
)
_ONE = "SELECT $1::text AS id, $2::text AS ordering_key, $3::bytea AS payload, 1::bigint AS ord"
_MANY = (
    "SELECT u.id, u.ordering_key, u.payload, u.ord "
    "FROM unnest($1::text[], $2::text[], $3::bytea[]) WITH ORDINALITY "
    "AS u(id, ordering_key, payload, ord)"
)

# Take: the oldest head (smallest live seq of its ordering key) that is pending and due,
# or in flight with its lease over; locked (SKIP LOCKED) and updated in one statement.
#
# The NOT IN line is only a shortcut: it skips, with one hash lookup per row, the entries
# of "busy" keys (an entry in flight under a live lease, or waiting for a retry), whose
# head is not takeable. Without it every entry queued behind a busy head costs an index
# probe of the head test on every take, and a poll of an inbox whose chats are all busy
# walks the whole backlog that way (10 chats x 1000 entries: ~150 ms per take instead of
# ~7 ms). The busy set comes from the small partial index ``…_inbox_busy_idx`` (entries
# taken at least once and not dead). Both tests stay: the head test decides; the shortcut
# never removes a takeable head, because in-flight and retry-waiting entries are always
# heads (see the module docstring: no entry ever gets in front of a live one).
_TAKE = (
    _NOW
    + """,
head AS (
  SELECT e.seq FROM {inbox} AS e
  WHERE e.status <> 'dead'
    AND ((e.status = 'pending' AND e.available_at <= (SELECT now FROM c))
         OR (e.status = 'in_flight' AND e.lease_expires_at <= (SELECT now FROM c)))
    AND e.ordering_key NOT IN (
      SELECT b.ordering_key FROM {inbox} AS b
      WHERE b.status <> 'dead' AND b.attempts > 0
        AND ((b.status = 'in_flight' AND b.lease_expires_at > (SELECT now FROM c))
             OR (b.status = 'pending' AND b.available_at > (SELECT now FROM c))))
    AND e.seq = (SELECT min(o.seq) FROM {inbox} AS o
                 WHERE o.ordering_key = e.ordering_key AND o.status <> 'dead')
  ORDER BY e.seq
  LIMIT 1
  FOR UPDATE OF e SKIP LOCKED
)
UPDATE {inbox} AS t
SET status = 'in_flight', attempts = t.attempts + 1, token = t.token + 1,
    lease_expires_at = c.now + $1::float8
FROM head, c
WHERE t.seq = head.seq
RETURNING {tcols}"""
)

_HELD = "t.id = $1 AND t.token = $2 AND t.status = 'in_flight'"
_ACK = "DELETE FROM {inbox} AS t WHERE " + _HELD + " RETURNING 1"
_RETRY = (
    _NOW
    + """
UPDATE {inbox} AS t
SET status = 'pending', available_at = c.now + $3::float8, lease_expires_at = 0,
    last_error = $4,
    attempts = CASE WHEN $5::boolean THEN greatest(t.attempts - 1, 0) ELSE t.attempts END
FROM c WHERE """
    + _HELD
    + " RETURNING 1"
)
_BURY = "UPDATE {inbox} AS t SET status = 'dead', last_error = $3 WHERE " + _HELD + " RETURNING 1"
_EXTEND = (
    _NOW
    + """
UPDATE {inbox} AS t SET lease_expires_at = c.now + $3::float8
FROM c WHERE """
    + _HELD
    + " RETURNING 1"
)
_DEAD_LETTERS = "SELECT {cols} FROM {inbox} WHERE status = 'dead' ORDER BY seq LIMIT $1"
# Redrive: back to pending at the tail of its ordering key (a fresh seq, drawn under the
# key's advisory lock: see the module docstring). The lock is taken in the InitPlan of
# the WHERE, before the row is updated and its new seq drawn.
_REDRIVE = (
    _NOW
    + """,
locks AS MATERIALIZED (
  SELECT count(pg_advisory_xact_lock(hashtext('{inbox}'), hashtext(d.ordering_key))) AS n
  FROM {inbox} AS d WHERE d.id = $1 AND d.status = 'dead'
)
UPDATE {inbox} AS t
SET seq = DEFAULT, status = 'pending', attempts = 0, available_at = c.now
FROM c
WHERE t.id = $1 AND t.status = 'dead' AND (SELECT n FROM locks) > 0
RETURNING 1"""
)
_DEPTH = "SELECT count(*) FROM {inbox} WHERE status <> 'dead'"

# The operator's reads. Every listing is read in seq order from an index and cut by its
# LIMIT: one status through …_status_idx (status, seq); one ordering key's live entries
# through …_heads_idx (ordering_key, seq) WHERE status <> 'dead', its dead letters
# through …_status_idx; everything through the primary key.
_GET = "SELECT {cols} FROM {inbox} WHERE id = $1"
_ENTRIES_ALL = "SELECT {cols} FROM {inbox} ORDER BY seq LIMIT $1"
_ENTRIES_STATUS = "SELECT {cols} FROM {inbox} WHERE status = $2 ORDER BY seq LIMIT $1"
_ENTRIES_LIVE_KEY = (
    "SELECT {cols} FROM {inbox} WHERE ordering_key = $2 AND status <> 'dead' "
    "AND status = $3 ORDER BY seq LIMIT $1"
)
_ENTRIES_DEAD_KEY = (
    "SELECT {cols} FROM {inbox} WHERE status = 'dead' AND ordering_key = $2 ORDER BY seq LIMIT $1"
)
_ENTRIES_KEY = (
    "SELECT {cols} FROM ("
    "(SELECT {cols} FROM {inbox} WHERE ordering_key = $2 AND status <> 'dead' "
    "ORDER BY seq LIMIT $1) UNION ALL "
    "(SELECT {cols} FROM {inbox} WHERE status = 'dead' AND ordering_key = $2 "
    "ORDER BY seq LIMIT $1)) AS u ORDER BY seq LIMIT $1"
)
_DROP = "DELETE FROM {inbox} WHERE id = $1 AND status = 'dead' RETURNING 1"
# One statement: counts, oldest admission per status and the clock, one snapshot.
_STATS = (
    _NOW
    + """
SELECT s.status, s.n, s.oldest, c.now
FROM c LEFT JOIN (
  SELECT status, count(*) AS n, min(admitted_at) AS oldest FROM {inbox} GROUP BY status
) AS s ON true"""
)
# The live entries per ordering key, read through …_heads_idx (live entries only).
_BACKLOG = """
SELECT ordering_key, count(*) FILTER (WHERE status = 'pending') AS pending,
       count(*) FILTER (WHERE status = 'in_flight') AS in_flight,
       min(admitted_at) AS oldest
FROM {inbox} WHERE status <> 'dead'
GROUP BY ordering_key
ORDER BY count(*) DESC, min(admitted_at), ordering_key
LIMIT $1"""

# (template, index of the "now" parameter when a clock is given, or 0: no "now")
_STATEMENTS: dict[str, tuple[str, int]] = {
    "admit": (_ADMIT.replace("{source}", _ONE), 5),
    "admit_many": (_ADMIT.replace("{source}", _MANY), 5),
    "take": (_TAKE, 2),
    "ack": (_ACK, 0),
    "retry": (_RETRY, 6),
    "bury": (_BURY, 0),
    "extend": (_EXTEND, 4),
    "dead_letters": (_DEAD_LETTERS, 0),
    "redrive": (_REDRIVE, 2),
    "depth": (_DEPTH, 0),
    "get": (_GET, 0),
    "entries_all": (_ENTRIES_ALL, 0),
    "entries_status": (_ENTRIES_STATUS, 0),
    "entries_live_key": (_ENTRIES_LIVE_KEY, 0),
    "entries_dead_key": (_ENTRIES_DEAD_KEY, 0),
    "entries_key": (_ENTRIES_KEY, 0),
    "drop": (_DROP, 0),
    "stats": (_STATS, 1),
    "backlog": (_BACKLOG, 0),
}


def build_inbox_sql(records: str, inbox: str, *, server_clock: bool) -> dict[str, str]:
    """The inbox statements for the tables ``records`` and ``inbox``.

    With ``server_clock`` every statement reads the server's clock; otherwise "now" is
    the last parameter.
    """
    fields = {"records": records, "inbox": inbox, "cols": _ENTRY_COLS, "tcols": _T_COLS}
    return render_statements(_STATEMENTS, server_clock=server_clock, fields=fields)
