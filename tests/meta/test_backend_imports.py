"""The house rules of issue 9: no import cycle through the stores, and no module of the
package reaching into another module's underscore names.

Read from the source (``ast``), so a lazy import inside a function counts as much as one
at the top. Rules, for every module of ``telegram_idem/`` (cycles: those through the
server stores' packages and the shared ``_base``, ``_driver`` and ``_url``; the runtime
import graph of the whole package is ``test_import_graph.py``'s):

- no import cycle through any of them (an import of ``a.b`` is an edge to ``a.b``, not
  to the package ``a``, as import-linter counts it);
- ``from m import _name`` only when ``m._name`` is a private *module* of a package the
  importer belongs to (a private module may be imported by its own package);
- no ``obj._name`` attribute access on anything but ``self``, ``cls`` or ``super()`` (an
  object's underscore members are its own), namedtuple's ``_replace`` aside.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "telegram_idem"
BACKENDS = PACKAGE / "backends"
OWNED_PACKAGES = ("postgres", "redis", "dynamodb")
OWNED_MODULES = ("_base", "_driver", "_url")
PUBLIC_UNDERSCORE = {"_replace", "_asdict", "_fields"}  # namedtuple's public API


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def backend_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def owned(name: str) -> bool:
    if not name.startswith("telegram_idem.backends"):
        return False
    tail = name.removeprefix("telegram_idem.backends").lstrip(".")
    return tail.split(".")[0] in OWNED_PACKAGES or tail in OWNED_MODULES


def imports_of(
    source: str, package: str, modules: dict[str, Path]
) -> list[tuple[str, str | None, int]]:
    """``(module, imported name or None, line)`` for every import in ``source``, a module
    of ``package`` (relative imports resolve against it)."""
    found: list[tuple[str, str | None, int]] = []
    tree = ast.parse(source)
    typing_only = {  # imports under `if TYPE_CHECKING:` never run
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:  # a submodule, not a name
                    found.append((f"{base}.{alias.name}", None, node.lineno))
                else:
                    found.append((base, alias.name, node.lineno))
    return found


def package_of(path: Path) -> str:
    name = module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def graph() -> dict[str, set[str]]:
    modules = backend_modules()
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = imports_of(path.read_text(encoding="utf-8"), package_of(path), modules)
        edges[name] = {target for target, _, _ in found if target in modules}
    return edges


def cycles_through_owned(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan) of more than one module, or a self-import,
    that contain an owned module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            cyclic = len(component) > 1 or node in edges.get(node, ())
            if cyclic and any(owned(m) for m in component):
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_through_the_server_stores() -> None:
    assert cycles_through_owned(graph()) == []


def test_the_checker_finds_a_cycle() -> None:
    edges = {
        "telegram_idem.backends.redis._a": {"telegram_idem.backends.redis._b"},
        "telegram_idem.backends.redis._b": {"telegram_idem.backends.redis._a"},
        "telegram_idem.backends.memory": {"telegram_idem.backends.memory"},
    }
    assert cycles_through_owned(edges) == [
        ["telegram_idem.backends.redis._a", "telegram_idem.backends.redis._b"]
    ]


def private_name_uses(source: str, me: str, package: str, modules: dict[str, Path]) -> list[str]:
    """Every use in ``source`` (module ``me`` of ``package``) of another module's
    underscore names, as ``"<module>:<line>: <what>"``."""
    found: list[str] = []
    for target, name, line in imports_of(source, package, modules):
        if name is not None and name.startswith("_") and not name.startswith("__"):
            found.append(f"{me}:{line}: imports {target}.{name}")
        last = target.rpartition(".")[2]
        if name is None and last.startswith("_") and not last.startswith("__"):
            owner = target.rpartition(".")[0]
            if not (me == owner or me.startswith(owner + ".")):
                found.append(f"{me}:{line}: imports private module {target}")
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or attr.startswith("__") or attr in PUBLIC_UNDERSCORE:
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        value = node.value
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            if value.func.id == "super":  # its own class's members
                continue
        found.append(f"{me}:{node.lineno}: uses .{attr} of another object")
    return found


@pytest.mark.parametrize(
    "name", list(backend_modules()), ids=lambda n: n.removeprefix("telegram_idem.")
)
def test_no_module_uses_another_modules_underscore_names(name: str) -> None:
    modules = backend_modules()
    path = modules[name]
    source = path.read_text(encoding="utf-8")
    assert private_name_uses(source, name, package_of(path), modules) == []


def test_the_checker_finds_private_uses() -> None:
    source = (
        "from telegram_idem.backends.postgres._store import _record\n"
        "from telegram_idem.backends.postgres import _sql\n"
        "from . import _connection\n"
        "def f(store, self):\n    return store._call, self._x, parts._replace\n"
    )
    me = "telegram_idem.backends.redis._probe"
    found = private_name_uses(source, me, "telegram_idem.backends.redis", backend_modules())
    assert [f.split(": ", 1)[1] for f in found] == [
        "imports telegram_idem.backends.postgres._store._record",
        "imports private module telegram_idem.backends.postgres._sql",
        "uses ._call of another object",
    ], found
