"""The few DynamoDB calls the store makes, typed (the aiobotocore client is ``Any``).

A conditional write answers :class:`Write`: written, or refused with the item that
refused it (``ReturnValuesOnConditionCheckFailure=ALL_OLD``), so a refusal is a decision,
never an exception.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from botocore.exceptions import ClientError

from telegram_idem.backends.dynamodb._errors import error_code
from telegram_idem.backends.dynamodb._items import Item, expression_names, string

__all__ = ["Table", "Write"]

_CCF: Final = "ConditionalCheckFailedException"


@dataclass(frozen=True, slots=True)
class Write:
    """The answer to one conditional write.

    Attributes:
        written: the condition held and the item was written.
    """

    written: bool
    current: Item | None = None
    """When refused: the item that refused it (``ALL_OLD``), ``None`` if there is none."""
    retried: bool = False
    """botocore re-sent the request: a refusal may be our own earlier attempt landing."""
    item: Item | None = None
    """When written with ``ReturnValues=ALL_NEW``: the item after the write."""


class Table:
    """One table through one aiobotocore client.

    Args:
        client: an aiobotocore DynamoDB client.
        table: the table name.
    """

    def __init__(self, client: Any, table: str) -> None:
        self.client = client
        self.table = table

    async def _conditional(self, method: str, condition: str, **kwargs: Any) -> Write:
        values: Mapping[str, Any] = kwargs.pop("values")
        expressions = f"{condition} {kwargs.get('UpdateExpression', '')}"
        names = expression_names(expressions)
        # DynamoDB rejects unused values too (moto does not): keep every call exact
        assert set(values) <= set(re.findall(r":\w+", expressions)), (values, expressions)
        if values:
            kwargs["ExpressionAttributeValues"] = dict(values)
        try:
            written = await getattr(self.client, method)(
                TableName=self.table,
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **kwargs,
            )
        except ClientError as exc:
            if error_code(exc) != _CCF:
                raise
            response: dict[str, Any] = exc.response
            retried = int(response.get("ResponseMetadata", {}).get("RetryAttempts", 0)) > 0
            return Write(False, response.get("Item") or None, retried)
        return Write(True, item=(written or {}).get("Attributes") or None)

    async def put(self, item: Item, condition: str, values: Mapping[str, Any]) -> Write:
        """``PutItem`` if ``condition`` holds.

        Args:
            item: the whole item, DynamoDB typed.
            condition: the ``ConditionExpression``.
            values: the ``ExpressionAttributeValues`` (``:name`` → DynamoDB typed value).

        Raises:
            botocore.exceptions.ClientError: the driver's errors (botocore
                ``ClientError``…), untranslated.
        """
        return await self._conditional("put_item", condition, Item=item, values=values)

    async def update(
        self,
        key: str,
        update: str,
        condition: str,
        values: Mapping[str, Any],
        *,
        return_new: bool = False,
    ) -> Write:
        """``UpdateItem`` of ``key`` if ``condition`` holds (never creates the item: every
        condition used requires the token); with ``return_new``, ``Write.item`` is the
        item after it.

        Args:
            key: the item's partition key (``pk``).
            update: the ``UpdateExpression``.
            condition: the ``ConditionExpression``.
            values: the ``ExpressionAttributeValues`` (``:name`` → DynamoDB typed value).
            return_new: ask for the item after the write (``ReturnValues=ALL_NEW``).

        Raises:
            botocore.exceptions.ClientError: the driver's errors (botocore
                ``ClientError``…), untranslated.
        """
        extra: dict[str, Any] = {"ReturnValues": "ALL_NEW"} if return_new else {}
        return await self._conditional(
            "update_item",
            condition,
            Key={"pk": string(key)},
            UpdateExpression=update,
            values=values,
            **extra,
        )

    async def delete(self, key: str, condition: str, values: Mapping[str, Any]) -> Write:
        """``DeleteItem`` of ``key`` if ``condition`` holds.

        Args:
            key: the item's partition key (``pk``).
            condition: the ``ConditionExpression``.
            values: the ``ExpressionAttributeValues`` (``:name`` → DynamoDB typed value).

        Raises:
            botocore.exceptions.ClientError: the driver's errors (botocore
                ``ClientError``…), untranslated.
        """
        return await self._conditional(
            "delete_item", condition, Key={"pk": string(key)}, values=values
        )

    async def query(
        self,
        index: str,
        key_condition: str,
        values: Mapping[str, Any],
        *,
        filter: str = "",
        limit: int,
        start: Item | None = None,
    ) -> tuple[list[Item], Item | None]:
        """One page of a ``Query`` on the global secondary index ``index``, ascending by
        its sort key: ``(items, last_evaluated_key)`` (``None`` on the last page).
        ``limit`` counts items read before ``filter``.

        Args:
            index: the global secondary index's name.
            key_condition: the ``KeyConditionExpression``.
            values: the ``ExpressionAttributeValues`` (``:name`` → DynamoDB typed value).
            filter: a ``FilterExpression`` (``""``: none).
            limit: the most items read for this page (before ``filter``).
            start: the previous page's ``last_evaluated_key``; ``None``: the first page.

        Raises:
            botocore.exceptions.ClientError: the driver's errors (botocore
                ``ClientError``…), untranslated.
        """
        kwargs: dict[str, Any] = {"FilterExpression": filter} if filter else {}
        if start is not None:
            kwargs["ExclusiveStartKey"] = start
        response = await self.client.query(
            TableName=self.table,
            IndexName=index,
            KeyConditionExpression=key_condition,
            ExpressionAttributeNames=expression_names(key_condition, filter),
            ExpressionAttributeValues=dict(values),
            ScanIndexForward=True,
            Limit=limit,
            **kwargs,
        )
        items: list[Item] = response.get("Items", [])
        return items, response.get("LastEvaluatedKey") or None

    async def get(self, key: str) -> Item | None:
        """Strongly consistent ``GetItem``.

        Args:
            key: the item's partition key (``pk``).

        Raises:
            botocore.exceptions.ClientError: the driver's errors (botocore
                ``ClientError``…), untranslated.
        """
        response = await self.client.get_item(
            TableName=self.table, Key={"pk": string(key)}, ConsistentRead=True
        )
        item: Item | None = response.get("Item")
        return item
