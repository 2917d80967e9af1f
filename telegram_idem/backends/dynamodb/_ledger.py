"""The effect ledger of :class:`~telegram_idem.backends.dynamodb.DynamoDBStore`: one item
per at-most-once effect in the store's own table, every rule a conditional write.

Item layout (partition key ``pk`` = ``ledger#<bounded key>``; no ``exp``, so the table's
TTL never deletes a ledger row):

| attribute     | type | meaning                                                        |
|---------------|------|----------------------------------------------------------------|
| ``pk``        | S    | ``ledger#`` + the bounded key                                  |
| ``lkey``      | S    | the bounded key (``LedgerEntry.key``)                          |
| ``lstate``    | S    | ``started`` / ``unknown`` / ``settled``                        |
| ``token``     | N    | fencing token of the last writer                               |
| ``started_at`` / ``updated_at`` | N | seconds since the epoch (the store's clock)       |
| ``holder``, ``detail`` | S | as :func:`~telegram_idem.ledger.storable_text` gives them     |
| ``attempts``  | N    | holders that met the row                                       |
| ``result``    | B    | the settled result (absent = ``None``), bytes exactly          |
| ``not_applied`` | BOOL | settled as "did not happen"                                 |
| ``op``        | S    | random id of the call that wrote the item last                 |
| ``lpart``     | S    | ``ledger#<state>``: partition of the ``ledger`` index          |
| ``lsort``     | S    | :func:`sort_key` of ``started_at`` and the key: its sort key   |

Round trips: ``start`` is one ``PutItem`` conditioned on ``attribute_not_exists(pk)``
(a refusal answers the existing row from ``ALL_OLD``); ``mark_unknown`` and ``settle``
one ``UpdateItem`` each, conditioned on the state (and for ``mark_unknown`` the token),
answering ``ALL_NEW``; ``finish`` one ``DeleteItem`` conditioned on the token; ``get``
one consistent ``GetItem``. botocore may re-send a write whose answer was lost: the
``op`` id tells our own landed write from another's, so a re-sent ``mark_unknown``
never counts an attempt twice (its condition also requires another ``op``). A re-sent
``finish`` refused with no item left answers ``True``: its first copy deleted the row
(the likeliest reading; no decision rests on it).

``entries`` Queries the ``ledger`` index, one partition per wanted state, ascending by
``lsort``: never a Scan. A global secondary index is eventually consistent, so a write
may take a moment (usually well under a second on AWS) to show in the listing; ``get``
is always current. The index is created with the table (``migrate()``,
``create_table=1``) and added to a table made before the ledger existed.

Keys ``ledger#…`` are the ledger's: a record key starting with ``ledger#`` would meet a
ledger item (and fail loudly as a malformed item, never silently).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from decimal import Decimal, localcontext
from typing import Any, Final

from botocore.exceptions import ClientError

from telegram_idem._keys import bounded_key
from telegram_idem.backends.dynamodb._connection import DynamoDBConnection
from telegram_idem.backends.dynamodb._errors import error_code
from telegram_idem.backends.dynamodb._items import Item, number, string
from telegram_idem.backends.dynamodb._setup import LEDGER_INDEX
from telegram_idem.backends.dynamodb._table import Table
from telegram_idem.errors import ConfigurationError, StoreError
from telegram_idem.ledger import Ledger, LedgerEntry, LedgerState, check_limit, check_settle
from telegram_idem.ledger import storable_text as _text

__all__ = ["KEY_PREFIX", "DynamoDBLedger", "sort_key"]

KEY_PREFIX: Final = "ledger#"
"""What a ledger item's ``pk`` starts with (then the bounded key)."""

_SORT_HEAD_CHARS: Final = 240
"""How many characters of the key ``lsort`` holds: 240 × 4 UTF-8 bytes stays under the
1024-byte limit of a sort key with the time in front. Rows whose ``lsort`` ties are
ordered by their whole key here (see :meth:`DynamoDBLedger.entries`)."""
_INT_DIGITS: Final = 16
_NEGATIVE_OFFSET: Final = Decimal(10**_INT_DIGITS)

_LIVE: Final = f"#lstate IN (:{LedgerState.STARTED.value}, :{LedgerState.UNKNOWN.value})"
_LIVE_VALUES: Final = {
    f":{LedgerState.STARTED.value}": string(LedgerState.STARTED.value),
    f":{LedgerState.UNKNOWN.value}": string(LedgerState.UNKNOWN.value),
}


def sort_key(started_at: float, key: str) -> str:
    """The ``lsort`` of a row: ``started_at`` spelled so that string order is number order
    (16 integer digits, the exact decimal fraction without trailing zeros; a negative time
    as ``-`` and its distance above −10¹⁶; times within ±10¹⁶ s), ``#``, the key's first
    240 characters.
    ``#`` sorts below every digit, so a shorter fraction sorts first; equal times sort by
    key (DynamoDB compares UTF-8 bytes, which is code point order)."""
    exact = Decimal(started_at) if isinstance(started_at, int) else Decimal(repr(started_at))
    sign = ""
    if exact == 0:
        exact = Decimal(0)  # -0.0 is 0
    elif exact < 0:
        with localcontext() as exact_sums:
            exact_sums.prec = 1000  # wide enough for any float: the sum is exact
            sign, exact = "-", exact + _NEGATIVE_OFFSET
    whole, _, fraction = format(exact, "f").partition(".")
    return f"{sign}{whole.zfill(_INT_DIGITS)}.{fraction.rstrip('0')}#{key[:_SORT_HEAD_CHARS]}"


def _partition(state: LedgerState) -> dict[str, str]:
    return string(f"{KEY_PREFIX}{state.value}")


def _to_entry(item: Item, table: str) -> LedgerEntry:
    try:
        return LedgerEntry(
            key=item["lkey"]["S"],
            state=LedgerState(item["lstate"]["S"]),
            token=int(item["token"]["N"]),
            started_at=float(item["started_at"]["N"]),
            holder=item["holder"]["S"],
            attempts=int(item["attempts"]["N"]),
            updated_at=float(item["updated_at"]["N"]),
            detail=item["detail"]["S"],
            result=bytes(item["result"]["B"]) if "result" in item else None,
            not_applied=bool(item["not_applied"]["BOOL"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(
            f"malformed ledger item in DynamoDB table {table!r} (attributes {sorted(item)}): "
            f"{exc!r}",
            original=exc,
        ) from exc


class DynamoDBLedger(Ledger):
    """:class:`~telegram_idem.ledger.Ledger` as items of the store's DynamoDB table (see
    the module docstring for the layout and the round trips).

    Args:
        connection: the store's connection (client, table readiness, clock, errors).
    """

    def __init__(self, connection: DynamoDBConnection) -> None:
        self._db = connection

    def __repr__(self) -> str:
        return f"{self._db.label}.ledger()"

    def _op(self) -> dict[str, str]:
        return string(secrets.token_hex(8))

    def _entry(self, item: Item) -> LedgerEntry:
        return _to_entry(item, self._db.table)

    async def start(self, key: str, *, token: int, holder: str) -> LedgerEntry | None:
        key = bounded_key(key)

        async def body() -> LedgerEntry | None:
            db = await self._db.ready()
            now = self._db.now()
            op = self._op()
            item: Item = {
                "pk": string(KEY_PREFIX + key),
                "lkey": string(key),
                "lstate": string(LedgerState.STARTED.value),
                "token": number(token),
                "started_at": number(now),
                "holder": string(_text(holder)),
                "attempts": number(1),
                "updated_at": number(now),
                "detail": string(""),
                "not_applied": {"BOOL": False},
                "op": op,
                "lpart": _partition(LedgerState.STARTED),
                "lsort": string(sort_key(now, key)),
            }
            answer = await db.put(item, "attribute_not_exists(#pk)", {})
            if answer.written:
                return None
            current = answer.current
            if current is None:  # refused, yet no item: deleted between the two
                raise StoreError(f"{self!r}.start({key!r}): refused with no item; try again")
            if current.get("op") == op:
                return None  # botocore re-sent our put after it had landed
            return self._entry(current)

        return await self._db.call("ledger.start", body)

    async def mark_unknown(self, key: str, *, token: int, detail: str) -> LedgerEntry | None:
        key = bounded_key(key)

        async def body() -> LedgerEntry | None:
            db = await self._db.ready()
            now = self._db.now()
            op = self._op()
            answer = await db.update(
                KEY_PREFIX + key,
                "SET #lstate = :unknown, #token = :t, #detail = :d, "
                "#attempts = #attempts + :one, #updated_at = :now, #lpart = :part, #op = :op",
                f"attribute_exists(#pk) AND {_LIVE} AND #token <= :t AND #op <> :op",
                {
                    **_LIVE_VALUES,
                    ":t": number(token),
                    ":d": string(_text(detail)),
                    ":one": number(1),
                    ":now": number(now),
                    ":part": _partition(LedgerState.UNKNOWN),
                    ":op": op,
                },
                return_new=True,
            )
            item = answer.item if answer.written else answer.current
            return None if item is None else self._entry(item)

        return await self._db.call("ledger.mark_unknown", body)

    async def settle(
        self, key: str, *, token: int, result: bytes | None, not_applied: bool
    ) -> bool:
        check_settle(result, not_applied)
        key = bounded_key(key)

        async def body() -> bool:
            db = await self._db.ready()
            now = self._db.now()
            op = self._op()
            values: dict[str, Any] = {
                **_LIVE_VALUES,
                ":settled": string(LedgerState.SETTLED.value),
                ":t": number(token),
                ":na": {"BOOL": not_applied},
                ":now": number(now),
                ":part": _partition(LedgerState.SETTLED),
                ":op": op,
            }
            update = (
                "SET #lstate = :settled, #token = :t, #not_applied = :na, "
                "#updated_at = :now, #lpart = :part, #op = :op"
            )
            if result is None:
                update += " REMOVE #result"
            else:
                update += ", #result = :res"
                values[":res"] = {"B": result}
            answer = await db.update(
                KEY_PREFIX + key, update, f"attribute_exists(#pk) AND {_LIVE}", values
            )
            if answer.written:
                return True
            current = answer.current
            if current is not None:
                self._entry(current)  # a malformed item is an error, not "settled already"
                return current.get("op") == op  # our re-sent settle had landed
            return False

        return await self._db.call("ledger.settle", body)

    async def finish(self, key: str, *, token: int) -> bool:
        key = bounded_key(key)

        async def body() -> bool:
            db = await self._db.ready()
            answer = await db.delete(
                KEY_PREFIX + key,
                "attribute_exists(#lstate) AND #token = :t",
                {":t": number(token)},
            )
            # A re-sent delete refused with no item left: ours had landed before.
            return answer.written or (answer.retried and answer.current is None)

        return await self._db.call("ledger.finish", body)

    async def get(self, key: str) -> LedgerEntry | None:
        key = bounded_key(key)

        async def body() -> LedgerEntry | None:
            db = await self._db.ready()
            item = await db.get(KEY_PREFIX + key)
            return None if item is None else self._entry(item)

        return await self._db.call("ledger.get", body)

    async def entries(
        self,
        *,
        states: Sequence[LedgerState] = (LedgerState.STARTED, LedgerState.UNKNOWN),
        prefix: str = "",
        limit: int = 100,
    ) -> list[LedgerEntry]:
        """Rows in ``states`` whose key starts with ``prefix``, oldest first (ties: by
        key), at most ``limit``: one Query per state on the ``ledger`` index (paged;
        ``prefix`` is a filter, so a rare prefix reads more pages). Eventually
        consistent (see the module docstring).

        Raises:
            ValueError: ``limit`` < 1.
            ConfigurationError: the table has no ``ledger`` index yet (run
                ``migrate()``), or as every call.
            StoreError: as every call.
        """
        check_limit(limit)
        wanted = list(dict.fromkeys(LedgerState(s) for s in states))

        async def body() -> list[LedgerEntry]:
            db = await self._db.ready()
            rows: list[LedgerEntry] = []
            for state in wanted:
                rows.extend(self._entry(i) for i in await self._listed(db, state, prefix, limit))
            rows.sort(key=lambda r: (r.started_at, r.key))
            return rows[:limit]

        return await self._db.call("ledger.entries", body)

    async def _check_index(self, db: Table, exc: ClientError) -> None:
        """Raise a ConfigurationError that says so when the Query failed because the table
        lacks the ``ledger`` index (DynamoDB answers ValidationException, moto
        ResourceNotFoundException); return otherwise (the caller re-raises ``exc``)."""
        code = error_code(exc)
        if code not in ("ValidationException", "ResourceNotFoundException"):
            return
        if code == "ResourceNotFoundException" and self._db.create_table:
            return  # the connection makes the table (and the index) again and retries
        try:
            described = await db.client.describe_table(TableName=self._db.table)
        except ClientError:
            return  # no table at all: the original error says so
        indexes = described["Table"].get("GlobalSecondaryIndexes") or []
        found = [i for i in indexes if i.get("IndexName") == LEDGER_INDEX]
        if found and found[0].get("IndexStatus") == "ACTIVE":
            return
        state = "still being created" if found else "made before the effect ledger"
        raise ConfigurationError(
            f"{self!r}.entries: DynamoDB table {self._db.table!r} has no {LEDGER_INDEX!r} "
            f"index ({state}): run `telegram-idem migrate <store URL>` (or `await "
            "store.migrate()`) once"
        ) from exc

    async def _listed(self, db: Table, state: LedgerState, prefix: str, limit: int) -> list[Item]:
        """The first ``limit`` items of ``state`` by ``lsort``, and every later one whose
        ``lsort`` ties the last of those (their order is decided by the whole key)."""
        values: dict[str, Any] = {":part": _partition(state)}
        condition = "begins_with(#lkey, :prefix)" if prefix else ""
        if prefix:
            values[":prefix"] = string(prefix)
        found: list[Item] = []
        start: Item | None = None
        while True:
            try:
                items, start = await db.query(
                    LEDGER_INDEX,
                    "#lpart = :part",
                    values,
                    filter=condition,
                    limit=limit + 1,
                    start=start,
                )
            except ClientError as exc:
                await self._check_index(db, exc)
                raise
            for item in items:
                if len(found) >= limit and item.get("lsort") != found[limit - 1].get("lsort"):
                    return found
                found.append(item)
            if start is None:
                return found
