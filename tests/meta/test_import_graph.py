"""No module of the package imports itself back at run time (grimp, as import-linter sees
the code). Imports under ``if TYPE_CHECKING:`` name types for mypy and never run, so they
are left out; the layering contracts are in ``pyproject.toml`` (``lint-imports``)."""

from __future__ import annotations

import grimp


def test_no_runtime_import_cycle_in_the_package() -> None:
    graph = grimp.build_graph("telegram_idem", exclude_type_checking_imports=True)
    cycles = sorted(
        (module, imported)
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        if graph.find_shortest_chain(importer=imported, imported=module) is not None
    )
    assert not cycles, f"import cycles (importer, imported): {cycles}"
