"""One scheme for test services: what scripts/services.py exports, what the benchmarks
read and what .ci/run requires are the pytest plugin's variables, and no file of the
repository still names the old ``IDEM_TEST_*`` or ``IDEM_REQUIRE_SERVICES`` variables."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from services import load_services_script

from telegram_idem.testing._stores import SERVER_STORES

ROOT = Path(__file__).resolve().parents[2]


def exported(lines: str) -> dict[str, str]:
    """``export NAME=VALUE`` lines as the shell reads them."""
    out: dict[str, str] = {}
    for line in lines.splitlines():
        words = shlex.split(line)
        assert words[0] == "export", line
        name, _, value = words[1].partition("=")
        out[name] = value
    return out


def test_the_services_script_exports_the_plugin_variables() -> None:
    module = load_services_script()
    started = module.Services(dir="/nonexistent", redis_ports=[7001, 7002], moto_port=8123)
    assert exported(started.exports()) == {
        SERVER_STORES["redis-cluster"].env: "redis+cluster://127.0.0.1:7001",
        SERVER_STORES["dynamodb"].env: (
            "dynamodb://idem_test?endpoint_url=http://127.0.0.1:8123&region=us-east-1"
        ),
    }
    assert module.Services(dir="/nonexistent").exports() == ""


def test_no_tracked_file_names_the_old_variables() -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    old = ("IDEM_TEST_", "IDEM_REQUIRE_SERVICES")
    found = [
        name
        for name in files.split("\0")
        if name and name != "tests/meta/test_services_scheme.py"
        for text in [_text(ROOT / name)]
        if any(o in text for o in old)
    ]
    assert found == []


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
        return ""


def test_ci_requires_every_store_the_plugin_way() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "export IDEM_REQUIRE_STORES=1" in ci
    assert SERVER_STORES["redis-cluster"].env in ci
