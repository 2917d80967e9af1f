"""The process groups of the scaling benchmark: start them, pause them, measure a burst.

A :class:`Group` is the processes serving one side, started once for the largest
process count: aiogram's ``SimpleRequestHandler`` in ``n`` processes on ``n`` ports (the
baseline), or one ``WebhookIngress`` process and ``n`` ``InboxWorker`` processes on a
shape's store (ours). Every process not being measured is paused (``SIGSTOP``, after a
burst drained, so it holds no entry), so its idle polling takes no CPU from the ones
that are; :func:`burst` resumes the first ``n`` of a group (:meth:`Group.active`), sends
them a burst from a separate load process, and reads the shared counter the handlers
``INCR`` until every update was processed.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from redis import Redis

HERE = Path(__file__).resolve().parent
SECRET = "scaling-secret"
TICK = os.sysconf("SC_CLK_TCK")
SAMPLE = 0.01
"""Seconds between reads of the counter during a burst."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used (``/proc/<pid>/stat``)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


@dataclass
class Group:
    """One side at one process count (see the module).

    Args:
        name: ``"baseline"`` or a shape's name.
        counter: the Redis key its handlers ``INCR``.
        ingress: whether ``children[0]`` is an ingress serving every worker (ours).
    """

    name: str
    counter: str
    ingress: bool = False
    settled: Callable[[], bool] = lambda: True
    """Whether nothing is left in flight (ours: the inbox is empty), so pausing the
    processes leaves no entry leased to a stopped worker."""
    urls: list[str] = field(default_factory=list)
    children: list[subprocess.Popen[str]] = field(default_factory=list)
    log: IO[str] = field(default_factory=lambda: tempfile.TemporaryFile("w+"))

    def spawn(self, role: str, config: dict[str, Any]) -> None:
        child = subprocess.Popen(
            [sys.executable, str(HERE / "_scaling_proc.py"), role, json.dumps(config)],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.children.append(child)

    def active(self, n: int) -> list[subprocess.Popen[str]]:
        """The processes of ``n`` workers: the first ``n`` (and the ingress)."""
        return self.children[: n + 1] if self.ingress else self.children[:n]

    def targets(self, n: int) -> list[str]:
        """The URLs the load splits over at ``n`` processes."""
        return self.urls if self.ingress else self.urls[:n]

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        for child in self.children:
            assert child.stdout is not None
            while True:
                left = deadline - time.monotonic()
                if child.poll() is not None or left <= 0:
                    raise RuntimeError(
                        f"{self.name}: process {child.pid} did not start (exit status "
                        f"{child.returncode}, {left:.0f} s left)\n{self.tail()}"
                    )
                ready, _, _ = select.select([child.stdout], [], [], min(left, 0.5))
                if ready and child.stdout.readline().strip() == "ready":
                    break

    def signal(self, sig: signal.Signals, n: int | None = None) -> None:
        for child in self.children if n is None else self.active(n):
            if child.poll() is None:
                child.send_signal(sig)

    def cpu(self, n: int) -> float:
        return sum(cpu_seconds(c.pid) for c in self.active(n) if c.poll() is None)

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        for child in self.children:
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    def tail(self, lines: int = 30) -> str:
        self.log.flush()
        self.log.seek(0)
        return "".join(self.log.readlines()[-lines:])


def start_baseline(procs: int, counter: str, redis_url: str) -> Group:
    group = Group("baseline", counter)
    for _ in range(procs):
        port = free_port()
        group.urls.append(f"http://127.0.0.1:{port}/webhook")
        config = {"port": port, "secret": SECRET, "redis": redis_url, "counter": counter}
        group.spawn("baseline", config)
    return group


def start_ours(
    name: str, spec: dict[str, Any], procs: int, counter: str, redis_url: str, concurrency: int
) -> Group:
    group = Group(name, counter, ingress=True)
    port = free_port()
    group.urls.append(f"http://127.0.0.1:{port}/webhook")
    group.spawn("ingress", {"port": port, "secret": SECRET, "spec": spec})
    for _ in range(procs):
        config = {
            "spec": spec,
            "redis": redis_url,
            "counter": counter,
            "concurrency": concurrency,
        }
        group.spawn("worker", config)
    return group


@dataclass(frozen=True)
class Burst:
    """What one burst measured.

    Args:
        rate: processed updates/s between 10 % and 90 % of the burst done.
        cpu_per_update: CPU seconds the group's processes spent per update (whole burst).
        processed: the counter's increase (``count`` when nothing ran twice).
        errors: deliveries never answered 200 after every re-send.
        resent: deliveries answered non-200 at least once.
        ingress_rate: updates/s the load had answered 200 (the whole burst): above
            ``rate`` when the workers, not the ingress, set the pace.
    """

    rate: float
    cpu_per_update: float
    processed: int
    errors: int
    resent: int
    ingress_rate: float


def _crossing(samples: list[tuple[float, int]], level: float) -> float:
    """When the counter reached ``level``, interpolated between two samples."""
    previous = samples[0]
    for sample in samples:
        if sample[1] >= level:
            (t0, c0), (t1, c1) = previous, sample
            return t1 if c1 == c0 else t0 + (t1 - t0) * (level - c0) / (c1 - c0)
        previous = sample
    raise ValueError(f"the counter never reached {level}")


def burst(
    group: Group,
    n: int,
    redis: Redis,
    *,
    first_id: int,
    count: int,
    concurrency: int,
    chats: int,
    timeout: float = 60.0,
) -> Burst:
    """Resume ``n`` processes of ``group``, send them ``count`` updates, wait until all
    were processed, pause them again.

    Raises:
        RuntimeError: not every update was processed within ``timeout`` seconds.
    """
    group.signal(signal.SIGCONT, n)
    time.sleep(0.2)  # the resumed loops look at their timers again
    base = int(redis.get(group.counter) or 0)
    cpu0 = group.cpu(n)
    config = {
        "urls": group.targets(n),
        "count": count,
        "concurrency": concurrency,
        "first_id": first_id,
        "chats": chats,
        "secret": SECRET,
    }
    load = subprocess.Popen(
        [sys.executable, str(HERE / "_scaling_load.py"), json.dumps(config)],
        stdout=subprocess.PIPE,
        text=True,
    )
    samples = [(time.perf_counter(), 0)]
    deadline = time.monotonic() + timeout
    try:
        while samples[-1][1] < count:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{group.name} × {n}: {samples[-1][1]} of {count} processed "
                    f"after {timeout:.0f} s\n{group.tail()}"
                )
            time.sleep(SAMPLE)
            samples.append((time.perf_counter(), int(redis.get(group.counter) or 0) - base))
        cpu1 = group.cpu(n)
        out, _ = load.communicate(timeout=60)
    finally:
        if load.poll() is None:
            load.kill()
            load.wait()
    while not group.settled():  # the last completions and acks
        if time.monotonic() > deadline:
            raise RuntimeError(f"{group.name} × {n}: entries left in the inbox\n{group.tail()}")
        time.sleep(0.05)
    time.sleep(0.1)  # a second run of an update would show here
    processed = int(redis.get(group.counter) or 0) - base
    group.signal(signal.SIGSTOP, n)
    result = json.loads(out.strip().splitlines()[-1])
    t10, t90 = _crossing(samples, 0.1 * count), _crossing(samples, 0.9 * count)
    return Burst(
        rate=0.8 * count / (t90 - t10),
        cpu_per_update=(cpu1 - cpu0) / count,
        processed=processed,
        errors=int(result["errors"]),
        resent=int(result["resent"]),
        ingress_rate=count / float(result["seconds"]),
    )
