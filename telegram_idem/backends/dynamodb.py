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
"""

from __future__ import annotations

import asyncio
import math
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar, Final, TypeVar
from urllib.parse import urlsplit

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    CredentialRetrievalError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from telegram_idem import machine
from telegram_idem.backends.base import Store, describe_error
from telegram_idem.backends.url import reject_unknown, url_options
from telegram_idem.clock import Clock
from telegram_idem.errors import ConfigurationError, IdemError, StoreError
from telegram_idem.records import Claim, Outcome, Record, Status

__all__ = ["THROTTLING_CODES", "TTL_ATTRIBUTE", "DynamoDBStore", "create_table"]

T = TypeVar("T")
Item = dict[str, Any]
"""One DynamoDB item in the low-level wire shape: ``{"pk": {"S": "…"}, …}``."""

TTL_ATTRIBUTE: Final = "exp"
"""The item attribute the table's TTL is enabled on (whole seconds since the epoch)."""

THROTTLING_CODES: Final = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ServiceUnavailable",
    }
)
"""Service error codes that mean "try later": raised as :class:`StoreError` (after
botocore's own retries), like every other service error except those in
:data:`CONFIGURATION_CODES` and a missing table."""

CONFIGURATION_CODES: Final = frozenset(
    {
        "UnrecognizedClientException",  # unknown access key id
        "InvalidSignatureException",  # wrong secret key
        "IncompleteSignatureException",
        "MissingAuthenticationTokenException",
        "InvalidClientTokenId",
        "ExpiredTokenException",  # session credentials expired: refresh them
        "AccessDeniedException",  # the IAM policy lacks dynamodb:<action> on the table
        "ValidationException",  # a request DynamoDB can never accept (e.g. a key > 2 KB)
    }
)
"""Service error codes no retry can fix: raised as :class:`ConfigurationError`."""

_CCF: Final = "ConditionalCheckFailedException"
_IN_PROGRESS: Final = {"S": Status.IN_PROGRESS.value}
_HELD: Final = "#token = :t AND #status = :ip AND #exp_at > :now"
"""The holder's condition: its token, still in progress, retention not over."""
_MAX_ROUNDS: Final = 8
_TABLE_NAME = re.compile(r"[A-Za-z0-9_.-]{3,255}")
_DUMMY_KEY: Final = "testing"
_DEFAULT_CONFIG: Final[dict[str, Any]] = {
    "connect_timeout": 2.0,
    "read_timeout": 5.0,
    "retries": {"mode": "standard", "total_max_attempts": 3},
    "max_pool_connections": 32,
}


# ----------------------------------------------------------------- wire helpers


def _n(value: float) -> dict[str, str]:
    """A DynamoDB number from seconds or a count: exact, never in exponent notation."""
    if not math.isfinite(value):
        raise ConfigurationError(f"a DynamoDB number must be finite, got {value!r}")
    if isinstance(value, int):
        return {"N": str(value)}
    return {"N": format(Decimal(repr(float(value))), "f")}


def _s(value: str) -> dict[str, str]:
    return {"S": value}


def _names(*expressions: str) -> dict[str, str]:
    """``ExpressionAttributeNames`` for the ``#name`` placeholders used (all and only those:
    DynamoDB rejects unused names). Every placeholder is the attribute's own name."""
    return {m: m[1:] for m in sorted(set(re.findall(r"#\w+", " ".join(expressions))))}


def _to_item(record: Record, cid: str) -> Item:
    item: Item = {
        "pk": _s(record.key),
        "status": _s(record.status.value),
        "token": _n(record.fencing_token),
        "lease": _n(record.lease_expires_at),
        "exp_at": _n(record.expires_at),
        TTL_ATTRIBUTE: _n(math.ceil(record.expires_at)),
        "attempts": _n(record.attempts),
        "cid": _s(cid),
    }
    if record.fingerprint is not None:
        item["fp"] = _s(record.fingerprint)
    if record.result is not None:
        item["result"] = {"B": record.result}
    return item


def _expiry_attribute(item: Item) -> str:
    """The attribute holding the retention end: ``exp_at``, or ``exp`` for an item written
    by something else that lacks it."""
    return "exp_at" if "exp_at" in item else TTL_ATTRIBUTE


def _to_record(item: Item, table: str) -> Record:
    try:
        return Record(
            key=item["pk"]["S"],
            status=Status(item["status"]["S"]),
            fencing_token=int(item["token"]["N"]),
            lease_expires_at=float(item["lease"]["N"]),
            expires_at=float(item[_expiry_attribute(item)]["N"]),
            fingerprint=item["fp"]["S"] if "fp" in item else None,
            result=bytes(item["result"]["B"]) if "result" in item else None,
            attempts=int(item["attempts"]["N"]) if "attempts" in item else 1,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(
            f"malformed item in DynamoDB table {table!r} (attributes {sorted(item)}): {exc!r}",
            original=exc,
        ) from exc


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _translate(exc: BaseException, where: str, table: str) -> IdemError:
    """The library error for a driver error: ``ConfigurationError`` for a missing table,
    bad or missing credentials, missing permissions or an invalid request (naming the
    table), ``StoreError`` (original attached) for everything else."""
    code = _error_code(exc)
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return ConfigurationError(
            f"{where}: no AWS credentials for DynamoDB table {table!r} ({describe_error(exc)}): "
            "configure them (environment, profile, role) or pass an aiobotocore session"
        )
    if code in CONFIGURATION_CODES:
        return ConfigurationError(
            f"{where}: DynamoDB refused the request on table {table!r}: {code}: "
            f"{_message(exc)} (check the AWS credentials, region and IAM permissions)"
        )
    if code == "ResourceNotFoundException":
        return ConfigurationError(
            f"{where}: DynamoDB table {table!r} does not exist (or is not ACTIVE yet). "
            "Create it once with `telegram-idem migrate <store URL>` (or `await "
            "store.migrate()`), or add `create_table=1` to the store URL."
        )
    kind = " (throttled: try later)" if code in THROTTLING_CODES else ""
    detail = f"{code}{kind}: {_message(exc)}" if code else describe_error(exc)
    return StoreError(f"{where} failed: {detail}", original=exc)


def _message(exc: BaseException) -> str:
    """The service's own message of a ``ClientError`` (or the exception's text)."""
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Message", "") or exc)


# ----------------------------------------------------------------- typed face of the client


@dataclass(frozen=True, slots=True)
class _Write:
    """The answer to one conditional write."""

    written: bool
    current: Item | None = None
    """When refused: the item that refused it (``ALL_OLD``), ``None`` if there is none."""
    retried: bool = False
    """botocore re-sent the request: a refusal may be our own earlier attempt landing."""


class _Table:
    """The few DynamoDB calls the store makes, typed (the aiobotocore client is ``Any``)."""

    def __init__(self, client: Any, table: str) -> None:
        self.client = client
        self.table = table

    async def _conditional(self, method: str, condition: str, **kwargs: Any) -> _Write:
        values: Mapping[str, Any] = kwargs.pop("values")
        expressions = f"{condition} {kwargs.get('UpdateExpression', '')}"
        names = _names(expressions)
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
            if _error_code(exc) != _CCF:
                raise
            response: dict[str, Any] = exc.response
            retried = int(response.get("ResponseMetadata", {}).get("RetryAttempts", 0)) > 0
            return _Write(False, response.get("Item") or None, retried)
        return _Write(True)

    async def put(self, item: Item, condition: str, values: Mapping[str, Any]) -> _Write:
        """``PutItem`` if ``condition`` holds."""
        return await self._conditional("put_item", condition, Item=item, values=values)

    async def update(
        self, key: str, update: str, condition: str, values: Mapping[str, Any]
    ) -> _Write:
        """``UpdateItem`` of ``key`` if ``condition`` holds (never creates the item: every
        condition used requires the token)."""
        return await self._conditional(
            "update_item", condition, Key={"pk": _s(key)}, UpdateExpression=update, values=values
        )

    async def get(self, key: str) -> Item | None:
        """Strongly consistent ``GetItem``."""
        response = await self.client.get_item(
            TableName=self.table, Key={"pk": _s(key)}, ConsistentRead=True
        )
        item: Item | None = response.get("Item")
        return item


_loader: Any = None


def _new_session() -> AioSession:
    """A new aiobotocore session sharing one botocore data loader (the parsed service
    models: parsing them again costs ~0.2 s of CPU per client)."""
    global _loader
    session = get_session()
    if _loader is None:
        _loader = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _loader)
    return session


# ----------------------------------------------------------------- the store


class DynamoDBStore(Store):
    """Records as items of one DynamoDB table, written only by conditional writes.

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

    One aiobotocore client is created on first use and reused; :meth:`close` ends it.
    Use a store from one event loop.
    """

    schemes = ("dynamodb",)
    driver_errors: ClassVar[tuple[type[BaseException], ...]] = (
        EndpointConnectionError,
        ConnectTimeoutError,
        ReadTimeoutError,
        ConnectionClosedError,
        BotoConnectionError,
        HTTPClientError,
        NoCredentialsError,
        CredentialRetrievalError,
        ClientError,
        aiohttp.ClientError,
        OSError,
        TimeoutError,
    )
    driver_base: ClassVar[tuple[type[BaseException], ...]] = (
        BotoCoreError,
        ClientError,
        aiohttp.ClientError,
    )

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
        _check_table_name(table)
        if max_concurrency <= 0:
            raise ConfigurationError(f"max_concurrency must be > 0, got {max_concurrency}")
        self.table = table
        self.region = region
        self.endpoint_url = endpoint_url
        self._clock: Clock = clock if clock is not None else time.time
        self._session = session
        self._config = AioConfig(**_DEFAULT_CONFIG)
        if client_config is not None:
            self._config = self._config.merge(client_config)
        self._create_table = create_table
        self._table_ready = not create_table
        self._max_concurrency = max_concurrency
        self._stack = AsyncExitStack()
        self._db: _Table | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        where = f", endpoint_url={self.endpoint_url!r}" if self.endpoint_url else ""
        return f"DynamoDBStore({self.table!r}, region={self.region!r}{where})"

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> DynamoDBStore:
        """``dynamodb://<table>?region=…&endpoint_url=…&create_table=1`` (options in the
        module docstring; also ``connect_timeout``, ``read_timeout`` in seconds and
        ``max_attempts``).

        Args:
            url: the store URL.
            clock: seconds since the epoch; ``None`` = the host's ``time.time``.

        Raises:
            ConfigurationError: no or bad table name, a path, a malformed or unknown option.
        """
        parts = urlsplit(url)
        if parts.scheme.lower() != "dynamodb" or parts.path not in ("", "/") or parts.fragment:
            raise ConfigurationError(f"a DynamoDB store URL is dynamodb://<table>?…, got {url!r}")
        options = url_options(url)
        region = options.pop("region", "us-east-1")
        if not re.fullmatch(r"[a-z0-9-]+", region):
            raise ConfigurationError(f"region must look like us-east-1 in {url!r}")
        endpoint = options.pop("endpoint_url", None)
        if endpoint is not None:
            ep = urlsplit(endpoint)
            if ep.scheme not in ("http", "https") or not ep.netloc:
                raise ConfigurationError(f"endpoint_url must be http(s)://host[:port] in {url!r}")
        create = _flag(url, "create_table", options.pop("create_table", "0"))
        config: dict[str, Any] = {}
        for name in ("connect_timeout", "read_timeout"):
            if name in options:
                config[name] = _positive(url, name, options.pop(name))
        if "max_attempts" in options:
            raw = options.pop("max_attempts")
            if not raw.isdigit() or int(raw) < 1:
                raise ConfigurationError(f"max_attempts must be an integer ≥ 1 in {url!r}")
            config["retries"] = {"mode": "standard", "total_max_attempts": int(raw)}
        reject_unknown(url, options)
        try:
            _check_table_name(parts.netloc)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{exc} in {url!r}") from None
        return cls(
            parts.netloc,
            region=region,
            endpoint_url=endpoint,
            clock=clock,
            client_config=AioConfig(**config) if config else None,
            create_table=create,
        )

    # ------------------------------------------------------------- client and errors

    async def client(self) -> Any:
        """The aiobotocore DynamoDB client, created on first use (for tools and tests).

        Raises:
            StoreError: the store is closed, or credentials could not be resolved.
        """
        if self._closed:
            raise StoreError(f"{self!r} is closed")
        if self._db is None:
            async with self._lock:
                if self._closed:
                    raise StoreError(f"{self!r} is closed")
                if self._db is None:
                    try:
                        self._db = _Table(await self._open(), self.table)
                    except self.driver_errors as exc:
                        raise _translate(exc, f"{self!r}.client", self.table) from exc
        return self._db.client

    async def _open(self) -> Any:
        session = self._session if self._session is not None else _new_session()
        kwargs: dict[str, Any] = {}
        if self.endpoint_url is not None and await session.get_credentials() is None:
            kwargs = {"aws_access_key_id": _DUMMY_KEY, "aws_secret_access_key": _DUMMY_KEY}
        return await self._stack.enter_async_context(
            session.create_client(
                "dynamodb",
                region_name=self.region,
                endpoint_url=self.endpoint_url,
                config=self._config,
                **kwargs,
            )
        )

    async def _ready(self) -> _Table:
        await self.client()
        if not self._table_ready:
            async with self._lock:
                if not self._table_ready:
                    await create_table(self, self.table)
                    self._table_ready = True
        if self._db is None:  # closed meanwhile
            raise StoreError(f"{self!r} is closed")
        return self._db

    async def _call(self, op: str, fn: Callable[[], Awaitable[T]]) -> T:
        async def once_more() -> T:
            try:
                return await fn()
            except ClientError as exc:
                if not (self._create_table and _error_code(exc) == "ResourceNotFoundException"):
                    raise
                # the table vanished (an emulator restarted, a table deleted): with
                # create_table=1 make it again and retry once; nothing was written
                self._table_ready = False
                return await fn()

        return await super()._call(op, once_more)

    def _translate(self, op: str, exc: Exception) -> IdemError | None:
        if isinstance(exc, self.driver_errors + self.driver_base):
            return _translate(exc, f"{self!r}.{op}", self.table)
        return None

    async def migrate(self) -> bool:
        """Create the table if absent and enable TTL on ``exp`` (:func:`create_table`
        with its defaults: on-demand billing). Idempotent.

        Returns:
            ``True`` if this call created the table.

        Raises:
            ConfigurationError: bad credentials or permissions, or a table with another
                key schema or another TTL attribute.
            StoreError: DynamoDB could not answer, or the table did not become ACTIVE.
        """
        created = await self._call("migrate", lambda: create_table(self, self.table))
        self._table_ready = True
        return created

    # ------------------------------------------------------------- claim

    async def _claim(
        self, key: str, fingerprint: str | None, lease: float, retention: float
    ) -> Claim:
        db = await self._ready()
        now = self._clock()
        cid = secrets.token_hex(8)
        judged: Item | None = None  # the item the next decision is about
        values: dict[str, Any]
        for _ in range(_MAX_ROUNDS):
            existing = _to_record(judged, self.table) if judged is not None else None
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
            answer = await db.put(_to_item(new, cid), condition, values)
            if answer.written:
                return Claim(Outcome.ACQUIRED, new)
            current = answer.current
            if (
                current is not None
                and current.get("cid") == _s(cid)
                and current.get("token") == _n(new.fencing_token)
            ):
                # botocore re-sent our put after it had landed: the refusal is our own record
                return Claim(Outcome.ACQUIRED, _to_record(current, self.table))
            judged = current
        raise StoreError(
            f"{self!r}.claim({key!r}): the record changed under {_MAX_ROUNDS} conditional "
            "writes in a row"
        )

    async def _claim_many(self, keys: Sequence[str], lease: float, retention: float) -> list[Claim]:
        if not keys:
            return []
        await self._ready()
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

    def _held_values(self, token: int, now: float) -> dict[str, Any]:
        return {":t": _n(token), ":ip": _IN_PROGRESS, ":now": _n(now)}

    async def _finish(
        self, key: str, token: int, status: Status, payload: bytes, retention: float
    ) -> bool:
        db = await self._ready()
        now = self._clock()
        exp_at = now + retention
        answer = await db.update(
            key,
            "SET #status = :st, #result = :res, #exp_at = :exp_at, #exp = :exp",
            _HELD,
            {
                **self._held_values(token, now),
                ":st": _s(status.value),
                ":res": {"B": payload},
                ":exp_at": _n(exp_at),
                ":exp": _n(math.ceil(exp_at)),
            },
        )
        if answer.written:
            return True
        # botocore re-sent a write that had landed: the record is exactly what we wrote
        current = answer.current
        return (
            answer.retried
            and current is not None
            and current.get("token") == _n(token)
            and current.get("status") == _s(status.value)
            and current.get("result") == {"B": payload}
        )

    async def _complete(self, key: str, token: int, result: bytes, retention: float) -> bool:
        return await self._finish(key, token, Status.COMPLETED, result, retention)

    async def _fail(self, key: str, token: int, error: bytes, retention: float) -> bool:
        return await self._finish(key, token, Status.FAILED, error, retention)

    async def _release(self, key: str, token: int) -> bool:
        db = await self._ready()
        now = self._clock()
        answer = await db.update(
            key, "SET #lease = :now REMOVE #fp", _HELD, self._held_values(token, now)
        )
        return answer.written

    async def _extend(self, key: str, token: int, lease: float) -> bool:
        db = await self._ready()
        now = self._clock()
        until = now + lease
        values = {**self._held_values(token, now), ":lease": _n(until), ":until": _n(until)}
        grow = False  # the usual heartbeat ends before the retention does: exp stays
        for _ in range(_MAX_ROUNDS):
            if grow:
                answer = await db.update(
                    key,
                    "SET #lease = :lease, #exp_at = :until, #exp = :exp",
                    f"{_HELD} AND #exp_at < :until",
                    {**values, ":exp": _n(math.ceil(until))},
                )
            else:
                answer = await db.update(
                    key, "SET #lease = :lease", f"{_HELD} AND #exp_at >= :until", values
                )
            if answer.written:
                return True
            current = answer.current
            if current is None:
                return False
            record = _to_record(current, self.table)
            if not (
                record.fencing_token == token
                and record.status is Status.IN_PROGRESS
                and record.expires_at > now
            ):
                return False
            grow = record.expires_at < until
        raise StoreError(f"{self!r}.extend({key!r}): the record kept changing")

    async def _get(self, key: str) -> Record | None:
        db = await self._ready()
        item = await db.get(key)
        record = _to_record(item, self.table) if item is not None else None
        return record if machine.is_live(record, self._clock()) else None

    async def _now(self) -> float:
        return self._clock()  # DynamoDB has no server clock: the writer's is all there is

    async def close(self) -> None:
        """Close the client and its connections. Idempotent; later calls raise StoreError."""
        self._closed = True
        self._db = None
        stack, self._stack = self._stack, AsyncExitStack()
        await stack.aclose()


def _takeover_condition(judged: Item, now: float) -> tuple[str, dict[str, Any]]:
    """The condition of a takeover put: the record is still exactly the one judged
    (token, retention end, fingerprint) and still acquirable at ``now``: retention over,
    or in progress with its lease over."""
    exp = "#" + _expiry_attribute(judged)
    parts = [
        "#token = :old_token",
        f"{exp} = :old_exp",
        f"({exp} <= :now OR (#status = :ip AND #lease <= :now))",
    ]
    values: dict[str, Any] = {
        ":old_token": judged["token"],
        ":old_exp": judged[exp[1:]],
        ":now": _n(now),
        ":ip": _IN_PROGRESS,
    }
    if "fp" in judged:
        parts.append("#fp = :old_fp")
        values[":old_fp"] = judged["fp"]
    else:
        parts.append("attribute_not_exists(#fp)")
    return " AND ".join(parts), values


# ----------------------------------------------------------------- table setup


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
    """Create the store's table if absent, wait until ACTIVE, enable TTL on ``exp``.

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
            another key schema, or with TTL on another attribute.
        StoreError: DynamoDB could not answer, or the table did not become ACTIVE
            within ``wait_timeout`` seconds.
    """
    if billing not in ("PAY_PER_REQUEST", "PROVISIONED"):
        raise ConfigurationError(f"billing must be PAY_PER_REQUEST or PROVISIONED, got {billing!r}")
    _check_table_name(table)
    where = f"create_table({table!r})"
    try:
        if isinstance(client_or_store, DynamoDBStore):
            client = await client_or_store.client()
        else:
            client = client_or_store
        created = await _create(client, table, billing, read_capacity, write_capacity)
        await _wait_active(client, table, wait_timeout, poll_interval)
        await _enable_ttl(client, table)
    except DynamoDBStore.driver_errors as exc:
        raise _translate(exc, where, table) from exc
    return created


async def _create(client: Any, table: str, billing: str, rcu: int, wcu: int) -> bool:
    try:
        described = await client.describe_table(TableName=table)
    except ClientError as exc:
        if _error_code(exc) != "ResourceNotFoundException":
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
        kwargs["ProvisionedThroughput"] = {"ReadCapacityUnits": rcu, "WriteCapacityUnits": wcu}
    try:
        await client.create_table(
            TableName=table,
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            **kwargs,
        )
    except ClientError as exc:
        if _error_code(exc) != "ResourceInUseException":  # created meanwhile by another
            raise
        return False
    return True


async def _wait_active(client: Any, table: str, within: float, interval: float) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            described = await client.describe_table(TableName=table)
            status = described["Table"].get("TableStatus")
        except ClientError as exc:  # eventually consistent right after CreateTable
            if _error_code(exc) != "ResourceNotFoundException":
                raise
            status = None
        if status == "ACTIVE":
            return
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
            if _error_code(exc) != "ValidationException" or attempt:
                raise


# ----------------------------------------------------------------- option parsing


def _check_table_name(table: str) -> None:
    if not _TABLE_NAME.fullmatch(table):
        raise ConfigurationError(
            f"a DynamoDB table name is 3–255 of A-Z a-z 0-9 _ . -, got {table!r}"
        )


def _flag(url: str, name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ConfigurationError(f"{name} must be 0 or 1 in {url!r}")


def _positive(url: str, name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigurationError(f"{name} must be seconds > 0 in {url!r}")
    return value
