"""The plugin's server finding and isolation, as a project meets them in a fresh
directory: the ``pytest_idem_server_url`` hook, the redis-cluster options,
``idem_store_url_factory`` / ``idem_store_factory``, and the deselection of
``idem_shared_state`` tests on a conformance class whose objects share nothing."""

from __future__ import annotations

import socket

import pytest
from services import redis_url

from telegram_idem.testing._stores import SERVER_STORES

pytest_plugins = ["pytester"]


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A fresh directory with no store setting from the outer environment, no Docker."""
    for name in (*(s.env for s in SERVER_STORES.values()), "IDEM_STORES", "IDEM_REQUIRE_STORES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    return pytester


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


ISOLATED = """
import pytest

pytestmark = pytest.mark.asyncio


async def test_isolated_urls_and_second_connections(
    idem_store_name, idem_store_url_factory, idem_store_factory
):
    first, second = idem_store_url_factory(), idem_store_url_factory()
    a = await idem_store_factory(first)
    b = await idem_store_factory(first)  # another connection on the same URL
    other = await idem_store_factory(second)
    held = await a.claim("k", lease=30, retention=60)
    assert held.outcome.value == "acquired"
    seen = (await b.claim("k", lease=30, retention=60)).outcome.value
    assert seen == ("acquired" if idem_store_name == "memory" else "in_progress")
    assert (await other.claim("k", lease=30, retention=60)).outcome.value == "acquired"
    if idem_store_name != "memory":
        assert first != second
"""


def test_the_url_factory_isolates_and_the_store_factory_shares(project: pytest.Pytester) -> None:
    project.makepyfile(ISOLATED)
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=2)  # memory and sqlite


def test_a_conftest_hook_names_the_server_when_none_is_configured(
    project: pytest.Pytester,
) -> None:
    base = redis_url()  # the suite's own Redis (skips without one)
    project.makeconftest(
        f"""
import pytest

asked = []

@pytest.hookimpl
def pytest_idem_server_url(config, name):
    asked.append(name)
    assert asked.count(name) == 1, "asked once per session"
    return {base!r} if name == "redis" else None
"""
    )
    project.makepyfile(ISOLATED, test_again=ISOLATED)
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--idem-stores=redis", "-v")
    result.assert_outcomes(passed=2)


def test_a_hook_that_raises_says_why_in_the_skip(project: pytest.Pytester) -> None:
    project.makeconftest(
        """
import pytest

@pytest.hookimpl
def pytest_idem_server_url(config, name):
    raise RuntimeError(f"no {name} on this machine")
"""
    )
    project.makepyfile(ISOLATED)
    result = project.runpytest_subprocess(
        "-p", "no:cacheprovider", "-rs", "--idem-stores=redis-cluster"
    )
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*no redis-cluster store configured (pytest_idem_server_url: no redis-cluster on"
            " this machine): pass --idem-redis-cluster-url=redis+cluster://*"
        ]
    )
    assert "Docker" not in result.stdout.str()  # no container is started for a cluster


@pytest.mark.parametrize("how", ["flag", "env", "ini"])
def test_the_redis_cluster_url_is_set_like_the_others(
    how: str, project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"redis+cluster://127.0.0.1:{closed_port()}"
    args = ["-p", "no:cacheprovider", "--idem-stores=redis-cluster"]
    if how == "flag":
        args.append(f"--idem-redis-cluster-url={url}")
    elif how == "env":
        monkeypatch.setenv("IDEM_REDIS_CLUSTER_URL", url)
    else:
        project.makeini(f"[pytest]\nidem_redis_cluster_url = {url}\n")
    project.makepyfile(
        """
import pytest

@pytest.mark.asyncio
async def test_store(idem_store):
    pass
"""
    )
    result = project.runpytest_subprocess(*args)
    result.assert_outcomes(errors=1)  # configured, so not answering is a failure
    result.stdout.fnmatch_lines(["*redis-cluster store configured but not answering*"])


def test_shares_state_false_deselects_the_tests_of_os_processes(project: pytest.Pytester) -> None:
    project.makepyfile(
        """
import pytest

from telegram_idem.testing.conformance import StoreConformance


class TestShared(StoreConformance):
    @pytest.fixture
    def store_url_factory(self, tmp_path):
        return lambda: f"sqlite:///{tmp_path}/x.db"


class TestAlone(StoreConformance):
    shares_state = False

    @pytest.fixture
    def store_url_factory(self):
        return lambda: "memory://"
"""
    )
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q")
    out = result.stdout.str()
    assert "TestShared::test_claims_from_4_os_processes_acquire_once" in out
    assert "TestAlone::test_claims_from_4_os_processes_acquire_once" not in out
    assert "TestAlone::test_50_concurrent_claims_from_separate_connections_acquire_once" in out
    result.stdout.fnmatch_lines(["*1 deselected*"])


def test_a_conformance_class_without_a_url_factory_says_what_to_define(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(
        """
from telegram_idem.testing.conformance import StoreConformance


class TestForgotten(StoreConformance):
    pass
"""
    )
    result = project.runpytest_subprocess(
        "-p", "no:cacheprovider", "-k", "test_first_claim_acquires_a_new_record"
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*TestForgotten must define a store_url_factory fixture*"])
