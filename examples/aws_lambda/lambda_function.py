"""A Telegram bot as one AWS Lambda function behind a Function URL, made duplicate-safe.

The webhook invocation claims the update and answers Telegram in milliseconds; an
asynchronous invocation of the same function (``InvocationType="Event"``) does the work
(``LambdaOffload``, docs/deploy-lambda.md). The bot itself needs no framework: it talks to
the Bot API with the standard library, so the deployment package is ``telegram-idem``
plus a store driver (``telegram-idem[dynamodb]``; boto3 is in the Lambda runtime).

``/start`` answers with an [Approve] button; a tap approves the order once, however many
times the button is tapped, and every tap is answered:

- a re-sent update (same ``update_id``) is answered 503 while its run holds the claim
  (Telegram re-sends again) and 200 once it completed, and is never run twice;
- taps are processed inline in the webhook invocation (``offload_when``): a callback
  query is answered at once, without a second invocation;
- ``@idempotent`` makes a double tap (two updates, two ``update_id`` values) approve once.

Deploy this file as ``lambda_function.py`` with the handler ``lambda_function.handler`` and
the environment ``BOT_TOKEN``, ``WEBHOOK_SECRET`` (the ``secret_token`` given to
``setWebhook``) and ``IDEM_STORE_URL`` (a store every container reaches, e.g.
``dynamodb://idem?region=eu-west-1``); ``TELEGRAM_API_URL`` is optional. The function's
role needs ``lambda:InvokeFunction`` on itself. ``python -m examples.aws_lambda`` runs it
on this machine (``examples/aws_lambda/local.py``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import urllib.request
from collections.abc import Mapping
from typing import Any

from telegram_idem import Idem, bot_id_from_token, idempotent
from telegram_idem.adapters.aws_lambda import LambdaOffload

PROMPT = "Approve the order?"
APPROVED = "Order approved ✅"
BUTTON = {"inline_keyboard": [[{"text": "Approve", "callback_data": "approve"}]]}


class BotAPI:
    """The Bot API over the standard library's HTTP client.

    Args:
        token: the bot token, ``<bot id>:<secret>``.
        api_url: the Bot API server.
    """

    def __init__(self, token: str, api_url: str = "https://api.telegram.org") -> None:
        self._base = f"{api_url.rstrip('/')}/bot{token}"

    async def call(self, method: str, **params: Any) -> Any:
        """Call ``method`` with ``params`` (sent as JSON); returns its ``result``.

        Raises:
            urllib.error.URLError: no answer, or (``HTTPError``) a non-2xx one; raised in a
                worker event, it makes Lambda retry the event.
        """
        return await asyncio.to_thread(self._post, method, params)

    def _post(self, method: str, params: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            f"{self._base}/{method}",
            data=json.dumps(params).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)["result"]


def is_command(message: Mapping[str, Any], name: str) -> bool:
    """Whether ``message`` is ``/name``, ``/name args`` or ``/name@bot``."""
    words = str(message.get("text") or "").split(maxsplit=1)
    return bool(words) and words[0].split("@", 1)[0] == f"/{name}"


@idempotent(key="approve:{callback_query.message.message_id}", in_progress="wait")
async def approve(api: BotAPI, chat_id: int) -> str:
    # The action, once per message carrying the button. A second tap while this runs
    # waits for it (in_progress="wait") and gets the stored result back without running.
    await api.call("sendMessage", chat_id=chat_id, text=APPROVED)
    return "Approved"


async def process(api: BotAPI, update: dict[str, Any]) -> None:
    """The bot: one update, with the update bound (``LambdaOffload`` binds it).

    Runs once per update: the update guard claimed it before this is called.
    """
    message = update.get("message")
    query = update.get("callback_query")
    if message and is_command(message, "start"):
        await api.call(
            "sendMessage", chat_id=message["chat"]["id"], text=PROMPT, reply_markup=BUTTON
        )
    elif query and query.get("data") == "approve" and "message" in query:
        text = await approve(api, query["message"]["chat"]["id"])
        # Outside the guarded action: every tap is answered, or its client keeps spinning.
        await api.call("answerCallbackQuery", callback_query_id=query["id"], text=text)


def make_offload(
    *,
    token: str,
    secret: str,
    store_url: str,
    api_url: str = "https://api.telegram.org",
    lambda_client: Any = None,
    function_name: str | None = None,
) -> LambdaOffload:
    """The function: webhook ingress and worker in one ``LambdaOffload``.

    Args:
        token: the bot token.
        secret: ``setWebhook``'s ``secret_token`` (1–256 of ``A-Z a-z 0-9 _ -``).
        store_url: a store every container reaches (DynamoDB, Redis, PostgreSQL).
        api_url: the Bot API server.
        lambda_client: a boto3 Lambda client (default ``boto3.client("lambda")``).
        function_name: the function to invoke (default: the invocation's own ARN).

    Raises:
        ConfigurationError: a malformed token or secret, or a bad store URL.
    """
    api = BotAPI(token, api_url)
    # lease: below Lambda's first retry delay, so a retry finds a killed run's claim free.
    idem = Idem(store_url, lease=30)
    return LambdaOffload(
        idem,
        functools.partial(process, api),
        bot_id=bot_id_from_token(token),
        secret_token=secret,
        lambda_client=lambda_client,
        function_name=function_name,
        offload_when=lambda update: "callback_query" not in update,  # taps: answer at once
    )


@functools.cache
def offload_from_env() -> LambdaOffload:
    """The function built from the environment (see the module doc), once per container.

    Raises:
        KeyError: ``BOT_TOKEN``, ``WEBHOOK_SECRET`` or ``IDEM_STORE_URL`` is not set.
    """
    return make_offload(
        token=os.environ["BOT_TOKEN"],
        secret=os.environ["WEBHOOK_SECRET"],
        store_url=os.environ["IDEM_STORE_URL"],
        api_url=os.environ.get("TELEGRAM_API_URL", "https://api.telegram.org"),
    )


def handler(event: Mapping[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda handler: a Function URL request or a worker event (``LambdaOffload.handle``)."""
    return offload_from_env().handler(event, context)
