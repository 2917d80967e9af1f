"""Replace citations of files outside the repository with the docs/design/ pages.

Code and docs once cited ``design.md §N`` and ``seeds/000``, which lived beside the
repository, not in it. Their content is now ``docs/design/record.md``,
``docs/design/failures.md`` and ``docs/design/incident.md``. Run from the repository root:

    python scripts/fix_citations.py          # rewrite tracked files, list what changed
    python scripts/fix_citations.py --check  # only list; exit 1 if anything would change

``tests/meta/test_citations.py`` fails while any such citation is left.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

RECORD = "docs/design/record.md"
REPLACEMENTS: list[tuple[str, str]] = [
    (r"design\.md §1\b", "docs/design/failures.md"),
    (r"design\.md §2\b", f"{RECORD}#three-boundaries"),
    (r"design\.md §3\b", f"{RECORD}#the-record-and-its-state-machine"),
    (r"design\.md §4\b", f"{RECORD}#the-store-contract"),
    (r"design\.md §5\b", f"{RECORD}#ingress-and-workers"),
    (r"design\.md §6\b", "docs/design/incident.md"),
    (r"seeds/000 section 4\b", "docs/design/incident.md#one-commit-per-action"),
    (r"seeds/000's\b", "the incident's (docs/design/incident.md)"),
    (r"seeds/000\b", "docs/design/incident.md"),
]
"""Applied in order: the most specific form first."""

SKIP = {"scripts/fix_citations.py", "tests/meta/test_citations.py"}


def tracked(root: Path) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True
    ).stdout.decode()
    return [root / name for name in out.split("\0") if name and name not in SKIP]


def rewrite(text: str) -> str:
    for pattern, replacement in REPLACEMENTS:
        text = re.sub(pattern, replacement, text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="list only; exit 1 on changes")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    changed = []
    for path in tracked(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        new = rewrite(text)
        if new != text:
            changed.append(path.relative_to(root))
            if not args.check:
                path.write_text(new, encoding="utf-8")
    for name in changed:
        print(name)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
