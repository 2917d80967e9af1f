"""A custom store registers its schemes with store_from_url, and ``telegram-idem migrate``
creates a DynamoDB table (issue 8, item 22)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Sequence
from typing import ClassVar

import pytest
from click.testing import CliRunner
from fixtures_dynamodb import (
    REGION,
    DynamoDBEndpoint,
    boto3_client,
    delete_tables,
    dynamodb_endpoint,  # noqa: F401 (fixture)
)

from telegram_idem import ConfigurationError, Record, store_from_url
from telegram_idem._cli import cli
from telegram_idem._clock import Clock
from telegram_idem._records import Claim
from telegram_idem.backends import known_schemes
from telegram_idem.backends._base import Store
from telegram_idem.backends.memory import MemoryStore


class _Delegating(Store):
    """A custom store (as a bot author writes one): records kept by a MemoryStore."""

    schemes: ClassVar[tuple[str, ...]] = ("idemtest", "idemtest+b")
    driver_errors = ()

    def __init__(self, url: str, clock: Clock | None) -> None:
        self.url = url
        self.inner = MemoryStore() if clock is None else MemoryStore(clock=clock)

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> _Delegating:
        return cls(url, clock)

    async def _claim(
        self, key: str, fingerprint: str | None, lease: float, retention: float
    ) -> Claim:
        return await self.inner.claim(
            key, fingerprint=fingerprint, lease=lease, retention=retention
        )

    async def _claim_many(self, keys: Sequence[str], lease: float, retention: float) -> list[Claim]:
        return await self.inner.claim_many(keys, lease=lease, retention=retention)

    async def _complete(self, key: str, token: int, result: bytes, retention: float) -> bool:
        return await self.inner.complete(key, token, result, retention=retention)

    async def _fail(self, key: str, token: int, error: bytes, retention: float) -> bool:
        return await self.inner.fail(key, token, error, retention=retention)

    async def _release(self, key: str, token: int) -> bool:
        return await self.inner.release(key, token)

    async def _extend(self, key: str, token: int, lease: float) -> bool:
        return await self.inner.extend(key, token, lease=lease)

    async def _get(self, key: str) -> Record | None:
        return await self.inner.get(key)


async def test_setting_schemes_registers_a_custom_store_with_store_from_url() -> None:
    store = store_from_url("idemtest://anything?x=1")
    assert isinstance(store, _Delegating) and store.url == "idemtest://anything?x=1"
    assert isinstance(store_from_url("IDEMTEST+B://y"), _Delegating)
    claim = await store.claim("idem:7:u:1", lease=30, retention=60)
    assert claim.record.fencing_token == 1
    assert {"idemtest", "idemtest+b", "redis", "sqlite"} <= set(known_schemes())


def test_the_unknown_scheme_error_lists_registered_schemes() -> None:
    with pytest.raises(ConfigurationError, match=r"idemtest://"):
        store_from_url("nosuchstore://x")


def test_a_scheme_served_by_another_class_is_refused_at_class_creation() -> None:
    with pytest.raises(ConfigurationError, match=r"redis:// is already served by"):

        class _Clash(_Delegating):
            schemes = ("redis",)

    with pytest.raises(ConfigurationError, match=r"idemtest:// is already served by"):

        class _Twin(_Delegating):
            schemes = ("idemtest",)

    with pytest.raises(ConfigurationError, match="not a lower-case URL scheme"):

        class _Bad(_Delegating):
            schemes = ("Bad Scheme",)

    assert isinstance(store_from_url("redis://127.0.0.1:6379/0"), Store)
    assert isinstance(store_from_url("idemtest://x"), _Delegating)


def test_a_subclass_without_its_own_schemes_registers_nothing() -> None:
    class _Quiet(_Delegating):
        pass

    assert isinstance(store_from_url("idemtest://x"), _Delegating)
    assert not isinstance(store_from_url("idemtest://x"), _Quiet)


# ----------------------------------------------------------------- migrate


@pytest.fixture
def new_table(dynamodb_endpoint: DynamoDBEndpoint) -> Iterator[str]:  # noqa: F811
    name = f"migrate-{secrets.token_hex(4)}"
    yield name
    delete_tables(dynamodb_endpoint.url, [name])


@pytest.mark.dynamodb
def test_cli_migrate_creates_the_dynamodb_table_with_ttl(
    dynamodb_endpoint: DynamoDBEndpoint,  # noqa: F811
    new_table: str,
) -> None:
    url = f"dynamodb://{new_table}?region={REGION}&endpoint_url={dynamodb_endpoint.url}"
    runner = CliRunner()
    result = runner.invoke(cli, ["migrate", url])
    assert result.exit_code == 0, result.output
    assert "nothing to migrate" not in result.output
    assert f"created: table {new_table}" in result.output
    boto = boto3_client(dynamodb_endpoint.url)
    described = boto.describe_table(TableName=new_table)["Table"]
    assert described["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}]
    ttl = boto.describe_time_to_live(TableName=new_table)["TimeToLiveDescription"]
    assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "exp")
    again = runner.invoke(cli, ["migrate", url])  # idempotent
    assert again.exit_code == 0, again.output
    assert f"ready: table {new_table}" in again.output


@pytest.mark.dynamodb
async def test_a_migrated_table_serves_a_store_without_create_table(
    dynamodb_endpoint: DynamoDBEndpoint,  # noqa: F811
    new_table: str,
) -> None:
    url = f"dynamodb://{new_table}?region={REGION}&endpoint_url={dynamodb_endpoint.url}"
    store = store_from_url(url)
    try:
        with pytest.raises(ConfigurationError, match="telegram-idem migrate"):
            await store.get("k")
        assert await store.migrate() is True  # type: ignore[attr-defined]
        assert (await store.claim("k", lease=30, retention=60)).record.fencing_token == 1
    finally:
        await store.close()
