"""A bot process for the process tests of ``idem.transaction(conn)``
(tests/transaction/test_joined_processes.py): it opens its own transaction on the store's
database (``sqlite`` file or ``postgres`` DSN), joins it, and runs the action ``key``,
whose work credits one row into the bot's table ``credits`` and takes ``hold`` seconds.

``python joined_worker.py <db> <store url> <target> <credits table> <key> <mode> <hold>``

- ``mode=run``: print ``{"ran": bool, "result": ...}`` once committed;
- ``mode=hang``: print ``ready`` once the credit and the claim are written (inside the
  open transaction), then sleep until killed.

``target`` is the SQLite file or the asyncpg DSN of the bot's own connection.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from typing import Any

from telegram_idem import Idem


async def main(
    db: str, url: str, target: str, table: str, key: str, mode: str, hold: float
) -> None:
    idem = Idem(url, heartbeat=False)
    ran: list[bool] = []
    try:
        if db == "sqlite":
            await idem.store.get("warm-up")  # the store's file is set up before the bot's
            conn = sqlite3.connect(target, isolation_level=None, timeout=30)
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
                result = await idem.run(key, credit_sqlite)
            conn.execute("COMMIT")
            conn.close()
        else:
            import asyncpg

            pg = await asyncpg.connect(target)
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
                        result = await idem.run(key, credit_pg)
            finally:
                await pg.close()
        print(json.dumps({"ran": bool(ran), "result": result}), flush=True)
    finally:
        await idem.close()


if __name__ == "__main__":
    db, url, target, table, key, mode, hold = sys.argv[1:8]
    asyncio.run(main(db, url, target, table, key, mode, float(hold)))
