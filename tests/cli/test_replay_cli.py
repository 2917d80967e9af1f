"""``telegram-idem replay`` against real webhooks on loopback: the library's own aiohttp
ingress admitting into an inbox on SQLite (each update admitted once, whatever the
re-sends and duplicate files), a webhook that fails first, a wrong secret, a URL nobody
listens on, a real subprocess, and Ctrl-C (SIGINT) in the middle of a run."""

from __future__ import annotations

import asyncio
import json
import shlex
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from click.testing import CliRunner, Result

from telegram_idem import Idem
from telegram_idem._cli import cli
from telegram_idem._cli._replay import percentile
from telegram_idem._cli._update_files import UpdateFileError, parse_updates
from telegram_idem.ingress import WebhookIngress
from telegram_idem.testing import UpdateFactory, serve_app

SECRET = "replay-secret_T0ken"
CLI = "from telegram_idem._cli import main; main()"


@dataclass
class Webhook:
    """A webhook on loopback: the library's ingress into an inbox on SQLite. With
    ``lose_first_answer`` an update the ingress admits is answered 500 instead (a proxy
    in front timing out): Telegram re-sends it, and the ingress must see a duplicate."""

    idem: Idem
    ingress: WebhookIngress
    url: str = ""
    requests: int = 0
    lose_first_answer: bool = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        admitted = self.ingress.admitted
        response = await self.ingress.handle(request)
        if self.lose_first_answer and self.ingress.admitted > admitted:
            return web.Response(status=500)  # only with --concurrency 1: no other request
        return response

    async def depth(self) -> int:
        return await self.idem.store.inbox().depth()


@pytest.fixture
async def webhook(tmp_path: Path) -> AsyncIterator[Webhook]:
    idem = Idem(f"sqlite:///{tmp_path / 'bot.db'}")
    hook = Webhook(idem, WebhookIngress(idem, bot_id=7, secret_token=SECRET))
    app = web.Application()
    app.router.add_post("/webhook", hook.handle)
    runner, base = await serve_app(app)
    hook.url = f"{base}/webhook"
    try:
        yield hook
    finally:
        await runner.cleanup()
        await idem.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def invoke(*args: str, stdin: str | None = None) -> Result:
    """The command in a thread (it runs its own event loop) while this loop serves."""
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args), input=stdin)


def summary_of(result: Result) -> dict[str, Any]:
    data = json.loads(result.stdout)
    assert isinstance(data, dict)
    return data


def write_jsonl(path: Path, updates: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(u) + "\n" for u in updates), encoding="utf-8")
    return str(path)


async def test_duplicate_files_in_flight_at_once_are_admitted_once(
    webhook: Webhook, tmp_path: Path
) -> None:
    factory = UpdateFactory()
    updates = [factory.command("/start"), factory.message("hi"), factory.message("again")]
    lines = write_jsonl(tmp_path / "updates.jsonl", updates)
    array = tmp_path / "array.json"
    array.write_text(json.dumps(updates[:2], indent=2), encoding="utf-8")
    single = tmp_path / "one.json"
    single.write_text(json.dumps(updates[2], indent=2), encoding="utf-8")
    result = await invoke(
        "replay", lines, str(array), str(single), lines,
        "--url", webhook.url, "--secret", SECRET, "--concurrency", "4", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = summary_of(result)
    assert summary["updates"] == summary["sent"] == summary["answered_2xx"] == 9
    assert (summary["failed"], summary["failed_update_ids"], summary["resends"]) == (0, [], 0)
    assert summary["statuses"] == {"200": 9}
    assert summary["p50_ms"] is not None and summary["p99_ms"] >= summary["p50_ms"]
    assert webhook.requests == 9
    assert (webhook.ingress.admitted, webhook.ingress.duplicates) == (3, 6)
    assert await webhook.depth() == 3


async def test_500_then_200_is_re_sent_counted_and_admitted_once(
    webhook: Webhook, tmp_path: Path
) -> None:
    factory = UpdateFactory()
    updates = [factory.message("one"), factory.message("two"), factory.message("three")]
    lines = write_jsonl(tmp_path / "updates.jsonl", updates)
    webhook.lose_first_answer = True
    result = await invoke(
        "replay", lines, lines, "--url", webhook.url, "--secret", SECRET, "--resend", "2", "--json"
    )
    assert result.exit_code == 0, result.output
    summary = summary_of(result)
    assert (summary["updates"], summary["answered_2xx"], summary["resends"]) == (6, 6, 3)
    assert summary["statuses"] == {"200": 6, "500": 3} and summary["failed"] == 0
    assert webhook.requests == 9  # 3 lost answers, 3 re-sends, 3 from the second file
    assert (webhook.ingress.admitted, webhook.ingress.duplicates) == (3, 6)
    assert await webhook.depth() == 3


async def test_wrong_secret_fails_every_update_and_admits_none(
    webhook: Webhook, tmp_path: Path
) -> None:
    factory = UpdateFactory()
    updates = [factory.message("one"), factory.message("two")]
    path = write_jsonl(tmp_path / "u.jsonl", updates)
    result = await invoke(
        "replay", path, "--url", webhook.url, "--secret", "not-the-secret", "--resend", "1"
    )
    assert result.exit_code == 1, result.output
    ids = ", ".join(str(u["update_id"]) for u in updates)
    assert f"error: 2 of 2 updates were never answered 2xx (update_id {ids})" in result.stderr
    assert "failed (never 2xx)" in result.stdout and "401: 4" in result.stdout
    assert "re-sends" in result.stdout
    assert await webhook.depth() == 0 and webhook.ingress.admitted == 0


async def test_secret_from_the_environment_and_updates_from_stdin(webhook: Webhook) -> None:
    update = UpdateFactory().message("piped")
    result = await asyncio.to_thread(
        CliRunner(env={"WEBHOOK_SECRET": SECRET}).invoke,
        cli,
        ["replay", "-", "--url", webhook.url, "--json"],
        input=json.dumps(update),
    )
    assert result.exit_code == 0, result.output
    assert summary_of(result)["statuses"] == {"200": 1}
    assert webhook.ingress.admitted == 1


async def test_a_url_nobody_listens_on_exits_3_after_one_update(tmp_path: Path) -> None:
    factory = UpdateFactory()
    path = write_jsonl(tmp_path / "u.jsonl", [factory.message(str(i)) for i in range(4)])
    url = f"http://127.0.0.1:{free_port()}/webhook"
    result = await invoke("replay", path, "--url", url, "--resend", "1", "--json")
    assert result.exit_code == 3, result.output
    assert f"error: could not reach {url}" in result.stderr
    summary = summary_of(result)
    assert (summary["sent"], summary["not_sent"], summary["failed"]) == (1, 3, 1)
    assert summary["statuses"] == {"no connection": 2}
    assert summary["unreachable"]


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ('{"update_id": 1}\n{"update_id": 2}\n{"update_id": 3, x}\n', "f:3:18", "not JSON"),
        ('{"update_id": 1}\n{"update_id": 2\n{"update_id": 3}\n', "f:2:16", "not JSON"),
        ('[\n  {"update_id": 1},\n  {"message": {}}\n]', "f:3:3", "without 'update_id'"),
        ('{"update_id": "5"}', "f:1:1", "not an integer ('5')"),
        ('[{"update_id": true}]', "f:1:2", "not an integer (True)"),
        ('{"update_id": 1}\n[1, 2]\n', "f:2:1", "a JSON array, not a JSON object"),
        ('[{"update_id": 1} {"update_id": 2}]', "f:1:19", "expected ',' or ']'"),
        ('[{"update_id": 1}] x', "f:1:20", "more after the array"),
        ('[{"update_id": 1}', "f:1:18", "found the end of the file"),
        ("  \n", "f", "the file is empty"),
        ("[ ]", "f:1:1", "an empty array"),
        ("[" * 100_000 + "]" * 100_000, "f:1:2", "nested too deeply"),
        (
            '{"update_id": 1, "m": ' + "[" * 100_000 + "]" * 100_000 + "}",
            "f:1:1",
            "nested too deeply",
        ),
    ],
)
def test_a_bad_file_is_refused_with_its_position(text: str, where: str, what: str) -> None:
    with pytest.raises(UpdateFileError) as caught:
        parse_updates(text, "f")
    message = str(caught.value)
    assert message.startswith(f"{where}: "), message
    assert what in message


def test_the_three_shapes_read_with_their_lines() -> None:
    one = parse_updates('\ufeff{\n  "update_id": 1\n}', "a")
    assert [(r.update_id, r.source) for r in one] == [(1, "a:1")]
    lines = parse_updates('{"update_id": 1}\n\n{"update_id": 2}\n', "b")
    assert [(r.update_id, r.source) for r in lines] == [(1, "b:1"), (2, "b:3")]
    array = parse_updates('[\n {"update_id": 5},\n {"update_id": 5}\n]', "c")
    assert [(r.update_id, r.source) for r in array] == [(5, "c:2"), (5, "c:3")]


async def test_a_bad_file_sends_nothing_from_any_file(webhook: Webhook, tmp_path: Path) -> None:
    good = write_jsonl(tmp_path / "good.jsonl", [UpdateFactory().message("fine")])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"update_id": 10}\n{"update_id": 11, "message": }\n', encoding="utf-8")
    latin = tmp_path / "latin.json"
    latin.write_bytes('{"update_id": 1, "text": "café"}'.encode("latin-1"))
    result = await invoke("replay", good, str(bad), "--url", webhook.url, "--secret", SECRET)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {bad}:2:30: not JSON (Expecting value)")
    result = await invoke("replay", str(latin), "--url", webhook.url, "--secret", SECRET)
    assert (result.exit_code, result.stderr) == (2, f"error: {latin}: not UTF-8 (byte 29)\n")
    assert webhook.requests == 0


async def test_bad_options_are_usage_errors(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "u.jsonl", [UpdateFactory().message("x")])
    for args in (
        ["--url", "ftp://127.0.0.1/x"],
        ["--url", "http://127.0.0.1:1/x", "--secret", "has spaces"],
        ["--url", "http://127.0.0.1:1/x", "--concurrency", "0"],
        ["--url", "http://127.0.0.1:1/x", "--timeout", "0"],
    ):
        result = await invoke("replay", path, *args)
        assert result.exit_code == 2, (args, result.output)
    assert (
        await invoke("replay", str(tmp_path / "missing.json"), "--url", "http://h/")
    ).exit_code == 2


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 0.5), percentile(values, 0.99)) == (50.0, 99.0)
    assert percentile([3.0], 0.99) == 3.0 and percentile([], 0.5) is None


@dataclass
class Holding:
    """A webhook that takes every request and answers none until released."""

    url: str = ""
    arrived: list[int] = field(default_factory=list)
    in_flight: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    wanted: int = 2

    async def handle(self, request: web.Request) -> web.Response:
        self.arrived.append(json.loads(await request.read())["update_id"])
        if len(self.arrived) >= self.wanted:
            self.in_flight.set()
        await self.release.wait()
        return web.Response(text="")


async def run_cli(
    *args: str,
) -> tuple[asyncio.subprocess.Process, Callable[[], Awaitable[tuple[int, str, str]]]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLI, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip

    async def finished() -> tuple[int, str, str]:
        out, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    return proc, finished


async def test_a_real_subprocess_replays_into_the_ingress(webhook: Webhook, tmp_path: Path) -> None:
    factory = UpdateFactory()
    path = write_jsonl(tmp_path / "u.jsonl", [factory.message("a"), factory.message("b")])
    _, finished = await run_cli("replay", path, path, "--url", webhook.url, "--secret", SECRET)
    code, out, err = await finished()
    assert code == 0, err
    assert f"replay to {webhook.url}" in out and "answered 2xx" in out
    assert "200: 4" in out
    assert (webhook.ingress.admitted, webhook.ingress.duplicates) == (2, 2)
    assert await webhook.depth() == 2


async def test_sigint_cancels_what_is_in_flight_and_prints_the_summary(tmp_path: Path) -> None:
    hook = Holding()
    app = web.Application()
    app.router.add_post("/webhook", hook.handle)
    runner, base = await serve_app(app)
    hook.url = f"{base}/webhook"
    factory = UpdateFactory()
    path = write_jsonl(tmp_path / "u.jsonl", [factory.message(str(i)) for i in range(5)])
    try:
        proc, finished = await run_cli(
            "replay", path, "--url", hook.url, "--concurrency", "2", "--timeout", "600", "--json"
        )
        await hook.in_flight.wait()  # two requests are waiting for their answers
        proc.send_signal(signal.SIGINT)
        code, out, err = await finished()
    finally:
        hook.release.set()
        await runner.cleanup()
    assert code == 130, err
    assert "interrupted: stopped" in err
    summary = json.loads(out)
    assert summary["interrupted"] is True
    assert (summary["sent"], summary["in_flight"], summary["not_sent"]) == (0, 2, 3)
    assert len(hook.arrived) == 2  # nothing more was sent after Ctrl-C


async def test_the_deploy_pages_replay_example_runs(webhook: Webhook, tmp_path: Path) -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "deploy-webhook.md"
    text = page.read_text(encoding="utf-8")
    marker = "<!-- cli-example: replay -->\n```sh\n"
    start = text.index(marker) + len(marker)
    [line] = text[start : text.index("```", start)].replace("\\\n", " ").strip().splitlines()
    program, *args = shlex.split(line)
    assert program == "telegram-idem" and "--url" in args
    factory = UpdateFactory()
    updates = write_jsonl(tmp_path / "updates.jsonl", [factory.message("a"), factory.message("b")])
    url = args[args.index("--url") + 1]
    args = [
        updates if a == "updates.jsonl" else webhook.url if a == url else a
        for a in (a.replace("$WEBHOOK_SECRET", SECRET) for a in args)
    ]
    result = await invoke(*args)
    assert result.exit_code == 0, result.output
    assert (webhook.ingress.admitted, webhook.ingress.duplicates) == (2, 2)


async def test_a_token_in_the_webhook_url_is_never_printed(tmp_path: Path) -> None:
    token = "7000000001:AAF" + "x" * 32
    path = write_jsonl(tmp_path / "u.jsonl", [UpdateFactory().message("x")])

    async def fail(request: web.Request) -> web.Response:
        return web.Response(status=500)

    app = web.Application()
    app.router.add_post(f"/bot{token}/hook", fail)
    runner, base = await serve_app(app)
    try:
        url = f"{base}/bot{token}/hook"
        table_run = await invoke("replay", path, "--url", url, "--resend", "0")
        json_run = await invoke("replay", path, "--url", url, "--resend", "0", "--json")
    finally:
        await runner.cleanup()
    down = await invoke("replay", path, "--url", url, "--resend", "0")  # nobody listens now
    for result, code in ((table_run, 1), (json_run, 1), (down, 3)):
        assert result.exit_code == code
        printed = result.stdout + result.stderr
        assert token not in printed and token.split(":")[1] not in printed, printed
        assert "/bot<token>/hook" in printed
