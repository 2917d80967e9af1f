"""``telegram-idem inspect KEY`` and ``inspect --prefix P`` against real SQLite,
PostgreSQL and Redis: one record's fields as stored, the records under a prefix in key
order (never a pattern), missing keys (exit 1), empty stores, usage (exit 2), bad URLs
(exit 4) and unreachable stores (exit 3) without a password shown."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest
from click.testing import Result
from services import UrlFactory

Invoke = Callable[..., Result]
"""The ``storecli_invoke`` fixture."""
Seed = Callable[..., None]
"""The ``storecli_seed`` fixture (tests/cli/conftest.py)."""

FP = "0123456789abcdef0123456789abcdef"


def test_one_record_shows_its_fields(
    storecli_url: str, storecli_seed: Seed, storecli_invoke: Invoke
) -> None:
    storecli_seed(storecli_url, ["idem:42:u:1001"], result=b"12345", fingerprint=FP)
    storecli_seed(storecli_url, ["idem:42:u:1002"], complete=False, lease=120.0)
    result = storecli_invoke(["inspect", "--store", storecli_url, "--json", "idem:42:u:1001"])
    assert result.exit_code == 0, result.output
    done = json.loads(result.stdout)
    assert {k: done[k] for k in ("found", "key", "status", "fencing_token", "attempts")} == {
        "found": True,
        "key": "idem:42:u:1001",
        "status": "completed",
        "fencing_token": 1,
        "attempts": 1,
    }
    assert (done["fingerprint"], done["result_bytes"], done["lease_left_s"]) == (FP, 5, None)
    assert 3500 < done["retention_left_s"] <= 3600
    running = storecli_invoke(["inspect", "--store", storecli_url, "--json", "idem:42:u:1002"])
    held = json.loads(running.stdout)
    assert (held["status"], held["result_bytes"], held["fingerprint"]) == (
        "in_progress",
        None,
        None,
    )
    assert 0 < held["lease_left_s"] <= 120
    people = storecli_invoke(["inspect", "--store", storecli_url, "idem:42:u:1001"])
    assert people.exit_code == 0
    for cell in ("idem:42:u:1001", "completed", FP, "retention left (s)"):
        assert cell in people.stdout


def test_a_key_without_a_record_exits_1(
    storecli_url: str, storecli_seed: Seed, storecli_invoke: Invoke
) -> None:
    storecli_seed(storecli_url, ["idem:42:u:1"])
    result = storecli_invoke(["inspect", "--store", storecli_url, "--json", "idem:42:u:2"])
    assert result.exit_code == 1, result.output
    assert json.loads(result.stdout) == {"key": "idem:42:u:2", "found": False}
    people = storecli_invoke(["inspect", "--store", storecli_url, "idem:42:u:2"])
    assert people.exit_code == 1 and "no record for key 'idem:42:u:2'" in people.stdout


def test_a_prefix_lists_its_live_records_in_key_order_up_to_the_limit(
    storecli_url: str, storecli_seed: Seed, storecli_invoke: Invoke
) -> None:
    storecli_seed(storecli_url, ["idem:7:u:3", "idem:7:u:1", "idem:7:u:2", "idem:8:u:1"])
    storecli_seed(storecli_url, ["idem:7:u:0"], retention=60.0, lease=60.0, age=120.0)
    result = storecli_invoke(["inspect", "--store", storecli_url, "--prefix", "idem:7:", "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert [r["key"] for r in listed["records"]] == ["idem:7:u:1", "idem:7:u:2", "idem:7:u:3"]
    assert (listed["prefix"], listed["limit"], listed["truncated"]) == ("idem:7:", 100, False)
    cut = storecli_invoke(
        ["inspect", "--store", storecli_url, "--prefix", "idem:7:", "--limit", "2", "--json"]
    )
    first = json.loads(cut.stdout)
    assert [r["key"] for r in first["records"]] == ["idem:7:u:1", "idem:7:u:2"]
    assert first["truncated"] is True
    people = storecli_invoke(["inspect", "--store", storecli_url, "--prefix", "idem:7:"])
    assert people.exit_code == 0
    assert "3 records under 'idem:7:'" in people.stdout
    assert "idem:8:u:1" not in people.stdout


def test_a_prefix_is_never_a_pattern(
    storecli_url: str, storecli_seed: Seed, storecli_invoke: Invoke
) -> None:
    storecli_seed(storecli_url, ["t:100%:a", "t:1000:a", "t:_x:a", "t:ax:a", "t:*:a", "t:?:a"])
    for prefix, keys in [
        ("t:100%", ["t:100%:a"]),
        ("t:_", ["t:_x:a"]),
        ("t:*", ["t:*:a"]),
        ("t:?", ["t:?:a"]),
    ]:
        result = storecli_invoke(["inspect", "--store", storecli_url, "--prefix", prefix, "--json"])
        assert [r["key"] for r in json.loads(result.stdout)["records"]] == keys, prefix


def test_an_empty_store_lists_nothing(
    storecli_url: str, storecli_seed: Seed, storecli_invoke: Invoke
) -> None:
    storecli_seed(storecli_url, [])
    result = storecli_invoke(
        ["inspect", "--prefix", "", "--json"], env={"IDEM_STORE_URL": storecli_url}
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["records"] == []
    people = storecli_invoke(["inspect", "--prefix", "idem:"], env={"IDEM_STORE_URL": storecli_url})
    assert people.exit_code == 0 and "0 records under 'idem:'" in people.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "--store", "sqlite:///x.db"],
        ["inspect", "--store", "sqlite:///x.db", "k", "--prefix", "p"],
        ["inspect", "k"],  # no --store and no IDEM_STORE_URL
        ["inspect", "--store", "sqlite:///x.db", "--prefix", "p", "--limit", "0"],
    ],
)
def test_usage_mistakes_exit_2(args: list[str], storecli_invoke: Invoke) -> None:
    result = storecli_invoke(args)
    assert result.exit_code == 2, result.output


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--store", "nope://x", "k"], "unknown store URL scheme"),
        (["--store", "redis://127.0.0.1:6379/0?bogus=1", "k"], "bogus"),
        (
            [
                "--store",
                "storecli-plain://",
                "--prefix",
                "p",
            ],
            "way to list or delete records by key prefix",
        ),
    ],
)
def test_a_bad_url_or_a_store_that_cannot_list_exits_4(
    args: list[str], named: str, storecli_invoke: Invoke
) -> None:
    result = storecli_invoke(["inspect", *args])
    assert result.exit_code == 4, result.output
    assert named in result.stderr


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
    for args in (["k"], ["--prefix", "p"]):
        result = storecli_invoke(["inspect", "--store", store, *args])
        assert result.exit_code == 3, result.output
        assert "s3cr3t-pw" not in result.stdout + result.stderr


@pytest.mark.redis
def test_the_installed_script_inspects_a_redis_store_in_a_real_process(
    redis_url_factory: UrlFactory, storecli_seed: Seed, storecli_script: str
) -> None:
    url = redis_url_factory()
    storecli_seed(url, ["idem:9:u:1"], result=b"abc")
    done = subprocess.run(
        [storecli_script, "inspect", "--json", "idem:9:u:1"],
        env={"IDEM_STORE_URL": url, "PATH": ""},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result_bytes"] == 3


@pytest.mark.redis
def test_a_redis_cluster_lists_records_of_every_slot_update_guards_included(
    redis_cluster_url_factory: UrlFactory, storecli_seed: Seed, storecli_invoke: Invoke
) -> None:
    url = redis_cluster_url_factory()
    keys = ["idem:5:a:pay:1", "idem:5:u:1", "idem:5:u:2", *(f"idem:5:a:k{i}" for i in range(9))]
    storecli_seed(url, [*keys, "idem:6:u:1"])
    result = storecli_invoke(["inspect", "--store", url, "--prefix", "idem:5:", "--json"])
    assert result.exit_code == 0, result.output
    assert [r["key"] for r in json.loads(result.stdout)["records"]] == sorted(keys)
