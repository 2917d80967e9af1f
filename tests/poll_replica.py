"""A polling replica for the leader-lease tests: ``python tests/poll_replica.py``.

It polls a :class:`~telegram_idem.testing.bot_api.FakeBotAPI` over real HTTP into the
inbox of a shared store, with a :class:`~telegram_idem.ingress.LeaderLease`, until
SIGTERM (SIGKILL in the tests). Each ``getUpdates`` carries ``replica=<name>``, which the
fake records, so a test knows who polled with which offset. It runs no worker: the test
process drains the inbox, so what a ``kill -9`` can break is the polling alone.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from telegram_idem import Idem, KeyBuilder
from telegram_idem.ingress import LeaderLease, PollingIngress

GetUpdates = Callable[[int | None, int, float], Awaitable[list[dict[str, Any]]]]


def http_get_updates(
    session: aiohttp.ClientSession, url: str, token: str, replica: str
) -> GetUpdates:
    """``getUpdates`` over HTTP, tagged with ``replica``; an error answer raises."""

    async def get_updates(offset: int | None, limit: int, timeout: float) -> list[dict[str, Any]]:  # noqa: ASYNC109
        params: dict[str, Any] = {"limit": limit, "timeout": timeout, "replica": replica}
        if offset is not None:
            params["offset"] = offset
        async with session.post(f"{url}/bot{token}/getUpdates", json=params) as response:
            body = await response.json()
        if not body.get("ok"):
            raise RuntimeError(f"getUpdates {body.get('error_code')}: {body.get('description')}")
        result: list[dict[str, Any]] = body["result"]
        return result

    return get_updates


async def main(args: argparse.Namespace) -> None:
    idem = Idem(args.store, keys=KeyBuilder(args.prefix), lease=args.lease)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with aiohttp.ClientSession() as session:
        polling = PollingIngress(
            idem,
            http_get_updates(session, args.api, args.token, args.name),
            bot_id=int(args.token.partition(":")[0]),
            poll_timeout=args.poll_timeout,
            error_delay=0.05,
            error_delay_max=0.2,
            leader=LeaderLease(
                lease=args.lease,
                renew_every=args.lease / 8,
                margin=args.lease / 4,
                holder=args.name,
            ),
        )
        print("ready", flush=True)
        try:
            await polling.run(stop)
        finally:
            await idem.close()


def parse(argv: list[str]) -> argparse.Namespace:
    """The replica's arguments."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--api", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--poll-timeout", type=float, default=0.5)
    return parser.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {sys.argv[-1]} %(message)s")
    asyncio.run(main(parse(sys.argv[1:])))
