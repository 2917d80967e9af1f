"""Creating the store's table: partition key ``pk`` (S), ACTIVE, TTL on ``exp``, and the
effect ledger's global secondary index :data:`LEDGER_INDEX` (partition
:data:`LEDGER_PARTITION`, sort :data:`LEDGER_SORT`, both S, all attributes projected),
added to a table made before the ledger existed.

:func:`ensure_table` runs on an aiobotocore client and raises the driver's errors
untranslated (the caller translates: the connection for ``create_table=1`` and
``migrate()``, :func:`telegram_idem.backends.dynamodb.create_table` for a direct call).
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from botocore.exceptions import ClientError

from telegram_idem.backends.dynamodb._errors import DRIVER_ERRORS, error_code, translate
from telegram_idem.backends.dynamodb._items import TTL_ATTRIBUTE
from telegram_idem.errors import ConfigurationError, StoreError

__all__ = [
    "BILLING_MODES",
    "LEDGER_INDEX",
    "LEDGER_PARTITION",
    "LEDGER_SORT",
    "check_table_name",
    "create_table_on",
    "ensure_table",
]

BILLING_MODES = ("PAY_PER_REQUEST", "PROVISIONED")
"""What ``billing`` may be: on-demand, or provisioned capacity."""

LEDGER_INDEX = "ledger"
"""The global secondary index listing ledger rows oldest first (only ledger items carry
its key attributes, so record items never enter it)."""
LEDGER_PARTITION = "lpart"
"""The index's partition key: ``ledger#<state>``, one partition per state."""
LEDGER_SORT = "lsort"
"""The index's sort key: ``started_at`` spelled to sort as a number, ``#``, the key's
head (see ``_ledger``)."""

_KEY_ATTRIBUTES = [
    {"AttributeName": "pk", "AttributeType": "S"},
    {"AttributeName": LEDGER_PARTITION, "AttributeType": "S"},
    {"AttributeName": LEDGER_SORT, "AttributeType": "S"},
]
_LEDGER_KEY_SCHEMA = [
    {"AttributeName": LEDGER_PARTITION, "KeyType": "HASH"},
    {"AttributeName": LEDGER_SORT, "KeyType": "RANGE"},
]

_TABLE_NAME = re.compile(r"[A-Za-z0-9_.-]{3,255}")


def check_table_name(table: str) -> None:
    """Accept a DynamoDB table name: 3–255 of ``A-Z a-z 0-9 _ . -``.

    Raises:
        ConfigurationError: any other name.
    """
    if not _TABLE_NAME.fullmatch(table):
        raise ConfigurationError(
            f"a DynamoDB table name is 3–255 of A-Z a-z 0-9 _ . -, got {table!r}"
        )


async def ensure_table(
    client: Any,
    table: str,
    *,
    billing: str = "PAY_PER_REQUEST",
    read_capacity: int = 5,
    write_capacity: int = 5,
    wait_timeout: float = 300.0,
    poll_interval: float = 1.0,
) -> bool:
    """Create ``table`` if absent, wait until ACTIVE, enable TTL on ``exp``, add the ledger
    index if the table lacks it and wait until it is ACTIVE; idempotent and safe from
    several processes at once.

    Args:
        client: an aiobotocore DynamoDB client.
        table: the table name (checked with :func:`check_table_name`).
        billing: one of :data:`BILLING_MODES`.
        read_capacity: read capacity units when provisioned.
        write_capacity: write capacity units when provisioned.
        wait_timeout: seconds to wait for the table to become ACTIVE.
        poll_interval: seconds between status checks while waiting.

    Returns:
        ``True`` if this call created the table, ``False`` if it existed.

    Raises:
        ConfigurationError: a bad ``billing`` or table name; an existing table with
            another key schema, with TTL on another attribute, or with an index named
            :data:`LEDGER_INDEX` of another key schema.
        StoreError: the table or its ledger index did not become ACTIVE within
            ``wait_timeout`` seconds.
        botocore.exceptions.ClientError, ...: what the client raised, untranslated.
    """
    if billing not in BILLING_MODES:
        raise ConfigurationError(f"billing must be PAY_PER_REQUEST or PROVISIONED, got {billing!r}")
    check_table_name(table)
    created = await _create(client, table, billing, read_capacity, write_capacity)
    described = await _wait_active(client, table, wait_timeout, poll_interval)
    await _enable_ttl(client, table)
    if await _ensure_ledger_index(client, table, described, read_capacity, write_capacity):
        await _wait_active(client, table, wait_timeout, poll_interval)
    return created


def _throughput(rcu: int, wcu: int) -> dict[str, Any]:
    return {"ProvisionedThroughput": {"ReadCapacityUnits": rcu, "WriteCapacityUnits": wcu}}


def _ledger_index(billing: str, rcu: int, wcu: int) -> dict[str, Any]:
    index: dict[str, Any] = {
        "IndexName": LEDGER_INDEX,
        "KeySchema": _LEDGER_KEY_SCHEMA,
        "Projection": {"ProjectionType": "ALL"},
    }
    if billing == "PROVISIONED":
        index.update(_throughput(rcu, wcu))
    return index


def _index_of(described: dict[str, Any], table: str) -> dict[str, Any] | None:
    for index in described["Table"].get("GlobalSecondaryIndexes") or []:
        if index.get("IndexName") == LEDGER_INDEX:
            if index.get("KeySchema") != _LEDGER_KEY_SCHEMA:
                raise ConfigurationError(
                    f"DynamoDB table {table!r} has an index {LEDGER_INDEX!r} with key schema "
                    f"{index.get('KeySchema')}; the effect ledger needs partition key "
                    f"{LEDGER_PARTITION!r} (S) and sort key {LEDGER_SORT!r} (S)"
                )
            return dict(index)
    return None


async def _ensure_ledger_index(
    client: Any, table: str, described: dict[str, Any], rcu: int, wcu: int
) -> bool:
    """Add the ledger index to a table made without it (by an older version); ``True``
    if it is being added (wait for it), ``False`` if ``described`` has it already."""
    if _index_of(described, table) is not None:
        return False
    summary = described["Table"].get("BillingModeSummary") or {}
    billing = summary.get("BillingMode", "PROVISIONED")  # absent: a provisioned table
    try:
        await client.update_table(
            TableName=table,
            AttributeDefinitions=_KEY_ATTRIBUTES,
            GlobalSecondaryIndexUpdates=[{"Create": _ledger_index(billing, rcu, wcu)}],
        )
    except ClientError as exc:
        # another process added it meanwhile (or is adding it): look again
        if error_code(exc) not in ("ResourceInUseException", "ValidationException"):
            raise
        if _index_of(await client.describe_table(TableName=table), table) is None:
            raise
    return True


async def _create(client: Any, table: str, billing: str, rcu: int, wcu: int) -> bool:
    try:
        described = await client.describe_table(TableName=table)
    except ClientError as exc:
        if error_code(exc) != "ResourceNotFoundException":
            raise
    else:
        schema = described["Table"].get("KeySchema")
        if schema != [{"AttributeName": "pk", "KeyType": "HASH"}]:
            raise ConfigurationError(
                f"DynamoDB table {table!r} exists with key schema {schema}; the store needs "
                "a partition key 'pk' (S) and no sort key"
            )
        return False
    kwargs: dict[str, Any] = {"BillingMode": billing}
    if billing == "PROVISIONED":
        kwargs.update(_throughput(rcu, wcu))
    try:
        await client.create_table(
            TableName=table,
            AttributeDefinitions=_KEY_ATTRIBUTES,
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            GlobalSecondaryIndexes=[_ledger_index(billing, rcu, wcu)],
            **kwargs,
        )
    except ClientError as exc:
        if error_code(exc) != "ResourceInUseException":  # created meanwhile by another
            raise
        return False
    return True


async def _wait_active(client: Any, table: str, within: float, interval: float) -> dict[str, Any]:
    """Poll ``DescribeTable`` until the table (and its ledger index, if any) is ACTIVE;
    the last description."""
    deadline = time.monotonic() + within
    while True:
        try:
            described = await client.describe_table(TableName=table)
            status = described["Table"].get("TableStatus")
        except ClientError as exc:  # eventually consistent right after CreateTable
            if error_code(exc) != "ResourceNotFoundException":
                raise
            status = None
        if status == "ACTIVE":  # and the ledger index, if there is one yet
            index = _index_of(described, table)
            status = "ACTIVE" if index is None else f"index {index.get('IndexStatus')}"
            if status in ("ACTIVE", "index ACTIVE"):
                return dict(described)
        if time.monotonic() >= deadline:
            raise StoreError(f"DynamoDB table {table!r} not ACTIVE after {within} s ({status})")
        await asyncio.sleep(interval)


async def _enable_ttl(client: Any, table: str) -> None:
    for attempt in range(2):
        described = await client.describe_time_to_live(TableName=table)
        ttl = described.get("TimeToLiveDescription", {})
        status, attribute = ttl.get("TimeToLiveStatus"), ttl.get("AttributeName")
        if status in ("ENABLED", "ENABLING"):
            if attribute != TTL_ATTRIBUTE:
                raise ConfigurationError(
                    f"DynamoDB table {table!r} has TTL on {attribute!r}; the store needs it "
                    f"on {TTL_ATTRIBUTE!r}"
                )
            return
        try:
            await client.update_time_to_live(
                TableName=table,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
            )
            return
        except ClientError as exc:
            # enabled meanwhile by another process: look again once
            if error_code(exc) != "ValidationException" or attempt:
                raise


async def create_table_on(client: Any, table: str, **options: Any) -> bool:
    """:func:`ensure_table` with the driver's errors translated (messages start with
    ``create_table('<table>')``).

    Raises:
        ConfigurationError, StoreError: as :func:`ensure_table`, and as
            :func:`~telegram_idem.backends.dynamodb._errors.translate` decides for the
            driver's errors.
    """
    try:
        return await ensure_table(client, table, **options)
    except DRIVER_ERRORS as exc:
        raise translate(exc, f"create_table({table!r})", table) from exc
