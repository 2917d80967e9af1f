"""``telegram-idem webhook info|set|delete`` against the fake Bot API on loopback: what
each shows and changes, the warning about pending updates, Telegram's errors, a refused
token, an unreachable API, and the token never printed in any of it."""

from __future__ import annotations

import asyncio
import json
import shlex
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner, Result

from telegram_idem._cli import cli
from telegram_idem.testing import FakeBotAPI, Fault, UpdateFactory, serve_app

TOKEN = "7000000042:AAHfake-secret_part-of-the-token-xyz"
SECRET_PART = TOKEN.split(":", 1)[1]
DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture
async def api() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI() as fake:
        yield fake


async def webhook(*args: str, api_url: str, token: str = TOKEN) -> Result:
    """``telegram-idem webhook …`` in a thread (it runs its own loop) while this loop
    serves the fake; the token comes from $BOT_TOKEN. Every result is checked for the
    token."""
    runner = CliRunner(env={"BOT_TOKEN": token, "TELEGRAM_API_URL": api_url})
    result = await asyncio.to_thread(runner.invoke, cli, ["webhook", *args])
    printed = result.stdout + result.stderr
    if token:
        assert token not in printed and token.split(":", 1)[-1] not in printed, printed
    assert SECRET_PART not in printed
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def queue(api: FakeBotAPI, n: int) -> None:
    factory = UpdateFactory()
    for i in range(n):
        api.queue_update(factory.message(f"queued {i}"))


async def test_info_shows_the_webhook_fields(api: FakeBotAPI) -> None:
    queue(api, 2)
    result = await webhook("info", api_url=api.url)
    assert result.exit_code == 0, result.output
    assert "(none: no webhook" in result.stdout and "pending_update_count" in result.stdout

    api.webhook.url = "https://bot.example.com/webhook"
    api.webhook.ip_address = "203.0.113.7"
    api.webhook.last_error_date = 1_700_000_000
    api.webhook.last_error_message = "Wrong response from the webhook: 502 Bad Gateway"
    api.webhook.allowed_updates = ["message", "callback_query"]
    result = await webhook("info", api_url=api.url)
    assert result.exit_code == 0, result.output
    for shown in (
        "https://bot.example.com/webhook",
        "203.0.113.7",
        "2023-11-14 22:13:20 UTC",
        "502 Bad Gateway",
        "message, callback_query",
        "40",
    ):
        assert shown in result.stdout, shown
    data = json.loads((await webhook("info", "--json", api_url=api.url)).stdout)
    assert data["pending_update_count"] == 2 and data["last_error_date"] == 1_700_000_000
    assert [c.method for c in api.calls] == ["getWebhookInfo"] * 3


async def test_set_without_drop_warns_when_updates_are_pending(api: FakeBotAPI) -> None:
    queue(api, 3)
    result = await webhook(
        "set", "https://bot.example.com/webhook", "--secret-token", "s3cret-_x",
        "--max-connections", "5", "--allowed-updates", "message, callback_query",
        api_url=api.url,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "warning: 3 pending update(s)" in result.stderr
    assert "add --drop-pending-updates to discard them" in result.stderr
    assert "webhook set: https://bot.example.com/webhook (3 pending update(s) kept" in (
        result.stdout
    )
    assert api.webhook.url == "https://bot.example.com/webhook"
    assert api.webhook.secret_token == "s3cret-_x"
    assert (api.webhook.max_connections, api.webhook.allowed_updates) == (
        5,
        ["message", "callback_query"],
    )
    assert len(api.pending_updates) == 3 and api.webhook.dropped_updates == 0
    assert "s3cret-_x" not in result.stdout + result.stderr


async def test_set_with_drop_discards_the_queue_and_does_not_warn(api: FakeBotAPI) -> None:
    queue(api, 2)
    result = await webhook(
        "set", "https://bot.example.com/hook", "--drop-pending-updates", "--json",
        api_url=api.url,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "pending update(s) will be delivered" not in result.stderr
    assert "no --secret-token" in result.stderr
    data = json.loads(result.stdout)
    assert (data["pending_before"], data["pending_update_count"]) == (2, 0)
    assert data["dropped_pending_updates"] is True and data["secret_token"] is False
    assert api.pending_updates == [] and api.webhook.dropped_updates == 2
    [set_call] = api.calls_of("setWebhook")
    assert set_call.params["drop_pending_updates"] is True


async def test_set_with_no_pending_updates_does_not_warn(api: FakeBotAPI) -> None:
    result = await webhook(
        "set", "https://bot.example.com/hook", "--secret-token", "abc", api_url=api.url
    )
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr
    assert "drop_pending_updates" not in api.calls_of("setWebhook")[0].params


async def test_a_token_in_the_webhook_url_is_not_printed(api: FakeBotAPI) -> None:
    url = f"https://bot.example.com/hook/{TOKEN}"
    result = await webhook("set", url, "--secret-token", "abc", api_url=api.url)
    assert result.exit_code == 0, result.output
    assert "https://bot.example.com/hook/<token>" in result.stdout
    assert api.webhook.url == url
    result = await webhook("info", "--json", api_url=api.url)
    assert json.loads(result.stdout)["url"] == "https://bot.example.com/hook/<token>"


async def test_delete_with_drop(api: FakeBotAPI) -> None:
    api.webhook.url = "https://bot.example.com/webhook"
    queue(api, 4)
    result = await webhook("delete", "--drop-pending-updates", api_url=api.url)
    assert result.exit_code == 0, result.output
    assert "webhook deleted: https://bot.example.com/webhook (0 pending update(s) now)" in (
        result.stdout
    )
    assert api.webhook.url == "" and api.webhook.dropped_updates == 4
    result = await webhook("delete", "--json", api_url=api.url)
    assert json.loads(result.stdout)["deleted_url"] is None


async def test_ok_false_exits_1_with_telegrams_description(api: FakeBotAPI) -> None:
    description = "Bad Request: bad webhook: An HTTPS URL must be provided for webhook"
    api.inject(Fault.error(400, description, method="setWebhook"))
    result = await webhook("set", "http://bot.example.com/hook", api_url=api.url)
    assert result.exit_code == 1
    assert result.stderr == f"error: setWebhook failed: {description} (error_code 400)\n"
    assert api.webhook.url == ""


@pytest.mark.parametrize("command", [["info"], ["set", "https://b.example/h"], ["delete"]])
async def test_a_refused_token_exits_4(api: FakeBotAPI, command: list[str]) -> None:
    api.inject(Fault.error(401, "Unauthorized", method="getWebhookInfo"))
    result = await webhook(*command, api_url=api.url)
    assert result.exit_code == 4
    assert result.stderr == (
        "error: the token was refused (401 Unauthorized): check --token or $BOT_TOKEN\n"
    )
    assert api.webhook.url == ""


async def test_a_token_the_api_cannot_read_is_refused(api: FakeBotAPI) -> None:
    result = await webhook("info", api_url=api.url, token="123-not-a-token")
    assert result.exit_code == 4 and "the token was refused" in result.stderr


async def test_an_unreachable_api_exits_3_without_the_token() -> None:
    api_url = f"http://127.0.0.1:{free_port()}"
    result = await webhook("info", api_url=api_url)
    assert result.exit_code == 3
    assert result.stderr.startswith(f"error: the Bot API at {api_url} cannot be reached: ")


async def test_an_answer_that_is_not_the_bot_apis_exits_3(api: FakeBotAPI) -> None:
    result = await webhook("info", api_url=f"{api.url}/_fake/state/nowhere")
    assert result.exit_code == 3
    assert "answered getWebhookInfo with HTTP 404, not a Bot API answer" in result.stderr


async def test_an_error_that_carries_the_url_is_redacted() -> None:
    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(request.path)  # forever: aiohttp gives up

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", redirect)
    runner, base = await serve_app(app)
    try:
        result = await webhook("info", api_url=base)
    finally:
        await runner.cleanup()
    assert result.exit_code == 3
    assert "TooManyRedirects" in result.stderr and "/bot<token>/getWebhookInfo" in result.stderr


@pytest.mark.parametrize(
    ("args", "token"),
    [
        (["info"], ""),
        (["info"], "has a/slash"),
        (["info", "--api-url", "ftp://example.com"], TOKEN),
        (["info", "--api-url", "http://[::1"], TOKEN),
        (["set", "https://b.example/h", "--secret-token", "no spaces"], TOKEN),
        (["set", "https://b.example/h", "--max-connections", "0"], TOKEN),
        (["set", "ftp://x/webhook"], TOKEN),
        (["set", "webhook.example.com"], TOKEN),
    ],
)
async def test_usage_errors_exit_2(api: FakeBotAPI, args: list[str], token: str) -> None:
    result = await webhook(*args, api_url=api.url, token=token)
    assert result.exit_code == 2, result.output
    assert api.calls == []


def test_help_texts_name_every_option() -> None:
    runner = CliRunner()
    for command, options in {
        "info": ["--token", "--api-url", "--json"],
        "set": [
            "--drop-pending-updates",
            "--secret-token",
            "--max-connections",
            "--allowed-updates",
        ],
        "delete": ["--drop-pending-updates"],
    }.items():
        result = runner.invoke(cli, ["webhook", command, "--help"])
        assert result.exit_code == 0
        for option in options:
            assert option in result.stdout, (command, option)
    assert "BOT_TOKEN" in runner.invoke(cli, ["webhook", "--help"]).stdout


def cli_example(page: Path, name: str) -> list[list[str]]:
    """The ``telegram-idem`` command lines of the ``sh`` block under ``<!-- cli-example:
    name -->`` in ``page``, continuation lines joined, each split as a shell would
    (without the program name)."""
    text = page.read_text(encoding="utf-8")
    marker = f"<!-- cli-example: {name} -->\n```sh\n"
    start = text.index(marker) + len(marker)
    block = text[start : text.index("```", start)].replace("\\\n", " ")
    commands = [shlex.split(line) for line in block.splitlines() if line.strip()]
    assert commands and all(c[0] == "telegram-idem" for c in commands)
    return [c[1:] for c in commands]


async def test_the_deploy_pages_webhook_example_runs(api: FakeBotAPI) -> None:
    queue(api, 2)
    env = {"BOT_TOKEN": TOKEN, "TELEGRAM_API_URL": api.url, "WEBHOOK_SECRET": "doc-secret"}
    for args in cli_example(DOCS / "deploy-webhook.md", "webhook"):
        args = [arg.replace("$WEBHOOK_SECRET", env["WEBHOOK_SECRET"]) for arg in args]
        result = await asyncio.to_thread(CliRunner(env=env).invoke, cli, args)
        assert result.exit_code == 0, (args, result.output)
        assert TOKEN not in result.stdout + result.stderr
    assert api.webhook.url == "https://bot.example.com/webhook"
    assert (api.webhook.secret_token, api.webhook.dropped_updates) == ("doc-secret", 2)
