"""``python -m examples.stars_shop.demo`` runs offline, as a reader would run it, and
every check it prints passes."""

from __future__ import annotations

import asyncio
import os
import sys

from examples._running import ROOT


async def test_the_demo_runs_offline_and_every_check_passes() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "always::ResourceWarning"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "examples.stars_shop.demo",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(120):
        out, err = await proc.communicate()
    stdout, stderr = out.decode(), err.decode(errors="replace")
    assert proc.returncode == 0, stdout + stderr
    assert stdout.count("✓") >= 15 and "✗" not in stdout, stdout
    assert stdout.rstrip().endswith("all checks passed"), stdout
    for sign in ("Traceback", "Unclosed", "never awaited"):
        assert sign not in stderr, stderr
