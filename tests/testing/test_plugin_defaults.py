"""The plugin as a bot author meets it with nothing configured: memory and SQLite run,
server stores only when asked for (one clear skip reason, or a failure when required),
and an aiohttp-based fixture without aiohttp names the extra to install."""

from __future__ import annotations

import pytest

from telegram_idem.testing._stores import SERVER_STORES

pytest_plugins = ["pytester"]

SERVER_ENV = tuple(store.env for store in SERVER_STORES.values())

WHICH_STORE = """
import pytest

@pytest.mark.asyncio
async def test_store(idem_store_name, idem_store):
    assert await idem_store.get("nothing") is None
"""


@pytest.fixture
def fresh(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A project with no store configuration, no server URL and no Docker."""
    for name in (*SERVER_ENV, "IDEM_STORES", "IDEM_REQUIRE_STORES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    pytester.makepyfile(WHICH_STORE)
    return pytester


def test_nothing_configured_runs_memory_and_sqlite_and_skips_nothing(
    fresh: pytest.Pytester,
) -> None:
    result = fresh.runpytest_subprocess("-v", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*telegram-idem stores: memory, sqlite"])
    result.stdout.fnmatch_lines(["*test_store?memory? PASSED*", "*test_store?sqlite? PASSED*"])


def test_a_server_store_asked_for_and_missing_skips_with_one_reason(
    fresh: pytest.Pytester,
) -> None:
    result = fresh.runpytest_subprocess("-rs", "-p", "no:cacheprovider", "--idem-stores=postgres")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        ["SKIPPED*no postgres store configured: pass --idem-postgres-url=*"]
    )


def test_the_environment_selects_stores(
    fresh: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IDEM_STORES", "sqlite,redis")
    result = fresh.runpytest_subprocess("-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*test_store?sqlite? PASSED*", "*test_store?redis? SKIPPED*"])


@pytest.mark.parametrize("how", ["flag", "env", "ini"])
def test_required_stores_fail_instead_of_skipping(
    how: str, fresh: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["-p", "no:cacheprovider", "--idem-stores=memory,dynamodb"]
    if how == "flag":
        args.append("--idem-require-stores")
    elif how == "env":
        monkeypatch.setenv("IDEM_REQUIRE_STORES", "1")
    else:
        fresh.makeini("[pytest]\nidem_require_stores = true\n")
    result = fresh.runpytest_subprocess(*args)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*required store missing: no dynamodb store configured*"])


def test_fake_bot_api_without_aiohttp_names_the_testing_extra(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        """
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "aiohttp":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

for name in [m for m in sys.modules if m.split(".")[0] == "aiohttp"]:
    del sys.modules[name]
sys.meta_path.insert(0, Block())
"""
    )
    pytester.makepyfile(
        """
import pytest

@pytest.mark.asyncio
async def test_api(fake_bot_api):
    pass
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    assert "the fake_bot_api fixture needs aiohttp" in out
    assert "pip install 'telegram-idem[testing]'" in out
    assert "Traceback" not in out and "ModuleNotFoundError" not in out
