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
    """The answer to one conditional write."""

    written: bool
    current: Item | None = None
    """When refused: the item that refused it (``ALL_OLD``), ``None`` if there is none."""
    retried: bool = False
    """botocore re-sent the request: a refusal may be our own earlier attempt landing."""


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
            await getattr(self.client, method)(
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
        return Write(True)

    async def put(self, item: Item, condition: str, values: Mapping[str, Any]) -> Write:
        """``PutItem`` if ``condition`` holds. Raises the driver's errors untranslated."""
        return await self._conditional("put_item", condition, Item=item, values=values)

    async def update(
        self, key: str, update: str, condition: str, values: Mapping[str, Any]
    ) -> Write:
        """``UpdateItem`` of ``key`` if ``condition`` holds (never creates the item: every
        condition used requires the token). Raises the driver's errors untranslated."""
        return await self._conditional(
            "update_item",
            condition,
            Key={"pk": string(key)},
            UpdateExpression=update,
            values=values,
        )

    async def get(self, key: str) -> Item | None:
        """Strongly consistent ``GetItem``. Raises the driver's errors untranslated."""
        response = await self.client.get_item(
            TableName=self.table, Key={"pk": string(key)}, ConsistentRead=True
        )
        item: Item | None = response.get("Item")
        return item
