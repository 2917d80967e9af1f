"""Closed-loop load for the scaling benchmark (its own process): POSTs ``count``
Telegram-shaped message updates from ``chats`` private chats, ``concurrency`` requests in
flight, spread evenly over ``urls`` (sender ``i`` always uses ``urls[i % len(urls)]``).

A delivery answered anything but 200 is sent again after 50 ms, as Telegram re-sends
(Bot API, ``setWebhook``), at most 50 times. Prints one JSON line:
``{"sent": n, "errors": n, "resent": n, "seconds": s}``.

Usage: python benchmarks/_scaling_load.py CONFIG_JSON
(``{"urls": [...], "count": n, "concurrency": n, "first_id": n, "chats": n, "secret": s}``)
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import aiohttp

RESENDS = 50


def bodies(first_id: int, count: int, chats: int) -> list[bytes]:
    """The updates, ``update_id`` ``first_id`` … ``first_id + count - 1``."""
    out = []
    for i in range(count):
        user = 5550000000 + i % chats
        update_id = first_id + i
        text = f"/order {update_id}"
        update = {
            "update_id": update_id,
            "message": {
                "message_id": 1 + i // chats,
                "date": 1761025920,
                "chat": {"id": user, "type": "private", "first_name": "U"},
                "from": {"id": user, "is_bot": False, "first_name": "U", "language_code": "en"},
                "text": text,
                "entities": [{"offset": 0, "length": 6, "type": "bot_command"}],
            },
        }
        out.append(json.dumps(update, separators=(",", ":")).encode())
    return out


async def main(config: dict[str, Any]) -> None:
    urls: list[str] = config["urls"]
    concurrency: int = config["concurrency"]
    payloads = bodies(config["first_id"], config["count"], config["chats"])
    headers = {
        "X-Telegram-Bot-Api-Secret-Token": config["secret"],
        "Content-Type": "application/json",
    }
    errors = resent = 0
    queue = iter(range(len(payloads)))
    per_url = -(-concurrency // len(urls))
    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=per_url)) for _ in urls]

    async def sender(n: int) -> None:
        nonlocal errors, resent
        session, url = sessions[n % len(urls)], urls[n % len(urls)]
        for i in queue:
            for attempt in range(RESENDS):
                try:
                    async with session.post(url, data=payloads[i], headers=headers) as resp:
                        await resp.read()
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                resent += attempt == 0
                await asyncio.sleep(0.05)
            else:
                errors += 1

    start = time.perf_counter()
    try:
        await asyncio.gather(*(sender(n) for n in range(concurrency)))
    finally:
        for session in sessions:
            await session.close()
    seconds = time.perf_counter() - start
    print(
        json.dumps({"sent": len(payloads), "errors": errors, "resent": resent, "seconds": seconds})
    )


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
