"""``telegram-idem migrate postgresql://…`` names every table it made or found (the
records, inbox, outbox, parked-chats, flood and ledger tables), against the real PostgreSQL."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from fixtures_postgres import (
    drop_tables,
    postgres_reachable_or_missing,
    run_sync,
    with_option,
)
from services import postgres_dsn

from telegram_idem._cli import cli

pytestmark = pytest.mark.postgres


@pytest.fixture
def prefix() -> Iterator[str]:
    postgres_reachable_or_missing()
    name = f"t{secrets.token_hex(6)}"
    yield name
    run_sync(lambda: drop_tables(postgres_dsn(), [name]))


async def _tables(prefix: str) -> set[str]:
    import asyncpg

    conn = await asyncpg.connect(postgres_dsn(), timeout=10.0)
    try:
        rows = await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_name LIKE $1",
            f"{prefix}\\_%",
        )
    finally:
        await conn.close()
    return {row["table_name"] for row in rows}


def test_cli_migrate_names_every_table_it_creates(prefix: str) -> None:
    url = with_option(postgres_dsn(), f"table_prefix={prefix}")
    named = (
        f"tables {prefix}_records, {prefix}_inbox, {prefix}_outbox, {prefix}_outbox_parked, "
        f"{prefix}_flood and {prefix}_ledger ("
    )
    for _ in range(2):  # made, then found (idempotent)
        result = CliRunner().invoke(cli, ["migrate", url])
        assert result.exit_code == 0, result.output
        assert named in result.output, result.output
    assert run_sync(lambda: _tables(prefix)) == {
        f"{prefix}_records",
        f"{prefix}_inbox",
        f"{prefix}_outbox",
        f"{prefix}_outbox_parked",
        f"{prefix}_flood",
        f"{prefix}_ledger",
    }
