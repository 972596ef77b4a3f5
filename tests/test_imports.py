"""The import graph of the project's own modules (engine, sim, harness, kernels): no circles, and a
core that depends on nothing but itself and the standard library.

Every import statement counts, those inside functions included (a function-level import hides
a circle, it does not remove one); only `if TYPE_CHECKING:` blocks are left out, as they never
run. Importing a package's submodule is an edge to that submodule, not to the package's
__init__.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "sim", "harness", "kernels")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST):
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
            else:
                stack.append(child)


def imported_names(name: str, path: Path) -> set[str]:
    """Every module name this module imports (absolute, any module, project or not)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    # `from pkg import sub` lists pkg and pkg.sub; `from pkg.mod import Name` lists pkg.mod and
    # pkg.mod.Name, which is no module and drops out here
    return {name: {m for m in imported_names(name, path) if m in modules and m != name}
            for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_function_level_circle(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [{"a", "b", "c"}]
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\n"
                      "def f():\n    from sim import features\n    from . import sibling\n")
    assert imported_names("engine.core.m", source) >= {"sim", "sim.features", "engine.core.sibling"}
    assert "x" not in imported_names("engine.core.m", source)


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_the_core_imports_only_itself_and_the_standard_library():
    forbidden = ("torch", "hydra", "omegaconf", "numpy", "pandas", "sim", "harness", "kernels", "triton")
    modules = project_modules()
    for name, path in modules.items():
        if not (name == "engine.core" or name.startswith("engine.core.")):
            continue
        for imported in imported_names(name, path):
            top = imported.split(".")[0]
            outside_core = top == "engine" and imported != "engine.core" and not imported.startswith("engine.core.")
            assert top not in forbidden and not outside_core, f"{name} imports {imported}"
