"""``telegram-idem purge`` against real SQLite, PostgreSQL and Redis: by prefix it
deletes exactly the prefix's records (after a confirmation, in batches), a dry run
deletes nothing, ``--expired`` deletes only the records past retention (stores that
expire records themselves say so), Ctrl-C stops between batches keeping what was done,
and mistakes exit 2, 3 or 4."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result
from services import UrlFactory

from telegram_idem._records import Record
from telegram_idem.backends.sqlite import SQLiteStore

Get = Callable[[str, str], Record | None]
"""The ``storecli_get`` fixture."""
Invoke = Callable[..., Result]
"""The ``storecli_invoke`` fixture."""
Seed = Callable[..., None]
"""The ``storecli_seed`` fixture (tests/cli/conftest.py)."""

DOOMED = [f"test:{i:02}" for i in range(12)]
KEPT = ["test", "tests:1", "tes:1", "idem:1:u:1", "Test:1"]


def _present(get: Get, url: str, keys: list[str]) -> list[str]:
    return [k for k in keys if get(url, k) is not None]


def test_a_prefix_deletes_exactly_its_records_in_batches(
    storecli_url: str, storecli_seed: Seed, storecli_get: Get, storecli_invoke: Invoke
) -> None:
    storecli_seed(storecli_url, DOOMED + KEPT)
    storecli_seed(storecli_url, ["test:in-flight"], complete=False)
    result = storecli_invoke(
        ["purge", "--store", storecli_url, "--prefix", "test:", "--yes", "--batch", "5", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"prefix": "test:", "dry_run": False, "deleted": 13}
    assert _present(storecli_get, storecli_url, [*DOOMED, "test:in-flight"]) == []
    assert _present(storecli_get, storecli_url, KEPT) == KEPT
    again = storecli_invoke(["purge", "--store", storecli_url, "--prefix", "test:", "--yes"])
    assert again.exit_code == 0
    assert "no record under 'test:': nothing to delete" in again.stdout


def test_a_dry_run_counts_and_deletes_nothing(
    storecli_url: str, storecli_seed: Seed, storecli_get: Get, storecli_invoke: Invoke
) -> None:
    storecli_seed(storecli_url, DOOMED + KEPT)
    result = storecli_invoke(
        ["purge", "--prefix", "test:", "--dry-run", "--json"],
        env={"IDEM_STORE_URL": storecli_url},
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"prefix": "test:", "dry_run": True, "would_delete": 12}
    assert _present(storecli_get, storecli_url, DOOMED + KEPT) == DOOMED + KEPT
    people = storecli_invoke(["purge", "--store", storecli_url, "--prefix", "test:", "--dry-run"])
    assert "dry run: 12 records under 'test:' would be deleted" in people.stdout


def test_it_asks_before_deleting_and_a_no_deletes_nothing(
    storecli_url: str, storecli_seed: Seed, storecli_get: Get, storecli_invoke: Invoke
) -> None:
    storecli_seed(storecli_url, DOOMED + KEPT)
    args = ["purge", "--store", storecli_url, "--prefix", "test:"]
    declined = storecli_invoke(args, input="n\n")
    assert declined.exit_code == 1, declined.output
    assert "delete 12 records whose key starts with 'test:'" in declined.stderr
    assert _present(storecli_get, storecli_url, DOOMED) == DOOMED
    accepted = storecli_invoke(args, input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert "deleted 12 records whose key starts with 'test:'" in accepted.stdout
    assert _present(storecli_get, storecli_url, DOOMED + KEPT) == KEPT


def test_expired_deletes_only_records_past_retention(
    storecli_url: str,
    storecli_store_name: str,
    storecli_seed: Seed,
    storecli_get: Get,
    storecli_invoke: Invoke,
) -> None:
    storecli_seed(storecli_url, ["live:1", "live:2"])
    storecli_seed(storecli_url, [f"old:{i}" for i in range(7)], retention=60.0, age=600.0)
    store = ["--store", storecli_url]
    if storecli_store_name == "redis":
        result = storecli_invoke(["purge", *store, "--expired", "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["expires_itself"] is True
        people = storecli_invoke(["purge", *store, "--expired"])
        assert "nothing to purge: Redis forgets each record" in people.stdout
        return
    dry = storecli_invoke(["purge", *store, "--expired", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout) == {"expired": True, "dry_run": True, "would_delete": 7}
    result = storecli_invoke(["purge", *store, "--expired", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"expired": True, "dry_run": False, "deleted": 7}
    assert _present(storecli_get, storecli_url, ["live:1", "live:2"]) == ["live:1", "live:2"]
    again = storecli_invoke(["purge", *store, "--expired"])
    assert again.exit_code == 0 and "deleted 0 records past retention" in again.stdout


def test_an_empty_store_has_nothing_to_purge(
    storecli_url: str, storecli_seed: Seed, storecli_invoke: Invoke
) -> None:
    storecli_seed(storecli_url, [])
    result = storecli_invoke(["purge", "--store", storecli_url, "--prefix", "idem:", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["deleted"] == 0


@pytest.mark.parametrize(
    "args",
    [
        ["purge", "--store", "sqlite:///x.db"],
        ["purge", "--store", "sqlite:///x.db", "--expired", "--prefix", "p"],
        ["purge", "--prefix", "p"],  # no --store and no IDEM_STORE_URL
        ["purge", "--store", "sqlite:///x.db", "--prefix", "p", "--batch", "0"],
        ["purge", "--store", "sqlite:///x.db", "--prefix", "", "--yes"],  # the whole store
    ],
)
def test_usage_mistakes_exit_2(args: list[str], storecli_invoke: Invoke) -> None:
    assert storecli_invoke(args).exit_code == 2


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--store", "redis://h:1/0?nope=1", "--expired"], "nope"),
        (
            [
                "--store",
                "storecli-plain://",
                "--prefix",
                "p",
                "--yes",
            ],
            "way to list or delete records by key prefix",
        ),
        (["--store", "storecli-plain://", "--expired"], "has no purge() (the Purgeable ability"),
    ],
)
def test_a_bad_url_or_a_store_without_the_ability_exits_4(
    args: list[str], named: str, storecli_invoke: Invoke
) -> None:
    result = storecli_invoke(["purge", *args])
    assert result.exit_code == 4, result.output
    assert named in result.stderr


def test_dynamodb_expires_records_itself(storecli_invoke: Invoke) -> None:
    url = "dynamodb://idem-table?region=us-east-1&endpoint_url=http://127.0.0.1:9"
    result = storecli_invoke(["purge", "--store", url, "--expired"])
    assert result.exit_code == 0, result.output
    assert "nothing to purge: DynamoDB deletes records past retention itself" in result.stdout


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://bot:s3cr3t-pw@127.0.0.1:{port}/test?connect_timeout=2",
        "redis://:s3cr3t-pw@127.0.0.1:{port}/0?socket_connect_timeout=2",
    ],
)
def test_an_unreachable_store_exits_3_without_showing_the_password(
    url: str, storecli_closed_port: int, storecli_invoke: Invoke
) -> None:
    store = url.format(port=storecli_closed_port)
    result = storecli_invoke(["purge", "--store", store, "--prefix", "p", "--yes"])
    assert result.exit_code == 3, result.output
    assert "s3cr3t-pw" not in result.stdout + result.stderr


class InterruptedSQLiteStore(SQLiteStore, schemes=("storecli-sigint",)):
    """An SQLite store (as a third-party store would be: a subclass serving its own
    scheme) that delivers a real SIGINT to this process in its second batch of
    deletions, as Ctrl-C would: once the batch is done (``during = False``), or while
    it is in flight (``during = True``: the signal comes first, the deletion after an
    await)."""

    batches = 0
    during = False

    async def delete_records(self, *, prefix: str, limit: int = 1000) -> int:
        type(self).batches += 1
        second = type(self).batches == 2
        if second and self.during:
            signal.raise_signal(signal.SIGINT)
        deleted = await super().delete_records(prefix=prefix, limit=limit)
        if second and not self.during:
            signal.raise_signal(signal.SIGINT)
        return deleted


@pytest.mark.sqlite
@pytest.mark.parametrize("during", [False, True], ids=["after-a-batch", "during-a-batch"])
def test_ctrl_c_stops_between_batches_and_keeps_what_was_deleted(
    during: bool,
    tmp_path: Path,
    storecli_seed: Seed,
    storecli_get: Get,
    storecli_invoke: Invoke,
) -> None:
    path = tmp_path / "bot.db"
    storecli_seed(f"sqlite:///{path}", DOOMED)
    InterruptedSQLiteStore.batches = 0
    InterruptedSQLiteStore.during = during
    result = storecli_invoke(
        [
            "purge",
            "--store",
            f"storecli-sigint:///{path}",
            "--prefix",
            "test:",
            "--yes",
            "--batch",
            "3",
        ]
    )
    assert result.exit_code == 130, result.output
    assert "interrupted: 6 records deleted before the stop" in result.stderr
    assert InterruptedSQLiteStore.batches == 2
    assert _present(storecli_get, f"sqlite:///{path}", DOOMED) == DOOMED[6:]


@pytest.mark.postgres
def test_the_installed_script_purges_a_postgres_store_in_a_real_process(
    postgres_url_factory: UrlFactory,
    storecli_seed: Seed,
    storecli_get: Get,
    storecli_script: str,
) -> None:
    url = postgres_url_factory()
    storecli_seed(url, DOOMED + KEPT)
    done = subprocess.run(
        [storecli_script, "purge", "--store", url, "--prefix", "test:", "--yes", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["deleted"] == 12
    assert _present(storecli_get, url, DOOMED + KEPT) == KEPT


@pytest.mark.redis
def test_a_redis_cluster_purges_a_prefix_on_every_master(
    redis_cluster_url_factory: UrlFactory,
    storecli_seed: Seed,
    storecli_get: Get,
    storecli_invoke: Invoke,
) -> None:
    url = redis_cluster_url_factory()
    doomed = ["idem:5:u:1", "idem:5:u:2", *(f"idem:5:a:k{i}" for i in range(9))]
    kept = ["idem:6:u:1", "idem:50:a:k"]
    storecli_seed(url, doomed + kept)
    args = ["purge", "--store", url, "--prefix", "idem:5:", "--yes", "--batch", "4", "--json"]
    result = storecli_invoke(args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["deleted"] == len(doomed)
    assert _present(storecli_get, url, doomed + kept) == kept
