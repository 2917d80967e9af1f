"""docs/testing.md's worked examples run unchanged, as a bot author would run them: the
titled code blocks are written to a fresh directory and run by pytest with only the
installed plugin (pytest-asyncio in its default strict mode)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from telegram_idem.testing._stores import SERVER_STORES

pytest_plugins = ["pytester"]

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"
BLOCK = re.compile(r'```python title="(?P<name>[^"]+)"\n(?P<code>.*?)\n```', re.DOTALL)


def titled_blocks() -> dict[str, str]:
    return {m["name"]: m["code"] + "\n" for m in BLOCK.finditer(DOC.read_text(encoding="utf-8"))}


def test_the_page_has_both_worked_examples_and_the_conformance_example() -> None:
    assert set(titled_blocks()) == {
        "shop_aiogram.py",
        "test_shop_aiogram.py",
        "shop_ptb.py",
        "test_shop_ptb.py",
        "my_store.py",
        "test_my_store.py",
    }


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A fresh directory holding the page's titled blocks, no store setting inherited."""
    for name in (*(s.env for s in SERVER_STORES.values()), "IDEM_STORES", "IDEM_REQUIRE_STORES"):
        monkeypatch.delenv(name, raising=False)
    for name, code in titled_blocks().items():
        (pytester.path / name).write_text(code, encoding="utf-8")
    return pytester


def test_the_worked_examples_pass(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess(
        "-p", "no:cacheprovider", "-rs", "test_shop_aiogram.py", "test_shop_ptb.py"
    )
    # 4 aiogram + 3 PTB tests, each on memory and sqlite (the default stores)
    result.assert_outcomes(passed=7 * 2)


def test_the_conformance_example_runs_the_whole_suite_on_the_custom_store(
    project: pytest.Pytester,
) -> None:
    collected = project.runpytest_subprocess(
        "-p", "no:cacheprovider", "--collect-only", "-q", "test_my_store.py"
    )
    count = re.search(r"(\d+) tests? collected", collected.stdout.str())
    assert count is not None, collected.stdout.str()
    assert int(count.group(1)) >= 50  # the record, concurrency, model and inbox contracts
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-rs", "test_my_store.py")
    result.assert_outcomes(passed=int(count.group(1)))
