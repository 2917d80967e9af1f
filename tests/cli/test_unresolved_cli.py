"""``telegram-idem unresolved`` against real SQLite, PostgreSQL and Redis stores: an
at-most-once step whose holder process was killed inside its effect, one whose effect
failed ambiguously, and an outbox send whose answer the fake Bot API dropped are listed
(oldest first, exit 1, the oldest age); each is resolved through the command
(``--result`` / ``--not-applied``), and the guard's later runs behave as the resolution
says: the result is replayed, or the effect runs once more. Also: namespaces
(``--prefix``, ``--bot-id``, ``--key-prefix``), empty stores, ``--json`` and exit codes
1/2/3/4."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from cli.ops_support import (
    BOT_ID,
    STORES,
    Bot,
    as_json,
    documented_commands,
    existing,
    holder_killed_in_effect,
    invoke,
    marked,
    store_time_passes,
    url_of,
)

from telegram_idem import AmbiguousEffectError, Idem, KeyBuilder, Record, UnknownOutcomeError
from telegram_idem._clock import Clock
from telegram_idem._records import Claim
from telegram_idem.backends import Store, ledger_of, outbox_of, store_from_url
from telegram_idem.backends.memory import MemoryStore
from telegram_idem.outbox import CallStatus
from telegram_idem.testing.bot_api import FakeBotAPI, Fault

LEASE = 1.0
"""Seconds a holder's lease lasts: a killed holder's step is unresolved a second later."""
CHAT = 5550009


@pytest.fixture(params=marked(STORES))
def url(request: pytest.FixtureRequest) -> str:
    """A fresh URL of each store an operator reads from outside."""
    return url_of(request)


@pytest.fixture
async def idem(url: str) -> AsyncIterator[Idem]:
    """The bot's guard on ``url`` (real clock, a short lease, no heartbeat)."""
    guard = Idem(store_from_url(url), lease=LEASE, heartbeat=False, holder="worker-2")
    yield guard
    await guard.close()


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class Effect:
    """An at-most-once effect that counts its runs and returns ``value``."""

    def __init__(self, value: Any = "granted") -> None:
        self.runs = 0
        self.value = value

    async def __call__(self) -> Any:
        self.runs += 1
        return self.value


async def rerun(idem: Idem, action: str, effect: Effect) -> Any:
    """The bot handling the update again: the action, whose step ``grant`` is at most
    once."""

    async def body() -> Any:
        return await idem.step("grant", effect, once="at_most")

    return await idem.run(action, body)


async def killed_holder(url: str, idem: Idem, action: str) -> str:
    """Kill a holder process inside step ``grant`` of ``action``; return once its lease
    is over for the store. The step's key."""
    await holder_killed_in_effect(url, action, lease=LEASE)
    step = idem.keys.step(action, "grant")
    record = await idem.store.get(step)
    assert record is not None
    await store_time_passes(idem.store, record.lease_expires_at)
    return step


async def ambiguous(idem: Idem, key: str) -> None:
    """An at-most-once action whose effect failed ambiguously (its provider timed out)."""

    async def charge() -> str:
        raise AmbiguousEffectError("the provider timed out after the request was sent")

    with pytest.raises(UnknownOutcomeError):
        await idem.run(key, charge, once="at_most")


# ------------------------------------------------------------------ listing


async def test_list_shows_the_dead_holders_step_and_exits_1(url: str, idem: Idem) -> None:
    action = idem.keys.action(BOT_ID, "grant:order-1")
    step = await killed_holder(url, idem, action)

    result = await invoke("unresolved", "list", "--store", url, "--json")
    assert result.exit_code == 1  # something is unresolved: the alert fires
    data = as_json(result)
    [item] = data["items"]
    assert (item["key"], item["kind"], item["state"]) == (step, "step", "started")
    assert (item["holder"], item["attempts"]) == ("worker-1", 1)
    assert data["count"] == 1 and data["oldest_age"] == item["age"] > 0

    people = await invoke("unresolved", "list", "--store", url)
    assert people.exit_code == 1
    assert step in people.stdout and "worker-1" in people.stdout
    assert "1 unresolved effect; the oldest started" in people.stdout


async def test_an_empty_store_lists_nothing_and_exits_0(url: str) -> None:
    result = await invoke("unresolved", "list", "--store", url, "--json")
    assert result.exit_code == 0
    assert as_json(result) == {"count": 0, "oldest_age": None, "items": []}
    people = await invoke("unresolved", "list", "--store", url)
    assert people.exit_code == 0 and "nothing is unresolved" in people.stdout


async def test_list_is_oldest_first_and_narrowed_by_namespace(url: str, idem: Idem) -> None:
    first = idem.keys.action(BOT_ID, "charge:1")
    await ambiguous(idem, first)
    other_bot = idem.keys.action(77, "charge:2")
    await ambiguous(idem, other_bot)
    tenant = Idem(idem.store, keys=KeyBuilder(prefix="shop"), heartbeat=False)
    in_tenant = tenant.keys.action(BOT_ID, "charge:3")  # shop:<bot>:a:charge:3
    await ambiguous(tenant, in_tenant)

    async def keys(*args: str) -> list[str]:
        result = await invoke("unresolved", "list", *args, "--store", url, "--json")
        assert result.exit_code == 1, result.output
        return [i["key"] for i in as_json(result)["items"]]

    assert await keys() == [first, other_bot, in_tenant]
    assert await keys("--limit", "2") == [first, other_bot]
    assert await keys("--bot-id", str(BOT_ID)) == [first]
    assert await keys("--bot-id", str(BOT_ID), "--key-prefix", "shop") == [in_tenant]
    assert await keys("--key-prefix", "shop") == [in_tenant]
    assert await keys("--prefix", "idem:77:") == [other_bot]
    nothing = await invoke("unresolved", "list", "--prefix", "idem:1:", "--store", url)
    assert nothing.exit_code == 0
    both = await invoke("unresolved", "list", "--prefix", "x", "--bot-id", "1", "--store", url)
    assert both.exit_code == 2


# ------------------------------------------------------------------ resolving


async def test_resolved_with_a_result_the_next_run_replays_it(url: str, idem: Idem) -> None:
    action = idem.keys.action(BOT_ID, "grant:order-2")
    step = await killed_holder(url, idem, action)
    effect = Effect()
    with pytest.raises(UnknownOutcomeError):  # the guard will not run it again by itself
        await rerun(idem, action, effect)

    result = await invoke(
        "unresolved", "resolve", step, "--result", '{"badge": "gold"}', "--store", url, "--json"
    )
    assert as_json(result) == {"key": step, "kind": "step", "resolved": "applied"}
    assert await rerun(idem, action, effect) == {"badge": "gold"}  # as the guard stores it
    assert effect.runs == 0
    assert (await invoke("unresolved", "list", "--store", url)).exit_code == 0

    again = await invoke("unresolved", "resolve", step, "--result", "1", "--store", url)
    assert again.exit_code == 1
    assert f"cannot resolve {step!r}" in again.stderr


async def test_resolved_not_applied_the_next_run_runs_it_once(url: str, idem: Idem) -> None:
    action = idem.keys.action(BOT_ID, "grant:order-3")
    step = await killed_holder(url, idem, action)

    result = await invoke("unresolved", "resolve", step, "--not-applied", "--store", url)
    assert result.exit_code == 0, result.output
    assert f"resolved: {step} did not happen; the next run runs it" in result.stdout
    effect = Effect("granted once")
    assert await rerun(idem, action, effect) == "granted once"
    assert await rerun(idem, action, effect) == "granted once"  # replayed now
    assert effect.runs == 1


async def test_an_ambiguous_action_resolved_with_a_falsy_result(url: str, idem: Idem) -> None:
    key = idem.keys.action(BOT_ID, "charge:9")
    await ambiguous(idem, key)
    result = await invoke("unresolved", "resolve", key, "--result", "null", "--store", url)
    assert result.exit_code == 0, result.output
    effect = Effect("charged again")
    assert await idem.run(key, effect, once="at_most") is None  # JSON null, replayed
    assert effect.runs == 0


async def test_an_unknown_send_is_listed_and_resolved(url: str, idem: Idem) -> None:
    async with FakeBotAPI() as fake, Bot(idem.store, fake.url) as outbound:
        fake.inject(Fault.drop(method="sendMessage"))
        with pytest.raises(UnknownOutcomeError) as lost:
            await outbound.call("sendMessage", {"chat_id": CHAT, "text": "Receipt"}, key="r:1")
        key = lost.value.key
        listed = as_json(await invoke("unresolved", "list", "--store", url, "--json"))
        [item] = listed["items"]
        assert (item["key"], item["kind"], item["state"]) == (key, "send", "unknown")
        assert item["holder"] == f"bot {BOT_ID}"
        assert item["detail"].startswith("sendMessage: no answer: ")
        assert item["detail"].count("sendMessage") == 1  # the method once, not twice

        bad = await invoke("unresolved", "resolve", key, "--result", "true", "--store", url)
        assert bad.exit_code == 2 and "sendMessage returns a Message" in bad.stderr
        [seen] = fake.messages(CHAT)
        result = await invoke(
            "unresolved", "resolve", key, "--result", json.dumps(seen.message), "--store", url
        )
        assert result.exit_code == 0, result.output
        assert await outbound.result(key) == seen.message
        fake.assert_sent_once(CHAT, "Receipt")


async def test_an_unknown_send_resolved_not_applied_is_sent_again(url: str, idem: Idem) -> None:
    async with FakeBotAPI() as fake, Bot(idem.store, fake.url) as outbound:
        fake.inject(Fault.drop(method="sendMessage", applied=False))
        with pytest.raises(UnknownOutcomeError) as lost:
            await outbound.call("sendMessage", {"chat_id": CHAT, "text": "Invoice"}, key="i:1")
        key = lost.value.key
        assert fake.sent_texts(CHAT) == []
        result = await invoke("unresolved", "resolve", key, "--not-applied", "--store", url)
        assert result.exit_code == 0, result.output
        assert "it goes back to be sent" in result.stdout
        assert (await outbound.result(key))["text"] == "Invoice"  # the relay sends it
        fake.assert_sent_once(CHAT, "Invoice")
        entry = await outbox_of(idem.store).get(key)
        assert entry is not None and entry.status is CallStatus.DELIVERED


async def test_a_running_step_is_not_resolved(url: str, idem: Idem) -> None:
    """A holder whose lease is alive is running: not listed, and resolve refuses it."""
    key = idem.keys.action(BOT_ID, "slow:1")
    claim = await idem.store.claim(key, lease=300.0, retention=600.0)
    assert await ledger_of(idem.store).start(key, token=claim.token, holder="busy") is None
    assert (await invoke("unresolved", "list", "--store", url)).exit_code == 0
    result = await invoke("unresolved", "resolve", key, "--not-applied", "--store", url)
    assert result.exit_code == 1 and "lease is alive" in result.stderr


# ------------------------------------------------------------------ exit codes


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["resolve", "k", "--store", "sqlite:///x.db"], 2, "exactly one of"),
        (
            ["resolve", "k", "--not-applied", "--result", "1", "--store", "sqlite:///x.db"],
            2,
            "exactly one of",
        ),
        (["resolve", "k", "--result", "{nope", "--store", "sqlite:///x.db"], 2, "not JSON"),
        (["list"], 2, "Missing option '--store'"),
        (["list", "--limit", "0", "--store", "sqlite:///x.db"], 2, "--limit"),
        (["list", "--store", "memory://"], 4, "memory://"),
        (["list", "--store", "bogus://x"], 4, "bogus"),
    ],
)
async def test_usage_and_configuration_exit_codes(args: list[str], code: int, says: str) -> None:
    result = await invoke("unresolved", *args)
    assert result.exit_code == code, result.output
    assert says in result.stderr


async def test_resolve_of_a_key_with_nothing_to_settle_exits_1(url: str) -> None:
    result = await invoke("unresolved", "resolve", "idem:1:a:none", "--not-applied", "--store", url)
    assert result.exit_code == 1
    assert "nothing under it is unresolved" in result.stderr


@pytest.mark.parametrize(
    "scheme",
    ["postgresql://postgres:hunter2@127.0.0.1:{port}/test", "redis://:hunter2@127.0.0.1:{port}/0"],
)
async def test_an_unreachable_store_exits_3(scheme: str, closed_port: int) -> None:
    url = scheme.format(port=closed_port)
    for args in (["list"], ["resolve", "k", "--not-applied"]):
        result = await invoke("unresolved", *args, "--store", url)
        assert result.exit_code == 3, (args, result.output)
        assert "hunter2" not in result.output


async def test_a_store_read_through_the_environment(url: str, idem: Idem) -> None:
    await ambiguous(idem, idem.keys.action(BOT_ID, "env:1"))
    result = await invoke("unresolved", "list", "--json", env={"IDEM_STORE_URL": url})
    assert result.exit_code == 1 and as_json(result)["count"] == 1


class _RecordsOnly(Store):
    """A third-party store with records only: no effect ledger, no outbox."""

    schemes: ClassVar[tuple[str, ...]] = ("opsclirecords",)
    driver_errors = ()

    def __init__(self) -> None:
        self.inner = MemoryStore()

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> _RecordsOnly:
        return cls()

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


async def test_a_store_with_neither_ledger_nor_outbox_exits_4() -> None:
    for args in (["list"], ["resolve", "k", "--not-applied"]):
        result = await invoke("unresolved", *args, "--store", "opsclirecords://x")
        assert result.exit_code == 4, result.output
        assert "_RecordsOnly has neither an effect ledger nor an outbox" in result.stderr


@pytest.mark.parametrize(
    ("page", "group"),
    [("effects.md", "unresolved"), ("outbound.md", "outbox")],
)
async def test_the_documented_command_lines_run(page: str, group: str, tmp_path: Path) -> None:
    """Every ``telegram-idem outbox|unresolved`` line of the guides' shell blocks is a
    valid command: run on an empty SQLite store, it answers 0 or 1 (nothing there),
    never a usage error."""
    lines = documented_commands(page, group)
    assert lines
    url = existing(f"sqlite:///{tmp_path / 'bot.db'}")
    for words in lines:
        args = [url if w == "sqlite:///bot.db" else w for w in words]
        result = await invoke(*args, env={"IDEM_STORE_URL": url})
        assert result.exit_code in (0, 1), (words, result.output)
