"""``telegram-idem check`` against real SQLite, PostgreSQL and Redis: a healthy store
answers "ok" with its server, tables, round trip and clock offset; a PostgreSQL store
never migrated and a missing SQLite file are problems (exit 1) that create nothing; bad
URLs exit 4 and unreachable stores exit 3, never showing a password."""

from __future__ import annotations

import json
import secrets
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from click.testing import Result
from fixtures_postgres import postgres_reachable_or_missing, with_option
from services import UrlFactory, postgres_dsn

from telegram_idem.backends.sqlite._browse import expected_tables

Invoke = Callable[..., Result]
"""The ``storecli_invoke`` fixture."""
Seed = Callable[..., None]
"""The ``storecli_seed`` fixture (tests/cli/conftest.py)."""

SERVERS = {"sqlite": "SQLite ", "postgres": "PostgreSQL ", "redis": "Redis "}


def test_a_healthy_store_is_ok_with_its_server_tables_round_trip_and_clock(
    storecli_url: str, storecli_store_name: str, storecli_seed: Seed, storecli_invoke: Invoke
) -> None:
    storecli_seed(storecli_url, [])
    result = storecli_invoke(["check", "--json", storecli_url])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["verdict"] == "ok" and report["problems"] == []
    assert report["server"].startswith(SERVERS[storecli_store_name])
    tables = report["tables"]
    assert tables["found"] == tables["expected"] and tables["missing"] == []
    if storecli_store_name != "redis":
        assert any(name.endswith("records") for name in tables["expected"])
    assert report["round_trip_ms"] > 0
    assert isinstance(report["clock_offset_ms"], float)
    assert report["clock_uncertainty_ms"] >= 0
    people = storecli_invoke(["check", storecli_url])
    assert people.exit_code == 0, people.output
    assert "round trip" in people.stdout and "clock offset" in people.stdout
    assert people.stdout.rstrip().splitlines()[-1] == "ok"


def test_the_url_comes_from_idem_store_url_when_not_given(
    storecli_url: str, storecli_seed: Seed, storecli_invoke: Invoke
) -> None:
    storecli_seed(storecli_url, [])
    result = storecli_invoke(["check", "--json"], env={"IDEM_STORE_URL": storecli_url})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ok"] is True
    assert storecli_invoke(["check"]).exit_code == 2  # no URL and no IDEM_STORE_URL


@pytest.mark.postgres
def test_a_postgres_store_never_migrated_says_which_tables_in_one_line(
    storecli_invoke: Invoke,
) -> None:
    postgres_reachable_or_missing()
    prefix = f"t{secrets.token_hex(6)}"
    url = with_option(postgres_dsn(), f"table_prefix={prefix}")
    result = storecli_invoke(["check", "--json", url])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    names = [
        f"{prefix}_{t}" for t in ("records", "inbox", "outbox", "outbox_parked", "flood", "ledger")
    ]
    assert report["tables"]["missing"] == names and report["tables"]["found"] == []
    assert report["verdict"] == (
        f"tables missing: {', '.join(names)} (run telegram-idem migrate URL)"
    )
    assert report["round_trip_ms"] is None  # not measured on a store that cannot work
    again = storecli_invoke(["check", url])  # the check created nothing
    assert again.exit_code == 1
    assert "run telegram-idem migrate URL" in again.stdout


@pytest.mark.sqlite
def test_a_missing_sqlite_file_is_reported_and_not_created(
    tmp_path: Path, storecli_invoke: Invoke
) -> None:
    path = tmp_path / "typo.db"
    result = storecli_invoke(["check", "--json", f"sqlite:///{path}"])
    assert result.exit_code == 1, result.output
    assert json.loads(result.stdout)["verdict"] == (
        f"file {path} does not exist (a store creates it on first use)"
    )
    assert not path.exists()


@pytest.mark.sqlite
def test_an_older_sqlite_file_is_reported_and_left_as_it_is(
    tmp_path: Path, storecli_invoke: Invoke
) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE idem_records (key TEXT PRIMARY KEY, status TEXT NOT NULL)")
    conn.commit()
    conn.close()
    result = storecli_invoke(["check", "--json", f"sqlite:///{path}"])
    assert result.exit_code == 1, result.output
    lacking = [c for c in expected_tables()["idem_records"] if c not in ("key", "status")]
    report = json.loads(result.stdout)
    assert report["problems"] == [
        f"table idem_records lacks columns {', '.join(lacking)}",
        "journal_mode is delete, not wal (several processes need WAL)",
    ]
    assert report["tables"]["found"] == ["idem_records"]
    assert report["round_trip_ms"] is None
    conn = sqlite3.connect(path)  # the check changed nothing
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == [
        "idem_records",
        "sqlite_autoindex_idem_records_1",
    ]
    conn.close()


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("bogus://somewhere", "unknown store URL scheme"),
        ("postgresql://postgres@127.0.0.1/test?no_such_option=1", "no_such_option"),
        ("redis://127.0.0.1:6379/0?key_prefix={x}", "key_prefix"),
        ("sqlite://host/file.db", "a SQLite URL is sqlite:///file.db"),
        ("memory://", "memory:// lives inside one process"),
        ("storecli-plain://", "has no health check (the Checkable ability"),
    ],
)
def test_a_bad_url_or_a_store_without_a_health_check_exits_4_naming_the_problem(
    url: str, named: str, storecli_invoke: Invoke
) -> None:
    result = storecli_invoke(["check", url])
    assert result.exit_code == 4, result.output
    assert result.stderr.startswith("error: ") and named in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres:s3cr3t-pw@127.0.0.1:{port}/test?connect_timeout=2",
        "redis://:s3cr3t-pw@127.0.0.1:{port}/0?socket_connect_timeout=2",
    ],
)
def test_an_unreachable_store_exits_3_without_showing_the_password(
    url: str, storecli_closed_port: int, storecli_invoke: Invoke
) -> None:
    result = storecli_invoke(["check", url.format(port=storecli_closed_port)])
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith("error: ")
    assert str(storecli_closed_port) in result.stderr
    assert "s3cr3t-pw" not in result.stdout + result.stderr


@pytest.mark.sqlite
def test_the_installed_script_checks_a_store_in_a_real_process(
    tmp_path: Path, storecli_seed: Seed, storecli_script: str
) -> None:
    url = f"sqlite:///{tmp_path / 'bot.db'}"
    storecli_seed(url, [])
    done = subprocess.run(
        [storecli_script, "check", "--json", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True
    missing = subprocess.run(
        [storecli_script, "check", f"sqlite:///{tmp_path / 'absent.db'}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert missing.returncode == 1
    assert "does not exist" in missing.stdout


@pytest.mark.redis
def test_a_redis_cluster_is_checked_on_every_master(
    redis_cluster_url_factory: UrlFactory, storecli_invoke: Invoke
) -> None:
    result = storecli_invoke(["check", "--json", redis_cluster_url_factory()])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert report["server"].startswith("Redis ") and "masters)" in report["server"]


@pytest.mark.dynamodb
def test_a_dynamodb_table_is_checked_and_a_missing_one_named(
    dynamodb_url_factory: UrlFactory, storecli_seed: Seed, storecli_invoke: Invoke
) -> None:
    url = dynamodb_url_factory()  # create_table=1: the table is made on first use
    storecli_seed(url, ["idem:1:u:1"])
    result = storecli_invoke(["check", "--json", url])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["server"].startswith("DynamoDB (http://")
    table = urlsplit(url).netloc
    assert report["tables"]["found"] == [table]
    never = f"dynamodb://{table}-never?" + "&".join(
        option for option in urlsplit(url).query.split("&") if not option.startswith("create_table")
    )
    missing = storecli_invoke(["check", "--json", never])
    assert missing.exit_code == 1, missing.output
    assert json.loads(missing.stdout)["verdict"] == (
        f"tables missing: {table}-never (run telegram-idem migrate URL)"
    )


@pytest.mark.sqlite
def test_the_sqlite_check_expects_exactly_what_a_store_creates(
    tmp_path: Path, storecli_seed: Seed
) -> None:
    path = tmp_path / "fresh.db"
    storecli_seed(f"sqlite:///{path}", [])
    conn = sqlite3.connect(path)
    try:
        names = [
            row[0]
            for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'"
            )
        ]
        made = {n: [r[1] for r in conn.execute(f"PRAGMA table_info('{n}')")] for n in names}
    finally:
        conn.close()
    assert {name: list(columns) for name, columns in expected_tables().items()} == made
