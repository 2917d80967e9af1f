"""Shared by the benchmarks: percentiles, and writing a section of docs/performance.md."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

__all__ = ["percentile", "write_section"]

PERFORMANCE = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
HEADER = """# Performance

Measured on this project's CI machine (2 cores) by the benchmarks under `benchmarks/`;
each table is rewritten by the command named above it. Every figure is a ratio against a
baseline measured in the same run, so the numbers compare like with like.
"""


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0–100) of ``values``, by linear interpolation."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return (
        float(statistics.quantiles(ordered, n=1000, method="inclusive")[int(q * 10) - 1])
        if len(ordered) > 1
        else ordered[0]
    )


def write_section(name: str, markdown: str) -> None:
    """Replace (or append) the section ``name`` of docs/performance.md."""
    text = PERFORMANCE.read_text(encoding="utf-8") if PERFORMANCE.exists() else HEADER
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    if begin in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    PERFORMANCE.write_text(text, encoding="utf-8")
