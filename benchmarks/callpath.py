"""Call path of one webhook update through the library: files crossed, cross-file calls.

    .venv/bin/python benchmarks/callpath.py

One update is POSTed on loopback to the framework-free webhook ingress on a fresh SQLite
file, and one worker run dispatches it to a handler that does nothing. Every Python call
from one ``telegram_idem`` module into another is counted (``sys.setprofile``), once for
the request and once for the worker run. Prints the files crossed and the cross-file
calls, and the calls from a store's inbox into its own records module (a part bouncing
through another part's internals). A measure of the layering, not of speed.
"""

from __future__ import annotations

import asyncio
import collections
import json
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

import telegram_idem

PACKAGE = str(Path(telegram_idem.__file__).resolve().parent)


class Tracer:
    def __init__(self) -> None:
        self.files: set[str] = set()
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = frame.f_code.co_filename
        if not callee.startswith(PACKAGE):
            return
        self.files.add(callee)
        caller = frame.f_back
        if caller is None or not caller.f_code.co_filename.startswith(PACKAGE):
            return
        if caller.f_code.co_filename != callee:
            self.calls[(short(caller.f_code.co_filename), short(callee))] += 1


def short(path: str) -> str:
    return path[len(PACKAGE) - len("telegram_idem") :]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def main() -> None:
    from telegram_idem import Idem
    from telegram_idem.backends import store_from_url

    try:  # the layout after the packaging of issue 9
        from telegram_idem.inbox import InboxWorker
        from telegram_idem.ingress import WebhookIngress
    except ImportError:  # pragma: no cover - older layouts
        from telegram_idem.inbox._worker import InboxWorker
        from telegram_idem.ingress._webhook import WebhookIngress

    tmp = tempfile.mkdtemp()
    store = store_from_url(f"sqlite:///{tmp}/callpath.db")
    idem = Idem(store)
    seen: list[int] = []

    async def dispatch(update: dict[str, Any]) -> None:
        seen.append(update["update_id"])

    ingress = WebhookIngress(idem, bot_id=1, secret_token="s3cret")
    worker = InboxWorker(store.inbox(), dispatch)
    app = web.Application()
    app.router.add_post("/hook", ingress.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    update = {
        "update_id": 7,
        "message": {"message_id": 1, "date": 0, "chat": {"id": 5, "type": "private"}, "text": "hi"},
    }
    async with aiohttp.ClientSession() as http:
        # warm up imports and connections with another update
        await http.post(
            f"http://127.0.0.1:{port}/hook",
            data=json.dumps({**update, "update_id": 6}),
            headers={"X-Telegram-Bot-Api-Secret-Token": "s3cret"},
        )
        await worker.run_once()
        results = {}
        for phase in ("request", "worker"):
            tracer = Tracer()
            sys.setprofile(tracer)
            try:
                if phase == "request":
                    async with http.post(
                        f"http://127.0.0.1:{port}/hook",
                        data=json.dumps(update),
                        headers={"X-Telegram-Bot-Api-Secret-Token": "s3cret"},
                    ) as r:
                        assert r.status == 200, r.status
                else:
                    assert await worker.run_once()
            finally:
                sys.setprofile(None)
            results[phase] = tracer
    assert seen == [6, 7], seen
    await runner.cleanup()
    await idem.close()
    files: set[str] = set()
    calls = 0
    bounce = 0
    for phase, tracer in results.items():
        n = sum(tracer.calls.values())
        files |= tracer.files
        calls += n
        print(f"{phase}: {len(tracer.files)} files, {n} cross-file calls")
        for (a, b), c in sorted(tracer.calls.items(), key=lambda kv: -kv[1]):
            print(f"    {c:4d}  {a} -> {b}")
            if "inbox" in a and "inbox" not in b and "backends" in b:
                bounce += c
    print(
        f"one webhook update: {len(files)} files, {calls} cross-file calls, "
        f"{bounce} of them an inbox calling into its store's records module"
    )


if __name__ == "__main__":
    asyncio.run(main())
