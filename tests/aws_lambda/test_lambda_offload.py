"""``LambdaOffload`` at the boto3 boundary: a real boto3 Lambda client under
``botocore.stub.Stubber`` (every ``invoke`` is checked: FunctionName, InvocationType="Event",
a Payload carrying the update and its claim), real Function URL events (payload format 2.0)
and the shipped update payloads.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from telegram_idem import Idem, ManualClock, Outcome, Status, current_update
from telegram_idem.adapters.aws_lambda import LambdaOffload
from telegram_idem.errors import ConfigurationError, InProgressError, UpdateInProgressError
from telegram_idem.testing._delivery import load_fixture, make_double_tap

BOT = 7000000001
SECRET = "webhook-secret_0123"
ARN = "arn:aws:lambda:eu-west-1:123456789012:function:blog-bot:live"
CONTEXT = SimpleNamespace(invoked_function_arn=ARN, function_name="blog-bot")


class WorkerPayload:
    """Matches an ``invoke`` Payload (bytes of JSON) that carries ``update``; keeps it."""

    def __init__(self, update: dict[str, Any], *, claimed: bool = True) -> None:
        self.update = update
        self.claimed = claimed
        self.seen: dict[str, Any] | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, bytes):
            return False
        data = json.loads(other)
        ok = (
            data.get("is_async_worker") is True
            and data.get("update_data") == self.update
            and data.get("bot_id") == BOT
            and (("claim" in data) if self.claimed else data.get("unguarded") is True)
        )
        if ok:
            self.seen = data
        return ok

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"WorkerPayload(update_id={self.update['update_id']})"


class Recorder:
    """The bot's processing: records update ids and what was bound while it ran."""

    def __init__(self, fail_times: int = 0, delay: float = 0.0) -> None:
        self.runs: list[int] = []
        self.bound: list[int] = []
        self.fail_times = fail_times
        self.delay = delay

    async def __call__(self, update: dict[str, Any]) -> object:
        self.runs.append(update["update_id"])
        self.bound.append(current_update().update["update_id"])
        if self.delay:
            await asyncio.sleep(self.delay)
        if len(self.runs) <= self.fail_times:
            raise ConnectionError("gemini 503")
        return None


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def idem(clock: ManualClock) -> AsyncIterator[Idem]:
    guard = Idem("memory://", clock=clock)
    yield guard
    await guard.close()


@pytest.fixture
async def broken_idem(tmp_path: Path) -> AsyncIterator[Idem]:
    """SQLite cannot open a directory: every store call raises StoreError."""
    guard = Idem("sqlite:///" + str(tmp_path))
    yield guard
    await guard.close()


@pytest.fixture
def client() -> Any:
    return boto3.client(
        "lambda",
        region_name="eu-west-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def stubber(client: Any) -> Iterator[Stubber]:
    with Stubber(client) as stub:
        yield stub
        stub.assert_no_pending_responses()


@pytest.fixture
def process() -> Recorder:
    return Recorder()


@pytest.fixture
def offload(idem: Idem, process: Recorder, client: Any) -> LambdaOffload:
    return LambdaOffload(idem, process, bot_id=BOT, lambda_client=client, secret_token=SECRET)


def http_event(
    update: dict[str, Any] | None = None,
    *,
    body: str | None = None,
    secret: str | None = SECRET,
    b64: bool = False,
    method: str = "POST",
) -> dict[str, Any]:
    """A Lambda Function URL event (payload 2.0) as Telegram's webhook POST makes it."""
    text = body if body is not None else json.dumps(update, ensure_ascii=False)
    headers = {"content-type": "application/json", "host": "abc.lambda-url.eu-west-1.on.aws"}
    if secret is not None:
        headers["x-telegram-bot-api-secret-token"] = secret
    return {
        "version": "2.0",
        "rawPath": "/",
        "rawQueryString": "",
        "headers": headers,
        "requestContext": {
            "accountId": "anonymous",
            "domainName": "abc.lambda-url.eu-west-1.on.aws",
            "http": {"method": method, "path": "/", "protocol": "HTTP/1.1"},
            "requestId": "5c3e0f0e-0000-4000-8000-000000000000",
        },
        "body": base64.b64encode(text.encode()).decode() if b64 else text,
        "isBase64Encoded": b64,
    }


def expect_invoke(stubber: Stubber, update: dict[str, Any], **kwargs: Any) -> WorkerPayload:
    payload = WorkerPayload(update, **kwargs)
    stubber.add_response(
        "invoke",
        {"StatusCode": 202},
        expected_params={"FunctionName": ARN, "InvocationType": "Event", "Payload": payload},
    )
    return payload


async def status_of(idem: Idem, update: dict[str, Any]) -> Status | None:
    record = await idem.store.get(idem.keys.update(BOT, update["update_id"]))
    return None if record is None else record.status


# ------------------------------------------------------------------ ingress


async def test_new_update_is_claimed_offloaded_and_answered_200(
    offload: LambdaOffload, stubber: Stubber, idem: Idem, process: Recorder
) -> None:
    update = load_fixture("techpost_no_title")
    payload = expect_invoke(stubber, update)
    answer = await offload.handle(http_event(update), CONTEXT)
    assert answer["statusCode"] == 200 and answer["body"] == "queued"
    assert process.runs == []  # nothing ran in the webhook invocation
    assert payload.seen is not None
    assert payload.seen["claim"] == {"key": idem.keys.update(BOT, update["update_id"]), "token": 1}
    assert await status_of(idem, update) is Status.IN_PROGRESS


async def test_resend_in_progress_is_503_and_after_completion_a_duplicate(
    offload: LambdaOffload, stubber: Stubber, process: Recorder
) -> None:
    update = load_fixture("techpost_no_title")
    payload = expect_invoke(stubber, update)
    assert (await offload.handle(http_event(update), CONTEXT))["body"] == "queued"
    for _ in range(4):  # Telegram re-sends while the worker holds the claim: not yet
        answer = await offload.handle(http_event(update), CONTEXT)
        assert answer["statusCode"] == 503
    # a fifth invoke would fail the stubber ("Unexpected API Call")
    assert payload.seen is not None
    assert (await offload.handle(payload.seen, None))["body"] == "processed"
    answer = await offload.handle(http_event(update), CONTEXT)
    assert answer["statusCode"] == 200 and answer["body"] == "duplicate"
    assert process.runs == [update["update_id"]]


async def test_access_denied_falls_back_to_inline_processing_under_the_guard(
    offload: LambdaOffload, stubber: Stubber, idem: Idem, process: Recorder
) -> None:
    update = load_fixture("techpost_no_title")
    stubber.add_client_error(
        "invoke",
        service_error_code="AccessDeniedException",
        service_message="User is not authorized to perform: lambda:InvokeFunction",
        http_status_code=403,
        expected_params={
            "FunctionName": ARN,
            "InvocationType": "Event",
            "Payload": WorkerPayload(update),
        },
    )
    answer = await offload.handle(http_event(update), CONTEXT)
    assert answer["statusCode"] == 200 and answer["body"] == "processed"
    assert process.runs == process.bound == [update["update_id"]]
    assert await status_of(idem, update) is Status.COMPLETED
    assert (await offload.handle(http_event(update), CONTEXT))["body"] == "duplicate"
    assert process.runs == [update["update_id"]]


async def test_inline_failure_answers_500_and_releases_the_claim(
    idem: Idem, client: Any, stubber: Stubber
) -> None:
    process = Recorder(fail_times=1)
    offload = LambdaOffload(
        idem, process, bot_id=BOT, lambda_client=client, allow_unauthenticated=True
    )
    update = load_fixture("techpost_command")
    for _ in range(2):
        stubber.add_client_error("invoke", "AccessDeniedException", http_status_code=403)
    assert (await offload.handle(http_event(update, secret=None), CONTEXT))["statusCode"] == 500
    assert (await offload.handle(http_event(update, secret=None), CONTEXT))["statusCode"] == 200
    assert process.runs == [update["update_id"]] * 2
    assert await status_of(idem, update) is Status.COMPLETED


async def test_refused_invoke_answers_503_and_releases_the_claim(
    offload: LambdaOffload, stubber: Stubber, idem: Idem
) -> None:
    update = load_fixture("techpost_command")
    stubber.add_client_error("invoke", "TooManyRequestsException", http_status_code=429)
    answer = await offload.handle(http_event(update), CONTEXT)
    assert answer["statusCode"] == 503
    # Telegram re-sends: the released claim is taken over and the update queued
    expect_invoke(stubber, update)
    assert (await offload.handle(http_event(update), CONTEXT))["body"] == "queued"


class FlakyLambda:
    """A Lambda client whose first ``invoke`` queues the event but loses the answer."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []

    def invoke(self, **kwargs: Any) -> Any:
        assert kwargs["InvocationType"] == "Event"
        self.payloads.append(json.loads(kwargs["Payload"]))
        if len(self.payloads) == 1:
            raise TimeoutError("read timeout on lambda.eu-west-1.amazonaws.com")
        return {"StatusCode": 202}


async def test_invoke_without_an_answer_is_503_and_still_runs_once(
    idem: Idem, process: Recorder
) -> None:
    client = FlakyLambda()
    offload = LambdaOffload(
        idem, process, bot_id=BOT, lambda_client=client, allow_unauthenticated=True
    )
    update = load_fixture("techpost_command")
    assert (await offload.handle(http_event(update, secret=None), CONTEXT))["statusCode"] == 503
    # Telegram re-sends: the claim was released, so the re-send claims and queues again
    answer = await offload.handle(http_event(update, secret=None), CONTEXT)
    assert answer["statusCode"] == 200 and answer["body"] == "queued"
    lost, queued = client.payloads  # the "lost" one had been queued after all
    assert (lost["claim"]["token"], queued["claim"]["token"]) == (1, 2)
    answers = await asyncio.gather(
        offload.handle(lost, None), offload.handle(queued, None), return_exceptions=True
    )
    outcomes = sorted(r["body"] if isinstance(r, dict) else type(r).__name__ for r in answers)
    assert outcomes in (["UpdateInProgressError", "processed"], ["processed", "skipped"])
    for event in (lost, queued):  # Lambda's retries, after the run completed
        assert (await offload.handle(event, None))["body"] == "skipped"
    assert process.runs == [update["update_id"]]


async def test_function_name_can_be_given(idem: Idem, client: Any, stubber: Stubber) -> None:
    offload = LambdaOffload(
        idem,
        Recorder(),
        bot_id=BOT,
        lambda_client=client,
        function_name="blog-bot-worker",
        allow_unauthenticated=True,
    )
    update = load_fixture("callback_delete")
    stubber.add_response(
        "invoke",
        {"StatusCode": 202},
        expected_params={
            "FunctionName": "blog-bot-worker",
            "InvocationType": "Event",
            "Payload": WorkerPayload(update),
        },
    )
    assert (await offload.handle(http_event(update, secret=None), object()))["statusCode"] == 200


async def test_function_name_falls_back_to_the_context_function_name(
    idem: Idem, client: Any, stubber: Stubber
) -> None:
    offload = LambdaOffload(
        idem, Recorder(), bot_id=BOT, lambda_client=client, allow_unauthenticated=True
    )
    update = load_fixture("callback_delete")
    stubber.add_response(
        "invoke",
        {"StatusCode": 202},
        expected_params={
            "FunctionName": "blog-bot",
            "InvocationType": "Event",
            "Payload": WorkerPayload(update),
        },
    )
    context = SimpleNamespace(function_name="blog-bot")
    assert (await offload.handle(http_event(update, secret=None), context))["statusCode"] == 200
    with pytest.raises(ConfigurationError, match="function_name"):
        await offload.handle(http_event(make_double_tap(update), secret=None), object())


async def test_offload_when_false_processes_quick_updates_inline(
    idem: Idem, client: Any, stubber: Stubber
) -> None:
    process = Recorder()
    offload = LambdaOffload(
        idem,
        process,
        bot_id=BOT,
        lambda_client=client,
        offload_when=lambda update: "callback_query" not in update,
        allow_unauthenticated=True,
    )
    tap = load_fixture("callback_delete")
    assert (await offload.handle(http_event(tap, secret=None), CONTEXT))["body"] == "processed"
    assert process.runs == [tap["update_id"]]
    assert (await offload.handle(http_event(tap, secret=None), CONTEXT))["body"] == "duplicate"


async def test_unknown_update_type_is_guarded_like_any_update(
    offload: LambdaOffload, stubber: Stubber, idem: Idem, process: Recorder
) -> None:
    update = {"update_id": 1, "future_thing": {"id": "abc", "from": {"id": 5550001001}}}
    payload = expect_invoke(stubber, update)  # with its claim
    assert (await offload.handle(http_event(update), CONTEXT))["statusCode"] == 200
    assert payload.seen is not None
    assert (await offload.handle(payload.seen, None))["body"] == "processed"
    assert process.runs == [1]
    assert await status_of(idem, update) is Status.COMPLETED
    assert (await offload.handle(http_event(update), CONTEXT))["body"] == "duplicate"


# ---------------------------------------------------------- request checks


@pytest.mark.parametrize("secret", [None, "wrong-secret", SECRET.upper()])
async def test_wrong_or_missing_secret_is_401(offload: LambdaOffload, secret: str | None) -> None:
    event = http_event(load_fixture("techpost_command"), secret=secret)
    assert (await offload.handle(event, CONTEXT))["statusCode"] == 401


async def test_secret_header_name_is_case_insensitive(
    offload: LambdaOffload, stubber: Stubber
) -> None:
    update = load_fixture("techpost_command")
    event = http_event(update, secret=None)
    event["headers"]["X-Telegram-Bot-Api-Secret-Token"] = SECRET  # REST API (v1) casing
    expect_invoke(stubber, update)
    assert (await offload.handle(event, CONTEXT))["statusCode"] == 200


@pytest.mark.parametrize(
    "body",
    ["", "not json", "[1, 2]", '{"message": {}}', '{"update_id": "1"}', '{"update_id": true}'],
)
async def test_non_update_bodies_are_400(offload: LambdaOffload, body: str) -> None:
    assert (await offload.handle(http_event(body=body), CONTEXT))["statusCode"] == 400


async def test_base64_bodies_are_decoded(offload: LambdaOffload, stubber: Stubber) -> None:
    update = load_fixture("techpost_command")  # Korean text: UTF-8 through base64
    expect_invoke(stubber, update)
    assert (await offload.handle(http_event(update, b64=True), CONTEXT))["statusCode"] == 200
    bad = http_event(update)
    bad["isBase64Encoded"] = True  # plain JSON flagged as base64
    assert (await offload.handle(bad, CONTEXT))["statusCode"] == 400


async def test_oversized_body_is_413(idem: Idem, client: Any) -> None:
    offload = LambdaOffload(
        idem, Recorder(), bot_id=BOT, lambda_client=client, max_body=200, allow_unauthenticated=True
    )
    update = load_fixture("callback_delete")
    assert len(json.dumps(update)) > 200
    for b64 in (False, True):
        event = http_event(update, secret=None, b64=b64)
        assert (await offload.handle(event, CONTEXT))["statusCode"] == 413


async def test_non_post_is_405(offload: LambdaOffload) -> None:
    event = http_event(load_fixture("techpost_command"), method="GET")
    assert (await offload.handle(event, CONTEXT))["statusCode"] == 405


def test_malformed_secret_is_refused(idem: Idem) -> None:
    with pytest.raises(ConfigurationError):
        LambdaOffload(idem, Recorder(), bot_id=BOT, secret_token="has spaces")


# ------------------------------------------------------------- store outage


async def test_store_outage_fails_closed_with_503(
    broken_idem: Idem, client: Any, stubber: Stubber
) -> None:
    process = Recorder()
    offload = LambdaOffload(
        broken_idem, process, bot_id=BOT, lambda_client=client, allow_unauthenticated=True
    )
    event = http_event(load_fixture("techpost_command"), secret=None)
    answer = await offload.handle(event, CONTEXT)
    assert answer["statusCode"] == 503
    assert process.runs == []  # and no invoke (the stubber has none queued)


async def test_store_outage_fail_open_offloads_unguarded(
    broken_idem: Idem, client: Any, stubber: Stubber
) -> None:
    process = Recorder()
    offload = LambdaOffload(
        broken_idem,
        process,
        bot_id=BOT,
        lambda_client=client,
        on_store_error="fail_open",
        allow_unauthenticated=True,
    )
    update = load_fixture("techpost_command")
    payload = expect_invoke(stubber, update, claimed=False)
    assert (await offload.handle(http_event(update, secret=None), CONTEXT))["statusCode"] == 200
    assert payload.seen is not None
    assert (await offload.handle(payload.seen, None))["body"] == "processed"
    assert process.runs == [update["update_id"]]


# ------------------------------------------------------------------ worker


async def queued_event(
    offload: LambdaOffload, stubber: Stubber, update: dict[str, Any]
) -> dict[str, Any]:
    """Deliver ``update`` to the webhook and return the worker event it invoked."""
    payload = expect_invoke(stubber, update)
    assert (await offload.handle(http_event(update), CONTEXT))["body"] == "queued"
    assert payload.seen is not None
    event: dict[str, Any] = json.loads(json.dumps(payload.seen))  # as Lambda hands it over
    return event


async def test_worker_runs_the_update_once_and_completes_the_claim(
    offload: LambdaOffload, stubber: Stubber, idem: Idem, process: Recorder
) -> None:
    update = load_fixture("techpost_no_title")
    event = await queued_event(offload, stubber, update)
    answer = await offload.handle(event, None)
    assert answer["statusCode"] == 200 and answer["body"] == "processed"
    assert process.runs == process.bound == [update["update_id"]]
    record = await idem.store.get(idem.keys.update(BOT, update["update_id"]))
    assert record is not None and record.status is Status.COMPLETED
    # Lambda's async queue is at-least-once: the same event again is skipped
    assert (await offload.handle(event, None))["body"] == "skipped"
    assert process.runs == [update["update_id"]]


async def test_the_same_worker_event_delivered_concurrently_runs_once(
    idem: Idem, client: Any, stubber: Stubber
) -> None:
    process = Recorder(delay=0.01)
    offload = LambdaOffload(idem, process, bot_id=BOT, lambda_client=client, secret_token=SECRET)
    update = load_fixture("techpost_no_title")
    event = await queued_event(offload, stubber, update)
    answers = await asyncio.gather(
        *(offload.handle(event, None) for _ in range(5)), return_exceptions=True
    )
    assert [a["body"] for a in answers if isinstance(a, dict)] == ["processed"]
    # the others fail so Lambda retries them; by then the update is done
    assert [type(a) for a in answers if not isinstance(a, dict)] == [UpdateInProgressError] * 4
    assert (await offload.handle(event, None))["body"] == "skipped"
    assert process.runs == [update["update_id"]]


async def test_worker_skips_when_its_claim_was_taken_over_and_completed(
    offload: LambdaOffload, stubber: Stubber, idem: Idem, process: Recorder, clock: ManualClock
) -> None:
    update = load_fixture("techpost_no_title")
    event = await queued_event(offload, stubber, update)
    # The worker is late: the lease ran out and another delivery took the update over.
    clock.advance(idem.lease + 1)
    takeover = await idem.claim_update(update, bot_id=BOT)
    assert takeover.outcome is Outcome.ACQUIRED and takeover.token == 2
    # while the new holder runs, the worker fails (Lambda retries it later) ...
    with pytest.raises(InProgressError):
        await offload.handle(event, None)
    record = await idem.store.get(idem.keys.update(BOT, update["update_id"]))
    assert record is not None and record.fencing_token == 2  # the new holder is untouched
    assert record.lease_expires_at > clock()
    # ... and once the new holder completed, the retry is skipped
    assert await idem.store.complete(record.key, 2, b"null", retention=idem.update_retention)
    answer = await offload.handle(event, None)
    assert answer["statusCode"] == 200 and answer["body"] == "skipped"
    assert process.runs == []


async def test_worker_retry_takes_over_from_a_dead_holder(
    offload: LambdaOffload, stubber: Stubber, idem: Idem, process: Recorder, clock: ManualClock
) -> None:
    """The first attempt was killed (function timeout) holding the claim: a retry before
    its lease ended fails again; the one after takes over and runs the update."""
    update = load_fixture("techpost_no_title")
    event = await queued_event(offload, stubber, update)
    # the killed attempt: took the hand-over (token 2), then its container was stopped
    key = event["claim"]["key"]
    assert await idem.store.release(key, event["claim"]["token"])
    dead = await idem.claim_update(update, bot_id=BOT)
    assert dead.outcome is Outcome.ACQUIRED and dead.token == 2
    with pytest.raises(InProgressError):  # Lambda's first retry, too early
        await offload.handle(event, None)
    clock.advance(idem.lease + 1)
    assert (await offload.handle(event, None))["body"] == "processed"  # second retry
    assert process.runs == [update["update_id"]]
    record = await idem.store.get(key)
    assert record is not None and record.status is Status.COMPLETED
    assert record.fencing_token == 3


async def test_worker_failure_releases_so_lambdas_retry_runs_it(
    idem: Idem, client: Any, stubber: Stubber
) -> None:
    process = Recorder(fail_times=1)
    offload = LambdaOffload(idem, process, bot_id=BOT, lambda_client=client, secret_token=SECRET)
    update = load_fixture("techpost_no_title")
    event = await queued_event(offload, stubber, update)
    with pytest.raises(ConnectionError):  # Lambda records the error and retries the event
        await offload.handle(event, None)
    assert (await offload.handle(event, None))["body"] == "processed"
    assert process.runs == [update["update_id"]] * 2
    assert await status_of(idem, update) is Status.COMPLETED


async def test_worker_event_without_a_claim_claims_itself(
    offload: LambdaOffload, idem: Idem, process: Recorder
) -> None:
    """the incident's (docs/design/incident.md) original payload: ``{"is_async_worker": true, "update_data": ...}``."""
    update = load_fixture("techpost_command")
    event = {"is_async_worker": True, "update_data": update}
    assert (await offload.handle(event, None))["body"] == "processed"
    assert (await offload.handle(event, None))["body"] == "skipped"
    assert process.runs == [update["update_id"]]


@pytest.mark.parametrize(
    "claim",
    [
        {"key": "idem:7000000001:u:1", "token": 1},  # another update's key
        {"key": "idem:7000000001:u:734519001", "token": "1"},
        "not-a-claim",
    ],
)
async def test_worker_refuses_a_claim_that_does_not_match(
    offload: LambdaOffload, process: Recorder, claim: object
) -> None:
    event = {"is_async_worker": True, "update_data": load_fixture("techpost_command")}
    event["claim"] = claim
    assert (await offload.handle(event, None))["statusCode"] == 400
    assert process.runs == []


async def test_worker_refuses_malformed_events(offload: LambdaOffload, process: Recorder) -> None:
    for event in (
        {"is_async_worker": True, "update_data": {"message": {}}},
        {"is_async_worker": True, "update_data": load_fixture("techpost_command"), "bot_id": 1},
    ):
        assert (await offload.handle(event, None))["statusCode"] == 400
    assert process.runs == []


async def test_a_function_url_body_cannot_pose_as_a_worker_event(
    offload: LambdaOffload, process: Recorder
) -> None:
    event = http_event(body=json.dumps({"is_async_worker": True, "update_data": {}}))
    event["is_async_worker"] = True  # even a top-level flag beside requestContext
    assert (await offload.handle(event, CONTEXT))["statusCode"] == 400
    assert process.runs == []


def test_sync_handler_keeps_one_loop_across_invocations(idem: Idem) -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def process(update: dict[str, Any]) -> None:
        loops.append(asyncio.get_running_loop())

    offload = LambdaOffload(
        idem, process, bot_id=BOT, lambda_client=object(), allow_unauthenticated=True
    )
    try:
        for name in ("techpost_command", "techpost_no_title"):
            event = {"is_async_worker": True, "update_data": load_fixture(name)}
            assert offload.handler(event, CONTEXT)["body"] == "processed"
    finally:
        offload.close()
    assert len(loops) == 2 and loops[0] is loops[1] and loops[0].is_closed()


# ------------------------------------------------- in progress elsewhere (item 1)


async def test_a_dead_holders_claim_is_503_then_the_resend_after_its_lease_runs_once(
    offload: LambdaOffload, stubber: Stubber, idem: Idem, process: Recorder, clock: ManualClock
) -> None:
    """A first run was killed (platform timeout, OOM) or its claim was applied after the
    store client timed out: a fresh instance gets Telegram's re-send within the lease."""
    update = load_fixture("techpost_command")
    dead = await idem.claim_update(update, bot_id=BOT)
    assert dead.outcome is Outcome.ACQUIRED
    answer = await offload.handle(http_event(update), CONTEXT)
    assert answer["statusCode"] == 503  # not "duplicate": Telegram must re-send it
    assert process.runs == []
    clock.advance(idem.lease + 1)  # the dead run's lease ends
    payload = expect_invoke(stubber, update)
    assert (await offload.handle(http_event(update), CONTEXT))["body"] == "queued"
    assert payload.seen is not None
    assert (await offload.handle(payload.seen, None))["body"] == "processed"
    assert process.runs == [update["update_id"]]
    assert await status_of(idem, update) is Status.COMPLETED


# ----------------------------------------------------------- secrets (item 14)


def test_a_secret_is_required_unless_opted_out(
    idem: Idem, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ConfigurationError, match="secret_token is required"):
        LambdaOffload(idem, Recorder(), bot_id=BOT)
    caplog.set_level(logging.WARNING, logger="telegram_idem.webhook")
    LambdaOffload(idem, Recorder(), bot_id=BOT, allow_unauthenticated=True)
    assert any("without a secret token" in r.message for r in caplog.records)


async def test_two_secrets_are_accepted_while_rotating(
    idem: Idem, client: Any, stubber: Stubber
) -> None:
    offload = LambdaOffload(
        idem, Recorder(), bot_id=BOT, lambda_client=client, secret_token=["old1", "new2"]
    )
    first, second = load_fixture("techpost_command"), load_fixture("techpost_no_title")
    expect_invoke(stubber, first)
    expect_invoke(stubber, second)
    assert (await offload.handle(http_event(first, secret="old1"), CONTEXT))["statusCode"] == 200
    assert (await offload.handle(http_event(second, secret="new2"), CONTEXT))["statusCode"] == 200
    third = load_fixture("callback_delete")
    for secret in ("other", None):
        answer = await offload.handle(http_event(third, secret=secret), CONTEXT)
        assert answer["statusCode"] == 401


# -------------------------------------------------- aiogram behind the worker


async def test_an_aiogram_dispatcher_runs_the_update_without_being_told_to_skip_the_guard(
    idem: Idem, client: Any, stubber: Stubber
) -> None:
    """``process`` feeds a dispatcher guarded by ``IdempotencyMiddleware`` as it is: the
    update is bound as admitted, so the middleware runs it instead of finding it held."""
    from aiogram import Bot, Dispatcher
    from aiogram.types import Message

    from telegram_idem.adapters.aiogram import IdempotencyMiddleware

    bot = Bot(token="7000000001:AAFakeTokenForTestsOnly_0123456789abcd")
    dp = Dispatcher()
    IdempotencyMiddleware(idem).setup(dp)
    ran: list[int] = []

    @dp.message()
    async def on_message(message: Message) -> None:
        ran.append(message.message_id)

    async def process(update: dict[str, Any]) -> object:
        return await dp.feed_raw_update(bot, update)

    offload = LambdaOffload(idem, process, bot_id=BOT, lambda_client=client, secret_token=SECRET)
    update = load_fixture("techpost_command")
    try:
        event = await queued_event(offload, stubber, update)
        assert (await offload.handle(event, None))["body"] == "processed"
        assert (await offload.handle(event, None))["body"] == "skipped"
    finally:
        await bot.session.close()
    assert ran == [update["message"]["message_id"]]
    assert await status_of(idem, update) is Status.COMPLETED
