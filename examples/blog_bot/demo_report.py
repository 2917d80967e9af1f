"""What the demo checks and prints: counts, and invariants that must hold."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["DecisionCounter", "Report"]


class DecisionCounter(logging.Handler):
    """Counts guard decisions from the ``telegram_idem.decisions`` log records."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.counts: Counter[tuple[str, str]] = Counter()
        self._stopped: set[tuple[str, str, object]] = set()

    def emit(self, record: logging.LogRecord) -> None:
        boundary = str(getattr(record, "boundary", "?"))
        decision = str(getattr(record, "decision", "?"))
        self.counts[(boundary, decision)] += 1
        if decision not in (
            "acquired",
            "admitted",
        ):  # one repeat stopped, however often a waiter polled
            self._stopped.add(
                (boundary, str(getattr(record, "key", "")), getattr(record, "update_id", None))
            )

    def absorbed(self, boundary: str) -> int:
        """Repeats stopped at ``boundary``: every refused update delivery; for actions and
        steps, distinct (key, update) pairs (a waiting caller polls several times)."""
        if boundary == "update":
            return sum(
                n
                for (b, d), n in self.counts.items()
                if b == boundary and d not in ("acquired", "admitted")
            )
        return sum(1 for b, _, _ in self._stopped if b == boundary)


@dataclass
class Report:
    """Lines to print and invariants that broke."""

    lines: list[str] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)

    def fact(self, name: str, value: object) -> None:
        """Print ``name: value``."""
        self.lines.append(f"  {name:<44} {value}")

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        """Record an invariant; a false one fails the demo."""
        self.lines.append(f"  {'✔' if ok else '✘'} {name}" + (f"  ({detail})" if detail else ""))
        if not ok:
            self.broken.append(name)

    def render(self) -> str:
        """The report text."""
        verdict = "all invariants hold" if not self.broken else f"BROKEN: {', '.join(self.broken)}"
        return "\n".join([*self.lines, "", verdict])
