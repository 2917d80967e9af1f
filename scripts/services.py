#!/usr/bin/env python3
"""Throwaway test services on loopback: a 3-master Redis Cluster and a moto (DynamoDB) server.

Also importable (not started by the command line): :func:`start_redis_server` and
:func:`start_postgres_server`, one private server each, which tests that stop or
reconfigure a server use instead of the machine's shared PostgreSQL and Redis.

Usage (CI; the standard library is all it needs)::

    eval "$(python3 scripts/services.py start --state /tmp/idem-services.json)"
    …
    python3 scripts/services.py stop --state /tmp/idem-services.json

``start`` prints shell ``export`` lines on stdout (progress goes to stderr), in the
pytest plugin's scheme (``telegram_idem.testing._stores``):

- ``IDEM_REDIS_CLUSTER_URL=redis+cluster://127.0.0.1:P1``
- ``IDEM_DYNAMODB_URL='dynamodb://idem_test?endpoint_url=http://127.0.0.1:PORT&region=us-east-1'``

and records what it started (pids, ports, the temporary directory) in the state file.
``stop`` ends exactly those processes (checking each pid still runs the program it
started) and removes the directory. A service whose program is missing
(``redis-server``/``redis-cli``, ``moto_server``) is skipped with a note on stderr;
``--only redis`` / ``--only moto`` start one of them.

The functions (:func:`start_redis_cluster`, :func:`start_moto`, :func:`stop_services`,
:func:`start_postgres_server`, :func:`stop_postgres_server`) are importable, so the test suite can start a private cluster when CI has not.
Exit status: 0 on success, 1 if a service failed to start (what did start is stopped).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = [
    "Services",
    "free_port",
    "postgres_bindir",
    "start_moto",
    "start_postgres_server",
    "start_redis_cluster",
    "start_redis_server",
    "stop_postgres_server",
    "stop_services",
]


REDIS_CLUSTER_ENV = "IDEM_REDIS_CLUSTER_URL"
"""The pytest plugin's variable for a Redis Cluster store URL."""
DYNAMODB_ENV = "IDEM_DYNAMODB_URL"
"""The pytest plugin's variable for a DynamoDB store URL."""


@dataclass
class Services:
    """What was started: enough for :func:`stop_services` to undo it.

    Attributes:
        dir: temporary directory holding configs, logs and node files.
        redis_ports: the cluster's master ports (empty if not started).
        redis_pids: their process ids.
        moto_port: the moto server's port, or 0.
        moto_pid: its process id, or 0.
    """

    dir: str
    redis_ports: list[int] = field(default_factory=list)
    redis_pids: list[int] = field(default_factory=list)
    moto_port: int = 0
    moto_pid: int = 0

    @property
    def redis_cluster_url(self) -> str:
        """``redis+cluster://127.0.0.1:P1`` (empty if no cluster was started)."""
        return f"redis+cluster://127.0.0.1:{self.redis_ports[0]}" if self.redis_ports else ""

    @property
    def dynamodb_endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` (empty if moto was not started)."""
        return f"http://127.0.0.1:{self.moto_port}" if self.moto_port else ""

    @property
    def dynamodb_url(self) -> str:
        """A DynamoDB store URL on the moto server (empty if moto was not started)."""
        if not self.moto_port:
            return ""
        return f"dynamodb://idem_test?endpoint_url={self.dynamodb_endpoint}&region=us-east-1"

    def exports(self) -> str:
        """Shell ``export`` lines for the started services (the plugin's variables)."""
        lines = []
        if self.redis_ports:
            lines.append(f"export {REDIS_CLUSTER_ENV}={shlex.quote(self.redis_cluster_url)}")
        if self.moto_port:
            lines.append(f"export {DYNAMODB_ENV}={shlex.quote(self.dynamodb_url)}")
        return "\n".join(lines)


class ServiceError(RuntimeError):
    """A service did not come up (the message says which and where its log is)."""


def _log(message: str) -> None:
    print(f"services: {message}", file=sys.stderr, flush=True)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, with_bus: bool = False) -> int:
    """A TCP port free on 127.0.0.1 right now.

    Args:
        with_bus: also require ``port + 10000`` free (a cluster node's bus port).

    Raises:
        ServiceError: none found after many tries.
    """
    for _ in range(200):
        port = random.randint(20000, 55000) if with_bus else _ephemeral()
        if _port_free(port) and (not with_bus or _port_free(port + 10000)):
            return port
    raise ServiceError("no free loopback port found")


def _ephemeral() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _program(name: str) -> str | None:
    """``name`` next to this Python (a venv's bin) or on PATH."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    return shutil.which(name)


def _redis_cli(port: int, *args: str, timeout: float = 10.0) -> str:
    cli = _program("redis-cli") or "redis-cli"
    out = subprocess.run(
        [cli, "-h", "127.0.0.1", "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return out.stdout + out.stderr


def _wait(what: str, ready: Callable[[], bool], timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except (OSError, subprocess.SubprocessError):
            pass
        time.sleep(0.1)
    where = f" (log: {log})" if log else ""
    raise ServiceError(f"{what} not ready after {timeout:.0f} s{where}")


def start_redis_server(directory: Path, port: int, *extra: str) -> int:
    """Start one daemonized ``redis-server`` on 127.0.0.1:``port``; returns its pid.

    No persistence (``--save ""``, ``--appendonly no``); files go to ``directory``.

    Raises:
        ServiceError: the program is missing or the server did not answer PING in 10 s.
    """
    server = _program("redis-server")
    if server is None:
        raise ServiceError("redis-server not found")
    pidfile = directory / f"redis-{port}.pid"
    logfile = directory / f"redis-{port}.log"
    pidfile.unlink(missing_ok=True)
    launched = subprocess.run(
        [
            server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "yes",
            "--dir",
            str(directory),
            "--pidfile",
            str(pidfile),
            "--logfile",
            str(logfile),
            *extra,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=10,
    )
    if launched.returncode != 0:
        raise ServiceError(f"redis-server :{port} failed: {launched.stdout}{launched.stderr}")
    _wait(f"redis-server :{port}", lambda: "PONG" in _redis_cli(port, "PING"), 10, logfile)
    _wait(f"redis-server :{port} pidfile", pidfile.exists, 5, logfile)
    return int(pidfile.read_text().strip())


def start_redis_cluster(services: Services, masters: int = 3) -> None:
    """Start a ``masters``-node Redis Cluster (no replicas) into ``services``.

    Three masters or more are joined by ``redis-cli --cluster create``; fewer (which it
    refuses) by hand: each node adds its share of the 16384 slots
    (``CLUSTER ADDSLOTSRANGE``) and meets the first. Waits until every node reports
    ``cluster_state:ok``. Pids and ports are recorded in ``services`` as each node
    starts, so a failure part way can still be stopped.

    Raises:
        ServiceError: a program is missing, ``masters`` is below 1, a node or the
            cluster did not come up.
    """
    if masters < 1:
        raise ServiceError(f"a Redis Cluster needs at least one master, got {masters}")
    if _program("redis-cli") is None:
        raise ServiceError("redis-cli not found")
    directory = Path(services.dir)
    for _ in range(masters):
        port = free_port(with_bus=True)
        pid = start_redis_server(
            directory,
            port,
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            str(directory / f"nodes-{port}.conf"),
            "--cluster-node-timeout",
            "5000",
        )
        services.redis_ports.append(port)
        services.redis_pids.append(pid)
    nodes = [f"127.0.0.1:{p}" for p in services.redis_ports]
    if masters >= 3:
        cli = _program("redis-cli") or "redis-cli"
        created = subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if created.returncode != 0:
            raise ServiceError(
                f"redis-cli --cluster create failed: {created.stdout}{created.stderr}"
            )
    else:
        _join_by_hand(services.redis_ports)

    def all_ok() -> bool:
        return all(
            "cluster_state:ok" in _redis_cli(p, "CLUSTER", "INFO") for p in services.redis_ports
        )

    _wait("redis cluster", all_ok, 30)
    _log(f"redis cluster up on {', '.join(nodes)}")


def _join_by_hand(ports: list[int]) -> None:
    """Give each node of ``ports`` an equal run of the 16384 slots and make them meet."""
    share = 16384 // len(ports)
    for n, port in enumerate(ports):
        first, last = n * share, 16383 if n == len(ports) - 1 else (n + 1) * share - 1
        answer = _redis_cli(port, "CLUSTER", "ADDSLOTSRANGE", str(first), str(last))
        if "OK" not in answer:
            raise ServiceError(f"CLUSTER ADDSLOTSRANGE on :{port} failed: {answer}")
        if n:
            answer = _redis_cli(port, "CLUSTER", "MEET", "127.0.0.1", str(ports[0]))
            if "OK" not in answer:
                raise ServiceError(f"CLUSTER MEET from :{port} failed: {answer}")


def start_moto(services: Services) -> None:
    """Start ``moto_server`` on a free loopback port into ``services``; waits for HTTP.

    Raises:
        ServiceError: the program is missing or it did not answer in 30 s.
    """
    program = _program("moto_server")
    if program is None:
        raise ServiceError("moto_server not found")
    port = free_port()
    log_path = Path(services.dir) / "moto.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [program, "-H", "127.0.0.1", "-p", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    services.moto_port, services.moto_pid = port, proc.pid

    def answers() -> bool:
        if proc.poll() is not None:
            raise ServiceError(f"moto_server exited with {proc.returncode} (log: {log_path})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1):
                return True
        except urllib.error.HTTPError:
            return True  # any HTTP answer means it serves
        except (urllib.error.URLError, OSError):
            return False

    _wait("moto_server", answers, 30, log_path)
    _log(f"moto server up on http://127.0.0.1:{port}")


def postgres_bindir() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``: next to ``initdb``
    on PATH, else the newest ``/usr/lib/postgresql/<version>/bin`` (Debian), else None."""
    found = shutil.which("initdb")
    if found is not None:
        return Path(found).resolve().parent
    candidates = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "initdb").exists()]
    if not candidates:
        return None
    return max(candidates, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)


def _as_postgres_user(directory: Path) -> list[str]:
    """The command prefix that runs a PostgreSQL program on ``directory``.

    ``initdb`` and ``postgres`` refuse to run as root: as root, the programs run as the
    ``postgres`` user (``runuser``) and ``directory`` is handed to it.

    Raises:
        ServiceError: running as root without a ``postgres`` user or ``runuser``.
    """
    if os.geteuid() != 0:
        return []
    import pwd

    runuser = shutil.which("runuser")
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        raise ServiceError("running as root and there is no 'postgres' user") from None
    if runuser is None:
        raise ServiceError("running as root and runuser is not installed")
    os.chown(directory, user.pw_uid, user.pw_gid)
    return [runuser, "-u", "postgres", "--"]


def _run(command: list[str], what: str, timeout: float = 60.0) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise ServiceError(f"{what} failed ({done.returncode}): {done.stdout}{done.stderr}")


def start_postgres_server(directory: Path, port: int) -> None:
    """Start a private PostgreSQL on 127.0.0.1:``port`` with its data under ``directory``.

    The first call makes the cluster (``initdb``: user ``postgres``, trust
    authentication, database ``postgres``); later calls on the same ``directory`` start it
    again (e.g. after :func:`stop_postgres_server`), with every committed write kept.
    ``fsync`` is off: a crash of the machine may lose data, which tests do not need. Its Unix socket is in ``directory`` too, so it never
    touches the machine's cluster. Returns once the server accepts connections.

    Raises:
        ServiceError: the binaries are missing, or ``initdb`` / ``pg_ctl start`` failed
            (the message carries their output and the server log's path).
    """
    bindir = postgres_bindir()
    if bindir is None:
        raise ServiceError("PostgreSQL server binaries (initdb, pg_ctl) not found")
    prefix = _as_postgres_user(directory)
    data, log = directory / "data", directory / "server.log"
    if not (data / "PG_VERSION").exists():
        _run(
            [
                *prefix,
                *(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-E", "UTF8"),
                *("--auth=trust", "--no-sync", "--no-instructions"),
            ],
            "initdb",
        )
    options = (
        # fsync=off: a crash of the *server* (stop -m immediate) loses nothing, since the
        # OS still holds what was written; synchronous_commit stays on for that reason
        f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        " -c full_page_writes=off"
    )
    _run(
        [
            *prefix,
            *(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log)),
            *("-w", "-t", "60", "-o", options, "start"),
        ],
        f"pg_ctl start on :{port} (log: {log})",
        timeout=90,
    )


def stop_postgres_server(directory: Path, *, mode: str = "immediate") -> None:
    """Stop the server :func:`start_postgres_server` started on ``directory``.

    Args:
        mode: ``pg_ctl`` shutdown mode; ``"immediate"`` ends every backend at once (a
            crash, as an outage looks to clients), ``"fast"`` shuts down cleanly.

    A server that is not running is not an error.

    Raises:
        ServiceError: ``pg_ctl stop`` failed on a running server.
    """
    bindir = postgres_bindir()
    data = directory / "data"
    if bindir is None or not (data / "postmaster.pid").exists():
        return
    _run(
        [
            *_as_postgres_user(directory),
            *(str(bindir / "pg_ctl"), "-D", str(data), "-m", mode, "-w", "-t", "60", "stop"),
        ],
        "pg_ctl stop",
        timeout=90,
    )


def _runs(pid: int, program: str) -> bool:
    """True if ``pid`` is alive and its command line mentions ``program``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True  # no /proc (macOS): trust the recorded pid
    return program.encode() in cmdline


def _end(pid: int, program: str, timeout: float = 10.0) -> None:
    if pid <= 0 or not _runs(pid, program):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _runs(pid, program):
            return
        try:  # reap it if it is our child (moto started by this process)
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop_services(services: Services) -> None:
    """End the processes recorded in ``services`` (by pid) and remove its directory."""
    for pid in services.redis_pids:
        _end(pid, "redis-server")
    _end(services.moto_pid, "moto_server")
    shutil.rmtree(services.dir, ignore_errors=True)


def start(only: str | None = None) -> Services:
    """Start the requested services (``None`` = all whose programs exist).

    Raises:
        ServiceError: a service failed to start; what had started is stopped first.
    """
    services = Services(dir=tempfile.mkdtemp(prefix="idem-services-"))
    try:
        if only in (None, "redis"):
            if _program("redis-server") and _program("redis-cli"):
                start_redis_cluster(services)
            else:
                _log("redis-server/redis-cli not found: no Redis Cluster")
        if only in (None, "moto"):
            if _program("moto_server"):
                start_moto(services)
            else:
                _log("moto_server not found: no DynamoDB endpoint")
    except BaseException:
        stop_services(services)
        raise
    return services


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start", help="start services, print export lines")
    p_start.add_argument("--state", required=True, help="file recording what was started")
    p_start.add_argument("--only", choices=["redis", "moto"], help="start just one service")
    p_stop = sub.add_parser("stop", help="stop what 'start' recorded in --state")
    p_stop.add_argument("--state", required=True)
    args = parser.parse_args(argv)
    state = Path(args.state)
    if args.command == "start":
        try:
            services = start(args.only)
        except ServiceError as exc:
            _log(f"failed: {exc}")
            return 1
        state.write_text(json.dumps(asdict(services), indent=2))
        print(services.exports())
        return 0
    if not state.exists():
        _log(f"no state file {state}: nothing to stop")
        return 0
    stop_services(Services(**json.loads(state.read_text())))
    state.unlink()
    _log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
