"""Every ```python block of ``docs/*.md`` and ``README.md`` runs as the page says.

How a block runs is chosen by an HTML comment on the line just above its fence (the
rendered site does not show it):

| marker | what the harness does |
|---|---|
| none | runs in the page's namespace, after the page's earlier blocks (a page reads top to bottom), in this process; top-level ``await`` allowed; 30 s at most |
| ``<!-- doctest: program webhook -->`` | a complete program: started as its own process against a local Bot API (``FakeBotAPI``) with ``BOT_TOKEN``, ``TELEGRAM_API_URL``, ``WEBHOOK_SECRET``, ``PORT`` and ``WEBHOOK_URL`` in its environment; an update is POSTed to ``/webhook`` with the secret; it must answer 200, send a message, and exit cleanly on SIGINT |
| ``<!-- doctest: program polling -->`` | as above, but the update is queued for ``getUpdates`` (with a webhook set beforehand, which the program must delete) |
| ``<!-- doctest: skip REASON -->`` | not run, for a block that needs a machine this suite does not have; the reason is required |
| ``title="name.py"`` on the fence | a file of a worked example, run as a file by another test (``RUN_ELSEWHERE``) |

Whatever its marker, every block must compile and its imports must import.
The names a page leaves to the reader (``BOT_TOKEN`` in a fragment, say) come from
``PRELUDES`` below, visibly, never from hidden patching.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import os
import re
import signal
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from telegram_idem.testing import DEFAULT_TOKEN, UpdateFactory
from telegram_idem.testing.bot_api import FakeBotAPI

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

FENCE = re.compile(r"^```python(?P<info>[^\n]*)\n(?P<code>.*?)^```\s*$", re.DOTALL | re.MULTILINE)
MARKER = re.compile(r"<!--\s*doctest:\s*(?P<kind>\w+)\s*(?P<arg>.*?)\s*-->\s*$")
TITLE = re.compile(r'title="(?P<name>[^"]+)"')

RUN_ELSEWHERE = {"testing.md": "tests/testing/test_docs_testing.py runs the worked examples"}
"""Pages whose titled blocks are files run by another test (with the reason)."""

SECRET = "doc-test-secret"

PRELUDES: dict[str, str] = {
    "concepts.md": """
BOT_TOKEN = "7000000001:AAFakeTokenForTestsOnly"
message_id, order = 42, "order-42"
async def handle(update: dict) -> None: ...
async def charge(order: str) -> str:
    return f"receipt-{order}"
""",
    "store-postgres.md": """
import ssl
ssl_context = ssl.create_default_context()
""",
    "deploy-lambda.md": """
import json
from telegram_idem.testing import UpdateFactory
function_url_event = {
    "requestContext": {"http": {"method": "POST"}},
    "headers": {"content-type": "application/json"},
    "body": json.dumps(UpdateFactory().message("hello")),
    "isBase64Encoded": False,
}
""",
    "deploy-ptb.md": """
from telegram_idem import Idem
TOKEN = "7000000001:AAFakeTokenForTestsOnly"
idem = Idem("memory://")
""",
    "testing.md": """
from telegram_idem.testing import OMIT, UpdateFactory
update_factory = UpdateFactory()
""",
}
"""Names a page's fragments take from the reader's own code, per page."""

ENV = {"BOT_TOKEN": DEFAULT_TOKEN, "WEBHOOK_SECRET": SECRET}
"""Environment of the in-process blocks (a page that reads ``os.environ``)."""


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    code: str
    kind: str  # "run", "program", "skip", "file"
    arg: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    """The page's python blocks, with the marker above each."""
    text = page.read_text(encoding="utf-8")
    found: list[Block] = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        kind, arg = ("run", "") if marker is None else (marker["kind"], marker["arg"])
        if TITLE.search(match["info"]):
            kind, arg = "file", TITLE.search(match["info"])["name"]  # type: ignore[index]
        found.append(Block(page, line, match["code"], kind, arg))
    return found


ALL_BLOCKS = [b for page in PAGES for b in blocks_of(page)]


def compiled(block: Block) -> Any:
    return compile(
        block.code, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
    )


def test_the_harness_found_the_blocks() -> None:
    assert len(ALL_BLOCKS) >= 30
    kinds = {b.kind for b in ALL_BLOCKS}
    assert kinds <= {"run", "program", "skip", "file"}, kinds
    for block in ALL_BLOCKS:
        if block.kind == "skip":
            assert block.arg, f"{block.id}: a skip needs its reason"
        if block.kind == "program":
            assert block.arg in ("webhook", "polling"), f"{block.id}: program {block.arg!r}"
        if block.kind == "file":
            assert block.page.name in RUN_ELSEWHERE, f"{block.id}: who runs {block.arg}?"


def test_the_deploy_pages_have_complete_programs() -> None:
    programs = {b.page.name for b in ALL_BLOCKS if b.kind == "program"}
    assert {"deploy-webhook.md", "deploy-polling.md", "deploy-ptb.md"} <= programs


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda b: b.id)
def test_every_block_compiles_and_its_imports_import(block: Block) -> None:
    tree = ast.parse(block.code, block.id)  # a SyntaxError names page and line
    compiled(block)
    imports: list[ast.stmt] = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    namespace: dict[str, Any] = {}
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        exec(compile(ast.Module(body=imports, type_ignores=[]), block.id, "exec"), namespace)
    except ImportError as exc:
        beside = {Path(b.arg).stem for b in blocks_of(block.page) if b.kind == "file"}
        if block.kind == "file" and exc.name in beside:
            return  # a worked example's test file imports the example file beside it
        raise
    finally:
        sys.path.remove(str(ROOT / "docs"))


# ---------------------------------------------------------------------- in process


def pages_with_runnable_blocks() -> Iterator[Path]:
    for page in PAGES:
        if any(b.kind == "run" for b in blocks_of(page)):
            yield page


async def _close_what_a_page_opened(namespace: dict[str, Any]) -> None:
    from aiogram import Bot

    from telegram_idem import Idem
    from telegram_idem.backends._base import Store

    for value in list(namespace.values()):
        if isinstance(value, Bot):
            await value.session.close()
        elif isinstance(value, Idem | Store):
            await value.close()


@pytest.mark.parametrize("page", list(pages_with_runnable_blocks()), ids=lambda p: p.name)
async def test_the_page_runs_top_to_bottom(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # sqlite:///bot.db and friends land here
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    namespace: dict[str, Any] = {"__name__": f"doc_{page.stem.replace('-', '_')}"}
    prelude = PRELUDES.get(page.name)
    if prelude:
        exec(compile(prelude, f"prelude of {page.name}", "exec"), namespace)
    try:
        for block in blocks_of(page):
            if block.kind != "run":
                continue
            result = eval(compiled(block), namespace)
            if inspect.iscoroutine(result):
                async with asyncio.timeout(30):
                    await result
    finally:
        await _close_what_a_page_opened(namespace)


# ---------------------------------------------------------------------- programs


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _until(predicate: Any, *, limit: float, what: str, proc: Any) -> None:
    async with asyncio.timeout(limit):
        while not await predicate():
            if proc.returncode is not None:
                raise AssertionError(f"the program exited ({proc.returncode}) before {what}")
            await asyncio.sleep(0.05)


PROGRAMS = [b for b in ALL_BLOCKS if b.kind == "program"]


@pytest.mark.parametrize("block", PROGRAMS, ids=lambda b: b.id)
async def test_the_program_starts_handles_an_update_and_stops(block: Block, tmp_path: Path) -> None:
    program = tmp_path / "bot.py"
    program.write_text(block.code, encoding="utf-8")
    port = _free_port()
    update = UpdateFactory().command("/techpost")
    async with FakeBotAPI() as api:
        env = {
            **os.environ,
            "BOT_TOKEN": DEFAULT_TOKEN,
            "TELEGRAM_API_URL": api.url,
            "WEBHOOK_SECRET": SECRET,
            "PORT": str(port),
            "WEBHOOK_URL": f"http://127.0.0.1:{port}/webhook",
            "PYTHONUNBUFFERED": "1",
            "PYTHONWARNINGS": "always::ResourceWarning",
        }
        if block.arg == "polling":
            api.webhook.url = "https://old.example/webhook"  # the program must delete it
            api.queue_update(update)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(program),
            cwd=tmp_path,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            if block.arg == "webhook":
                await _post_when_listening(port, update, proc)

            async def replied() -> bool:
                return bool(api.calls_of("sendMessage"))

            await _until(replied, limit=30, what="it sent a message", proc=proc)
            proc.send_signal(signal.SIGINT)
            async with asyncio.timeout(45):
                _out, err = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    stderr = err.decode(errors="replace")
    assert proc.returncode == 0, f"exit {proc.returncode}\n{stderr}"
    for sign in ("Traceback", "Unclosed", "never awaited", "never retrieved"):
        assert sign not in stderr, f"{sign!r} on stderr:\n{stderr}"
    sent = api.calls_of("sendMessage")[0].params
    assert str(sent["chat_id"]) == str(update["message"]["chat"]["id"])
    if block.arg == "polling":
        assert api.webhook.url == "", "the webhook was not deleted before polling"


async def _post_when_listening(port: int, update: dict[str, Any], proc: Any) -> None:
    url = f"http://127.0.0.1:{port}/webhook"
    headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as session:
        async with asyncio.timeout(30):
            while True:
                if proc.returncode is not None:
                    _, err = await proc.communicate()
                    raise AssertionError(f"the program exited: {err.decode(errors='replace')}")
                try:
                    async with session.post(url, data=json.dumps(update), headers=headers) as r:
                        assert r.status == 200, f"webhook answered {r.status}: {await r.text()}"
                        return
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.1)
