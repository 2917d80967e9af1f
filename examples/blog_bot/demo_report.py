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

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[(getattr(record, "boundary", "?"), getattr(record, "decision", "?"))] += 1

    def absorbed(self, boundary: str) -> int:
        """Decisions at ``boundary`` that stopped a repeat (anything but ``acquired``)."""
        return sum(n for (b, d), n in self.counts.items() if b == boundary and d != "acquired")


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
