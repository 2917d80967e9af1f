"""The outbox's SQL (:class:`~telegram_idem.backends.postgres.PostgresOutbox`): the
tables ``<table_prefix>_outbox`` and ``<table_prefix>_outbox_parked``.

**Take** is one statement, as the inbox's: ``UPDATE … FROM (SELECT … the best takeable
head of the bot … LIMIT n FOR UPDATE SKIP LOCKED) RETURNING …`` (token + 1, attempts +
1). A head is the live entry (pending or in flight) with the smallest ``seq`` of its
``(bot_id, ordering_key)``; among the takeable heads the lowest ``priority`` goes first,
then the smallest ``seq``. Two heads of one unit cannot exist in one snapshot, so ``LIMIT
n`` (``take_many``) gives entries of distinct chats.

Concurrency (READ COMMITTED)
----------------------------

*One entry is never taken twice*: the head is locked with ``FOR UPDATE SKIP LOCKED``,
and one a concurrent taker committed after this statement's snapshot is re-checked on
its newest version (PostgreSQL's EvalPlanQual): in flight under a live lease, it is
passed over.

*Two entries of one chat are never in flight at once.* The head test reads the
statement's snapshot, which is trustworthy under one invariant (the inbox's, see
:mod:`telegram_idem.backends.postgres._inbox_sql`): per unit, an entry with a smaller
``seq`` is visible to every snapshot that sees a live entry with a larger one. Entries
only leave the live set in place (deliver, settle, park, supersede) or stay live in
place (take, retry, extend), which keeps it; every writer that makes an entry live
with a ``seq`` (enqueue, redrive, unpark, a retry that moves the entry to another chat)
draws a **fresh** ``seq`` while holding a transaction-level advisory lock on the unit
(:data:`LOCK`, ``pg_advisory_xact_lock(hashtext(<outbox table>), hashtext(<bot>:u:<unit>))``)
until it commits, so per unit ``seq`` order is commit order. (So redrive and unpark put
entries at the back of their chat, in their old order; the in-process stores keep the
old ``seq`` of an unparked or migrated entry.)

For ``park``, ``unpark``, ``redrive``, a moving retry and an enqueue with a
``collapse_key`` the lock is taken by a statement of its own, *before* the writing
statement, in the same transaction: the writing statement's snapshot then sees everything
the previous holder committed. An enqueue with a ``collapse_key`` also locks
``<bot>:c:<collapse key>`` (locks are taken in ``hashtext`` order: no deadlock), so two
enqueues of one collapse key supersede each other in commit order (its ``UPDATE`` can only
supersede rows its snapshot sees).

An enqueue *without* a collapse key (almost every call) is one statement
(``enqueue_locked``): a CTE takes the chat's lock and the insert reads it, so the ``seq``
is still drawn under the lock (the invariant above holds: one call in flight per chat).
Its snapshot, though, is taken before the lock wait. Two cases differ from two statements,
both only when the enqueue waited for the lock while a park or an unpark of that chat
committed:

- an unpark: its deleted mark is in the older snapshot, so the mark is read
  ``FOR KEY SHARE``, which skips a row deleted by a committed transaction: the call is
  stored ``PENDING``, never ``PARKED`` in a chat no longer parked (where it would stay);
- a park: its new mark is not in the older snapshot, and is missed: the call is stored
  ``PENDING`` in a parked chat. **Accepted**: it is the chat's only live call, so a relay
  sends it at once; Telegram answers 403 again (the user blocked the bot a moment ago) and
  the relay parks it, behind the chat's other parked calls. Only a user who unblocks the
  bot within that moment gets it ahead of them. The window is the park's own transaction
  (one statement and its commit), and it saves a round trip on every enqueue.

The same statements run on a caller's own transaction (``enqueue_in``), whose commit
then releases the locks.

Every statement reads "now" once from the ``c`` CTE: the server's clock, or the store's
clock sent as the last parameter (see :mod:`telegram_idem.backends.postgres._sql`).
"""

from __future__ import annotations

from telegram_idem.backends.postgres._schema import OUTBOX_COLUMNS
from telegram_idem.backends.postgres._sql import NOW_CTE, render_statements

__all__ = ["LOCK", "WITHOUT_NOW", "build_outbox_sql", "collapse_lock", "unit_lock"]

_COLS = ", ".join(OUTBOX_COLUMNS)
_T_COLS = ", ".join(f"t.{c}" for c in OUTBOX_COLUMNS)
_NOW = "(SELECT now FROM c)"
_LIVE = "('pending', 'in_flight')"
_REDRIVABLE = "('dead', 'unknown', 'parked')"
# Delivered or superseded past their retention: as good as deleted (enqueue stores anew).
_EXPIRED = (
    "({a}.status IN ('delivered', 'superseded') AND {a}.settled_at + {a}.retention <= " + _NOW + ")"
)


def unit_lock(bot_id: int, unit: str) -> str:
    """The advisory lock name of a chat (``<bot_id>:u:<unit>``), as :data:`LOCK` hashes
    it; SQL spells the same name ``bot_id::text || ':u:' || ordering_key``."""
    return f"{bot_id}:u:{unit}"


def collapse_lock(bot_id: int, collapse_key: str) -> str:
    """The advisory lock name of a collapse key (``<bot_id>:c:<collapse key>``)."""
    return f"{bot_id}:c:{collapse_key}"


LOCK = """SELECT count(pg_advisory_xact_lock(hashtext('{outbox}'), k.h))
FROM (SELECT DISTINCT hashtext(n) AS h FROM unnest($1::text[]) AS n ORDER BY h) AS k"""
"""Take the advisory locks named ``$1`` (a text array), in ``hashtext`` order."""

# The insert of a call, or the replacement of an entry whose retention ended (a fresh
# seq, the token kept so a stale holder cannot record over the new entry); ``{source}``
# gives ``c`` (now) and ``pk.yes`` (the chat is parked).
_INSERT_CALL = (
    """
  INSERT INTO {outbox} AS o
    (key, bot_id, method, params, ordering_key, collapse_key, policy, priority, retention,
     status, attempts, token, created_at, available_at, lease_expires_at, settled_at,
     result, last_error)
  SELECT $1::text, $2::bigint, $3::text, $4::bytea, $5::text, $6::text, $7::text,
         $8::integer, $9::float8, CASE WHEN pk.yes THEN 'parked' ELSE 'pending' END,
         0, 0, c.now, c.now, 0, CASE WHEN pk.yes THEN c.now ELSE 0 END, NULL, NULL
  FROM {source}
  ON CONFLICT (key) DO UPDATE SET
    seq = excluded.seq, bot_id = excluded.bot_id, method = excluded.method,
    params = excluded.params, ordering_key = excluded.ordering_key,
    collapse_key = excluded.collapse_key, policy = excluded.policy,
    priority = excluded.priority, retention = excluded.retention, status = excluded.status,
    attempts = 0, created_at = excluded.created_at, available_at = excluded.available_at,
    lease_expires_at = 0, settled_at = excluded.settled_at, result = NULL, last_error = NULL
  WHERE """
    + _EXPIRED.format(a="o")
    + """
  RETURNING {ocols}"""
)
_RESULT = """
SELECT true AS written, ins.* FROM ins
UNION ALL
SELECT false, old.* FROM old WHERE NOT EXISTS (SELECT 1 FROM ins)"""

# Enqueue (after LOCK). ``old`` is the stored entry in this statement's snapshot; ``ins``
# inserts the call or replaces an expired entry; ``sup`` supersedes the pending entries
# of the same bot and collapse key, only when ``ins`` wrote. When nothing comes back (the
# key was committed by a transaction this snapshot cannot see: the unique index made the
# insert wait for it), the caller runs the statement again.
_ENQUEUE = (
    NOW_CTE
    + """,
old AS (SELECT {cols} FROM {outbox} WHERE key = $1::text),
pk AS (SELECT EXISTS (SELECT 1 FROM {parked} p
                      WHERE p.bot_id = $2::bigint AND p.ordering_key = $5::text) AS yes),
ins AS ("""
    + _INSERT_CALL.replace("{source}", "c, pk")
    + """
),
sup AS (
  UPDATE {outbox} AS s SET status = 'superseded', settled_at = c.now, result = $10::bytea
  FROM c
  WHERE $6::text IS NOT NULL AND s.bot_id = $2::bigint AND s.collapse_key = $6::text
    AND s.status = 'pending' AND s.key <> $1::text AND EXISTS (SELECT 1 FROM ins)
  RETURNING 1
)"""
    + _RESULT
)

# Enqueue of a call without a collapse key in one statement (no LOCK before it): ``lk``
# takes the chat's advisory lock ($10, :func:`unit_lock`) and everything that must
# follow it reads ``lk``: the parked mark (``FOR KEY SHARE``: a mark deleted by an
# unpark that committed while this statement waited for the lock is skipped, not read
# from the older snapshot) and the insert, whose ``seq`` is drawn only once ``lk`` has
# its row (the lock held). See the module docstring for what the older snapshot can miss.
_ENQUEUE_LOCKED = (
    NOW_CTE
    + """,
lk AS MATERIALIZED (
  SELECT count(pg_advisory_xact_lock(hashtext('{outbox}'), hashtext($10::text))) AS n
),
old AS (SELECT {cols} FROM {outbox} WHERE key = $1::text),
ins AS ("""
    + _INSERT_CALL.replace(
        "{source}",
        """c, lk, LATERAL (SELECT EXISTS (
         SELECT 1 FROM {parked} p
         WHERE p.bot_id = $2::bigint AND p.ordering_key = $5::text AND lk.n > 0
         FOR KEY SHARE OF p) AS yes) AS pk""",
    )
    + """
)"""
    + _RESULT
)

_TAKE = (
    NOW_CTE
    + """,
head AS (
  SELECT e.seq FROM {outbox} AS e
  WHERE e.bot_id = $1::bigint AND e.status IN """
    + _LIVE
    + """
    AND ($3::text IS NULL OR e.ordering_key = $3::text)
    AND ((e.status = 'pending' AND e.available_at <= (SELECT now FROM c))
         OR (e.status = 'in_flight' AND e.lease_expires_at <= (SELECT now FROM c)))
    AND NOT EXISTS (SELECT 1 FROM {outbox} AS o
                    WHERE o.bot_id = e.bot_id AND o.ordering_key = e.ordering_key
                      AND o.status IN """
    + _LIVE
    + """ AND o.seq < e.seq)
  ORDER BY e.priority, e.seq
  LIMIT $4::integer
  FOR UPDATE OF e SKIP LOCKED
)
UPDATE {outbox} AS t
SET status = 'in_flight', attempts = t.attempts + 1, token = t.token + 1,
    lease_expires_at = c.now + $2::float8
FROM head, c
WHERE t.seq = head.seq
RETURNING {tcols}"""
)

_HELD = "t.key = $1::text AND t.token = $2::bigint AND t.status = 'in_flight'"


def _held_update(set_clause: str) -> str:
    return (
        NOW_CTE
        + "\nUPDATE {outbox} AS t SET "
        + set_clause
        + " FROM c WHERE "
        + _HELD
        + (" RETURNING 1")
    )


_DELIVER = _held_update(
    "status = 'delivered', result = $3::bytea, settled_at = c.now, lease_expires_at = 0"
)
_SETTLE = _held_update(
    "status = $3::text, last_error = $4::text, settled_at = c.now, lease_expires_at = 0"
)
_EXTEND = _held_update("lease_expires_at = c.now + $3::float8")
_RETRY = _held_update(
    "status = 'pending', available_at = c.now + greatest($3::float8, 0), lease_expires_at = 0, "
    "last_error = $4::text, params = coalesce($5::bytea, t.params)"
)
# A retry into another chat (after LOCK on the new chat): a fresh seq, at its back.
_RETRY_MOVE = _held_update(
    "seq = DEFAULT, status = 'pending', available_at = c.now + greatest($3::float8, 0), "
    "lease_expires_at = 0, last_error = $4::text, params = coalesce($5::bytea, t.params), "
    "ordering_key = $6::text"
)
# Park (after LOCK on the entry's chat): the entry, then the chat's pending entries, and
# the parked mark.
_PARK = (
    NOW_CTE
    + """,
me AS (
  UPDATE {outbox} AS t
  SET status = 'parked', last_error = $3::text, settled_at = c.now, lease_expires_at = 0
  FROM c WHERE """
    + _HELD
    + """
  RETURNING t.bot_id, t.ordering_key
),
mark AS (
  INSERT INTO {parked} (bot_id, ordering_key, parked_at)
  SELECT me.bot_id, me.ordering_key, c.now FROM me, c
  ON CONFLICT (bot_id, ordering_key) DO NOTHING
),
rest AS (
  UPDATE {outbox} AS r SET status = 'parked', settled_at = c.now
  FROM me, c
  WHERE r.bot_id = me.bot_id AND r.ordering_key = me.ordering_key AND r.status = 'pending'
  RETURNING 1
)
SELECT count(*) FROM me"""
)

_VISIBLE = "NOT " + _EXPIRED.format(a="t")
_GET = NOW_CTE + "\nSELECT {tcols} FROM {outbox} AS t WHERE t.key = $1::text AND " + _VISIBLE
_ENTRIES = (
    NOW_CTE
    + """
SELECT {tcols} FROM {outbox} AS t
WHERE t.status = $1::text AND ($2::bigint IS NULL OR t.bot_id = $2::bigint) AND """
    + _VISIBLE
    + """
ORDER BY t.seq LIMIT $3::integer"""
)
_COUNTS = (
    NOW_CTE
    + """
SELECT t.status, count(*) AS n FROM {outbox} AS t
WHERE ($1::bigint IS NULL OR t.bot_id = $1::bigint) AND """
    + _VISIBLE
    + """
GROUP BY t.status"""
)
# Redrive: LOCK_OF_ENTRY first (it names the entry's chat from the row), then REDRIVE.
_LOCK_OF_ENTRY = (
    "SELECT count(pg_advisory_xact_lock(hashtext('{outbox}'), "
    "hashtext(d.bot_id::text || ':u:' || d.ordering_key))) "
    "FROM {outbox} AS d WHERE d.key = $1::text AND d.status IN " + _REDRIVABLE
)
_REDRIVE = (
    NOW_CTE
    + """
UPDATE {outbox} AS t
SET seq = DEFAULT, status = 'pending', attempts = 0, available_at = c.now,
    lease_expires_at = 0, settled_at = 0
FROM c
WHERE t.key = $1::text AND t.status IN """
    + _REDRIVABLE
    + """
RETURNING 1"""
)
_RESOLVE = (
    NOW_CTE
    + """
UPDATE {outbox} AS t SET status = 'delivered', result = $2::bytea, settled_at = c.now
FROM c WHERE t.key = $1::text AND t.status = 'unknown'
RETURNING 1"""
)
# Unpark (after LOCK on the chat): the mark goes, the parked entries come back pending
# at the back of the chat, fresh seqs drawn in their old order.
_UNPARK = (
    NOW_CTE
    + """,
del AS (DELETE FROM {parked} WHERE bot_id = $1::bigint AND ordering_key = $2::text),
back AS (
  SELECT s.seq AS old, nextval(pg_get_serial_sequence('{outbox}', 'seq')) AS new
  FROM (SELECT seq FROM {outbox}
        WHERE bot_id = $1::bigint AND ordering_key = $2::text AND status = 'parked'
        ORDER BY seq) AS s
)
UPDATE {outbox} AS t
SET seq = back.new, status = 'pending', available_at = c.now, lease_expires_at = 0,
    settled_at = 0
FROM back, c
WHERE t.seq = back.old
RETURNING 1"""
)
_PARKED_UNITS = """SELECT bot_id, ordering_key FROM {parked}
WHERE $1::bigint IS NULL OR bot_id = $1::bigint ORDER BY bot_id, ordering_key"""
_PURGE = (
    NOW_CTE
    + """
DELETE FROM {outbox} WHERE seq = ANY(ARRAY(
  SELECT t.seq FROM {outbox} AS t WHERE """
    + _EXPIRED.format(a="t")
    + """
  LIMIT $1::integer FOR UPDATE SKIP LOCKED
))"""
)
_EXISTS = "SELECT to_regclass($1::text) IS NOT NULL AND to_regclass($2::text) IS NOT NULL"

# (template, index of the "now" parameter when a clock is given, or 0: no "now")
_STATEMENTS: dict[str, tuple[str, int]] = {
    "lock": (LOCK, 0),
    "enqueue": (_ENQUEUE, 11),
    "enqueue_locked": (_ENQUEUE_LOCKED, 11),
    "take": (_TAKE, 5),
    "deliver": (_DELIVER, 4),
    "settle": (_SETTLE, 5),
    "extend": (_EXTEND, 4),
    "retry": (_RETRY, 6),
    "retry_move": (_RETRY_MOVE, 7),
    "park": (_PARK, 4),
    "get": (_GET, 2),
    "entries": (_ENTRIES, 4),
    "counts": (_COUNTS, 2),
    "lock_of_entry": (_LOCK_OF_ENTRY, 0),
    "redrive": (_REDRIVE, 2),
    "resolve": (_RESOLVE, 3),
    "unpark": (_UNPARK, 3),
    "parked_units": (_PARKED_UNITS, 0),
    "purge": (_PURGE, 2),
    "exists": (_EXISTS, 0),
}

WITHOUT_NOW = frozenset(name for name, (_, now) in _STATEMENTS.items() if now == 0)
"""The statements that take no "now" parameter."""


def build_outbox_sql(outbox: str, parked: str, *, server_clock: bool) -> dict[str, str]:
    """The outbox statements for the tables ``outbox`` and ``parked``, by name.

    With ``server_clock`` every statement reads the server's clock; otherwise "now" is
    the last parameter.
    """
    fields = {
        "outbox": outbox,
        "parked": parked,
        "cols": _COLS,
        "tcols": _T_COLS,
        "ocols": ", ".join(f"o.{c}" for c in OUTBOX_COLUMNS),
    }
    return render_statements(_STATEMENTS, server_clock=server_clock, fields=fields)
