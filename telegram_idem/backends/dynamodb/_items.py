"""The store's items in DynamoDB's wire shape: one record ↔ one item (docs/store-dynamodb.md).

Attributes: ``pk`` (S, the key), ``status`` (S), ``token`` (N), ``lease`` (N, seconds),
``exp_at`` (N, the exact retention end every condition judges), ``exp`` (N,
``ceil(exp_at)``: the table's TTL attribute, :data:`TTL_ATTRIBUTE`), ``fp`` (S, absent =
none), ``result`` (B, absent while in progress), ``attempts`` (N), ``cid`` (S, the claim
call that wrote the item). Numbers are written exactly, never in exponent notation.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any, Final

from telegram_idem._records import Record, Status
from telegram_idem.errors import ConfigurationError, StoreError

__all__ = [
    "IN_PROGRESS",
    "TTL_ATTRIBUTE",
    "Item",
    "expiry_attribute",
    "expression_names",
    "number",
    "string",
    "to_item",
    "to_record",
]

Item = dict[str, Any]
"""One DynamoDB item in the low-level wire shape: ``{"pk": {"S": "…"}, …}``."""

TTL_ATTRIBUTE: Final = "exp"
"""The item attribute the table's TTL is enabled on (whole seconds since the epoch)."""

IN_PROGRESS: Final = {"S": Status.IN_PROGRESS.value}
"""The ``status`` value of a record in progress."""


def number(value: float) -> dict[str, str]:
    """A DynamoDB number from seconds or a count: exact, never in exponent notation.

    Raises:
        ConfigurationError: ``value`` is not finite.
    """
    if not math.isfinite(value):
        raise ConfigurationError(f"a DynamoDB number must be finite, got {value!r}")
    if isinstance(value, int):
        return {"N": str(value)}
    return {"N": format(Decimal(repr(float(value))), "f")}


def string(value: str) -> dict[str, str]:
    """A DynamoDB string."""
    return {"S": value}


def expression_names(*expressions: str) -> dict[str, str]:
    """``ExpressionAttributeNames`` for the ``#name`` placeholders used (all and only those:
    DynamoDB rejects unused names). Every placeholder is the attribute's own name."""
    return {m: m[1:] for m in sorted(set(re.findall(r"#\w+", " ".join(expressions))))}


def to_item(record: Record, cid: str) -> Item:
    """The item of ``record``, written by the claim call ``cid``."""
    item: Item = {
        "pk": string(record.key),
        "status": string(record.status.value),
        "token": number(record.fencing_token),
        "lease": number(record.lease_expires_at),
        "exp_at": number(record.expires_at),
        TTL_ATTRIBUTE: number(math.ceil(record.expires_at)),
        "attempts": number(record.attempts),
        "cid": string(cid),
    }
    if record.fingerprint is not None:
        item["fp"] = string(record.fingerprint)
    if record.result is not None:
        item["result"] = {"B": record.result}
    return item


def expiry_attribute(item: Item) -> str:
    """The attribute holding the retention end: ``exp_at``, or ``exp`` for an item written
    by something else that lacks it."""
    return "exp_at" if "exp_at" in item else TTL_ATTRIBUTE


def to_record(item: Item, table: str) -> Record:
    """The record an item holds.

    Raises:
        StoreError: a malformed item (a missing attribute, an unknown status), naming
            ``table``.
    """
    try:
        return Record(
            key=item["pk"]["S"],
            status=Status(item["status"]["S"]),
            fencing_token=int(item["token"]["N"]),
            lease_expires_at=float(item["lease"]["N"]),
            expires_at=float(item[expiry_attribute(item)]["N"]),
            fingerprint=item["fp"]["S"] if "fp" in item else None,
            result=bytes(item["result"]["B"]) if "result" in item else None,
            attempts=int(item["attempts"]["N"]) if "attempts" in item else 1,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(
            f"malformed item in DynamoDB table {table!r} (attributes {sorted(item)}): {exc!r}",
            original=exc,
        ) from exc
