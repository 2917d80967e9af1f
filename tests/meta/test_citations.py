"""No tracked file cites a file the repository does not have.

A clone has only what ``git ls-files`` lists: the design notes and source articles that
once lived beside the repository (the files :data:`OUTSIDE` names) are not in it (their
content is ``docs/design/``), and a relative Markdown link must name a file that exists.
Cite the page of ``docs/design/`` that holds the material instead. This file spells those
names only as patterns, so it cites nothing itself.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SELF = {"tests/meta/test_citations.py"}

OUTSIDE = re.compile(r"(?<![\w/.-])design\.md\b|(?<![\w/.-])seeds[/]|\.\./shared\b")
"""Files that live outside the repository."""
SECTION = re.compile(r"(?P<file>[\w./-]+\.md)\s*§\s*\d+")
"""``some.md §3``: a section of a document, which must be in the repository."""
LINK = re.compile(r"\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
"""A Markdown link target."""


def tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [name for name in out.split("\0") if name and name not in SELF]


def text_of(name: str) -> str | None:
    try:
        return (ROOT / name).read_text(encoding="utf-8")
    except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
        return None


def missing_citations() -> list[str]:
    files = set(tracked())
    found: list[str] = []
    for name in sorted(files):
        text = text_of(name)
        if text is None:
            continue
        in_fence = False
        for number, line in enumerate(text.splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_fence = not in_fence
            for match in OUTSIDE.finditer(line):
                found.append(f"{name}:{number}: {match.group(0)!r} is outside the repository")
            for match in SECTION.finditer(line):
                cited = match["file"]
                if not any(f == cited or f.endswith("/" + cited.lstrip("./")) for f in files):
                    found.append(f"{name}:{number}: {match.group(0)!r} cites a missing file")
            if not name.endswith(".md") or in_fence:
                continue  # links only in Markdown prose, not in its code blocks
            for match in LINK.finditer(line):
                target = match["target"].split("#", 1)[0]
                if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # an anchor on the same page, or a URL
                resolved = ((ROOT / name).parent / target).resolve()
                if not resolved.exists():
                    found.append(f"{name}:{number}: link to missing {match['target']!r}")
    return found


def test_no_citation_of_a_file_the_repository_does_not_have() -> None:
    found = missing_citations()
    assert not found, (
        f"{len(found)} citation(s) of files not in the repository "
        "(cite the docs/design/ page that holds the material):\n" + "\n".join(found)
    )


def test_the_checker_sees_each_form(tmp_path: Path) -> None:
    notes, articles, shared = "design" + ".md", "seeds" + "/", ".." + "/shared"
    for line in (f"see {notes} §3", f"as in {articles}000", f"{shared}/notes", "x.md §2"):
        assert OUTSIDE.search(line) or SECTION.search(line), line
    assert not OUTSIDE.search("docs/design/record.md#the-store-contract")
    assert LINK.search("[a](missing.md)")["target"] == "missing.md"  # type: ignore[index]
