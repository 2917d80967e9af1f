"""A moto server on loopback for benchmarks/stores.py, in its own process.

Prints its port once it listens, and stops when its standard input closes (so it never
outlives the benchmark, even if the benchmark is killed).
"""

from __future__ import annotations

import logging
import sys

from moto.server import ThreadedMotoServer


def main() -> None:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    print(server.get_host_and_port()[1], flush=True)
    try:
        sys.stdin.read()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
