"""The public/private line: which modules are public, what each exports, and that no
public signature hands out a private type.

A module is public when no part of its dotted name starts with ``_``. Each public module
lists its public names in ``__all__``; every class and function it defines or imports
from the library is either listed there or named with a leading underscore; every name a
public signature mentions is itself public (exported by some public module). The list of
public modules and names is ``docs/api.md``, checked here against the code, so the page
cannot rot: when it fails, the message holds the page as it should read.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import telegram_idem

ROOT = Path(__file__).resolve().parents[2]
API_PAGE = ROOT / "docs" / "api.md"
BEGIN, END = "<!-- public-surface:begin -->", "<!-- public-surface:end -->"


def public_module_names() -> list[str]:
    names = ["telegram_idem"]
    for info in pkgutil.walk_packages(telegram_idem.__path__, "telegram_idem."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


def load(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:  # an extra that is not installed: the dev install has all
        pytest.fail(f"public module {name} does not import: {exc}")


def exported(module: ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    assert isinstance(names, list), f"{module.__name__} has no __all__ list"
    return names


def public_objects() -> dict[int, str]:
    """id(object) → the public dotted name it is exported under (first found)."""
    found: dict[int, str] = {}
    for name in public_module_names():
        module = load(name)
        for attr in exported(module):
            found.setdefault(id(getattr(module, attr)), f"{name}.{attr}")
    return found


MODULES = public_module_names()


@pytest.mark.parametrize("name", MODULES)
def test_all_lists_resolvable_unique_names(name: str) -> None:
    module = load(name)
    names = exported(module)
    assert len(set(names)) == len(names), f"{name}.__all__ repeats a name"
    for attr in names:
        assert not attr.startswith("_"), f"{name}.__all__ lists the private name {attr}"
        assert hasattr(module, attr), f"{name}.__all__ lists {attr}, which it does not have"


@pytest.mark.parametrize("name", MODULES)
def test_every_class_and_function_a_public_module_defines_is_exported_or_private(name: str) -> None:
    module = load(name)
    listed = set(exported(module))
    leaked = sorted(
        attr
        for attr, value in vars(module).items()
        if not attr.startswith(("_", "pytest_"))  # pytest_* are hook implementations
        and attr not in listed
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", "") == name
    )
    assert not leaked, (
        f"{name}: public names missing from __all__ (or make them _private): {leaked}"
    )


def _annotation_names(obj: Any) -> list[tuple[str, Any]]:
    """(where, annotation value) for each annotation of ``obj`` (a function or class)."""
    targets: list[tuple[str, Any]] = []
    if inspect.isclass(obj):
        for attr, member in vars(obj).items():
            if attr.startswith("_") and attr != "__init__":
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if isinstance(member, property):
                member = member.fget
            if inspect.isfunction(member):
                targets.append((f"{obj.__qualname__}.{attr}", member))
    elif callable(obj):
        targets.append((getattr(obj, "__qualname__", repr(obj)), obj))
    found: list[tuple[str, Any]] = []
    for where, fn in targets:
        for value in getattr(fn, "__annotations__", {}).values():
            found.append((where, (fn, value)))
    return found


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def _resolve(fn: Any, annotation: Any) -> list[Any]:
    """The library objects an annotation names (strings resolved in ``fn``'s module)."""
    if isinstance(annotation, str):
        module = importlib.import_module(fn.__module__)
        names = vars(module)
        hints: dict[str, Any] = {}
        if typing.TYPE_CHECKING is False:  # names imported only for type checking
            source = inspect.getsource(module)
            block = re.search(
                r"if (?:typing\.|_typing\.)?TYPE_CHECKING:\n((?:    .*\n|\n)+)", source
            )
            if block:
                for line in block.group(1).splitlines():
                    m = re.match(r"\s+from (\S+) import \(?(.*?)\)?$", line)
                    if m:
                        hints.update({n.strip(): m.group(1) for n in m.group(2).split(",")})
        objects = []
        for ident in _IDENT.findall(annotation):
            head = ident.split(".")[0]
            if head in names:
                value = names[head]
                for part in ident.split(".")[1:]:
                    value = getattr(value, part, None)
                objects.append(value)
            elif head in hints and hints[head].startswith("telegram_idem"):
                objects.append(getattr(importlib.import_module(hints[head]), head, None))
        return objects
    return [annotation, *[a for arg in typing.get_args(annotation) for a in _resolve(fn, arg)]]


def test_no_public_signature_exposes_a_private_type() -> None:
    public = public_objects()
    problems = set()
    for name in MODULES:
        module = load(name)
        for attr in exported(module):
            obj = getattr(module, attr)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            for where, (fn, annotation) in _annotation_names(obj):
                for value in _resolve(fn, annotation):
                    if (
                        (
                            inspect.isclass(value)
                            or isinstance(
                                value,
                                typing.TypeAliasType if hasattr(typing, "TypeAliasType") else (),
                            )
                        )
                        and getattr(value, "__module__", "").startswith("telegram_idem")
                        and id(value) not in public
                    ):
                        problems.add(
                            f"{name}.{attr} ({where}) exposes {value.__module__}.{value.__qualname__}"
                        )
    assert not problems, "\n".join(sorted(problems))


def surface_markdown() -> str:
    lines = [BEGIN, ""]
    total = 0
    for name in MODULES:
        names = sorted(exported(load(name)))
        total += len(names)
        page = f"reference/{name}.md"  # its API reference page (tests/meta/test_reference_pages.py)
        lines.append(f"### [`{name}`]({page})")
        lines.append("")
        lines.append(
            ", ".join(f"[`{n}`]({page}#{name}.{n})" for n in names)
            if names
            else "(a namespace: its modules)"
        )
        lines.append("")
    lines.append(f"{len(MODULES)} public modules, {total} public names.")
    lines.append("")
    lines.append(END)
    return "\n".join(lines)


def test_the_api_page_lists_exactly_the_public_surface() -> None:
    text = API_PAGE.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, f"{API_PAGE} lacks the {BEGIN} … {END} block"
    current = text[text.index(BEGIN) : text.index(END) + len(END)]
    expected = surface_markdown()
    assert current == expected, f"docs/api.md is out of date; the block should read:\n\n{expected}"


def module_table_rows() -> list[tuple[str, str]]:
    """``(first cell, whole row)`` of the "module | what it is for" table of the page."""
    lines = API_PAGE.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| module |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append((line.split("|")[1].strip().strip("`"), line))
    return rows


def covered_by(module: str, cell: str, row: str) -> bool:
    """``cell`` names ``module``, or a pattern over its package (``pkg.*``, ``pkg.<store>``),
    or ``module``'s parent package whose row names ``.child``."""
    if cell == module:
        return True
    if cell.endswith(".*") or cell.endswith(">"):
        package = cell.rsplit(".", 1)[0]
        return module == package or module.startswith(package + ".")
    parent, _, child = module.rpartition(".")
    return cell == parent and f"`.{child}`" in row


def test_the_module_table_covers_every_public_module() -> None:
    rows = module_table_rows()
    missing = [m for m in MODULES if not any(covered_by(m, cell, row) for cell, row in rows)]
    assert not missing, f"docs/api.md's module table does not mention {missing}"
