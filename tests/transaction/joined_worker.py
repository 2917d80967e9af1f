"""A bot process for the process tests of ``idem.transaction(conn)``
(tests/transaction/test_joined_processes.py): it opens its own transaction on the store's
database (``sqlite`` file or ``postgres`` DSN), joins it, and runs the action ``key``,
whose work credits one row into the bot's table ``credits`` and takes ``hold`` seconds.

``python joined_worker.py <db> <store url> <target> <credits table> <key> <mode> <hold> [go]``

- ``mode=run``: print ``{"ran": bool, "result": ..., "seconds": ...}`` once committed
  (``seconds``: how long ``idem.run`` took, waiting on the key included); with a ``go``
  file given, print ``waiting`` once set up and open the transaction only once the file
  exists (so two processes start their transactions together);
- ``mode=hang``: print ``ready`` once the credit and the claim are written (inside the
  open transaction), then sleep until killed.

``target`` is the SQLite file or the asyncpg DSN of the bot's own connection.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from telegram_idem import Idem


async def wait_for(go: str | None) -> None:
    if go is None:
        return
    print("waiting", flush=True)
    while not Path(go).exists():
        await asyncio.sleep(0.005)


async def main(
    db: str, url: str, target: str, table: str, key: str, mode: str, hold: float, go: str | None
) -> None:
    idem = Idem(url, heartbeat=False)
    ran: list[bool] = []
    await idem.store.get("warm-up")  # the store is set up before the bot's transaction
    try:
        if db == "sqlite":
            conn = sqlite3.connect(target, isolation_level=None, timeout=30)
            await wait_for(go)
            conn.execute("BEGIN")

            async def credit_sqlite() -> dict[str, Any]:
                ran.append(True)
                conn.execute(f"INSERT INTO {table} (who) VALUES ('buyer')")
                if mode == "hang":
                    print("ready", flush=True)
                    await asyncio.sleep(3600)
                await asyncio.sleep(hold)
                return {"credited": key}

            async with idem.transaction(conn):
                started = time.monotonic()
                result = await idem.run(key, credit_sqlite)
                seconds = time.monotonic() - started
            conn.execute("COMMIT")
            conn.close()
        else:
            import asyncpg

            pg = await asyncpg.connect(target)
            await wait_for(go)
            try:

                async def credit_pg() -> dict[str, Any]:
                    ran.append(True)
                    await pg.execute(f"INSERT INTO {table} (who) VALUES ('buyer')")
                    if mode == "hang":
                        print("ready", flush=True)
                        await asyncio.sleep(3600)
                    await asyncio.sleep(hold)
                    return {"credited": key}

                async with pg.transaction():
                    async with idem.transaction(pg):
                        started = time.monotonic()
                        result = await idem.run(key, credit_pg)
                        seconds = time.monotonic() - started
            finally:
                await pg.close()
        answer = {"ran": bool(ran), "result": result, "seconds": seconds}
        print(json.dumps(answer), flush=True)
    finally:
        await idem.close()


if __name__ == "__main__":
    db, url, target, table, key, mode, hold = sys.argv[1:8]
    go = sys.argv[8] if len(sys.argv) > 8 else None
    asyncio.run(main(db, url, target, table, key, mode, float(hold), go))
