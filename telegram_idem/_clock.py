"""Clocks: where time decides an outcome (leases, retention, token expiry) it is passed in.

A clock is any zero-argument callable returning seconds since the Unix epoch as a float.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Clock", "ManualClock", "system_clock"]

Clock = Callable[[], float]
"""A callable returning the current time in seconds since the epoch."""

system_clock: Clock = time.time


class ManualClock:
    """A clock that moves only when told to, for tests.

    Args:
        start: initial time in seconds since the epoch.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``.

        Args:
            seconds: how far, seconds (≥ 0).

        Raises:
            ValueError: ``seconds`` < 0.
        """
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self.now += seconds
