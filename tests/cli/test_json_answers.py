"""Under ``--json`` every answer is one JSON document on stdout, failures included: a
script parsing stdout never meets an empty answer or two documents."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from cli.inbox_support import invoke


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["inbox", "show", "idem:nope"], 1),
        (["outbox", "show", "idem:nope"], 1),
        (["unresolved", "resolve", "idem:nope", "--not-applied"], 1),
        (["inspect", "idem:nope"], 1),
        (["inbox", "redrive", "idem:nope"], 1),
    ],
)
def test_a_miss_answers_one_json_document(tmp_path: Path, args: list[str], code: int) -> None:
    path = tmp_path / "bot.db"
    sqlite3.connect(path).close()
    result = invoke(*args, "--json", "--store", f"sqlite:///{path}")
    assert result.exit_code == code, result.output
    json.loads(result.stdout)  # exactly one document (raises on none or two)


@pytest.mark.parametrize(
    ("url", "code"),
    [("bogus://x", 4), ("redis://127.0.0.1:1/0?socket_connect_timeout=0.5", 3)],
)
def test_a_failure_answers_its_error_and_exit_code_as_json(url: str, code: int) -> None:
    result = invoke("inbox", "stats", "--json", "--store", url)
    assert result.exit_code == code, result.output
    answer = json.loads(result.stdout)
    assert answer["exit_code"] == code
    assert answer["error"] and result.stderr.startswith("error: ")
