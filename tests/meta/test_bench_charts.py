"""The benchmarks' charts: ``benchmarks/_report.py`` draws a section's ratios as a real
PNG, ``write_section`` embeds what it draws, every benchmark that writes a section draws
its chart, and every chart ``docs/performance.md`` shows is there."""

from __future__ import annotations

import ast
import importlib.util
import re
import struct
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from matplotlib.image import imread

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
PERFORMANCE = ROOT / "docs" / "performance.md"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
GREEN, RED = (0x2E, 0x7D, 0x32), (0xC6, 0x28, 0x28)


def load_report() -> ModuleType:
    """``benchmarks/_report.py`` as a module (benchmarks/ is not a package)."""
    name = "idem_bench_report"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / "_report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels from the PNG's IHDR chunk; fails unless it is a PNG."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def has_colour(path: Path, rgb: tuple[int, int, int]) -> bool:
    pixels = (imread(path)[:, :, :3] * 255).round().astype(int)
    return bool(np.any(np.all(np.abs(pixels - np.array(rgb)) <= 2, axis=-1)))


def table_chart(report: ModuleType) -> object:
    """A chart from the rows of a table like the joined section's: one row meets the
    goal (≤ 1.3×), one misses it, one is a reference row."""
    rows = [("postgres", 1.25, 1.1, 1.4), ("sqlite", 3.86, 2.29, 3.91)]
    bars = [report.Bar(store, median, low, high) for store, median, low, high in rows]
    bars.append(report.Bar("floor by hand", 1.55, 1.37, 1.66, judged=False))
    return report.Chart(
        "Joined transactions", [report.Panel("joined action / business tx", bars, goal=1.3)]
    )


def test_a_table_is_drawn_as_a_png_of_the_expected_size(tmp_path: Path) -> None:
    report = load_report()
    out = report.draw_chart(table_chart(report), tmp_path / "deep" / "joined.png")
    assert out == tmp_path / "deep" / "joined.png"
    assert out.stat().st_size > 0
    # 9 × 100 dpi wide; 0.55 in per bar + 0.9 per panel + 0.6 for the titles, high.
    assert png_size(out) == (900, round((0.55 * 3 + 0.9 + 0.6) * 100))
    assert has_colour(out, GREEN) and has_colour(out, RED)  # met and missed goals


def test_more_rows_make_a_taller_chart_and_a_higher_goal_turns_bars_green(
    tmp_path: Path,
) -> None:
    report = load_report()
    bars = [report.Bar(f"row {i}", 2.0) for i in range(6)]
    tall = report.draw_chart(
        report.Chart("t", [report.Panel("p", bars, goal=2.5), report.Panel("q", bars[:1])]),
        tmp_path / "tall.png",
    )
    short = report.draw_chart(
        report.Chart("t", [report.Panel("p", bars[:1], goal=1.5)]), tmp_path / "short.png"
    )
    assert png_size(tall)[1] > png_size(short)[1] and png_size(tall)[0] == 900
    assert has_colour(tall, GREEN) and not has_colour(tall, RED)
    assert has_colour(short, RED) and not has_colour(short, GREEN)


def test_a_higher_is_better_goal_and_shares_are_judged_the_other_way(tmp_path: Path) -> None:
    report = load_report()
    panel = report.Panel(
        "of allowed", [report.Bar("ours", 0.99)], goal=0.95, better="higher", percent=True
    )
    assert panel.met(panel.bars[0]) is True
    assert panel.met(report.Bar("slow", 0.5)) is False
    assert panel.met(report.Bar("theirs", 0.5, judged=False)) is None
    assert has_colour(report.draw_chart(report.Chart("c", [panel]), tmp_path / "c.png"), GREEN)


def test_an_empty_chart_is_refused(tmp_path: Path) -> None:
    report = load_report()
    with pytest.raises(ValueError, match="at least one bar"):
        report.draw_chart(report.Chart("c", [report.Panel("p", [])]), tmp_path / "c.png")
    with pytest.raises(ValueError, match="at least one bar"):
        report.draw_chart(report.Chart("c", []), tmp_path / "c.png")
    assert not (tmp_path / "c.png").exists()


def test_write_section_draws_the_chart_it_embeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = load_report()
    page = tmp_path / "performance.md"
    page.write_text("# Performance\n\n<!-- joined:begin -->\nold\n<!-- joined:end -->\n")
    monkeypatch.setattr(report, "PERFORMANCE", page)
    monkeypatch.setattr(report, "IMAGES", tmp_path / "img" / "bench")
    link = report.chart_link("joined", "the table as bars")
    report.write_section("joined", f"| a | b |\n|---|---|\n\n{link}", table_chart(report))
    assert png_size(tmp_path / "img" / "bench" / "joined.png")[0] == 900
    text = page.read_text()
    assert "old" not in text and "![the table as bars](img/bench/joined.png)" in text

    with pytest.raises(ValueError, match="does not embed it"):
        report.write_section("ingress", "| a |\n|---|", table_chart(report))
    assert not (tmp_path / "img" / "bench" / "ingress.png").exists()
    assert "ingress" not in page.read_text()


def test_every_benchmark_that_writes_a_section_draws_its_chart() -> None:
    writers = []
    for script in sorted(BENCHMARKS.glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "write_section":
                writers.append(script.name)
                assert len(node.args) + len(node.keywords) == 3, (
                    f"{script.name} writes a section without its chart"
                )
    assert sorted(writers) == [
        "cluster_ingress.py",
        "deployed.py",
        "ingress.py",
        "joined.py",
        "outbound.py",
        "pg_profile.py",
        "redis_profile.py",
        "scaling.py",
        "stores.py",
    ]


def test_every_chart_performance_md_shows_exists_and_every_section_shows_one() -> None:
    text = PERFORMANCE.read_text(encoding="utf-8")
    shown = re.findall(r"!\[[^\]]*\]\((img/bench/[^)]+\.png)\)", text)
    assert shown, "docs/performance.md shows no chart"
    for link in shown:
        assert png_size(ROOT / "docs" / link)[0] == 900, link
    sections = re.findall(r"<!-- ([\w-]+):begin -->(.*?)<!-- \1:end -->", text, flags=re.S)
    assert {name for name, _ in sections} == {
        "ingress",
        "deployed",
        "stores",
        "outbound",
        "joined",
        "redis-profile",
        "pg-profile",
        "scaling",
        "cluster",
    }
    for name, body in sections:
        assert f"(img/bench/{name}.png)" in body, f"section {name} shows no chart"
    drawn = {f"img/bench/{p.name}" for p in (ROOT / "docs" / "img" / "bench").glob("*.png")}
    assert drawn == set(shown), "a chart in docs/img/bench/ that no section shows"
