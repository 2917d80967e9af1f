"""The API reference (``docs/reference/``) has one page per public module, each in the
site's nav under "API reference", rendering that module from its docstrings; the CLI
reference (``docs/cli.md``) is generated from the click group and carries the exit codes
as ``telegram_idem._cli._common`` defines them; every guide links the reference.

The public modules are the ones ``tests/meta/test_public_surface.py`` derives (a module
is public when no part of its dotted name starts with ``_``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_public_surface import MODULES

import telegram_idem._cli._common as cli_common

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"


def nav_section(title: str) -> dict[str, str]:
    """``title: page`` of the entries of the nav section ``title`` of mkdocs.yml (the nav
    is read as lines: the file holds ``!!python/name`` tags a safe YAML load refuses)."""
    lines = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").splitlines()
    head = next((i for i, line in enumerate(lines) if line == f"  - {title}:"), None)
    assert head is not None, f"mkdocs.yml's nav has no {title!r} section"
    entries = {}
    for line in lines[head + 1 :]:
        match = re.fullmatch(r"      - (.+?): (\S+\.md)", line)
        if match is None:
            break
        entries[match[1]] = match[2]
    return entries


def nav_page(title: str) -> str | None:
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    match = re.search(rf"^  - {re.escape(title)}: (\S+\.md)$", text, re.M)
    return match[1] if match else None


@pytest.mark.parametrize("module", MODULES)
def test_every_public_module_has_a_reference_page_in_the_nav(module: str) -> None:
    page = REFERENCE / f"{module}.md"
    assert page.is_file(), f"{module} has no reference page {page.relative_to(ROOT)}"
    assert re.search(rf"^::: {re.escape(module)}\s*$", page.read_text(encoding="utf-8"), re.M), (
        f"{page.relative_to(ROOT)} does not render {module} (a '::: {module}' line)"
    )
    assert nav_section("API reference").get(module) == f"reference/{module}.md", (
        f"mkdocs.yml's 'API reference' nav lacks '{module}: reference/{module}.md'"
    )


def test_the_reference_has_no_page_of_a_module_that_is_not_public() -> None:
    pages = {p.stem for p in REFERENCE.glob("*.md")}
    assert pages == set(MODULES), f"not public, or gone: {sorted(pages - set(MODULES))}"
    assert set(nav_section("API reference")) == set(MODULES)


def test_the_cli_page_is_generated_from_the_click_group_with_the_exit_codes() -> None:
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    assert "::: mkdocs-click" in text
    assert ":module: telegram_idem._cli" in text and ":command: cli" in text
    doc = cli_common.__doc__
    assert doc is not None
    table = doc[doc.index("| code |") :].strip()
    assert table in text, f"docs/cli.md's exit code table differs from _common's:\n{table}"
    assert "IDEM_STORE_URL" in text and "--json" in text
    assert nav_page("CLI reference") == "cli.md", "mkdocs.yml's nav lacks 'CLI reference: cli.md'"


def guides() -> list[Path]:
    skip = {"api.md", "cli.md"}
    return [
        p for p in sorted(DOCS.rglob("*.md")) if p.name not in skip and REFERENCE not in p.parents
    ]


PUBLIC_MENTION = re.compile(r"telegram_idem(?:\.[a-z_]+)*")


def mentioned_modules(text: str) -> set[str]:
    """The public modules a page names (``telegram_idem.inbox``, ``from telegram_idem.x
    import``); a name past the module (``telegram_idem.inbox.InboxWorker``) counts for
    its module; ``from telegram_idem import`` counts for the package itself)."""
    found = set()
    for match in PUBLIC_MENTION.finditer(text):
        name = match.group(0)
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != "telegram_idem":
            found.add(name)
    if re.search(r"^\s*from telegram_idem import", text, re.M):
        found.add("telegram_idem")
    return found


@pytest.mark.parametrize("page", guides(), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_guide_links_the_reference_of_the_modules_it_discusses(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    depth = len(page.relative_to(DOCS).parts) - 1
    prefix = "../" * depth + "reference/"
    linked = set(re.findall(rf"\]\({re.escape(prefix)}([a-z_.]+)\.md", text))
    missing = sorted(mentioned_modules(text) - linked)
    assert not missing, (
        f"{page.relative_to(ROOT)} discusses {missing} without a 'Reference:' link "
        f"to {prefix}<module>.md"
    )
