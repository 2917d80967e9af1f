"""docs/testing.md's worked examples run unchanged, as a bot author would run them: the
titled code blocks are written to a fresh directory and run by pytest with only the
installed plugin (pytest-asyncio in its default strict mode)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"
BLOCK = re.compile(r'```python title="(?P<name>[^"]+)"\n(?P<code>.*?)\n```', re.DOTALL)


def titled_blocks() -> dict[str, str]:
    return {m["name"]: m["code"] + "\n" for m in BLOCK.finditer(DOC.read_text(encoding="utf-8"))}


def test_the_page_has_both_worked_examples() -> None:
    assert set(titled_blocks()) == {
        "shop_aiogram.py",
        "test_shop_aiogram.py",
        "shop_ptb.py",
        "test_shop_ptb.py",
    }


def test_the_worked_examples_pass(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("IDEM_POSTGRES_URL", "IDEM_REDIS_URL", "IDEM_DYNAMODB_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, code in titled_blocks().items():
        (pytester.path / name).write_text(code, encoding="utf-8")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    # 4 aiogram + 3 PTB tests, each on memory and sqlite (the default stores)
    result.assert_outcomes(passed=7 * 2)
