"""A server under test (run as its own process): bare aiohttp, or the ingress on a store.

Usage: python benchmarks/_server.py KIND PORT SECRET [STORE_URL]
KIND: ``bare`` (answers 200 without work) or ``ingress`` (WebhookIngress on STORE_URL).
"""

from __future__ import annotations

import sys

from aiohttp import web

from telegram_idem import Idem
from telegram_idem.ingress._webhook import WebhookIngress


async def bare(_request: web.Request) -> web.Response:
    await _request.read()
    return web.Response(text="ok")


def main() -> None:
    kind, port, secret = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    app = web.Application()
    if kind == "bare":
        app.router.add_post("/webhook", bare)
    else:
        idem = Idem(sys.argv[4])
        ingress = WebhookIngress(idem, bot_id=7000000001, secret_token=secret)
        app.router.add_post("/webhook", ingress.handle)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


if __name__ == "__main__":
    main()
