"""``python -m examples.blog_bot serve|poll|demo``.

- ``serve --host H --port P [--workers process|inline]``: the webhook server
  (``POST /webhook``), configured by env (see :class:`~examples.blog_bot.config.Settings`).
  By default the inbox workers run in the server's own event loop; ``--workers process``
  admits updates only and starts ``work`` as a child process to process them (for a
  server store: on SQLite the two processes contend for the file's write lock).
- ``work [--nice N]``: the inbox workers and the outbox relay alone (what ``serve``
  starts, at ``nice`` +10).
- ``poll``: getUpdates long polling into the inbox (deletes the webhook first).
- ``set-webhook URL [--drop-pending-updates]``: re-enable a webhook, optionally dropping
  what Telegram queued meanwhile (the first takeaway of the incident, docs/design/incident.md).
- ``dead-letters`` / ``redrive ID``: list updates that failed every attempt; put one back.
- ``demo``: the whole bot on SQLite + a new local git repository + the offline writer,
  against a local Bot API and a Telegram-like delivery loop; exits non-zero if an
  invariant breaks.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator

from aiohttp import web

from examples.blog_bot.app import build_blog_bot
from examples.blog_bot.config import Settings

log = logging.getLogger("blog_bot")

WORKER_NICE = 10
"""How much lower the CPU priority of the worker process ``serve`` starts is."""


async def _poll(settings: Settings) -> None:
    blog = build_blog_bot(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await blog.poll(stop)
    finally:
        await blog.close()


async def _admin(settings: Settings, args: argparse.Namespace) -> int:
    blog = build_blog_bot(settings)
    try:
        if args.command == "set-webhook":
            await blog.bot.set_webhook(
                args.url,
                secret_token=settings.webhook_secret_token(),
                drop_pending_updates=args.drop_pending_updates,
            )
            print(
                f"webhook set to {args.url} (pending updates dropped: {args.drop_pending_updates})"
            )
        elif args.command == "dead-letters":
            dead = await blog.idem.store.inbox().dead_letters(limit=args.limit)
            for entry in dead:
                print(f"{entry.id}\tattempts={entry.attempts}\t{entry.last_error}")
            print(f"{len(dead)} dead letter(s)")
        elif args.command == "redrive":
            if not await blog.idem.store.inbox().redrive(args.entry_id):
                print(f"no dead letter {args.entry_id}", file=sys.stderr)
                return 1
            print(f"{args.entry_id} is back in the inbox")
        return 0
    finally:
        await blog.close()


async def _work(settings: Settings, nice: int, watch_parent: bool) -> None:
    if nice:
        os.nice(nice)  # the git commits it runs inherit it
    blog = build_blog_bot(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()

    async def orphaned() -> None:
        # Started by ``serve``: a parent killed outright (kill -9) cannot stop us, so
        # stop when it is gone rather than process beside its replacement's worker.
        while os.getppid() == parent:  # noqa: ASYNC110 - no event tells of a parent's death
            await asyncio.sleep(1.0)
        log.warning("the serve process that started this worker is gone: stopping")
        stop.set()

    watch = asyncio.create_task(orphaned()) if watch_parent else None
    log.info("worker processing the inbox (pid %s)", os.getpid())
    try:
        await blog.work(stop)
    finally:
        if watch is not None:
            watch.cancel()
        await blog.close()


async def _worker_process(_app: web.Application) -> AsyncIterator[None]:
    """Run ``python -m examples.blog_bot work`` (same environment) while the app runs: it
    starts before the server listens and is stopped (SIGTERM, in-flight entries finish
    within 30 s) after the server stopped taking requests. If it exits on its own, the
    server stops too (SIGTERM to itself), so a supervisor restarts both rather than the
    inbox filling with nobody to process it. The workers run at a lower CPU priority
    (``nice`` +:data:`WORKER_NICE`), so on a machine with few cores the webhook's answers
    are not kept waiting for a core by the handlers' work."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "examples.blog_bot",
        "work",
        "--nice",
        str(WORKER_NICE),
        "--watch-parent",
    )
    stopping = False

    async def watch() -> None:
        code = await proc.wait()
        if not stopping:
            log.error("the worker process exited (status %s): stopping the server", code)
            os.kill(os.getpid(), signal.SIGTERM)

    watcher = asyncio.create_task(watch())
    try:
        yield
    finally:
        stopping = True
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout=40)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await watcher


def _serve(settings: Settings, host: str, port: int, workers: str) -> None:
    blog = build_blog_bot(settings)

    async def make_app() -> web.Application:
        inline = workers == "inline"
        app = blog.web_app(workers=inline)
        if not inline:
            app.cleanup_ctx.append(_worker_process)

        async def close(_app: web.Application) -> None:
            await blog.close()

        app.on_cleanup.append(close)
        return app

    web.run_app(make_app(), host=host, port=port)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m examples.blog_bot", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve POST /webhook")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument(
        "--workers",
        choices=["process", "inline"],
        default="inline",
        help="inline (default): the inbox workers run in the server's own process and "
        "event loop; process: in a child process (`work`), for a server store",
    )
    work = sub.add_parser("work", help="process the inbox (workers and outbox relay), no webhook")
    work.add_argument("--nice", type=int, default=0, help="lower the CPU priority by this much")
    work.add_argument(
        "--watch-parent", action="store_true", help="stop when the parent process is gone"
    )
    sub.add_parser("poll", help="long-poll getUpdates")
    hook = sub.add_parser("set-webhook", help="point Telegram at URL (re-enable a webhook)")
    hook.add_argument("url")
    hook.add_argument(
        "--drop-pending-updates",
        action="store_true",
        help="discard updates Telegram queued meanwhile (docs/design/incident.md: before re-enabling)",
    )
    dead = sub.add_parser("dead-letters", help="list updates that failed every attempt")
    dead.add_argument("--limit", type=int, default=100)
    redrive = sub.add_parser("redrive", help="put a dead letter back into the inbox")
    redrive.add_argument("entry_id")
    demo = sub.add_parser("demo", help="run the offline end-to-end demo")
    demo.add_argument("--workdir", help="keep the demo's database and repository here")
    demo.add_argument("--delay-scale", type=float, default=0.02, help="writer latency scale")
    demo.add_argument("-v", "--verbose", action="store_true", help="log every guard decision")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "demo":
        from examples.blog_bot.demo import run_demo

        if args.verbose:
            logging.getLogger().setLevel(logging.INFO)
        return asyncio.run(
            run_demo(workdir=args.workdir, delay_scale=args.delay_scale, verbose=args.verbose)
        )
    settings = Settings.from_env()
    logging.getLogger().setLevel(logging.INFO)
    if args.command == "serve":
        _serve(settings, args.host, args.port, args.workers)
    elif args.command == "work":
        asyncio.run(_work(settings, args.nice, args.watch_parent))
    elif args.command == "poll":
        asyncio.run(_poll(settings))
    else:
        return asyncio.run(_admin(settings, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
