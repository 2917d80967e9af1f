"""Open-loop load generator (run as its own process): POSTs updates at a fixed rate.

Latency is counted from each request's *scheduled* send time, so a stalled server cannot
hide its stall by slowing the generator down (no coordinated omission). Prints one JSON
line: {"sent": n, "errors": n, "latencies_ms": [...]}.

Usage: python benchmarks/_load.py URL RATE SECONDS SECRET
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import aiohttp


async def main(url: str, rate: float, seconds: float, secret: str) -> None:
    latencies: list[float] = []
    errors = 0
    total = int(rate * seconds)
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=connector) as session:
        # Warm-up, excluded from the figures: a concurrent burst, so every server (and its
        # store client) has opened its connections and loaded its scripts before timing.
        async def warm(i: int) -> None:
            body = json.dumps(
                {"update_id": 10_000_000 + i, "message": {"message_id": i, "date": 0,
                 "chat": {"id": i % 50, "type": "private"}, "text": "warm"}}
            )  # fmt: skip
            async with session.post(
                url,
                data=body,
                headers={
                    "X-Telegram-Bot-Api-Secret-Token": secret,
                    "Content-Type": "application/json",
                },
            ) as r:
                await r.read()

        for burst in range(3):
            await asyncio.gather(*(warm(burst * 100 + i) for i in range(100)))
        await asyncio.sleep(0.5)

        headers = {"X-Telegram-Bot-Api-Secret-Token": secret, "Content-Type": "application/json"}
        bodies = [
            json.dumps(
                {
                    "update_id": i,
                    "message": {
                        "message_id": i,
                        "date": 1761025920,
                        "chat": {"id": 5550000000 + i % 200, "type": "private"},
                        "from": {"id": 5550000000 + i % 200, "is_bot": False, "first_name": "U"},
                        "text": f"/techpost load {i}",
                    },
                }
            ).encode()
            for i in range(total)
        ]

        async def one(i: int, scheduled: float) -> None:
            nonlocal errors
            try:
                async with session.post(url, data=bodies[i], headers=headers) as resp:
                    await resp.read()
                    if resp.status != 200:
                        errors += 1
            except aiohttp.ClientError:
                errors += 1
            latencies.append((time.perf_counter() - scheduled) * 1000)

        start = time.perf_counter() + 0.1
        tasks = []
        for i in range(total):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, scheduled)))
        await asyncio.gather(*tasks)
    print(json.dumps({"sent": total, "errors": errors, "latencies_ms": latencies}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]))
