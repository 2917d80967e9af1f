"""AWS Lambda ingress: claim the update, answer ``200`` at once, process it in an
asynchronous self-invocation (``InvocationType="Event"``) — the incident's (docs/design/incident.md) layers 1 and 2.

Telegram waits about 60 s for a 2xx and re-sends the same update otherwise (Bot API,
``setWebhook``; docs/design/failures.md): a Lambda that runs a 45–60 s pipeline before answering is
re-sent the update and runs it again. :class:`LambdaOffload` answers in milliseconds::

    offload = LambdaOffload(Idem("dynamodb://idem?region=eu-west-1"), process,
                            bot_id=bot_id_from_token(TOKEN), secret_token=SECRET)
    handler = offload.handler          # the Lambda entry point: handler(event, context)

The function receives two kinds of events:

**A webhook request** (Lambda Function URL or API Gateway HTTP API, payload format 2.0;
an API Gateway REST API event, format 1.0, is read the same way), checked by the request
core (:func:`telegram_idem.webhook_request.check_webhook_request`, the same checks as
every webhook shell):

| request                                          | answer                                 |
|--------------------------------------------------|----------------------------------------|
| not ``POST``                                     | 405                                    |
| ``X-Telegram-Bot-Api-Secret-Token`` wrong/absent | 401 (compared in constant time; any    |
|                                                  | header case)                           |
| body over ``max_body`` bytes                     | 413 (after base64 decoding)            |
| not JSON / no integer ``update_id`` / bad base64 | 400                                    |
| duplicate of a completed (or failed) update      | 200, nothing invoked                   |
| in progress elsewhere (holder's lease alive)     | 503, nothing invoked: Telegram re-sends|
|                                                  | (the holder may be a killed run)       |
| new update                                       | 200 once the worker invocation queued  |
| ``invoke`` denied (``AccessDeniedException``)    | processed inline under the guard: 200, |
|                                                  | or 500 if it raised (claim released)   |
| ``invoke`` failed otherwise (throttled, timeout) | 503, claim released: Telegram re-sends |
| store outage, ``fail_closed`` (default)          | 503: Telegram re-sends later           |
| store outage, ``fail_open``                      | 200, worker processes unguarded        |
| unknown update type (Bot API "Update")           | as any update (guarded by update_id)   |

An update the framework cannot parse is JSON with an integer ``update_id``: it is
answered 200 and queued; ``process`` raises in the worker, Lambda retries the async event
and then sends it to the function's on-failure destination (or DLQ), where an operator
sees it. The secret rule (required unless ``allow_unauthenticated=True``; several secrets
while rotating) is :mod:`telegram_idem._webhook_secret`'s; the table for every ingress
shape is ``docs/answers.md``.

**A worker event**, the payload of the self-invocation (the incident's (docs/design/incident.md) shape, plus the
claim hand-over)::

    {"is_async_worker": true, "update_data": {...update...}, "bot_id": 7000000001,
     "claim": {"key": "idem:7000000001:u:734519002", "token": 1}}

*The claim hand-over.* The webhook invocation claimed the update guard key (fencing token
``t``) and still holds its lease when the worker starts, so the worker cannot simply claim
again. It hands the lease over: ``release(key, t)`` — token-checked, so it ends the lease
only if ``t`` still holds the key — then an ordinary claim, which takes over with token
``t + 1`` and runs ``process`` under the guard (bound update, heartbeat, completion with its
own token). The worker then answers by the claim's outcome:

| claim outcome                                    | worker                                  |
|--------------------------------------------------|-----------------------------------------|
| acquired                                         | runs ``process``; ``processed``         |
| replay (someone completed the update)            | ``skipped``                             |
| in progress (another holder's lease is alive)    | raises :class:`UpdateInProgressError`   |
| ``process`` raised                               | releases the claim and re-raises        |

Raising makes Lambda retry the async event (by default twice, about 1 and 3 minutes
later), so in every ordering one run completes and no two runs overlap:

* the same event delivered twice (Lambda's async queue is at-least-once), even at the same
  time: both release (the second is a no-op), exactly one claim acquires; the other fails
  with ``InProgressError`` and its retry finds the completed record: ``skipped``;
* another holder took the key over meanwhile (``t`` expired and a re-delivery claimed
  ``t + 1``): the release does nothing; the worker skips once that holder completed, or
  fails and retries while it runs;
* the holder died (the function timeout killed the first attempt of this very event): its
  lease ends ``lease`` seconds after its last heartbeat and a retry takes over. Keep
  ``Idem(lease=...)`` under Lambda's first retry delay (the default 60 s is borderline;
  30 s is safe) — a retry that still finds the dead lease fails again and waits for the
  next one, and after the last retry the event goes to the on-failure destination;
* ``process`` raised: its claim is released, so the retry runs it again. Configure an
  on-failure destination (or DLQ) for what still fails.

A worker event without ``claim`` (the incident's (docs/design/incident.md) original shape) claims normally. Worker
events are trusted: only principals allowed ``lambda:InvokeFunction`` can send them; a
Function URL request is never mistaken for one (its top level has ``requestContext``).

The function name comes from ``function_name``, else the context's
``invoked_function_arn`` (the same alias or version), else ``function_name``. The
function's role needs ``lambda:InvokeFunction`` on itself; without it every update is
processed inline (the fallback of docs/design/incident.md), which brings Telegram's timeout back for
slow pipelines — guarded, so a re-sent update is answered ``503`` while the first run
holds its lease (kept alive by the heartbeat), and ``200`` once it completed.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from telegram_idem._admission import Admission, StorePolicy, StorePolicyLike
from telegram_idem._admitted import Admitted
from telegram_idem._guard import Idem
from telegram_idem._updates import validate_update
from telegram_idem._webhook_secret import SecretTokens, secret_check
from telegram_idem.errors import (
    ConfigurationError,
    MalformedUpdateError,
    UpdateInProgressError,
)
from telegram_idem.webhook_request import (
    DEFAULT_MAX_BODY,
    SECRET_HEADER,
    Refusal,
    WebhookRequest,
    check_webhook_request,
)

__all__ = [
    "DEFAULT_MAX_BODY",
    "INLINE_FALLBACK_ERRORS",
    "SECRET_HEADER",
    "WORKER_FLAG",
    "LambdaOffload",
    "Process",
]

log = logging.getLogger("telegram_idem.aws_lambda")

WORKER_FLAG = "is_async_worker"
"""Top-level key marking a worker event (the incident's (docs/design/incident.md) name)."""
INLINE_FALLBACK_ERRORS = frozenset({"AccessDeniedException", "RequestEntityTooLargeException"})
"""``invoke`` error codes that will not go away by retrying: process inline instead.
``AccessDeniedException``: the role lacks ``lambda:InvokeFunction``;
``RequestEntityTooLargeException``: the payload exceeds the async invocation limit."""

Process = Callable[[dict[str, Any]], Awaitable[object]]
"""Processes one update (a Bot API dict): feed your dispatcher. The update is bound as
admitted (:meth:`telegram_idem._admitted.Admitted.run`), so aiogram's
``IdempotencyMiddleware`` passes it through without claiming it again
(``await dp.feed_raw_update(bot, update)``); PTB: ``await
app.process_update(Update.de_json(update, app.bot))``."""

_REFUSED = {
    Admission.NOT_YET: "in progress elsewhere",
    Admission.UNAVAILABLE: "store unavailable",
}


def _answer(status: int, text: str, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {
        "statusCode": status,
        "headers": {"Content-Type": "text/plain; charset=utf-8", **(headers or {})},
        "body": text,
    }


def _error_code(exc: BaseException) -> str | None:
    """The AWS error code of a botocore ``ClientError`` (the service answered), else None."""
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        error = response.get("Error")
        if isinstance(error, Mapping) and error.get("Code"):
            return str(error["Code"])
    return None


class LambdaOffload:
    """Webhook ingress and async worker in one Lambda function (see the module doc).

    Args:
        idem: the guard; on Lambda use a shared store (DynamoDB, Redis, Postgres): each
            invocation may run in a different container.
        process: ``async (update: dict) -> object``; runs in the worker (or inline) with
            the update bound, so ``@idempotent`` handlers and steps work.
        bot_id: the bot's id (the number before ``:`` in its token).
        function_name: the function to invoke (default: from the Lambda context).
        lambda_client: a boto3 Lambda client (default ``boto3.client("lambda")``, made on
            first use). Calls run in a thread (``asyncio.to_thread``).
        secret_token: ``setWebhook``'s ``secret_token`` to require, or a sequence of
            secrets all accepted while rotating (:mod:`telegram_idem._webhook_secret`).
        allow_unauthenticated: with ``secret_token=None``, accept requests without a
            secret (a WARNING is logged at construction).
        max_body: largest body accepted, bytes (after base64 decoding).
        on_store_error: a :class:`~telegram_idem._admission.StorePolicy` (or its string
            value): ``"fail_closed"`` answers 503 on a store outage (Telegram re-sends
            later); ``"fail_open"`` processes the update unguarded.
        offload_when: ``(update) -> bool``; ``False`` processes that update inline in the
            webhook invocation (for quick ones). Default: offload every update.

    Raises:
        ConfigurationError: no ``secret_token`` without ``allow_unauthenticated=True``, a
            malformed one, or an unknown ``on_store_error``.
    """

    def __init__(
        self,
        idem: Idem,
        process: Process,
        *,
        bot_id: int,
        function_name: str | None = None,
        lambda_client: Any = None,
        secret_token: SecretTokens = None,
        allow_unauthenticated: bool = False,
        max_body: int = DEFAULT_MAX_BODY,
        on_store_error: StorePolicyLike = StorePolicy.FAIL_CLOSED,
        offload_when: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> None:
        self.secret = secret_check(
            secret_token, allow_unauthenticated=allow_unauthenticated, where="LambdaOffload"
        )
        self.idem = idem
        self.process = process
        self.bot_id = bot_id
        self.function_name = function_name
        self.max_body = max_body
        self.on_store_error = StorePolicy.of(on_store_error)
        self.offload_when = offload_when
        self._client: Any = lambda_client
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------ entry points

    def handler(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
        """The synchronous Lambda entry point: runs :meth:`handle` to completion.

        One event loop is kept for the container's life (not ``asyncio.run`` per
        invocation): store clients made in one warm invocation (aiobotocore, redis-py,
        asyncpg) are tied to the loop that made them, and ``asyncio.run`` closes it.

        Args:
            event: the Lambda event (a Function URL or API Gateway request, or the worker's
                own event).
            context: the Lambda context.
        """
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(self.handle(event, context))

    def close(self) -> None:
        """Close the event loop :meth:`handler` keeps (tests, or a shutdown hook). The
        :class:`Idem` is the caller's to close. Idempotent."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.close()
        self._loop = None

    async def handle(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
        """Answer a webhook request or run a worker event (see the module doc).

        Args:
            event: the Lambda event (Function URL / HTTP API 2.0 request, or worker event).
            context: the Lambda context (``invoked_function_arn``, ``function_name``).

        Returns:
            ``{"statusCode": int, "headers": {...}, "body": str}``. For worker events the
            body says ``processed``, ``skipped`` or why the event was refused (400).

        Raises:
            ConfigurationError: no function name (neither given nor in ``context``).
            StoreError: worker only — the store could not answer before ``process``
                ran; Lambda retries the async event.
            UpdateInProgressError: worker only — another holder's lease is alive; Lambda
                retries the async event (the module doc says why).
            Exception: worker only — whatever ``process`` raised (claim released first);
                Lambda retries the async event.
        """
        if event.get(WORKER_FLAG) is True and "requestContext" not in event:
            return await self._work(event)
        return await self._ingress(event, context)

    # ---------------------------------------------------------------- ingress

    def _request(self, event: Mapping[str, Any]) -> WebhookRequest:
        """The update the request carries, or its refusal (the request core's checks)."""
        context = event.get("requestContext")
        http = context.get("http") if isinstance(context, Mapping) else None
        method = http.get("method") if isinstance(http, Mapping) else None
        if method is None:
            method = event.get("httpMethod")  # API Gateway REST API (payload format 1.0)
        headers = event.get("headers")
        body = event.get("body") or ""
        return check_webhook_request(
            method if isinstance(method, str) else None,
            headers if isinstance(headers, Mapping) else {},
            body.encode("utf-8", "surrogatepass") if isinstance(body, str) else b"",
            secret=self.secret,
            max_body=self.max_body,
            base64_encoded=bool(event.get("isBase64Encoded")),
        )

    async def _ingress(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
        request = self._request(event)
        if isinstance(request, Refusal):
            return _answer(request.status, request.reason, request.headers)
        update = request.update
        function = self._function(context)
        admitted = await self.idem.admit(
            update, bot_id=self.bot_id, store_policy=self.on_store_error
        )
        if not admitted.acknowledged:  # NOT_YET, UNAVAILABLE: Telegram re-sends
            return _answer(admitted.webhook_status, _REFUSED[admitted.outcome])
        if admitted.outcome is Admission.DUPLICATE:
            return _answer(200, "duplicate")
        return await self._hand_off(admitted, update, function)

    def _function(self, context: Any) -> str:
        name = (
            self.function_name
            or getattr(context, "invoked_function_arn", None)
            or getattr(context, "function_name", None)
        )
        if not name:
            raise ConfigurationError(
                "no function to invoke: pass function_name= or run inside Lambda"
            )
        return str(name)

    def _lambda(self) -> Any:
        if self._client is None:
            self._client = importlib.import_module("boto3").client("lambda")
        return self._client

    async def _hand_off(
        self, admitted: Admitted, update: dict[str, Any], function: str
    ) -> dict[str, Any]:
        uid = update["update_id"]
        if self.offload_when is not None and not self.offload_when(update):
            return await self._inline(admitted, update)
        payload: dict[str, Any] = {WORKER_FLAG: True, "update_data": update, "bot_id": self.bot_id}
        if admitted.claim is None:  # UNGUARDED
            payload["unguarded"] = True
        else:
            payload["claim"] = {"key": admitted.key, "token": admitted.claim.token}
        try:
            response = await asyncio.to_thread(
                self._lambda().invoke,
                FunctionName=function,
                InvocationType="Event",
                Payload=json.dumps(payload, ensure_ascii=False).encode("utf-8"),
            )
        except Exception as exc:
            code = _error_code(exc)
            if code in INLINE_FALLBACK_ERRORS:
                log.warning("invoke refused (%s): update %s processed inline", code, uid)
                return await self._inline(admitted, update)
            # Refused (nothing queued) or no answer (maybe queued): either way release,
            # so Telegram's re-send can claim anew. A worker that was queued after all
            # only releases with its own token (now stale) and then claims like anyone:
            # it skips or defers to the re-send's holder, so the update still runs once.
            log.error(
                "invoke failed (%s): update %s answered 503",
                code or type(exc).__name__,
                uid,
                exc_info=None if code else exc,
            )
            await admitted.release()
            return _answer(503, "could not queue the update")
        status = response.get("StatusCode") if isinstance(response, Mapping) else None
        if status not in (200, 202):
            log.error("invoke answered %s: update %s answered 503", status, uid)
            await admitted.release()
            return _answer(503, "could not queue the update")
        return _answer(200, "queued")

    async def _inline(self, admitted: Admitted, update: dict[str, Any]) -> dict[str, Any]:
        try:
            await admitted.run(lambda: self.process(update))
        except Exception:
            log.exception(
                "update %s failed inline; answered 500 so Telegram re-sends",
                update["update_id"],
            )
            return _answer(500, "update failed")
        return _answer(200, "processed")

    # ----------------------------------------------------------------- worker

    async def _work(self, event: Mapping[str, Any]) -> dict[str, Any]:
        try:
            update = validate_update(event.get("update_data"))
        except MalformedUpdateError as exc:
            log.error("worker event refused: %s", exc)
            return _answer(400, f"bad worker event: {exc}")
        uid = update["update_id"]
        if event.get("bot_id", self.bot_id) != self.bot_id:
            log.error("worker event for bot %s refused by bot %s", event["bot_id"], self.bot_id)
            return _answer(400, "bad worker event: another bot's update")
        if event.get("unguarded") is True:  # the webhook invocation failed open
            unguarded = self.idem.adopt(update, bot_id=self.bot_id, outcome=Admission.UNGUARDED)
            await unguarded.run(lambda: self.process(update))
            return _answer(200, "processed")
        handover = event.get("claim")
        if handover is not None:
            key = handover.get("key") if isinstance(handover, Mapping) else None
            token = handover.get("token") if isinstance(handover, Mapping) else None
            if (
                key != self.idem.keys.update(self.bot_id, uid)
                or not isinstance(token, int)
                or isinstance(token, bool)
            ):
                log.error("worker event for update %s has a bad claim %r", uid, handover)
                return _answer(400, "bad worker event: claim does not match the update")
            # End the webhook invocation's lease, only if its token still holds the key.
            await self.idem.store.release(key, token)
        admitted = await self.idem.admit(update, bot_id=self.bot_id)
        if admitted.outcome is Admission.UNAVAILABLE:
            assert admitted.error is not None
            raise admitted.error  # Lambda retries the event
        if admitted.outcome is Admission.NOT_YET:
            # Another holder runs it. If that holder is dead (e.g. this event's own first
            # attempt, killed by the function timeout), only a retry of this event will
            # ever run the update: fail, so Lambda retries after its lease has ended.
            raise UpdateInProgressError(
                f"update {uid} is being processed by another holder; retry later",
                key=admitted.key,
                record=admitted.claim.record if admitted.claim is not None else None,
            )
        if admitted.outcome is Admission.DUPLICATE:
            log.info("worker skipped update %s: already processed", uid)
            return _answer(200, "skipped")
        # What process raised propagates, its claim released: Lambda's retry runs it again.
        await admitted.run(lambda: self.process(update))
        return _answer(200, "processed")
