"""DynamoDB store (``dynamodb://table?region=…``) on aiobotocore: one item per key.

URL: ``dynamodb://<table>[?option=value&…]``, options

| option            | meaning                                                          | default     |
|-------------------|------------------------------------------------------------------|-------------|
| ``region``        | AWS region                                                       | us-east-1   |
| ``endpoint_url``  | ``http(s)://host:port`` of DynamoDB Local, moto, a VPC endpoint  | AWS's       |
| ``create_table``  | ``1``: create the table (and TTL on ``exp``) on first use        | ``0``       |
| ``connect_timeout`` / ``read_timeout`` | seconds per HTTP attempt                    | 2 / 5       |
| ``max_attempts``  | HTTP attempts per call, retries included (botocore "standard")   | 3           |

Item layout (partition key ``pk``, no sort key):

| attribute  | type | meaning                                                                   |
|------------|------|---------------------------------------------------------------------------|
| ``pk``     | S    | the idempotency key                                                       |
| ``status`` | S    | ``in_progress`` / ``completed`` / ``failed``                              |
| ``token``  | N    | fencing token                                                             |
| ``lease``  | N    | lease end, seconds since the epoch                                        |
| ``exp_at`` | N    | retention end, seconds since the epoch (exact; judged by every condition) |
| ``exp``    | N    | ``ceil(exp_at)``, whole seconds: the table's TTL attribute                |
| ``fp``     | S    | payload fingerprint (absent = ``None``)                                   |
| ``result`` | B    | stored result or failure (absent while in progress)                       |
| ``attempts`` | N  | how many times the key was acquired                                       |
| ``cid``    | S    | random id of the claim call that wrote the item                           |

Round trips: a first claim and a duplicate (replay, conflict, in progress, failed) are one
conditional ``PutItem`` (``ReturnValuesOnConditionCheckFailure=ALL_OLD`` hands back the
record that refused the write); a takeover of an expired lease or of a retention-expired
record still present (TTL deletion lags up to 48 h) is two: the refused put, then a
``PutItem`` conditioned on the exact record judged expired. complete / fail / release /
extend are one ``UpdateItem`` conditioned on the token (extend past the retention end:
two). ``get`` is one consistent ``GetItem``.

DynamoDB has no server clock: every time is the writer's (``clock``, ``time.time`` by
default). Workers judge each other's leases by their own clocks, so keep hosts
NTP-synced and leases much longer than the clock skew.

The store is a part over one :class:`DynamoDBConnection` (``store.connection``): the
client, table readiness (``create_table``), the clock and the error translation.
:meth:`DynamoDBStore.migrate` and :func:`create_table` create the table (idempotent).
Modules (private, one job each): ``_url`` (the URL), ``_errors`` (botocore's
exceptions), ``_items`` (records ↔ items), ``_table`` (the typed calls), ``_setup``
(creating the table and the ledger index), ``_connection``, ``_store`` (the records
store), ``_ledger`` (the effect ledger: items ``ledger#<key>`` in the same table, listed
through the global secondary index ``ledger``).
"""

from __future__ import annotations

from telegram_idem.backends.dynamodb._connection import DynamoDBConnection
from telegram_idem.backends.dynamodb._errors import CONFIGURATION_CODES, THROTTLING_CODES
from telegram_idem.backends.dynamodb._items import TTL_ATTRIBUTE
from telegram_idem.backends.dynamodb._ledger import DynamoDBLedger
from telegram_idem.backends.dynamodb._store import DynamoDBStore, create_table
from telegram_idem.backends.dynamodb._table import Table, Write

__all__ = [
    "CONFIGURATION_CODES",
    "THROTTLING_CODES",
    "TTL_ATTRIBUTE",
    "DynamoDBConnection",
    "DynamoDBLedger",
    "DynamoDBStore",
    "Table",
    "Write",
    "create_table",
]
