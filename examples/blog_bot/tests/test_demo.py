"""The README's first command, as a test: the demo runs and every invariant holds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from examples.blog_bot.demo import run_demo

ROOT = Path(__file__).resolve().parents[3]


async def test_demo_invariants_hold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert await run_demo(workdir=str(tmp_path), delay_scale=0.01) == 0
    out = capsys.readouterr().out
    assert "all invariants hold" in out
    assert "✘" not in out
    assert "one commit per published post" in out


def test_demo_command_line_exits_zero(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "examples.blog_bot", "demo", "--workdir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "commits made" in done.stdout
    assert (tmp_path / "blog_bot.db").exists()
