"""The DynamoDB store's browsing and health check (the
:class:`~telegram_idem.backends.Browsable` and :class:`~telegram_idem.backends.Checkable`
abilities), on the store's :class:`~telegram_idem.backends.dynamodb.DynamoDBConnection`.

DynamoDB cannot list a key range of a table whose only key is a partition key, so
``records`` and ``count_records`` **scan the whole table** (strongly consistent ``Scan``
pages, ``begins_with(pk, :prefix)`` as the filter: it compares the value, never reads
it as a pattern), which reads, and bills, every item; they are for an operator's
command, not for a bot. Only record items are taken (those with a ``status``: the
effect ledger's ``ledger#…`` items have none). ``delete_records`` scans until it has
``limit`` keys and deletes them with ``BatchWriteItem`` (25 per request, unprocessed
ones sent again). These three make the table first with ``create_table=1``, as
every record call does; ``health`` never does. Records past retention stay in the table until its TTL removes them
(up to 48 h later), so they are counted (``expired``) and deleted like any other.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from botocore.exceptions import ClientError

from telegram_idem._keys import MAX_KEY_BYTES
from telegram_idem._records import Record
from telegram_idem.backends._browse import check_limit, stored_prefix
from telegram_idem.backends._health import StoreHealth
from telegram_idem.backends.dynamodb._connection import DynamoDBConnection
from telegram_idem.backends.dynamodb._errors import error_code
from telegram_idem.backends.dynamodb._items import (
    TTL_ATTRIBUTE,
    Item,
    expression_names,
    number,
    string,
    to_record,
)
from telegram_idem.backends.dynamodb._setup import LEDGER_INDEX
from telegram_idem.errors import StoreError

__all__ = ["DynamoDBBrowsing"]

_BATCH_WRITE = 25
"""Most requests in one ``BatchWriteItem``."""
_UNPROCESSED_ROUNDS = 10
"""Times unprocessed deletions are sent again before the batch gives up."""


class DynamoDBBrowsing:
    """Mixed into :class:`~telegram_idem.backends.dynamodb.DynamoDBStore`."""

    connection: DynamoDBConnection
    table: str

    async def _scan(
        self, prefix: str, *, expired: bool = False, keys_only: bool = False
    ) -> AsyncIterator[Item]:
        """Every record item under ``prefix`` (past retention only, with ``expired``),
        page by page; the driver's errors untranslated."""
        conditions = ["attribute_exists(#status)"]
        values: dict[str, Any] = {}
        start = stored_prefix(prefix)
        if len(start.encode("utf-8")) > MAX_KEY_BYTES:
            return  # no stored key is that long (and DynamoDB refuses such an operand)
        if start:
            conditions.append("begins_with(#pk, :prefix)")
            values[":prefix"] = string(start)
        if expired:
            conditions.append("#exp_at <= :now")
            values[":now"] = number(self.connection.now())
        condition = " AND ".join(conditions)
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "FilterExpression": condition,
            "ExpressionAttributeNames": expression_names(condition, "#pk" if keys_only else ""),
            "ConsistentRead": True,
        }
        if values:
            kwargs["ExpressionAttributeValues"] = values
        if keys_only:
            kwargs["ProjectionExpression"] = "#pk"
        client = (await self.connection.ready()).client
        while True:
            page = await client.scan(**kwargs)
            for item in page.get("Items", []):
                yield item
            last = page.get("LastEvaluatedKey")
            if not last:
                return
            kwargs["ExclusiveStartKey"] = last

    async def records(self, *, prefix: str, limit: int = 100) -> list[Record]:
        """The live records whose key starts with ``prefix``, the first ``limit`` in key
        (code point) order: a whole-table ``Scan`` (see the module docstring).

        Raises:
            ConfigurationError: ``limit`` < 1, the table is missing, or credentials or
                permissions are wrong.
            StoreError: DynamoDB could not answer.
        """
        check_limit(limit)

        async def run() -> list[Record]:
            now = self.connection.now()
            found = [to_record(item, self.table) async for item in self._scan(prefix)]
            live = sorted((r for r in found if r.expires_at > now), key=lambda r: r.key)
            return live[:limit]

        return await self.connection.call("records", run)

    async def count_records(self, *, prefix: str, expired: bool = False) -> int:
        """How many records are stored under ``prefix`` (with ``expired``: only those
        past retention, which the table's TTL has not removed yet): a whole-table
        ``Scan``.

        Raises:
            ConfigurationError: the table is missing, or credentials or permissions are
                wrong.
            StoreError: DynamoDB could not answer.
        """

        async def run() -> int:
            n = 0
            async for _ in self._scan(prefix, expired=expired, keys_only=True):
                n += 1
            return n

        return await self.connection.call("count_records", run)

    async def delete_records(self, *, prefix: str, limit: int = 1000) -> int:
        """Delete up to ``limit`` records stored under ``prefix`` (``Scan`` until that
        many, then ``BatchWriteItem``); returns how many.

        Raises:
            ConfigurationError: ``limit`` < 1, the table is missing, or credentials or
                permissions are wrong.
            StoreError: DynamoDB could not answer, or kept refusing part of a batch.
        """
        check_limit(limit)

        async def run() -> int:
            doomed: list[Item] = []
            async for item in self._scan(prefix, keys_only=True):
                doomed.append({"pk": item["pk"]})
                if len(doomed) >= limit:
                    break
            client = (await self.connection.ready()).client
            for i in range(0, len(doomed), _BATCH_WRITE):
                requests = [{"DeleteRequest": {"Key": key}} for key in doomed[i : i + _BATCH_WRITE]]
                pending: dict[str, Any] = {self.table: requests}
                for _ in range(_UNPROCESSED_ROUNDS):
                    answer = await client.batch_write_item(RequestItems=pending)
                    pending = answer.get("UnprocessedItems") or {}
                    if not pending:
                        break
                else:
                    raise StoreError(
                        f"{self.connection.label}.delete_records: DynamoDB left "
                        f"{len(pending.get(self.table, []))} deletion(s) unprocessed"
                    )
            return len(doomed)

        return await self.connection.call("delete_records", run)

    async def health(self) -> StoreHealth:
        """The table (``DescribeTable``): present and ``ACTIVE``, partition key ``pk``
        of type S and no sort key, TTL enabled on ``exp`` (``DescribeTimeToLive``), the
        effect ledger's index; creates nothing (also with ``create_table=1``).

        Raises:
            ConfigurationError: credentials or permissions are wrong.
            StoreError: DynamoDB could not answer.
        """
        label = self.connection.label
        where = self.connection.endpoint_url or f"region {self.connection.region}"
        server = f"DynamoDB ({where})"
        compared = (
            "the table: key schema, status, TTL on exp, ledger index (DynamoDB keeps no "
            "schema version)"
        )

        async def run() -> tuple[dict[str, Any] | None, dict[str, Any]]:
            client = await self.connection.client()
            try:
                described = await client.describe_table(TableName=self.table)
            except ClientError as exc:
                if error_code(exc) != "ResourceNotFoundException":
                    raise
                return None, {}
            ttl = await client.describe_time_to_live(TableName=self.table)
            return dict(described["Table"]), dict(ttl.get("TimeToLiveDescription", {}))

        table, ttl = await self.connection.call("health", run)
        if table is None:
            return StoreHealth(server=server, compared=compared, expected=(self.table,))
        problems: list[str] = []
        keys = {(k["AttributeName"], k["KeyType"]) for k in table.get("KeySchema", [])}
        types = {
            a["AttributeName"]: a["AttributeType"] for a in table.get("AttributeDefinitions", [])
        }
        if keys != {("pk", "HASH")} or types.get("pk") != "S":
            problems.append(
                f"table {self.table} has key schema {sorted(keys)}; the store needs a "
                "partition key pk (S) and no sort key"
            )
        if table.get("TableStatus") != "ACTIVE":
            problems.append(f"table {self.table} is {table.get('TableStatus')}, not ACTIVE")
        if ttl.get("TimeToLiveStatus") not in ("ENABLED", "ENABLING") or (
            ttl.get("AttributeName") != TTL_ATTRIBUTE
        ):
            problems.append(
                f"TTL is not enabled on {TTL_ATTRIBUTE} (records past retention are never "
                f"removed): run telegram-idem migrate URL ({label})"
            )
        indexes = {i.get("IndexName") for i in table.get("GlobalSecondaryIndexes", [])}
        if LEDGER_INDEX not in indexes:
            problems.append(
                f"index {LEDGER_INDEX} missing (the effect ledger lists by it): run "
                "telegram-idem migrate URL"
            )
        return StoreHealth(
            server=server,
            compared=compared,
            expected=(self.table,),
            found=(self.table,),
            problems=tuple(problems),
        )
