"""The DynamoDB effect ledger's specifics, against moto in server mode (the rules
themselves are the conformance suite's, tests/stores/test_ledger_conformance.py): one
request per rule and never a Scan, the item layout (no TTL attribute), the listing's
order where sort keys tie, the ``ledger`` index added to a table made before it, re-sent
writes recognised, and a record key that meets a ledger item failing loudly.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from decimal import Decimal
from typing import Any

import pytest
from aiobotocore.config import AioConfig
from aiohttp import ClientSession, web
from fixtures_dynamodb import (
    DynamoDBEndpoint,
    boto3_client,
    delete_tables,
    dynamodb_endpoint,  # noqa: F401  (fixture)
    free_port,
)
from hypothesis import given
from hypothesis import strategies as st

from telegram_idem import ConfigurationError, ManualClock, StoreError
from telegram_idem.backends.dynamodb import TTL_ATTRIBUTE, DynamoDBStore
from telegram_idem.backends.dynamodb._ledger import KEY_PREFIX, sort_key
from telegram_idem.ledger import Ledger, LedgerState

pytestmark = pytest.mark.dynamodb

UrlFactory = Callable[[], str]
KEY = "idem:7:a:pay:42:s:charge"


@pytest.fixture
async def store(
    dynamodb_url_factory: UrlFactory, clock: ManualClock
) -> AsyncIterator[DynamoDBStore]:
    """A warm store on a fresh table (client made, table checked: later counts are exact)."""
    s = DynamoDBStore.from_url(dynamodb_url_factory(), clock=clock)
    await s.get("warm-up")
    yield s
    await s.close()


@pytest.fixture
def boto(dynamodb_endpoint: DynamoDBEndpoint) -> Any:  # noqa: F811
    return boto3_client(dynamodb_endpoint.url)


@pytest.fixture
def extra_tables(dynamodb_endpoint: DynamoDBEndpoint) -> Iterator[list[str]]:  # noqa: F811
    names: list[str] = []
    yield names
    delete_tables(dynamodb_endpoint.url, names)


class Sent:
    """The DynamoDB operations a client sent (``before-send``: once per HTTP request)."""

    def __init__(self) -> None:
        self.ops: list[str] = []

    def __call__(self, **kwargs: Any) -> None:
        self.ops.append(str(kwargs["event_name"]).rpartition(".")[2])

    def take(self) -> list[str]:
        out, self.ops = self.ops, []
        return out


async def test_one_request_per_rule_and_the_listing_is_a_query(store: DynamoDBStore) -> None:
    sent = Sent()
    (await store.client()).meta.events.register("before-send.dynamodb", sent)
    ledger = store.ledger()
    assert await ledger.start(KEY, token=1, holder="h:1") is None
    assert sent.take() == ["PutItem"]
    assert await ledger.start(KEY, token=2, holder="h:2") is not None  # answered by ALL_OLD
    assert sent.take() == ["PutItem"]
    assert await ledger.mark_unknown(KEY, token=2, detail="found") is not None
    assert sent.take() == ["UpdateItem"]
    assert [e.key for e in await ledger.entries(states=list(LedgerState))] == [KEY]
    assert sent.take() == ["Query", "Query", "Query"]  # one partition per state, no Scan
    assert await ledger.settle(KEY, token=3, result=b"r", not_applied=False)
    assert sent.take() == ["UpdateItem"]
    assert await ledger.get(KEY) is not None
    assert sent.take() == ["GetItem"]
    assert await ledger.finish(KEY, token=3)
    assert sent.take() == ["DeleteItem"]
    assert store.ledger() is ledger


async def test_items_live_in_the_stores_table_without_a_ttl_attribute(
    store: DynamoDBStore, boto: Any, clock: ManualClock
) -> None:
    await store.ledger().start(KEY, token=1, holder="h:1")
    item = boto.get_item(TableName=store.table, Key={"pk": {"S": KEY_PREFIX + KEY}})["Item"]
    assert TTL_ATTRIBUTE not in item and "exp_at" not in item  # never expires
    assert (item["lkey"]["S"], item["lstate"]["S"], item["lpart"]["S"]) == (
        KEY,
        "started",
        "ledger#started",
    )
    assert item["lsort"]["S"] == sort_key(clock(), KEY)
    # the record of the same key is another item: the ledger never touches it
    assert await store.get(KEY) is None


@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.integers(min_value=-(10**12), max_value=10**12),
                st.floats(min_value=-1e12, max_value=1e12, allow_nan=False),
            ),
            st.text(max_size=6),
        ),
        min_size=2,
        max_size=8,
    )
)
def test_sort_keys_order_as_time_then_key(rows: list[tuple[float, str]]) -> None:
    """String order of ``lsort`` (UTF-8 bytes, as DynamoDB compares) is the order of
    ``(started_at, key)``: ints, fractions, negatives, keys sorting below ``#``."""
    spelled = sorted(rows, key=lambda r: sort_key(r[0], r[1]).encode("utf-8", "surrogatepass"))
    by_value = sorted(rows, key=lambda r: (Decimal(repr(r[0])), r[1]))
    assert [(Decimal(repr(t)), k) for t, k in spelled] == [
        (Decimal(repr(t)), k) for t, k in by_value
    ]


def test_equal_times_spell_one_sort_key() -> None:
    assert sort_key(1700000000, "k") == sort_key(1700000000.0, "k")
    assert sort_key(1.5, "k") < sort_key(1.25 + 0.5, "k")


async def test_rows_whose_sort_keys_tie_are_ordered_by_their_whole_key(
    store: DynamoDBStore,
) -> None:
    """Keys longer than the sort key's head, started at one instant: ``lsort`` ties, the
    listing still orders them by the whole key and cuts at ``limit`` exactly."""
    head = "idem:7:a:" + "x" * 300
    keys = [head + tail for tail in ("c", "a", "d", "b")]
    ledger = store.ledger()
    for n, key in enumerate(keys):
        await ledger.start(key, token=n + 1, holder="h")
    assert [e.key for e in await ledger.entries(limit=2)] == sorted(keys)[:2]
    assert [e.key for e in await ledger.entries(limit=3, prefix=head)] == sorted(keys)[:3]
    assert [e.key for e in await ledger.entries()] == sorted(keys)


async def test_tied_sort_keys_are_cut_at_limit_by_the_whole_key_whatever_the_index_order(
    store: DynamoDBStore, boto: Any
) -> None:
    """DynamoDB does not order items whose index sort keys tie (moto happens to order
    them by ``pk``): two items written with one ``lsort`` and their keys in the opposite
    order of their ``pk``s; ``limit=1`` still answers the smaller key."""
    await store.ledger().start("idem:7:a:tie", token=1, holder="h")
    item = boto.get_item(TableName=store.table, Key={"pk": {"S": KEY_PREFIX + "idem:7:a:tie"}})
    for pk, key in (("idem:7:a:tie:1", "idem:7:a:tie:z"), ("idem:7:a:tie:2", "idem:7:a:tie:a")):
        copy = {**item["Item"], "pk": {"S": KEY_PREFIX + pk}, "lkey": {"S": key}}
        boto.put_item(TableName=store.table, Item=copy)
    listed = await store.ledger().entries(prefix="idem:7:a:tie:", limit=1)
    assert [e.key for e in listed] == ["idem:7:a:tie:a"]


async def test_listing_pages_through_a_rare_prefix(
    store: DynamoDBStore, clock: ManualClock
) -> None:
    ledger = store.ledger()
    for n in range(7):
        await ledger.start(f"idem:7:a:common:{n}", token=1, holder="h")
        clock.advance(1)
    await ledger.start("idem:7:a:rare", token=1, holder="h")
    listed = await ledger.entries(prefix="idem:7:a:rare", limit=1)  # pages of 2: 4 of them
    assert [e.key for e in listed] == ["idem:7:a:rare"]


async def test_a_table_made_before_the_ledger_gets_its_index_from_migrate(
    dynamodb_endpoint: DynamoDBEndpoint,  # noqa: F811
    boto: Any,
    extra_tables: list[str],
    clock: ManualClock,
) -> None:
    name = f"t{time.time_ns():x}old"
    extra_tables.append(name)
    boto.create_table(  # what earlier versions created
        TableName=name,
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    store = DynamoDBStore(name, endpoint_url=dynamodb_endpoint.url, clock=clock)
    try:
        assert (await store.claim("k", lease=30, retention=3600)).token == 1
        await store.ledger().start(KEY, token=1, holder="h")  # items need no index
        with pytest.raises(ConfigurationError, match=r"no 'ledger' index.*migrate"):
            await store.ledger().entries()
        assert await store.migrate() is False  # the table existed; the index is added
        indexes = boto.describe_table(TableName=name)["Table"]["GlobalSecondaryIndexes"]
        assert [i["IndexName"] for i in indexes] == ["ledger"]
        assert [e.key for e in await store.ledger().entries()] == [KEY]
        assert await store.migrate() is False  # idempotent
        assert (await store.get("k")) is not None  # the record survived
    finally:
        await store.close()


async def test_an_index_named_ledger_of_another_shape_is_a_configuration_error(
    dynamodb_endpoint: DynamoDBEndpoint,  # noqa: F811
    boto: Any,
    extra_tables: list[str],
) -> None:
    name = f"t{time.time_ns():x}gsi"
    extra_tables.append(name)
    boto.create_table(
        TableName=name,
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "other", "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "ledger",
                "KeySchema": [{"AttributeName": "other", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    store = DynamoDBStore(name, endpoint_url=dynamodb_endpoint.url)
    try:
        with pytest.raises(ConfigurationError, match="index 'ledger' with key schema"):
            await store.migrate()
    finally:
        await store.close()


async def test_a_record_key_meeting_a_ledger_item_fails_loudly(
    store: DynamoDBStore, boto: Any
) -> None:
    """``ledger#…`` keys are the ledger's: a record there, or a ledger row where a record
    is, is a malformed item (StoreError), never a silent decision."""
    await store.ledger().start(KEY, token=1, holder="h")
    with pytest.raises(StoreError, match="malformed"):
        await store.claim(KEY_PREFIX + KEY, lease=30, retention=3600)
    assert (await store.claim(KEY_PREFIX + "other", lease=30, retention=3600)).token == 1
    with pytest.raises(StoreError, match="malformed ledger item"):
        await store.ledger().start("other", token=1, holder="h")
    with pytest.raises(StoreError, match="malformed ledger item"):
        await store.ledger().mark_unknown("other", token=5, detail="d")
    with pytest.raises(StoreError, match="malformed ledger item"):
        await store.ledger().settle("other", token=5, result=b"r", not_applied=False)
    assert not await store.ledger().finish("other", token=1)  # a record is never deleted
    assert (await store.get(KEY_PREFIX + "other")) is not None


async def test_no_endpoint_is_a_store_error_and_no_table_a_configuration_error(
    dynamodb_endpoint: DynamoDBEndpoint,  # noqa: F811
) -> None:
    one_attempt = AioConfig(retries={"mode": "standard", "total_max_attempts": 1})
    down = DynamoDBStore(
        "idem", endpoint_url=f"http://127.0.0.1:{free_port()}", client_config=one_attempt
    )
    missing = DynamoDBStore("idem-not-created", endpoint_url=dynamodb_endpoint.url)
    calls: list[Callable[[Ledger], Awaitable[object]]] = [
        lambda ledger: ledger.start(KEY, token=1, holder="h"),
        lambda ledger: ledger.mark_unknown(KEY, token=1, detail="d"),
        lambda ledger: ledger.settle(KEY, token=1, result=b"r", not_applied=False),
        lambda ledger: ledger.finish(KEY, token=1),
        lambda ledger: ledger.get(KEY),
        lambda ledger: ledger.entries(),
    ]
    try:
        for call in calls:
            with pytest.raises(StoreError, match=r"ledger\.\w+ failed") as raised:
                await call(down.ledger())
            assert not isinstance(raised.value, ConfigurationError)
            with pytest.raises(ConfigurationError, match="'idem-not-created' does not exist"):
                await call(missing.ledger())
    finally:
        await down.close()
        await missing.close()


# ----------------------------------------------------------------- writes botocore re-sent


@asynccontextmanager
async def losing_proxy(target: str, lose_once: set[str]) -> AsyncIterator[str]:
    """A proxy to ``target`` that answers 500 to the first successful request of each op
    in ``lose_once``, after it reached DynamoDB: botocore re-sends it."""

    async def proxy(request: web.Request) -> web.Response:
        op = request.headers.get("X-Amz-Target", "").rpartition(".")[2]
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
        }
        async with ClientSession() as http:
            async with http.post(target + "/", data=await request.read(), headers=headers) as r:
                body, status = await r.read(), r.status
                content_type = r.headers.get("Content-Type", "application/x-amz-json-1.0")
        if op in lose_once and status == 200:
            lose_once.discard(op)
            error = {"__type": "com.amazonaws.dynamodb.v20120810#InternalServerError"}
            return web.Response(
                status=500, body=json.dumps(error).encode(), content_type=content_type
            )
        return web.Response(status=status, body=body, headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", proxy)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def _with_lost_answers(
    endpoint: str,
    extra_tables: list[str],
    clock: ManualClock,
    lose_once: set[str],
    body: Callable[[DynamoDBStore], Awaitable[None]],
) -> None:
    async with losing_proxy(endpoint, lose_once) as url:
        table = f"t{time.time_ns():x}"
        extra_tables.append(table)
        store = DynamoDBStore(
            table,
            endpoint_url=url,
            clock=clock,
            create_table=True,
            client_config=AioConfig(retries={"mode": "standard", "total_max_attempts": 3}),
        )
        try:
            await store.get("warm-up")
            await body(store)
        finally:
            await store.close()
    assert not lose_once  # every answer meant to be lost was lost


async def test_re_sent_ledger_writes_are_recognised_as_ours(
    dynamodb_endpoint: DynamoDBEndpoint,  # noqa: F811
    extra_tables: list[str],
    clock: ManualClock,
) -> None:
    """start, mark_unknown, settle and finish land, their answers are lost, botocore
    sends them again: each still answers as if the first answer had arrived, and
    mark_unknown counts one attempt, not two."""

    async def body(store: DynamoDBStore) -> None:
        ledger = store.ledger()
        assert await ledger.start(KEY, token=1, holder="h:1") is None  # "run it", not "found"
        row = await ledger.mark_unknown(KEY, token=2, detail="found")
        assert row is not None and (row.state, row.attempts, row.token) == (
            LedgerState.UNKNOWN,
            2,
            2,
        )
        assert await ledger.settle(KEY, token=3, result=b"r", not_applied=False)
        assert await ledger.finish(KEY, token=3)
        assert await ledger.get(KEY) is None

    await _with_lost_answers(
        dynamodb_endpoint.url,
        extra_tables,
        clock,
        {"PutItem", "UpdateItem", "DeleteItem"},
        body,
    )


async def test_a_re_sent_settle_is_ours_and_a_second_settle_still_refused(
    dynamodb_endpoint: DynamoDBEndpoint,  # noqa: F811
    extra_tables: list[str],
    clock: ManualClock,
) -> None:
    async def body(store: DynamoDBStore) -> None:
        ledger = store.ledger()
        await ledger.start(KEY, token=1, holder="h:1")
        assert await ledger.settle(KEY, token=2, result=None, not_applied=True)
        assert not await ledger.settle(KEY, token=3, result=b"r", not_applied=False)
        row = await ledger.get(KEY)
        assert row is not None and (row.token, row.not_applied, row.result) == (2, True, None)

    await _with_lost_answers(dynamodb_endpoint.url, extra_tables, clock, {"UpdateItem"}, body)
