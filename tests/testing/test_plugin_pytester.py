"""The ``telegram_idem`` pytest plugin, tested the way a bot author meets it: a generated
test file in a fresh directory, run by ``pytester`` with only the installed entry point
(no conftest), in pytest-asyncio's default *strict* mode."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest

from telegram_idem.testing._stores import SERVER_STORES

pytest_plugins = ["pytester"]

SERVER_ENV = tuple(store.env for store in SERVER_STORES.values())

STORE_TESTS = """
import time

import pytest

from telegram_idem import CallbackTokens, ExpiredCallbackTokenError

pytestmark = pytest.mark.asyncio  # strict mode, as in a bot author's project


async def test_store_claims_and_leases_follow_the_clock(
    idem_store, idem_store_name, idem_store_url, idem_clock, idem_keys
):
    key = idem_keys.action(1, "charge")
    first = await idem_store.claim(key, lease=30, retention=3600)
    assert first.outcome.value == "acquired"
    assert (await idem_store.claim(key, lease=30, retention=3600)).outcome.value == "in_progress"
    idem_clock.advance(31)  # the holder "crashed": its lease ends on the clock
    taken = await idem_store.claim(key, lease=30, retention=3600)
    assert taken.outcome.value == "acquired" and taken.token == first.token + 1
    assert await idem_store.get(key) is not None
    assert idem_store_url.startswith(idem_store_name[:4])


async def test_idem_retention_wait_and_token_expiry_without_sleeping(idem, idem_clock):
    calls = []

    async def charge():
        calls.append(idem_clock())
        return len(calls)

    key = idem.keys.action(1, "pay:1")
    assert await idem.run(key, charge) == 1
    assert await idem.run(key, charge) == 1  # replayed
    idem_clock.advance(idem.action_retention + 1)  # retention over: a new action
    assert await idem.run(key, charge) == 2

    stuck = idem.keys.action(1, "stuck")
    await idem.store.claim(stuck, lease=idem.lease, retention=3600)  # never completed
    before, started = idem_clock(), time.monotonic()
    assert await idem.run(stuck, charge, in_progress="wait") == 3
    assert idem_clock() - before >= idem.lease  # waited a whole lease on the clock...
    assert time.monotonic() - started < 20  # ...not in real time

    tokens = CallbackTokens(idem, "s" * 32, ttl=600)
    data = await tokens.issue("del", {"slug": "a"}, bot_id=1)
    assert await tokens.resolve(data, bot_id=1) == {"slug": "a"}
    idem_clock.advance(601)
    with pytest.raises(ExpiredCallbackTokenError):
        await tokens.resolve(data, bot_id=1)
"""

TELEGRAM_TESTS = """
import asyncio

import pytest
from aiogram import Dispatcher, F, Router
from aiogram.types import CallbackQuery
from aiohttp import web

from telegram_idem import idempotent
from telegram_idem.adapters.aiogram import IdempotencyMiddleware
from telegram_idem.testing import (
    aiogram_bot,
    assert_every_callback_answered,
    assert_no_update_lost,
    assert_ran_once,
    assert_step_ran_once,
)

pytestmark = pytest.mark.asyncio


async def test_replay_fake_bot_api_and_assertions(idem, fake_bot_api, update_factory, replay):
    router = Router()

    @idempotent(key="del:{callback_data}", in_progress="wait")
    async def delete(data):
        await idem.step("commit", asyncio.sleep, 0.01, "sha")
        return "deleted"

    @router.callback_query(F.data.startswith("del:"))
    async def on_tap(query: CallbackQuery):
        await query.answer(await delete(query.data))

    dp = Dispatcher()
    dp.update.outer_middleware(IdempotencyMiddleware(idem))
    dp.include_router(router)
    async with aiogram_bot(fake_bot_api) as bot:
        tap = update_factory.callback_query("del:1")
        result = await replay((dp, bot)).concurrent(tap, 5)
        assert_ran_once(result, delete)
        assert_step_ran_once(result, "commit")
        assert_no_update_lost(result)
        taps = await replay((dp, bot)).double_tap(update_factory.double_tap(tap))
        assert taps.runs(delete) == 0 and taps.duplicates_absorbed == 2
        assert_every_callback_answered(fake_bot_api, taps)
        with pytest.raises(AssertionError, match="ran 0 time"):
            assert_ran_once(taps, delete)


async def test_telegram_delivery_resends_after_a_500(telegram_delivery, update_factory):
    answers = iter([500, 200])

    async def hook(request):
        return web.Response(status=next(answers))

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        delivery = telegram_delivery(f"http://{host}:{port}/hook", retry_delay=0)
        report = await delivery.deliver(update_factory.message("hi"))
        assert report.statuses == [500, 200]
    finally:
        await runner.cleanup()


def test_update_factory_dates_follow_the_clock(update_factory, idem_clock):
    idem_clock.advance(3600)
    assert update_factory.message()["message"]["date"] == int(idem_clock())
"""

WHICH_STORE = """
import pytest

@pytest.mark.asyncio
async def test_store(idem_store_name, idem_store):
    assert await idem_store.get("nothing") is None
"""


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No store setting leaks in from the outer environment (CI requires every store)."""
    for name in (*SERVER_ENV, "IDEM_STORES", "IDEM_REQUIRE_STORES"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_every_fixture_in_a_fresh_project(pytester: pytest.Pytester, clean_env: object) -> None:
    pytester.makepyfile(test_stores=STORE_TESTS, test_telegram=TELEGRAM_TESTS)
    result = pytester.runpytest_subprocess(
        "-rs", "-p", "no:cacheprovider", "--idem-stores=memory,sqlite,postgres,redis,dynamodb"
    )
    # memory and sqlite pass; postgres, redis and dynamodb skip (asked for: no URL, no Docker)
    result.assert_outcomes(passed=3 * 2 + 2, skipped=3 * 3)
    result.stdout.fnmatch_lines(["*telegram-idem stores: memory, sqlite, postgres (no url)*"])
    out = result.stdout.str()
    for what in ("--idem-postgres-url=", "IDEM_POSTGRES_URL", "idem_postgres_url"):
        assert what in out
    for what in ("IDEM_REDIS_URL", "IDEM_DYNAMODB_URL", "--idem-stores=memory,sqlite"):
        assert what in out


def test_the_cli_flag_wins_over_the_ini_option(
    pytester: pytest.Pytester, clean_env: object
) -> None:
    pytester.makeini("[pytest]\nidem_stores = sqlite\n")
    pytester.makepyfile(WHICH_STORE)
    by_ini = pytester.runpytest_subprocess("-v")
    by_ini.assert_outcomes(passed=1)
    by_ini.stdout.fnmatch_lines(["*test_store?sqlite? PASSED*"])
    by_flag = pytester.runpytest_subprocess("-v", "--idem-stores=memory,redis")
    by_flag.assert_outcomes(passed=1, skipped=1)
    by_flag.stdout.fnmatch_lines(["*test_store?memory? PASSED*", "*test_store?redis? SKIPPED*"])


def test_a_configured_server_that_does_not_answer_fails(
    pytester: pytest.Pytester, clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.setenv("IDEM_REDIS_URL", f"redis://127.0.0.1:{closed_port()}/0")
    pytester.makepyfile(WHICH_STORE)
    result = pytester.runpytest_subprocess("--idem-stores=redis")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*redis store configured but not answering*"])


def test_unknown_store_names_are_a_usage_error(
    pytester: pytest.Pytester, clean_env: object
) -> None:
    pytester.makepyfile(WHICH_STORE)
    result = pytester.runpytest_subprocess("--idem-stores=memory,mongo")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*unknown store(s)*mongo*known: memory*"])


def test_without_docker_or_testcontainers_the_skip_says_why(
    pytester: pytest.Pytester, clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{closed_port()}")
    pytester.makeini("[pytest]\nidem_testcontainers = false\n")
    pytester.makepyfile(WHICH_STORE)
    result = pytester.runpytest_subprocess("-rs", "--idem-stores=dynamodb")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*idem_testcontainers is false*"])


@pytest.mark.parametrize(
    ("name", "factory"),
    [
        ("postgres", "postgres_url_factory"),
        ("redis", "redis_url_factory"),
        ("redis-cluster", "redis_cluster_url_factory"),
        ("dynamodb", "dynamodb_url_factory"),
    ],
    ids=["postgres", "redis", "redis-cluster", "dynamodb"],
)
def test_server_store_runs_isolated_and_cleans_up(
    name: str,
    factory: str,
    pytester: pytest.Pytester,
    clean_env: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """Against the repo's test services (skipped when absent, like the store suite)."""
    url_factory: Callable[[], str] = request.getfixturevalue(factory)
    url = url_factory()
    clean_env.setenv(SERVER_STORES[name].env, url)
    pytester.makepyfile(test_stores=STORE_TESTS)
    result = pytester.runpytest_subprocess(f"--idem-stores={name}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert records_left(name, url) == 0  # each test's prefix was purged at teardown


def records_left(name: str, url: str) -> int:
    """How many records the store at ``url`` still holds (its own table/prefix)."""
    code = {
        "redis": """
import redis, redis.cluster, sys
from urllib.parse import parse_qs, urlsplit
url = sys.argv[1]
parts = urlsplit(url)
prefix = parse_qs(parts.query)["key_prefix"][0]
if parts.scheme == "redis+cluster":
    host, port = parts.netloc.rpartition("@")[2].split(",")[0].rsplit(":", 1)
    client = redis.cluster.RedisCluster(host=host, port=int(port))
else:
    client = redis.Redis.from_url(url.split("?")[0])
print(len(list(client.scan_iter(match=prefix + ":*"))))
""",
        "postgres": """
import asyncio, sys, asyncpg
from urllib.parse import parse_qs, urlsplit
url = sys.argv[1]
prefix = parse_qs(urlsplit(url).query)["table_prefix"][0]
async def main():
    conn = await asyncpg.connect(url.split("?")[0])
    print(await conn.fetchval(f'SELECT count(*) FROM "{prefix}_records"'))
    await conn.close()
asyncio.run(main())
""",
        "dynamodb": """
import sys, boto3
from urllib.parse import parse_qs, urlsplit
url = sys.argv[1]
parts = urlsplit(url)
query = parse_qs(parts.query)
client = boto3.client("dynamodb", region_name="us-east-1", endpoint_url=query["endpoint_url"][0],
                      aws_access_key_id="testing", aws_secret_access_key="testing")
print(client.scan(TableName=parts.netloc, Select="COUNT", ConsistentRead=True)["Count"])
""",
    }["redis" if name.startswith("redis") else name]
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(done.stdout.strip())


def test_plugin_and_testing_import_without_frameworks(tmp_path: os.PathLike[str]) -> None:
    """aiogram, python-telegram-bot and aiohttp absent: the plugin still loads; only the
    aiohttp-based helpers fail, on first use, with ImportError."""
    code = textwrap.dedent(
        """
        import importlib.abc, sys

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {"aiogram", "telegram", "aiohttp"}:
                    raise ImportError(f"blocked {name}")
                return None

        sys.meta_path.insert(0, Block())
        import telegram_idem.testing.plugin
        import telegram_idem.testing as t
        update = t.UpdateFactory().command("/start")
        assert update["message"]["text"] == "/start"
        try:
            t.FakeBotAPI
        except ImportError:
            print("lazy ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "lazy ok"


NATS_TESTS = """
def test_broker(idem_nats_url):
    assert idem_nats_url.startswith("nats://")
"""

NO_NATS_AT_THE_DEFAULT = """
import telegram_idem.testing.plugin as plugin

plugin.nats_answers = lambda url, timeout=1.0: False  # nothing greets on 127.0.0.1:4222
"""


def test_the_nats_url_skips_without_a_server_and_fails_when_stores_are_required(
    pytester: pytest.Pytester, clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.delenv("IDEM_NATS_URL", raising=False)
    pytester.makeconftest(NO_NATS_AT_THE_DEFAULT)
    pytester.makepyfile(test_nats=NATS_TESTS)
    skipped = pytester.runpytest_subprocess("-rs", "-p", "no:cacheprovider")
    skipped.assert_outcomes(skipped=1)
    skipped.stdout.fnmatch_lines(["*no NATS server*IDEM_NATS_URL*"])
    required = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--idem-require-stores")
    required.assert_outcomes(errors=1)
    required.stdout.fnmatch_lines(["*required store missing: no NATS server*"])
    given = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--idem-nats-url=nats://127.0.0.1:1"
    )
    given.assert_outcomes(passed=1)  # a URL given is used as given
