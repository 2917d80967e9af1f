"""``python -m examples.blog_bot serve|poll|demo``.

- ``serve --host H --port P``: the webhook server (``POST /webhook``), configured by env
  (see :class:`~examples.blog_bot.config.Settings`).
- ``poll``: getUpdates long polling instead of a webhook (deletes the webhook first).
- ``demo``: the whole bot on SQLite + a new local git repository + the offline writer,
  against a local Bot API and a Telegram-like delivery loop; exits non-zero if an
  invariant breaks.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from aiohttp import web

from examples.blog_bot.app import build_blog_bot
from examples.blog_bot.config import Settings


async def _poll(settings: Settings) -> None:
    blog = build_blog_bot(settings)
    try:
        await blog.bot.delete_webhook(drop_pending_updates=False)
        await blog.dispatcher.start_polling(blog.bot, handle_signals=True)
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
    else:
        asyncio.run(_poll(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
