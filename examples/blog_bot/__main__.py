"""``python -m examples.blog_bot serve|poll|demo``.

- ``serve --host H --port P``: the webhook server (``POST /webhook``), configured by env
  (see :class:`~examples.blog_bot.config.Settings`).
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
import signal
import sys

from aiohttp import web

from examples.blog_bot.app import build_blog_bot
from examples.blog_bot.config import Settings


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


def _serve(settings: Settings, host: str, port: int) -> None:
    blog = build_blog_bot(settings)

    async def make_app() -> web.Application:
        app = blog.web_app()

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
        _serve(settings, args.host, args.port)
    elif args.command == "poll":
        asyncio.run(_poll(settings))
    else:
        return asyncio.run(_admin(settings, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
