"""The package's shape: no import cycle between modules of `bench`, function-level imports included.

Imports under `if TYPE_CHECKING:` are left out: they name types for the checker and never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import bench

PACKAGE = Path(bench.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree` except the bodies of `if TYPE_CHECKING:` blocks."""
    nodes: list[ast.AST] = []
    pending = [tree]
    while pending:
        node = pending.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            pending.extend(node.orelse)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return nodes


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """Modules of `bench` that `path` imports when it runs (top level or in functions)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in runtime_nodes(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:  # `from pkg import module` depends on the module, not on pkg's __init__
                target = f"{base}.{alias.name}"
                found.add(target if target in modules else base)
    return (found & modules) - {name}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    return {module_name(path): imports_of(path, modules) for path in paths}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_import_graph_sees_relative_and_function_level_imports_but_not_type_checking_ones() -> None:
    graph = import_graph()
    assert {"bench.lifecycle", "bench.conformance"} <= graph["bench.plugin"]
    assert "bench.report" in graph["bench.lifecycle"]  # imported inside Lifecycle.finish
    assert "bench.localbox.server" in graph["bench.lifecycle"]  # at run time, in Lifecycle.serve
    assert graph["bench.model.server"] >= {"bench.model.api", "bench.model.policy"}  # `from . import api`
    assert "bench.model" not in graph["bench.model.server"]


def test_no_module_of_bench_imports_itself_through_others() -> None:
    assert cycles(import_graph()) == []
