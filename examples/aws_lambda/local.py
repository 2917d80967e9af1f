"""Run the Lambda function of ``lambda_function.py`` on this machine, no AWS involved.

``python -m examples.aws_lambda --port 8080`` serves a stand-in for the function's
Function URL at ``http://127.0.0.1:8080/`` (``BOT_TOKEN`` and ``WEBHOOK_SECRET`` in the
environment). Two containers share one store, as two Lambda containers share DynamoDB:

- the **web** container (the main thread) turns each HTTP request into a Function URL
  event (payload format 2.0) and answers with what the function returned; one request
  at a time, as one container takes one invocation at a time;
- its ``invoke(InvocationType="Event")`` goes to :class:`LocalLambda`, which queues the
  worker event for the **worker** container (a thread), which runs it. An event that
  raises is retried twice (after 1 s and 2 s; Lambda waits about 1 and 2 minutes).

``--store`` (or ``IDEM_STORE_URL``) defaults to ``sqlite:///aws_lambda_local.db``: fine on
one machine, where both containers reach the file. ``--api-url`` (or
``TELEGRAM_API_URL``) points the bot at another Bot API server. Point a tunnel's public
URL at the port and ``setWebhook`` to it (with the secret) to try it with Telegram.
Stops on SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import queue
import signal
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from examples.aws_lambda.lambda_function import make_offload
from telegram_idem import UpdateInProgressError
from telegram_idem.adapters.aws_lambda import LambdaOffload

log = logging.getLogger("examples.aws_lambda")

Event = dict[str, Any]


class Container:
    """One Lambda container: an event loop kept for its life (what ``handler`` does)."""

    def __init__(self, offload: LambdaOffload) -> None:
        self.offload = offload
        self._runner = asyncio.Runner()

    def invoke(self, event: Event) -> dict[str, Any]:
        """Run one invocation to its end; returns the function's answer.

        Raises:
            Exception: what a worker event raised (Lambda would retry it).
        """
        return self._runner.run(self.offload.handle(event, None))

    def shutdown(self) -> None:
        """Close the store, then the loop (cancelling what is left, e.g. a heartbeat)."""
        self._runner.run(self.offload.idem.close())
        self._runner.close()


class LocalLambda:
    """Stands in for ``boto3.client("lambda")``: ``invoke`` queues an asynchronous event.

    ``events`` holds ``(event, attempt)`` pairs, and ``None`` to stop the worker.
    """

    def __init__(self) -> None:
        self.events: queue.Queue[tuple[Event, int] | None] = queue.Queue()

    def invoke(self, *, FunctionName: str, InvocationType: str, Payload: bytes) -> dict[str, int]:
        """Queue ``Payload`` (JSON) as an event; ``{"StatusCode": 202}`` like Lambda.

        Raises:
            ValueError: not ``InvocationType="Event"``.
        """
        if InvocationType != "Event":
            raise ValueError("only asynchronous invocations are emulated")
        self.events.put((json.loads(Payload), 1))
        return {"StatusCode": 202}


def run_worker(container: Container, events: queue.Queue[tuple[Event, int] | None]) -> None:
    """The worker container: run queued events until ``None``; retry a failed one twice."""
    while (item := events.get()) is not None:
        event, attempt = item
        try:
            container.invoke(event)
        except Exception as exc:
            # UpdateInProgressError is expected, not a fault: a re-delivery claimed the
            # update between the webhook's hand-over and this event (the worker releases,
            # then claims). The holder runs it; the retry finds it done and skips it.
            expected = isinstance(exc, UpdateInProgressError)
            if attempt >= 3:
                log.error(
                    "event failed 3 times: Lambda sends it to the on-failure destination",
                    exc_info=not expected,
                )
                continue
            log.log(
                logging.INFO if expected else logging.WARNING,
                "event failed (attempt %d, %s); retried in %d s",
                attempt,
                exc,
                attempt,
                exc_info=not expected,
            )
            retry = threading.Timer(attempt, events.put, [(event, attempt + 1)])
            retry.daemon = True
            retry.start()


def function_url(container: Container) -> type[BaseHTTPRequestHandler]:
    """An HTTP handler turning each request into a Function URL event for ``container``."""

    class FunctionURL(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self._invoke("POST")

        def do_GET(self) -> None:
            self._invoke("GET")  # the function answers 405

        def _invoke(self, method: str) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            event: Event = {
                "version": "2.0",
                "rawPath": self.path,
                "headers": {name.lower(): value for name, value in self.headers.items()},
                "requestContext": {"http": {"method": method, "path": self.path}},
                "body": base64.b64encode(body).decode(),
                "isBase64Encoded": True,
            }
            answer = container.invoke(event)
            data = str(answer.get("body", "")).encode()
            self.send_response(int(answer["statusCode"]))
            for name, value in answer.get("headers", {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            log.info("%s %s", self.address_string(), format % args)

    return FunctionURL


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module doc); returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.aws_lambda",
        description="The Lambda function on this machine, behind a local Function URL. "
        "BOT_TOKEN: the bot token; WEBHOOK_SECRET: the webhook's secret_token.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get("PORT", "8080")), help="env PORT"
    )
    parser.add_argument(
        "--api-url",
        default=os.environ.get("TELEGRAM_API_URL", "https://api.telegram.org"),
        help="Bot API server (env TELEGRAM_API_URL; default Telegram's)",
    )
    parser.add_argument(
        "--store",
        default=os.environ.get("IDEM_STORE_URL", "sqlite:///aws_lambda_local.db"),
        help="store URL (env IDEM_STORE_URL; default sqlite:///aws_lambda_local.db)",
    )
    args = parser.parse_args(argv)
    token = os.environ.get("BOT_TOKEN")
    secret = os.environ.get("WEBHOOK_SECRET")
    if not token or not secret:
        parser.error(
            "set BOT_TOKEN (from @BotFather) and WEBHOOK_SECRET (1-256 of A-Z a-z 0-9 _ -)"
        )
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")

    def container(lambda_client: LocalLambda | None = None) -> Container:
        offload = make_offload(
            token=token,
            secret=secret,
            store_url=args.store,
            api_url=args.api_url,
            lambda_client=lambda_client,
            function_name="local",
        )
        return Container(offload)

    lambda_client = LocalLambda()
    web, worker = container(lambda_client), container()
    worker_thread = threading.Thread(
        target=run_worker, args=(worker, lambda_client.events), name="worker container"
    )
    server = HTTPServer((args.host, args.port), function_url(web))
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it as Ctrl-C does
    worker_thread.start()
    log.info("Function URL on http://%s:%d/", args.host, server.server_port)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("stopping")
    finally:
        server.server_close()
        lambda_client.events.put(None)  # the worker finishes what is queued, then stops
        worker_thread.join()
        web.shutdown()
        worker.shutdown()
    return 0
