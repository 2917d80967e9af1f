"""One log of a store outage for every loop that meets it (the inbox worker's tasks, the
relay's take loops).

Several loops fail at once when the store goes away. Each reports its failures here, and
the outage is logged once when it starts (ERROR, with the wall-clock time it began), then
at most every ``every`` seconds while it lasts with the count of failures so far (ERROR),
and once when a call succeeds again (at ``recovered_level``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

__all__ = ["OutageLog"]


class OutageLog:
    """The state of one outage, shared by the loops that report to it.

    Args:
        log: where the lines go.
        what: what is unavailable, the lines' subject (``"outbox"``, ``"inbox"``).
        every: seconds between two lines while an outage lasts (> 0).
        noun: what the count counts (``"failed takes"``, ``"failed polls"``).
        recovered_level: the logging level of the line that ends an outage.
        clock: monotonic seconds (a test clock in tests).
        wall: seconds since the epoch, for the time an outage began (a test clock in tests).

    Raises:
        ValueError: ``every`` not > 0.
    """

    def __init__(
        self,
        log: logging.Logger,
        what: str,
        *,
        every: float = 60.0,
        noun: str = "failed takes",
        recovered_level: int = logging.INFO,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if not every > 0:
            raise ValueError(f"every must be > 0 seconds, got {every!r}")
        self.log = log
        self.what = what
        self.every = every
        self.noun = noun
        self.recovered_level = recovered_level
        self.clock = clock
        self.wall = wall
        self.failures = 0
        """Failures of the outage going on (0: none is)."""
        self.since: float | None = None
        """Seconds since the epoch when the outage going on began, or ``None``."""
        self._started = 0.0
        self._said = 0.0

    def failed(self, error: BaseException) -> None:
        """One call failed with ``error``: logged if it starts an outage, or if the last
        line is ``every`` seconds old."""
        now = self.clock()
        self.failures += 1
        if self.failures == 1:
            self._started = self._said = now
            self.since = self.wall()
            self.log.error("%s unavailable since %s: %s", self.what, _when(self.since), error)
        elif now - self._said >= self.every:
            self._said = now
            self.log.error(
                "%s still unavailable after %.0f s (%d %s): %s",
                self.what,
                now - self._started,
                self.failures,
                self.noun,
                error,
            )

    def succeeded(self) -> None:
        """A call succeeded: an outage going on ends, logged at ``recovered_level``."""
        if self.failures:
            self.log.log(
                self.recovered_level,
                "%s available again after %.1f s (%d %s)",
                self.what,
                self.clock() - self._started,
                self.failures,
                self.noun,
            )
            self.failures = 0
            self.since = None


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")
