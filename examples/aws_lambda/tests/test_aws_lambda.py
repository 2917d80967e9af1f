"""The Lambda example: its ``handler`` called the way the Lambda runtime calls it, with
Function URL events (payload format 2.0) and a real boto3 Lambda client under
``botocore.stub.Stubber`` (no AWS), against a local Bot API; and ``python -m
examples.aws_lambda``, its local run, over real HTTP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from examples._running import free_port, run_example
from examples.aws_lambda.lambda_function import APPROVED, PROMPT, make_offload
from telegram_idem.adapters.aws_lambda import LambdaOffload
from telegram_idem.testing import DEFAULT_TOKEN, FakeBotAPI, TelegramDelivery, UpdateFactory

SECRET = "example-webhook-secret"
ARN = "arn:aws:lambda:eu-west-1:123456789012:function:orders-bot:live"
CONTEXT = SimpleNamespace(invoked_function_arn=ARN, function_name="orders-bot")


def texts(api: FakeBotAPI) -> list[str | None]:
    return [call.params.get("text") for call in api.calls_of("sendMessage")]


def function_url_event(update: dict[str, Any], *, secret: str = SECRET) -> dict[str, Any]:
    """The event a Function URL makes of Telegram's webhook POST."""
    return {
        "version": "2.0",
        "rawPath": "/",
        "headers": {
            "content-type": "application/json",
            "x-telegram-bot-api-secret-token": secret,
        },
        "requestContext": {"http": {"method": "POST", "path": "/"}},
        "body": json.dumps(update),
        "isBase64Encoded": False,
    }


class Payload:
    """Matches an ``invoke`` Payload (JSON bytes) and keeps it: the worker event."""

    def __init__(self) -> None:
        self.event: dict[str, Any] | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, bytes):
            return False
        self.event = json.loads(other)
        return True

    __hash__ = None  # type: ignore[assignment]


@pytest.fixture
def lambda_client() -> Any:
    return boto3.client(
        "lambda",
        region_name="eu-west-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def stubber(lambda_client: Any) -> Iterator[Stubber]:
    with Stubber(lambda_client) as stub:
        yield stub
        stub.assert_no_pending_responses()


@pytest.fixture
async def api() -> AsyncIterator[FakeBotAPI]:
    async with FakeBotAPI() as server:
        yield server


@pytest.fixture
async def offload(
    api: FakeBotAPI, lambda_client: Any, tmp_path: Path
) -> AsyncIterator[LambdaOffload]:
    function = make_offload(
        token=DEFAULT_TOKEN,
        secret=SECRET,
        store_url=f"sqlite:///{tmp_path / 'idem.db'}",
        api_url=api.url,
        lambda_client=lambda_client,
    )
    yield function
    function.close()
    await function.idem.close()


async def invoke(offload: LambdaOffload, event: dict[str, Any]) -> dict[str, Any]:
    """One invocation as the Lambda runtime makes it: the synchronous handler, in a thread
    (this test's event loop serves the Bot API meanwhile)."""
    return await asyncio.to_thread(offload.handler, event, CONTEXT)


async def test_handler_runs_a_resent_update_once_and_a_double_tap_once(
    offload: LambdaOffload, stubber: Stubber, api: FakeBotAPI
) -> None:
    updates = UpdateFactory()
    start = updates.command("/start")
    payload = Payload()
    stubber.add_response(
        "invoke",
        {"StatusCode": 202},
        expected_params={"FunctionName": ARN, "InvocationType": "Event", "Payload": payload},
    )
    answer = await invoke(offload, function_url_event(start))
    assert (answer["statusCode"], answer["body"]) == (200, "queued")
    assert texts(api) == []  # nothing ran in the webhook invocation
    # Telegram re-sends while the worker has not run: 503, so it re-sends again later.
    assert (await invoke(offload, function_url_event(start)))["statusCode"] == 503
    assert payload.event is not None
    assert (await invoke(offload, payload.event))["body"] == "processed"
    assert (await invoke(offload, payload.event))["body"] == "skipped"  # Lambda delivered it twice
    answer = await invoke(offload, function_url_event(start))
    assert (answer["statusCode"], answer["body"]) == (200, "duplicate")
    assert texts(api) == [PROMPT]

    [prompt] = api.messages(start["message"]["chat"]["id"])
    tap = updates.callback_query("approve", from_message=prompt)
    again = updates.double_tap(tap)
    for event in (tap, again):  # processed inline: no invoke (the stubber has none left)
        answer = await invoke(offload, function_url_event(event))
        assert (answer["statusCode"], answer["body"]) == (200, "processed")
    assert texts(api) == [PROMPT, APPROVED]
    assert api.answered_callback_ids() == [
        tap["callback_query"]["id"],
        again["callback_query"]["id"],
    ]

    answer = await invoke(offload, function_url_event(start, secret="not-the-secret"))
    assert answer["statusCode"] == 401


async def test_local_run_answers_over_http_and_handles_each_update_once(tmp_path: Path) -> None:
    updates = UpdateFactory()
    start = updates.command("/start")
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    async with FakeBotAPI() as api:
        env = {
            "BOT_TOKEN": DEFAULT_TOKEN,
            "WEBHOOK_SECRET": SECRET,
            "TELEGRAM_API_URL": api.url,
            "IDEM_STORE_URL": f"sqlite:///{tmp_path / 'idem.db'}",
        }
        async with (
            run_example("aws_lambda", "--port", str(port), env=env, workdir=tmp_path) as bot,
            TelegramDelivery(
                url, secret_token=SECRET, retry_delay=0.2, max_attempts=20
            ) as telegram,
        ):
            await bot.listening(port)
            reports = await telegram.deliver_concurrently(start, 3)  # 503s are re-sent
            assert all(r.delivered for r in reports)
            await bot.until(lambda: PROMPT in texts(api), what="an answer to /start")

            [prompt] = api.messages(start["message"]["chat"]["id"])
            tap = updates.callback_query("approve", from_message=prompt)
            first, second = await asyncio.gather(
                telegram.deliver(tap), telegram.deliver(updates.double_tap(tap))
            )
            assert (first.statuses, second.statuses) == ([200], [200])
            await bot.stop()
    assert texts(api) == [PROMPT, APPROVED]  # /start handled once, approved once
    assert len(api.answered_callback_ids()) == 2
