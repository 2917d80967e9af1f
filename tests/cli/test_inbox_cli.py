"""``telegram-idem inbox stats|list|show|redrive|drop`` against real SQLite, PostgreSQL and
Redis stores: updates admitted the way the webhook ingress admits them, processed by a
real :class:`~telegram_idem.inbox.InboxWorker`, read and repaired by the command from the
store's URL.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli.inbox_support import admit, entry_id, invoke, message, run_worker, with_inbox
from cli.ops_support import existing
from services import UrlFactory

from telegram_idem._admission import Admission
from telegram_idem.inbox import EntryStatus, Inbox

PYTHON_CLI = [sys.executable, "-c", "from telegram_idem._cli import main; main()"]
"""``telegram-idem`` in a process of its own."""

STORES = pytest.mark.parametrize("idem_store_name", ["sqlite", "postgres", "redis"], indirect=True)


@pytest.fixture
def url(idem_store_url_factory: UrlFactory) -> str:
    """A new, empty store of the store under test (a SQLite file exists: the bot ran)."""
    return existing(idem_store_url_factory())


def _json(result: Any) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


async def _bury_one(inbox: Inbox) -> str:
    taken = await inbox.take(lease=30)
    assert taken is not None
    assert await inbox.bury(taken, error="RuntimeError: boom")
    return taken.id


# ----------------------------------------------------------------- empty


@STORES
def test_an_empty_inbox(url: str) -> None:
    stats = _json(invoke("inbox", "stats", "--store", url, "--json"))
    assert stats["counts"] == {"pending": 0, "in_flight": 0, "dead": 0}
    assert stats["oldest_age_seconds"] == {} and stats["backlog"] == []
    shown = invoke("inbox", "stats", "--store", url)
    assert shown.exit_code == 0 and "no chat is waiting" in shown.stdout
    assert _json(invoke("inbox", "list", "--store", url, "--json")) == []
    listed = invoke("inbox", "list", "--status", "dead", "--store", url)
    assert listed.exit_code == 0 and "no entries" in listed.stdout
    missing = invoke("inbox", "show", entry_id(1), "--store", url)
    assert missing.exit_code == 1 and "no inbox entry" in missing.stderr
    everything = _json(invoke("inbox", "redrive", "--all", "--store", url, "--json"))
    assert everything == {"redriven": 0, "dead_at_start": 0, "interrupted": False}


# ----------------------------------------------------------------- reads


@STORES
def test_list_show_and_stats_after_admission(url: str) -> None:
    assert (
        admit(url, message(1, 42), message(2, -100), message(3, 42, "x" * 500))
        == [Admission.RUN] * 3
    )
    assert admit(url, message(1, 42)) == [Admission.DUPLICATE]  # Telegram re-sent it

    stats = _json(invoke("inbox", "stats", "--store", url, "--json"))
    assert stats["counts"] == {"pending": 3, "in_flight": 0, "dead": 0}
    assert set(stats["oldest_age_seconds"]) == {"pending"}
    assert [(u["ordering_key"], u["pending"]) for u in stats["backlog"]] == [
        ("chat:42", 2),
        ("chat:-100", 1),
    ]
    table = invoke("inbox", "stats", "--store", url)
    assert table.exit_code == 0
    assert "pending" in table.stdout and "chat:42" in table.stdout

    listed = _json(invoke("inbox", "list", "--store", url, "--json"))
    assert [e["id"] for e in listed] == [entry_id(1), entry_id(2), entry_id(3)]
    assert listed[1]["update"] == {"update_id": 2, "type": "message", "chat": -100}
    assert listed[0]["status"] == "pending" and "payload" not in listed[0]
    assert listed[0]["admitted_at"] > 0
    by_chat = _json(invoke("inbox", "list", "--chat", "42", "--store", url, "--json"))
    assert [e["id"] for e in by_chat] == [entry_id(1), entry_id(3)]
    by_key = _json(invoke("inbox", "list", "--chat", "chat:-100", "--store", url, "--json"))
    assert [e["id"] for e in by_key] == [entry_id(2)]
    first = _json(invoke("inbox", "list", "--limit", "1", "--store", url, "--json"))
    assert [e["id"] for e in first] == [entry_id(1)]
    people = invoke("inbox", "list", "--store", url)
    assert people.exit_code == 0
    assert entry_id(3) in people.stdout and "message" in people.stdout
    assert "x" * 100 not in people.stdout  # the payload is not printed in a listing

    shown = _json(invoke("inbox", "show", entry_id(3), "--store", url, "--json"))
    assert shown["payload"] == message(3, 42, "x" * 500)
    assert (shown["status"], shown["ordering_key"], shown["attempts"]) == ("pending", "chat:42", 0)
    full = invoke("inbox", "show", entry_id(3), "--store", url)
    assert full.exit_code == 0
    assert '"update_id": 3' in full.stdout and "x" * 500 in full.stdout.replace("\n", "")


@STORES
def test_list_filters_by_status(url: str) -> None:
    admit(url, message(1, 1), message(2, 2), message(3, 3))
    assert with_inbox(url, _bury_one) == entry_id(1)
    dead = _json(invoke("inbox", "list", "--status", "dead", "--store", url, "--json"))
    assert [(e["id"], e["last_error"]) for e in dead] == [(entry_id(1), "RuntimeError: boom")]
    pending = _json(invoke("inbox", "list", "--status", "pending", "--store", url, "--json"))
    assert [e["id"] for e in pending] == [entry_id(2), entry_id(3)]
    stats = _json(invoke("inbox", "stats", "--store", url, "--json"))
    assert stats["counts"] == {"pending": 2, "in_flight": 0, "dead": 1}


# ----------------------------------------------------------------- a dead letter, end to end


@STORES
def test_a_dead_letter_is_redriven_end_to_end(url: str) -> None:
    admit(url, message(1, 42), message(2, 42))
    processed: list[int] = []
    fixed = False

    async def handler(update: dict[str, Any]) -> None:
        if update["update_id"] == 1 and not fixed:
            raise RuntimeError("handler bug: KeyError 'text'")
        processed.append(update["update_id"])

    # max_attempts=1: the first failure buries it; update 2 of the chat goes on.
    assert run_worker(url, handler, max_attempts=1) == 2
    assert processed == [2]
    dead = _json(invoke("inbox", "list", "--status", "dead", "--store", url, "--json"))
    assert [e["id"] for e in dead] == [entry_id(1)]
    assert "handler bug" in dead[0]["last_error"]
    people = invoke("inbox", "list", "--status", "dead", "--store", url)
    assert entry_id(1) in people.stdout and "dead" in people.stdout
    assert run_worker(url, handler, max_attempts=1) == 0  # a dead letter is never taken

    fixed = True  # the bot is fixed and redeployed
    redriven = invoke("inbox", "redrive", entry_id(1), "--store", url)
    assert redriven.exit_code == 0 and f"{entry_id(1)}: redriven" in redriven.stdout
    again = invoke("inbox", "redrive", entry_id(1), "--store", url)
    assert again.exit_code == 1 and "not a dead letter" in again.stdout
    pending = _json(invoke("inbox", "list", "--store", url, "--json"))
    assert [(e["id"], e["status"], e["attempts"]) for e in pending] == [(entry_id(1), "pending", 0)]

    assert run_worker(url, handler, max_attempts=1) == 1
    assert processed == [2, 1]  # processed once more, once
    assert run_worker(url, handler, max_attempts=1) == 0
    assert invoke("inbox", "show", entry_id(1), "--store", url).exit_code == 1  # acked: gone
    stats = _json(invoke("inbox", "stats", "--store", url, "--json"))
    assert stats["counts"] == {"pending": 0, "in_flight": 0, "dead": 0}
    assert admit(url, message(1, 42)) == [Admission.DUPLICATE]


@STORES
def test_redrive_all_works_in_batches(url: str) -> None:
    admit(url, *(message(uid, uid) for uid in range(1, 8)))
    for _ in range(7):
        with_inbox(url, _bury_one)
    result = invoke("inbox", "redrive", "--all", "--batch", "3", "--store", url)
    assert result.exit_code == 0, result.output
    assert "redriven 7 of 7 dead letters" in result.stdout
    # no terminal: no bar, a line per batch instead
    assert [ln for ln in result.stderr.splitlines() if ln.startswith("redriven")] == [
        "redriven 3 of 7",
        "redriven 6 of 7",
        "redriven 7 of 7",
    ]
    stats = _json(invoke("inbox", "stats", "--store", url, "--json"))
    assert stats["counts"] == {"pending": 7, "in_flight": 0, "dead": 0}


def test_redrive_needs_ids_or_all(sqlite_url_factory: UrlFactory) -> None:
    url = sqlite_url_factory()
    assert invoke("inbox", "redrive", "--store", url).exit_code == 2
    assert invoke("inbox", "redrive", entry_id(1), "--all", "--store", url).exit_code == 2
    assert invoke("inbox", "list", "--limit", "0", "--store", url).exit_code == 2
    assert invoke("inbox", "list", "--status", "lost", "--store", url).exit_code == 2
    assert invoke("inbox", "drop", "--store", url).exit_code == 2


def test_ctrl_c_stops_redrive_all_after_the_batch_in_hand(tmp_path: Path) -> None:
    """A real process and a real SIGINT: the test holds the file's write lock while the
    command is inside its second batch, interrupts it there, then lets the batch end.

    The lock is taken after the first batch's line is read, so on a loaded machine the
    command can finish its second batch first; that attempt proves nothing and is run
    again on a fresh file (up to 5 times), never judged."""
    for attempt in range(5):
        outcome = _interrupt_the_second_batch(tmp_path / f"bot{attempt}.db")
        if outcome is not None:
            break
    else:
        pytest.fail("the second batch always ended before the test could hold the lock")
    returncode, out, err, url = outcome
    assert returncode == 130, err
    assert "redriven 6 of 9" in err and "interrupted" in err
    assert "redriven 6 of 9 dead letters" in out
    stats = with_inbox(url, lambda inbox: inbox.stats())
    assert (stats.counts[EntryStatus.PENDING], stats.counts[EntryStatus.DEAD]) == (6, 3)


def _interrupt_the_second_batch(path: Path) -> tuple[int, str, str, str] | None:
    """Run ``redrive --all --batch 3`` on 9 dead letters and SIGINT it inside its second
    batch: (exit code, stdout, stderr, url), or ``None`` when the second batch ended
    before the lock was held (the race this attempt lost)."""
    url = f"sqlite:///{path}"
    admit(url, *(message(uid, uid) for uid in range(1, 10)))
    for _ in range(9):
        with_inbox(url, _bury_one)
    proc = subprocess.Popen(
        [*PYTHON_CLI, "inbox", "redrive", "--all", "--batch", "3", "--store", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lock = sqlite3.connect(path, isolation_level=None)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first.strip() == "redriven 3 of 9", first
        lock.execute("BEGIN IMMEDIATE")  # the second batch waits for this lock
        proc.send_signal(signal.SIGINT)
        second = proc.stderr.readline()
        if "stopping after this batch" not in second:
            assert second.strip() == "redriven 6 of 9", second  # the race was lost
            lock.execute("COMMIT")
            proc.communicate(timeout=60)
            return None
        lock.execute("COMMIT")
        out, err = proc.communicate(timeout=60)
    finally:
        lock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err, url


# ----------------------------------------------------------------- drop


@STORES
def test_drop_asks_and_keeps_the_update_guard(url: str) -> None:
    admit(url, message(1, 42), message(2, 42))
    assert with_inbox(url, _bury_one) == entry_id(1)
    declined = invoke("inbox", "drop", entry_id(1), "--store", url, input="n\n")
    assert declined.exit_code == 1 and "nothing dropped" in declined.stderr
    assert invoke("inbox", "show", entry_id(1), "--store", url).exit_code == 0
    live = invoke("inbox", "drop", entry_id(2), "--yes", "--store", url)
    assert live.exit_code == 1 and "not a dead letter" in live.stdout  # pending: kept
    confirmed = invoke("inbox", "drop", entry_id(1), "--store", url, "--json", input="y\n")
    assert confirmed.exit_code == 0, confirmed.output
    assert json.loads(confirmed.stdout) == {"done": [entry_id(1)], "not_done": []}
    assert invoke("inbox", "show", entry_id(1), "--store", url).exit_code == 1
    assert invoke("inbox", "show", entry_id(2), "--store", url).exit_code == 0
    # the update guard record stays: Telegram re-sending the update is a duplicate
    assert admit(url, message(1, 42)) == [Admission.DUPLICATE]
    assert invoke("inbox", "show", entry_id(1), "--store", url).exit_code == 1


# ----------------------------------------------------------------- failures


@pytest.mark.parametrize(
    "unreachable",
    [
        "postgresql://postgres@127.0.0.1:1/test?connect_timeout=2",
        "redis://127.0.0.1:1/0",
    ],
)
@pytest.mark.parametrize(
    "args",
    [["stats"], ["list"], ["show", entry_id(1)], ["redrive", "--all"], ["drop", "x", "--yes"]],
)
def test_an_unreachable_store_exits_3(unreachable: str, args: list[str]) -> None:
    result = invoke("inbox", *args, "--store", unreachable)
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith("error: ")


@pytest.mark.parametrize(
    "args", [["inbox", "stats"], ["inspect", "k"], ["outbox", "list"], ["purge", "--expired"]]
)
def test_a_sqlite_path_with_no_file_exits_4_and_makes_none(tmp_path: Path, args: list[str]) -> None:
    """A mistyped path must not look like an empty inbox: nothing is created there."""
    path = tmp_path / "typo.db"
    result = invoke(*args, "--store", f"sqlite:///{path}")
    assert result.exit_code == 4, result.output
    assert "no SQLite file at" in result.stderr
    assert not path.exists()


def test_an_unopenable_sqlite_file_exits_3(tmp_path: Path) -> None:
    result = invoke("inbox", "stats", "--store", f"sqlite:///{tmp_path}")  # a directory
    assert result.exit_code == 3, result.output


@pytest.mark.parametrize(
    "bad",
    [
        "bogus://somewhere",
        "memory://",
        "postgresql://postgres@127.0.0.1:5432/test?table_prefix=Bad-Prefix",
        "redis://127.0.0.1:6379/0?key_prefix={x}",
    ],
)
def test_a_bad_url_exits_4(bad: str) -> None:
    result = invoke("inbox", "list", "--store", bad)
    assert result.exit_code == 4, result.output
    assert result.stderr.startswith("error: ")


def test_the_store_url_comes_from_the_environment(
    sqlite_url_factory: UrlFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = sqlite_url_factory()
    admit(url, message(1, 42))
    monkeypatch.setenv("IDEM_STORE_URL", url)
    listed = _json(invoke("inbox", "list", "--json"))
    assert [e["id"] for e in listed] == [entry_id(1)]


@pytest.mark.dynamodb
def test_a_store_without_an_inbox_exits_4(dynamodb_url_factory: UrlFactory) -> None:
    result = invoke("inbox", "stats", "--store", dynamodb_url_factory())
    assert result.exit_code == 4, result.output
    assert "inbox" in result.stderr.lower()
