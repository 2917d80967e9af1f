"""DynamoDB store specifics, against moto in server mode (a real HTTP endpoint on loopback).

The state machine itself is checked by the conformance suite
(tests/stores/test_conformance.py); here: round trips counted from the client (aiobotocore
``before-send`` hooks) and, when the session's own moto server is used, from the server;
the expiry check inside the conditions (an expired item that TTL has not deleted yet);
races between the two round trips of a takeover; writes whose response was lost and that
botocore re-sent; create_table and TTL; outages and throttling as ``StoreError``; URLs.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import pytest
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from aiohttp import ClientSession, web
from botocore.exceptions import ClientError, EndpointConnectionError
from fixtures_dynamodb import (
    REGION,
    DynamoDBEndpoint,
    boto3_client,
    delete_tables,
    dynamodb_endpoint,  # noqa: F401  (fixture)
    dynamodb_url,
    free_port,
    table_of,
)

from telegram_idem import ConfigurationError, ManualClock, Outcome, Status, Store, StoreError
from telegram_idem.backends import store_from_url
from telegram_idem.backends.dynamodb import (
    THROTTLING_CODES,
    TTL_ATTRIBUTE,
    DynamoDBStore,
    create_table,
)
from telegram_idem.backends.dynamodb._items import expression_names

pytestmark = pytest.mark.dynamodb

LEASE = 30.0
RETENTION = 3600.0
ONE_ATTEMPT = AioConfig(retries={"mode": "standard", "total_max_attempts": 1}, connect_timeout=2)

UrlFactory = Callable[[], str]


class Sent:
    """The DynamoDB operations a client sent, one entry per HTTP request (retries too)."""

    def __init__(self) -> None:
        self.ops: list[str] = []

    def __call__(self, **kwargs: Any) -> None:
        self.ops.append(str(kwargs["event_name"]).rpartition(".")[2])

    def take(self) -> list[str]:
        out, self.ops = self.ops, []
        return out


async def count_requests(store: DynamoDBStore) -> Sent:
    """Hook a request counter on the store's client (``before-send``: once per HTTP send)."""
    sent = Sent()
    (await store.client()).meta.events.register("before-send.dynamodb", sent)
    return sent


async def claim(store: Store, key: str = "k", fp: str | None = None, **kw: float) -> Any:
    return await store.claim(
        key, fingerprint=fp, lease=kw.get("lease", LEASE), retention=kw.get("retention", RETENTION)
    )


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
    """A synchronous boto3 client on the same endpoint, to write and inspect items."""
    return boto3_client(dynamodb_endpoint.url)


@pytest.fixture
def extra_tables(dynamodb_endpoint: DynamoDBEndpoint) -> Iterator[list[str]]:  # noqa: F811
    """Names of tables a test makes itself; deleted at teardown."""
    names: list[str] = []
    yield names
    delete_tables(dynamodb_endpoint.url, names)


# ----------------------------------------------------------------- round trips


async def test_round_trips_per_primitive(
    store: DynamoDBStore,
    clock: ManualClock,
    dynamodb_endpoint: DynamoDBEndpoint,  # noqa: F811
) -> None:
    server = dynamodb_endpoint.server
    received_before = Counter(server.requests) if server else Counter()
    sent = await count_requests(store)
    total: Counter[str] = Counter()

    def trips() -> list[str]:
        ops = sent.take()
        total.update(ops)
        return ops

    first = await claim(store, fp="a")
    assert first.outcome is Outcome.ACQUIRED
    assert trips() == ["PutItem"]  # a first claim: one conditional put
    assert (await claim(store, fp="a")).outcome is Outcome.IN_PROGRESS
    assert trips() == ["PutItem"]  # a duplicate: the refused put's ALL_OLD decides
    assert (await claim(store, fp="b")).outcome is Outcome.CONFLICT
    assert trips() == ["PutItem"]
    assert await store.extend("k", first.token, lease=LEASE)
    assert trips() == ["UpdateItem"]
    assert await store.complete("k", first.token, b'"done"', retention=RETENTION)
    assert trips() == ["PutItem"]  # the claim's own item, replaced whole (conditioned)
    replay = await claim(store, fp="a")
    assert (replay.outcome, replay.record.result) == (Outcome.REPLAY, b'"done"')
    assert trips() == ["PutItem"]  # duplicate detection with the stored result: one
    assert (await store.get("k")) is not None
    assert trips() == ["GetItem"]

    held = await claim(store, "r")
    assert await store.release("r", held.token)
    assert trips() == ["PutItem", "UpdateItem"]
    after_release = await claim(store, "r")
    assert (after_release.outcome, after_release.token) == (Outcome.ACQUIRED, held.token + 1)
    assert trips() == ["PutItem", "PutItem"]  # a takeover: refused put, conditional put
    clock.advance(LEASE + 1)
    taken = await claim(store, "r")
    assert (taken.outcome, taken.token, taken.record.attempts) == (
        Outcome.ACQUIRED,
        held.token + 2,
        3,
    )
    assert trips() == ["PutItem", "PutItem"]

    short = await claim(store, "s", lease=10.0, retention=20.0)
    clock.advance(15)
    assert await store.extend("s", short.token, lease=10.0)  # past the retention end
    assert trips() == ["PutItem", "UpdateItem", "UpdateItem"]
    record = await store.get("s")
    assert record is not None and record.expires_at == pytest.approx(clock.now + 10.0)
    trips()

    claims = await store.claim_many(["m1", "m2", "m3"], lease=LEASE, retention=RETENTION)
    assert [c.outcome for c in claims] == [Outcome.ACQUIRED] * 3
    assert trips() == ["PutItem"] * 3

    if server is not None:  # what the server received is what the client sent
        received = Counter(server.requests)
        received.subtract(received_before)
        assert +received == total


async def test_the_holders_last_write_replaces_the_claims_item_or_updates_it(
    store: DynamoDBStore, clock: ManualClock, boto: Any
) -> None:
    sent = await count_requests(store)
    first = await claim(store, "k", fp="a")
    clock.advance(LEASE - 1)
    assert await store.extend("k", first.token, lease=RETENTION)  # grows the retention end
    sent.take()
    clock.advance(1)
    assert await store.complete("k", first.token, b'"done"', retention=10.0)
    assert sent.take() == ["PutItem"]
    item = boto.get_item(TableName=store.table, Key={"pk": {"S": "k"}}, ConsistentRead=True)
    item = item["Item"]
    assert item["status"] == {"S": "completed"} and item["result"]["B"] == b'"done"'
    assert item["fp"] == {"S": "a"} and item["attempts"] == {"N": "1"}
    assert float(item["exp_at"]["N"]) == pytest.approx(clock.now + 10.0)
    assert float(item["lease"]["N"]) == pytest.approx(clock.now - 1 + RETENTION)

    # a holder whose claim another store object wrote: the four attributes are updated
    other = DynamoDBStore(
        store.table, region=store.region, endpoint_url=store.endpoint_url, clock=clock
    )
    try:
        held = await claim(store, "u")
        assert await other.complete("u", held.token, b'"other"', retention=RETENTION)
        record = await store.get("u")
        assert record is not None and record.result == b'"other"'
        # the item was removed and claimed afresh by someone else with the same token:
        # the claim call's id tells the items apart, so the stale holder writes nothing
        stale = await claim(store, "v")
        boto.delete_item(TableName=store.table, Key={"pk": {"S": "v"}})
        fresh = await claim(other, "v")
        assert (fresh.outcome, fresh.token) == (Outcome.ACQUIRED, stale.token)
        sent.take()
        assert not await store.complete("v", stale.token, b'"stale"', retention=RETENTION)
        assert sent.take() == ["PutItem"]
        assert await other.complete("v", fresh.token, b'"fresh"', retention=RETENTION)
        record = await store.get("v")
        assert record is not None and record.result == b'"fresh"'
    finally:
        await other.close()


# ----------------------------------------------------------------- expiry inside conditions


def _expired_item(key: str, now: float, shape: str) -> dict[str, Any]:
    item: dict[str, Any] = {
        "pk": {"S": key},
        "status": {"S": "completed"},
        "token": {"N": "7"},
        "lease": {"N": str(now - 100)},
        "exp_at": {"N": str(now - 10)},
        TTL_ATTRIBUTE: {"N": str(int(now) - 10)},
        "fp": {"S": "old"},
        "result": {"B": b'"old"'},
        "attempts": {"N": "3"},
        "cid": {"S": "someone"},
    }
    if shape == "in_progress_lease_alive":  # retention over beats a live lease
        item["status"] = {"S": "in_progress"}
        item["lease"] = {"N": str(now + 600)}
        del item["result"]
    elif shape == "foreign":  # written by something else: TTL attribute only
        for name in ("exp_at", "attempts", "cid"):
            del item[name]
    return item


@pytest.mark.parametrize("shape", ["completed", "in_progress_lease_alive", "foreign"])
async def test_claim_acquires_an_expired_item_that_ttl_has_not_deleted(
    dynamodb_url_factory: UrlFactory, boto: Any, shape: str
) -> None:
    url = dynamodb_url_factory()
    store = DynamoDBStore.from_url(url)  # the host's clock, as in production
    try:
        await store.get("warm-up")
        now = time.time()
        boto.put_item(TableName=table_of(url), Item=_expired_item("k", now, shape))
        assert await store.get("k") is None  # past retention: gone for readers
        sent = await count_requests(store)
        got = await store.claim("k", fingerprint="new", lease=LEASE, retention=RETENTION)
        assert sent.take() == ["PutItem", "PutItem"]
        assert got.outcome is Outcome.ACQUIRED
        assert got.token == 8  # old + 1: a zombie of the old record can never match
        assert (got.record.status, got.record.fingerprint, got.record.result) == (
            Status.IN_PROGRESS,
            "new",
            None,
        )
        assert got.record.attempts == 1
        item = boto.get_item(TableName=table_of(url), Key={"pk": {"S": "k"}}, ConsistentRead=True)[
            "Item"
        ]
        assert item["token"] == {"N": "8"} and "result" not in item
        ttl = int(item[TTL_ATTRIBUTE]["N"])
        assert ttl == pytest.approx(now + RETENTION, abs=5)
        assert ttl >= float(item["exp_at"]["N"])  # TTL never deletes a live record early
        assert not await store.complete("k", 7, b'"zombie"', retention=RETENTION)
        assert await store.complete("k", 8, b'"fresh"', retention=RETENTION)
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("between", "outcome", "token"),
    [
        ("heir claims", Outcome.IN_PROGRESS, 2),
        ("holder completes late", Outcome.REPLAY, 1),
        ("holder extends late", Outcome.IN_PROGRESS, 1),
    ],
)
async def test_a_write_landing_between_the_two_round_trips_of_a_takeover_wins(
    store: DynamoDBStore,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    between: str,
    outcome: Outcome,
    token: int,
) -> None:
    other = DynamoDBStore(
        store.table, region=store.region, endpoint_url=store.endpoint_url, clock=clock
    )
    try:
        first = await claim(store)
        clock.advance(LEASE + 1)  # the lease is over: the next claim takes over in two trips
        db = await store.connection.ready()
        put = db.put
        calls = 0

        async def racing_put(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 2:  # after the refused put, before the conditional takeover
                if between == "heir claims":
                    assert (await claim(other)).outcome is Outcome.ACQUIRED
                elif between == "holder completes late":
                    assert await other.complete("k", first.token, b"1", retention=RETENTION)
                else:
                    assert await other.extend("k", first.token, lease=LEASE)
            return await put(*args)

        monkeypatch.setattr(db, "put", racing_put)
        got = await claim(store)
        assert (got.outcome, got.token) == (outcome, token)
        assert calls == 2  # the refused takeover's ALL_OLD was the new record: decided
    finally:
        await other.close()


# ----------------------------------------------------------------- writes botocore re-sent


@asynccontextmanager
async def serve(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[str]:
    """A tiny HTTP server on a free loopback port; yields its URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def _error(code: str, status: int) -> web.Response:
    body = {"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": f"test: {code}"}
    return web.Response(
        status=status, body=json.dumps(body).encode(), content_type="application/x-amz-json-1.0"
    )


async def test_a_write_whose_answer_was_lost_and_was_resent_is_still_ours(
    dynamodb_endpoint: DynamoDBEndpoint,  # noqa: F811
    extra_tables: list[str],
    clock: ManualClock,
) -> None:
    """A proxy forwards the claim's PutItem, the complete's PutItem and one complete's
    UpdateItem to moto, then answers 500 instead of moto's 200: botocore re-sends, and
    the condition refuses the copy."""
    lose = {"PutItem": 2, "UpdateItem": 1}  # the claim's and complete's puts, one update
    seen: list[str] = []

    async def proxy(request: web.Request) -> web.Response:
        op = request.headers.get("X-Amz-Target", "").rpartition(".")[2]
        seen.append(op)
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
        }
        async with ClientSession() as http:
            async with http.post(
                dynamodb_endpoint.url + "/", data=await request.read(), headers=headers
            ) as r:
                body, status = await r.read(), r.status
                content_type = r.headers.get("Content-Type", "application/x-amz-json-1.0")
        if lose.get(op) and status == 200:
            lose[op] -= 1
            return _error("InternalServerError", 500)
        return web.Response(status=status, body=body, headers={"Content-Type": content_type})

    async with serve(proxy) as url:
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
            seen.clear()
            got = await claim(store)
            assert (got.outcome, got.token) == (Outcome.ACQUIRED, 1)  # not "in progress"
            assert seen == ["PutItem", "PutItem"]
            assert await store.complete("k", got.token, b'"r"', retention=RETENTION)
            assert seen[2:] == ["PutItem", "PutItem"]
            # without a re-send, completing twice is refused as the state machine says
            assert not await store.complete("k", got.token, b'"r"', retention=RETENTION)
            replay = await claim(store)
            assert (replay.outcome, replay.record.result) == (Outcome.REPLAY, b'"r"')
            # a holder whose claim another store object wrote completes with an UpdateItem
            other = DynamoDBStore(table, endpoint_url=url, clock=clock)
            try:
                held = await claim(store, "u")
                seen.clear()
                assert await other.complete("u", held.token, b'"u"', retention=RETENTION)
                assert seen == ["UpdateItem", "UpdateItem"]
            finally:
                await other.close()
        finally:
            await store.close()


# ----------------------------------------------------------------- concurrency


async def test_50_store_objects_claim_one_key_at_once_one_acquires(
    dynamodb_url_factory: UrlFactory, clock: ManualClock
) -> None:
    url = dynamodb_url_factory()
    first = DynamoDBStore.from_url(url, clock=clock)
    session = get_session()  # one session (credentials resolved once), 50 clients
    session.set_credentials("testing", "testing")
    stores = [first] + [
        DynamoDBStore(table_of(url), endpoint_url=first.endpoint_url, clock=clock, session=session)
        for _ in range(49)
    ]
    try:
        await first.get("warm-up")  # creates the table
        claims = await asyncio.gather(*(claim(s, fp="fp") for s in stores))
        outcomes = Counter(c.outcome for c in claims)
        assert outcomes == {Outcome.ACQUIRED: 1, Outcome.IN_PROGRESS: 49}
        assert {c.token for c in claims} == {1}
        clock.advance(LEASE + 1)  # now all 50 race to take the expired lease over
        claims = await asyncio.gather(*(claim(s, fp="fp") for s in stores))
        outcomes = Counter(c.outcome for c in claims)
        assert outcomes == {Outcome.ACQUIRED: 1, Outcome.IN_PROGRESS: 49}
        assert {c.token for c in claims} == {2}
    finally:
        for s in stores:
            await s.close()


# ----------------------------------------------------------------- table and TTL


async def test_create_table_is_idempotent_and_enables_ttl_on_exp(
    dynamodb_endpoint: DynamoDBEndpoint,  # noqa: F811
    boto: Any,
    extra_tables: list[str],
) -> None:
    names = [f"t{time.time_ns():x}{i}" for i in range(4)]
    extra_tables.extend(names)
    store = DynamoDBStore(names[0], endpoint_url=dynamodb_endpoint.url)
    try:
        assert await create_table(store, names[0]) is True
        assert await create_table(store, names[0]) is False
        ttl = boto.describe_time_to_live(TableName=names[0])["TimeToLiveDescription"]
        assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "exp")
        table = boto.describe_table(TableName=names[0])["Table"]
        assert table["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}]
        assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"

        client = await store.client()  # a raw aiobotocore client works too
        assert await create_table(
            client, names[1], billing="PROVISIONED", read_capacity=2, write_capacity=3
        )
        throughput = boto.describe_table(TableName=names[1])["Table"]["ProvisionedThroughput"]
        assert (throughput["ReadCapacityUnits"], throughput["WriteCapacityUnits"]) == (2, 3)

        boto.create_table(
            TableName=names[2],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
        with pytest.raises(ConfigurationError, match="key schema"):
            await create_table(store, names[2])

        boto.create_table(
            TableName=names[3],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
        boto.update_time_to_live(
            TableName=names[3], TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"}
        )
        with pytest.raises(ConfigurationError, match="TTL on 'ttl'"):
            await create_table(store, names[3])
        with pytest.raises(ConfigurationError):
            await create_table(store, names[0], billing="FREE")
    finally:
        await store.close()


async def test_migrate_creates_the_table_with_ttl_and_is_idempotent(
    dynamodb_endpoint: DynamoDBEndpoint,  # noqa: F811
    boto: Any,
    extra_tables: list[str],
) -> None:
    """``store.migrate()`` (what ``telegram-idem migrate`` runs) on a store without
    ``create_table``: the table appears with key ``pk`` and TTL on ``exp``; a second
    migrate (or another store's) finds it and changes nothing."""
    name = f"t{time.time_ns():x}m"
    extra_tables.append(name)
    store = DynamoDBStore(name, endpoint_url=dynamodb_endpoint.url)
    again = DynamoDBStore(name, endpoint_url=dynamodb_endpoint.url)
    try:
        with pytest.raises(ConfigurationError, match="does not exist"):
            await store.get("k")  # no create_table: the first call does not make it
        assert await store.migrate() is True
        table = boto.describe_table(TableName=name)["Table"]
        assert table["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}]
        assert table["TableStatus"] == "ACTIVE"
        ttl = boto.describe_time_to_live(TableName=name)["TimeToLiveDescription"]
        assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "exp")
        assert (await store.claim("k", lease=LEASE, retention=RETENTION)).outcome is (
            Outcome.ACQUIRED
        )
        assert await store.migrate() is False
        assert await again.migrate() is False
        assert (await again.claim("k", lease=LEASE, retention=RETENTION)).outcome is (
            Outcome.IN_PROGRESS
        )  # the record survived both migrations
    finally:
        await store.close()
        await again.close()


async def test_store_url_with_create_table_makes_the_table_with_ttl(
    dynamodb_url_factory: UrlFactory, boto: Any
) -> None:
    url = dynamodb_url_factory()
    store = store_from_url(url)
    try:
        assert (await store.claim("k", lease=LEASE, retention=RETENTION)).token == 1
    finally:
        await store.close()
    ttl = boto.describe_time_to_live(TableName=table_of(url))["TimeToLiveDescription"]
    assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "exp")


async def test_a_missing_table_is_a_configuration_error_naming_it(
    dynamodb_endpoint: DynamoDBEndpoint,  # noqa: F811
) -> None:
    store = DynamoDBStore("idem-not-created", endpoint_url=dynamodb_endpoint.url)
    try:
        with pytest.raises(ConfigurationError, match=r"'idem-not-created'.*create_table"):
            await claim(store)
        with pytest.raises(ConfigurationError):
            await store.get("k")
    finally:
        await store.close()


async def test_a_malformed_item_is_a_store_error(store: DynamoDBStore, boto: Any) -> None:
    boto.put_item(TableName=store.table, Item={"pk": {"S": "k"}, "status": {"S": "weird"}})
    with pytest.raises(StoreError, match="malformed"):
        await claim(store)
    with pytest.raises(StoreError, match="malformed"):
        await store.get("k")


# ----------------------------------------------------------------- outage and throttling


async def test_an_endpoint_that_is_not_listening_is_a_store_error() -> None:
    store = DynamoDBStore(
        "idem", endpoint_url=f"http://127.0.0.1:{free_port()}", client_config=ONE_ATTEMPT
    )
    try:
        with pytest.raises(StoreError) as info:
            await claim(store)
        assert isinstance(info.value.original, EndpointConnectionError)
        assert info.value.__cause__ is info.value.original
        for call in (
            lambda: store.claim_many(["a", "b"], lease=LEASE, retention=RETENTION),
            lambda: store.complete("k", 1, b"1", retention=RETENTION),
            lambda: store.fail("k", 1, b"1", retention=RETENTION),
            lambda: store.release("k", 1),
            lambda: store.extend("k", 1, lease=LEASE),
            lambda: store.get("k"),
        ):
            with pytest.raises(StoreError):
                await call()
    finally:
        await store.close()


class MotoProcess:
    """A moto server in its own OS process (its own, empty state) on a given port."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> MotoProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto_server exited with {self.proc.returncode}")
            with socket.socket() as s, suppress(OSError):
                s.settimeout(0.2)
                s.connect(("127.0.0.1", self.port))
                return self
            time.sleep(0.1)
        raise RuntimeError("moto_server did not start listening")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


async def test_a_server_that_stops_mid_run_is_a_store_error_and_a_new_one_recovers(
    clock: ManualClock,
) -> None:
    port = free_port()
    server = MotoProcess(port).start()
    store = store_from_url(
        dynamodb_url(f"http://127.0.0.1:{port}", "idem-restart", max_attempts="1"), clock=clock
    )
    try:
        first = await store.claim("k", lease=LEASE, retention=RETENTION)
        assert first.outcome is Outcome.ACQUIRED
        server.stop()
        with pytest.raises(StoreError) as info:
            await store.claim("k2", lease=LEASE, retention=RETENTION)
        assert info.value.original is not None
        with pytest.raises(StoreError):
            await store.complete("k", first.token, b"1", retention=RETENTION)
        server = MotoProcess(port).start()  # a new, empty server on the same port
        again = await store.claim("k", lease=LEASE, retention=RETENTION)
        assert (again.outcome, again.token) == (Outcome.ACQUIRED, 1)  # table recreated
        assert await store.complete("k", again.token, b"1", retention=RETENTION)
    finally:
        await store.close()
        server.stop()


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("ProvisionedThroughputExceededException", 400),
        ("ThrottlingException", 400),
        ("RequestLimitExceeded", 400),
        ("InternalServerError", 500),
        ("ServiceUnavailable", 503),
    ],
)
async def test_throttling_is_a_store_error(code: str, status: int) -> None:
    assert code in THROTTLING_CODES
    hits: list[str] = []

    async def throttle(request: web.Request) -> web.Response:
        hits.append(request.headers.get("X-Amz-Target", ""))
        return _error(code, status)

    async with serve(throttle) as url:
        store = DynamoDBStore("idem", endpoint_url=url, client_config=ONE_ATTEMPT)
        try:
            with pytest.raises(StoreError, match="throttled") as info:
                await claim(store)
            original = info.value.original
            assert isinstance(original, ClientError)
            assert original.response["Error"]["Code"] == code
            with pytest.raises(StoreError):
                await store.complete("k", 1, b"1", retention=RETENTION)
            with pytest.raises(StoreError):
                await store.get("k")
        finally:
            await store.close()
    assert hits == [
        "DynamoDB_20120810.PutItem",
        "DynamoDB_20120810.UpdateItem",
        "DynamoDB_20120810.GetItem",
    ]


async def test_throttling_is_retried_by_botocore_then_a_store_error() -> None:
    hits = 0

    async def throttle(request: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        return _error("ProvisionedThroughputExceededException", 400)

    async with serve(throttle) as url:
        store = store_from_url(f"dynamodb://idem?endpoint_url={url}&max_attempts=2")
        try:
            with pytest.raises(StoreError, match="ProvisionedThroughputExceeded"):
                await claim(store)
        finally:
            await store.close()
    assert hits == 2


async def test_a_closed_store_raises_store_error(store: DynamoDBStore) -> None:
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        await claim(store)
    with pytest.raises(StoreError, match="closed"):
        await store.get("k")


# ----------------------------------------------------------------- URLs


def test_url_options() -> None:
    store = store_from_url(
        "dynamodb://idem_records.v1?region=eu-west-1&endpoint_url=http://127.0.0.1:5000"
        "&create_table=1&connect_timeout=1.5&read_timeout=3&max_attempts=4"
    )
    assert isinstance(store, DynamoDBStore)
    assert (store.table, store.region, store.endpoint_url) == (
        "idem_records.v1",
        "eu-west-1",
        "http://127.0.0.1:5000",
    )
    assert store.connection.create_table is True
    assert (store.connection.config.connect_timeout, store.connection.config.read_timeout) == (
        1.5,
        3.0,
    )
    assert store.connection.config.retries == {"mode": "standard", "total_max_attempts": 4}
    plain = store_from_url("dynamodb://idem")
    assert isinstance(plain, DynamoDBStore)
    assert (plain.table, plain.region, plain.endpoint_url, plain.connection.create_table) == (
        "idem",
        REGION,
        None,
        False,
    )
    assert plain.connection.config.retries == {"mode": "standard", "total_max_attempts": 3}


@pytest.mark.parametrize(
    "url",
    [
        "dynamodb://",
        "dynamodb://ab",
        "dynamodb://has space",
        "dynamodb://idem/path",
        "dynamodb://user@idem",
        "dynamodb://idem?colour=blue",
        "dynamodb://idem?create_table=maybe",
        "dynamodb://idem?endpoint_url=ftp://127.0.0.1:21",
        "dynamodb://idem?endpoint_url=localhost:8000",
        "dynamodb://idem?region=US%20East",
        "dynamodb://idem?read_timeout=-1",
        "dynamodb://idem?connect_timeout=soon",
        "dynamodb://idem?max_attempts=0",
    ],
)
def test_bad_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError):
        store_from_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "dynamodb://user:s3cret@idem",
        "dynamodb://:s3cret@idem?region=eu-west-1",
        "dynamodb://user:s3cret@idem?colour=blue",
        "dynamodb://user:s3cret@idem?read_timeout=soon",
        "dynamodb://user:s3cret@x",
    ],
)
def test_url_errors_never_show_a_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        store_from_url(url)
    assert "s3cret" not in str(info.value)
    assert "***" in str(info.value)


def test_bad_constructor_arguments_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError):
        DynamoDBStore("x")
    with pytest.raises(ConfigurationError):
        DynamoDBStore("idem", max_concurrency=0)


def test_expressions_name_only_the_placeholders_they_use() -> None:
    # DynamoDB rejects a request whose ExpressionAttributeNames has an unused entry
    assert expression_names("#token = :t AND #exp_at > :now", "SET #lease = :l") == {
        "#exp_at": "exp_at",
        "#lease": "lease",
        "#token": "token",
    }
