"""One log of a store outage for all of a relay's take loops.

A relay runs ``concurrency`` take loops; when the store goes away every one of them fails
its take at once. Each loop reports its failures here, and the outage is logged once when
it starts (ERROR), then at most every ``every`` seconds while it lasts with the count of
failed takes so far (ERROR), and once at INFO when a take succeeds again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["OutageLog"]


class OutageLog:
    """The state of one outage, shared by the loops that report to it.

    Args:
        log: where the lines go.
        what: what is unavailable, the lines' subject (``"outbox"``).
        every: seconds between two lines while an outage lasts (> 0).
        clock: monotonic seconds (a test clock in tests).

    Raises:
        ValueError: ``every`` not > 0.
    """

    def __init__(
        self,
        log: logging.Logger,
        what: str,
        *,
        every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not every > 0:
            raise ValueError(f"every must be > 0 seconds, got {every!r}")
        self.log = log
        self.what = what
        self.every = every
        self.clock = clock
        self.failures = 0
        """Failed takes of the outage going on (0: none is)."""
        self._started = 0.0
        self._said = 0.0

    def failed(self, error: BaseException) -> None:
        """One take failed with ``error``: logged if it starts an outage, or if the last
        line is ``every`` seconds old."""
        now = self.clock()
        self.failures += 1
        if self.failures == 1:
            self._started = self._said = now
            self.log.error("%s unavailable: %s", self.what, error)
        elif now - self._said >= self.every:
            self._said = now
            self.log.error(
                "%s still unavailable after %.0f s (%d failed takes): %s",
                self.what,
                now - self._started,
                self.failures,
                error,
            )

    def succeeded(self) -> None:
        """A take succeeded: an outage going on ends, logged at INFO."""
        if self.failures:
            self.log.info(
                "%s available again after %.1f s (%d failed takes)",
                self.what,
                self.clock() - self._started,
                self.failures,
            )
            self.failures = 0
