"""The records part of the DynamoDB store: :class:`DynamoDBStore`, over a
:class:`~telegram_idem.backends.dynamodb._connection.DynamoDBConnection`.

A claim is one conditional ``PutItem`` (a takeover two); the holder's writes are one
conditional ``UpdateItem`` each; ``get`` is one consistent ``GetItem``. Every condition
checks the retention end (TTL deletion lags up to 48 h).
"""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Final, TypeVar

from aiobotocore.session import AioSession

from telegram_idem import machine
from telegram_idem._clock import Clock
from telegram_idem._records import Claim, Outcome, Record, Status
from telegram_idem.backends._base import Store
from telegram_idem.backends.dynamodb._browse import DynamoDBBrowsing
from telegram_idem.backends.dynamodb._connection import DynamoDBConnection
from telegram_idem.backends.dynamodb._errors import DRIVER_BASE, DRIVER_ERRORS
from telegram_idem.backends.dynamodb._items import (
    IN_PROGRESS,
    Item,
    expiry_attribute,
    number,
    string,
    to_item,
    to_record,
)
from telegram_idem.backends.dynamodb._ledger import DynamoDBLedger
from telegram_idem.backends.dynamodb._setup import (
    BILLING_MODES,
    check_table_name,
    create_table_on,
)
from telegram_idem.backends.dynamodb._url import SCHEMES, parse_store_url
from telegram_idem.errors import ConfigurationError, IdemError, StoreError

__all__ = ["DynamoDBStore", "create_table"]

T = TypeVar("T")

_HELD: Final = "#token = :t AND #status = :ip AND #exp_at > :now"
"""The holder's condition: its token, still in progress, retention not over."""
_MAX_ROUNDS: Final = 8
_REMEMBERED: Final = 4096
"""Most items of claims still held that a store remembers (:meth:`DynamoDBStore._finish`)."""


class DynamoDBStore(DynamoDBBrowsing, Store):
    """Records as items of one DynamoDB table, written only by conditional writes.
    Lists, counts and deletes records by key prefix (a whole-table ``Scan``) and checks
    the table (:class:`~telegram_idem.backends.dynamodb._browse.DynamoDBBrowsing`).

    Args:
        table: table name (3–255 of ``A-Z a-z 0-9 _ . -``), partition key ``pk`` (S).
        region: AWS region.
        endpoint_url: ``http(s)://host:port`` of DynamoDB Local, moto or a VPC endpoint;
            ``None`` = AWS's regional endpoint. With an endpoint and no AWS credentials
            configured anywhere, dummy credentials (``testing``) are used.
        clock: seconds since the epoch; ``None`` = the host's ``time.time``. DynamoDB has
            no server clock: leases and retention are judged by the writer's clock, so keep
            every host NTP-synced.
        session: an ``aiobotocore`` session (credentials, profile); ``None`` = a new one.
        client_config: a ``botocore``/``aiobotocore`` ``Config`` merged over the defaults
            (2 s connect, 5 s read timeout, 3 attempts in botocore's "standard" retry
            mode, 32 pooled connections).
        create_table: on first use, create the table if absent and enable TTL on ``exp``
            (see :func:`create_table`).
        max_concurrency: most claims :meth:`claim_many` sends at once (> 0).

    Raises:
        ConfigurationError: a bad table name or ``max_concurrency``.

    One aiobotocore client is created on first use and reused (``store.connection``, a
    :class:`~telegram_idem.backends.dynamodb.DynamoDBConnection`); :meth:`close` ends it.
    Use a store from one event loop.
    """

    __module__ = "telegram_idem.backends.dynamodb"  # its public home (and the scheme table's)
    schemes = SCHEMES
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = DRIVER_ERRORS
    driver_base: ClassVar[tuple[type[BaseException], ...]] = DRIVER_BASE

    def __init__(
        self,
        table: str,
        *,
        region: str = "us-east-1",
        endpoint_url: str | None = None,
        clock: Clock | None = None,
        session: AioSession | None = None,
        client_config: Any | None = None,
        create_table: bool = False,
        max_concurrency: int = 16,
    ) -> None:
        check_table_name(table)
        if max_concurrency <= 0:
            raise ConfigurationError(f"max_concurrency must be > 0, got {max_concurrency}")
        self.table = table
        self.region = region
        self.endpoint_url = endpoint_url
        where = f", endpoint_url={endpoint_url!r}" if endpoint_url else ""
        self.connection = DynamoDBConnection(
            table,
            label=f"DynamoDBStore({table!r}, region={region!r}{where})",
            region=region,
            endpoint_url=endpoint_url,
            clock=clock,
            session=session,
            client_config=client_config,
            create_table=create_table,
        )
        """The client, table readiness, clock and error translation of this store."""
        self._max_concurrency = max_concurrency
        self._ledger = DynamoDBLedger(self.connection)
        self._held: dict[tuple[str, int], Item] = {}
        """(key, token) → the item this store's claim wrote, while that claim is held."""

    def __repr__(self) -> str:
        return self.connection.label

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> DynamoDBStore:
        """``dynamodb://<table>?region=…&endpoint_url=…&create_table=1`` (options in the
        package docstring; also ``connect_timeout``, ``read_timeout`` in seconds and
        ``max_attempts``).

        Args:
            url: the store URL.
            clock: seconds since the epoch; ``None`` = the host's ``time.time``.

        Raises:
            ConfigurationError: no or bad table name, a user or password, a path, a
                malformed or unknown option (the message never shows a password).
        """
        table, kwargs = parse_store_url(url)
        return cls(table, clock=clock, **kwargs)

    async def client(self) -> Any:
        """The aiobotocore DynamoDB client, created on first use (for tools and tests).

        Raises:
            StoreError: the store is closed, or credentials could not be resolved.
        """
        return await self.connection.client()

    def _call(self, op: str, fn: Callable[[], Awaitable[T]]) -> Awaitable[T]:
        return self.connection.call(op, fn)

    def _translate(self, op: str, exc: Exception) -> IdemError | None:
        return self.connection.translate(op, exc)

    def ledger(self) -> DynamoDBLedger:
        """The effect ledger as items of this store's table (the same object on every
        call; :class:`~telegram_idem.backends.dynamodb.DynamoDBLedger`)."""
        return self._ledger

    async def migrate(self) -> bool:
        """Create the table if absent, enable TTL on ``exp`` and add the effect ledger's
        index ``ledger`` if the table lacks it (:func:`create_table` with its defaults:
        on-demand billing). Idempotent.

        Returns:
            ``True`` if this call created the table (adding the index to an existing
            table answers ``False``).

        Raises:
            ConfigurationError: bad credentials or permissions, or a table with another
                key schema, another TTL attribute or another ``ledger`` index.
            StoreError: DynamoDB could not answer, or the table did not become ACTIVE.
        """
        return await self.connection.call("migrate", self.connection.ensure_table)

    # ------------------------------------------------------------- claim

    async def _claim(
        self, key: str, fingerprint: str | None, lease: float, retention: float
    ) -> Claim:
        db = await self.connection.ready()
        now = self.connection.now()
        cid = secrets.token_hex(8)
        judged: Item | None = None  # the item the next decision is about
        values: dict[str, Any]
        for _ in range(_MAX_ROUNDS):
            existing = to_record(judged, self.table) if judged is not None else None
            claim, new = machine.decide_claim(
                existing,
                key=key,
                fingerprint=fingerprint,
                now=now,
                lease=lease,
                retention=retention,
            )
            if new is None:
                return claim  # replay, conflict, in progress, failed: decided from ALL_OLD
            if judged is None:
                condition, values = "attribute_not_exists(#pk)", {}
            else:
                condition, values = _takeover_condition(judged, now)
            item = to_item(new, cid)
            answer = await db.put(item, condition, values)
            if answer.written:
                self._remember(key, new.fencing_token, item)
                return Claim(Outcome.ACQUIRED, new)
            current = answer.current
            if (
                current is not None
                and current.get("cid") == string(cid)
                and current.get("token") == number(new.fencing_token)
            ):
                # botocore re-sent our put after it had landed: the refusal is our own record
                self._remember(key, new.fencing_token, current)
                return Claim(Outcome.ACQUIRED, to_record(current, self.table))
            judged = current
        raise StoreError(
            f"{self!r}.claim({key!r}): the record changed under {_MAX_ROUNDS} conditional "
            "writes in a row"
        )

    async def _claim_many(self, keys: Sequence[str], lease: float, retention: float) -> list[Claim]:
        if not keys:
            return []
        await self.connection.ready()
        gate = asyncio.Semaphore(self._max_concurrency)

        async def one(key: str) -> Claim:
            async with gate:
                return await self._claim(key, None, lease, retention)

        tasks = [asyncio.ensure_future(one(k)) for k in keys]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:  # after a failure, stop the claims not yet sent
                task.cancel()

    # ------------------------------------------------------------- holder's writes

    def _remember(self, key: str, token: int, item: Item) -> None:
        """Keep the item a claim of this store wrote, for its holder's last write."""
        held = self._held
        held[(key, token)] = item
        if len(held) > _REMEMBERED:  # claims never finished here: forget the oldest
            del held[next(iter(held))]

    def _held_values(self, token: int, now: float) -> dict[str, Any]:
        return {":t": number(token), ":ip": IN_PROGRESS, ":now": number(now)}

    async def _finish(
        self, key: str, token: int, status: Status, payload: bytes, retention: float
    ) -> bool:
        """Complete or fail: the record's last write by its holder.

        When this store wrote the claim (the item is remembered), a conditional
        ``PutItem`` of the whole item, conditioned on the claim call's ``cid`` too, so
        that it replaces exactly the item that claim wrote (and this store's
        ``extend`` kept up to date); otherwise a conditional ``UpdateItem`` of the four
        attributes. Same decision either way; the put is the cheaper request to process
        (moto parses no ``UpdateExpression``: ``benchmarks/stores.py``).
        """
        db = await self.connection.ready()
        now = self.connection.now()
        exp_at = now + retention
        held = self._held.pop((key, token), None)
        values = {**self._held_values(token, now)}
        if held is not None and "cid" in held and "exp_at" in held:
            item = {
                **held,
                "status": string(status.value),
                "result": {"B": payload},
                "exp_at": number(exp_at),
                "exp": number(math.ceil(exp_at)),
            }
            answer = await db.put(item, f"{_HELD} AND #cid = :cid", {**values, ":cid": held["cid"]})
        else:
            answer = await db.update(
                key,
                "SET #status = :st, #result = :res, #exp_at = :exp_at, #exp = :exp",
                _HELD,
                {
                    **values,
                    ":st": string(status.value),
                    ":res": {"B": payload},
                    ":exp_at": number(exp_at),
                    ":exp": number(math.ceil(exp_at)),
                },
            )
        if answer.written:
            return True
        # botocore re-sent a write that had landed: the record is exactly what we wrote
        current = answer.current
        return (
            answer.retried
            and current is not None
            and current.get("token") == number(token)
            and current.get("status") == string(status.value)
            and current.get("result") == {"B": payload}
        )

    async def _complete(self, key: str, token: int, result: bytes, retention: float) -> bool:
        return await self._finish(key, token, Status.COMPLETED, result, retention)

    async def _fail(self, key: str, token: int, error: bytes, retention: float) -> bool:
        return await self._finish(key, token, Status.FAILED, error, retention)

    async def _release(self, key: str, token: int) -> bool:
        self._held.pop((key, token), None)
        db = await self.connection.ready()
        now = self.connection.now()
        answer = await db.update(
            key, "SET #lease = :now REMOVE #fp", _HELD, self._held_values(token, now)
        )
        return answer.written

    async def _extend(self, key: str, token: int, lease: float) -> bool:
        db = await self.connection.ready()
        now = self.connection.now()
        until = now + lease
        values = {**self._held_values(token, now), ":lease": number(until), ":until": number(until)}
        grow = False  # the usual heartbeat ends before the retention does: exp stays
        for _ in range(_MAX_ROUNDS):
            if grow:
                answer = await db.update(
                    key,
                    "SET #lease = :lease, #exp_at = :until, #exp = :exp",
                    f"{_HELD} AND #exp_at < :until",
                    {**values, ":exp": number(math.ceil(until))},
                )
            else:
                answer = await db.update(
                    key, "SET #lease = :lease", f"{_HELD} AND #exp_at >= :until", values
                )
            if answer.written:
                held = self._held.get((key, token))
                if held is not None:  # the item as it is now, for complete / fail
                    held["lease"] = values[":lease"]
                    if grow:
                        held.update(exp_at=values[":until"], exp=number(math.ceil(until)))
                return True
            current = answer.current
            if current is None:
                self._held.pop((key, token), None)
                return False
            record = to_record(current, self.table)
            if not (
                record.fencing_token == token
                and record.status is Status.IN_PROGRESS
                and record.expires_at > now
            ):
                self._held.pop((key, token), None)
                return False
            grow = record.expires_at < until
        raise StoreError(f"{self!r}.extend({key!r}): the record kept changing")

    async def _get(self, key: str) -> Record | None:
        db = await self.connection.ready()
        item = await db.get(key)
        record = to_record(item, self.table) if item is not None else None
        return record if machine.is_live(record, self.connection.now()) else None

    async def _now(self) -> float:
        return self.connection.now()  # DynamoDB has no server clock: the writer's is all there is

    async def close(self) -> None:
        """Close the client and its connections. Idempotent; later calls raise StoreError."""
        await self.connection.close()


def _takeover_condition(judged: Item, now: float) -> tuple[str, dict[str, Any]]:
    """The condition of a takeover put: the record is still exactly the one judged
    (token, retention end, fingerprint) and still acquirable at ``now``: retention over,
    or in progress with its lease over."""
    exp = "#" + expiry_attribute(judged)
    parts = [
        "#token = :old_token",
        f"{exp} = :old_exp",
        f"({exp} <= :now OR (#status = :ip AND #lease <= :now))",
    ]
    values: dict[str, Any] = {
        ":old_token": judged["token"],
        ":old_exp": judged[exp[1:]],
        ":now": number(now),
        ":ip": IN_PROGRESS,
    }
    if "fp" in judged:
        parts.append("#fp = :old_fp")
        values[":old_fp"] = judged["fp"]
    else:
        parts.append("attribute_not_exists(#fp)")
    return " AND ".join(parts), values


async def create_table(
    client_or_store: DynamoDBStore | Any,
    table: str,
    *,
    billing: str = "PAY_PER_REQUEST",
    read_capacity: int = 5,
    write_capacity: int = 5,
    wait_timeout: float = 300.0,
    poll_interval: float = 1.0,
) -> bool:
    """Create the store's table if absent, wait until ACTIVE, enable TTL on ``exp``, and
    add the effect ledger's global secondary index ``ledger`` if absent (waiting until it
    is ACTIVE).

    Idempotent and safe to run from several processes at once: an existing table (with
    the partition key ``pk`` of type S) is fine, and TTL already enabled on ``exp`` is kept.

    Args:
        client_or_store: a :class:`DynamoDBStore` or an aiobotocore DynamoDB client.
        table: the table name.
        billing: ``"PAY_PER_REQUEST"`` (on-demand) or ``"PROVISIONED"``.
        read_capacity: read capacity units when provisioned.
        write_capacity: write capacity units when provisioned.
        wait_timeout: seconds to wait for the table to become ACTIVE.
        poll_interval: seconds between status checks while waiting.

    Returns:
        ``True`` if this call created the table, ``False`` if it existed.

    Raises:
        ConfigurationError: a bad ``billing`` or table name; an existing table with
            another key schema, with TTL on another attribute, or with an index
            ``ledger`` of other keys.
        StoreError: DynamoDB could not answer, or the table (or its ledger index) did
            not become ACTIVE within ``wait_timeout`` seconds.
    """
    if billing not in BILLING_MODES:
        raise ConfigurationError(f"billing must be PAY_PER_REQUEST or PROVISIONED, got {billing!r}")
    check_table_name(table)
    if isinstance(client_or_store, DynamoDBStore):
        client = await client_or_store.client()
    else:
        client = client_or_store
    return await create_table_on(
        client,
        table,
        billing=billing,
        read_capacity=read_capacity,
        write_capacity=write_capacity,
        wait_timeout=wait_timeout,
        poll_interval=poll_interval,
    )
