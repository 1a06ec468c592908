"""Reading a package's import graph from its source (``ast``, nothing imported), for the layering tests.

Torch-free: the runtime's layering test (tests/runtime) uses it as well as the PyTorch side's
(tests/torch/test_import_graph.py).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple


class Import(NamedTuple):
    """One import of a package's own module: who imports it, where, and whether inside a function."""

    source: str  # the importing module, dotted
    target: str  # the imported module, dotted (``m.x`` for ``from m import x`` when ``m.x`` is a module)
    file: str  # the importing file, relative to the root
    line: int
    in_function: bool


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_exists(root: Path) -> Callable[[str], bool]:
    """Whether a dotted name is a module under ``root``: a .py file, a package, or an extension module."""

    def exists(name: str) -> bool:
        path = root.joinpath(*name.split("."))
        return (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()
                or any(path.parent.glob(f"{path.name}.*.so")))  # an extension module (torch_openreg._C)

    return exists


def targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, exists) -> list[str]:
    """The modules an import statement loads (for ``from m import x``: ``m.x`` when that is a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".")
        base = base[: len(base) - node.level + (1 if is_package else 0)]
        source = ".".join([*base, node.module] if node.module else base)
    else:
        source = node.module or ""
    return [f"{source}.{alias.name}" if exists(f"{source}.{alias.name}") else source for alias in node.names]


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Ids of the nodes under ``if TYPE_CHECKING:`` (imports for annotations: never run)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            found.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return found


def imports(root: Path, package: str, extra: Callable[[str], bool] = lambda name: False) -> Iterator[Import]:
    """Every import of ``package``'s own modules in ``package``, at the top of a module or in a function.

    ``extra(name)``: names that are modules without a file to find (an extension module not built here).
    """
    on_disk = module_exists(root)

    def exists(name: str) -> bool:
        return on_disk(name) or extra(name)

    for path in sorted((root / package).rglob("*.py")):
        module = module_name(path, root)
        tree = ast.parse(path.read_text(), filename=str(path))
        skipped = _type_checking_only(tree)
        in_function = {id(node) for func in ast.walk(tree) if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for node in ast.walk(func)}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in skipped:
                continue
            for target in targets(node, module, path.name == "__init__.py", exists):
                if not (target == package or target.startswith(package + ".")):
                    continue
                while target != package and not exists(target):  # ``import pkg.mod.attr``: the module
                    target = target.rpartition(".")[0]
                yield Import(module, target, str(path.relative_to(root)), node.lineno, id(node) in in_function)


def cycles(edges: list[Import]) -> list[list[Import]]:
    """One import cycle through each group of modules that import each other (a strongly connected
    component of the import graph), as the imports that close it, shortest first."""
    graph: dict[str, dict[str, Import]] = {}
    for edge in edges:
        if edge.source != edge.target:  # ``from . import c`` in c.py names the module itself: no cycle
            graph.setdefault(edge.source, {}).setdefault(edge.target, edge)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components = []

    def visit(node: str) -> None:  # Tarjan's algorithm (import graphs are shallow: recursion is fine)
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = set()
            while True:
                member = stack.pop()
                members.add(member)
                if member == node:
                    break
            if len(members) > 1:
                components.append(members)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    found = []
    for members in components:
        start = min(members)
        paths = {start: []}  # breadth first inside the component: the shortest way back to start
        queue = [start]
        closing = None
        while queue and closing is None:
            node = queue.pop(0)
            for nxt, edge in sorted(graph.get(node, {}).items()):
                if nxt == start:
                    closing = paths[node] + [edge]
                    break
                if nxt in members and nxt not in paths:
                    paths[nxt] = paths[node] + [edge]
                    queue.append(nxt)
        found.append(closing)
    return sorted(found, key=len)


def describe(cycle: list[Import]) -> str:
    """``a -> b (a.py:3) -> a (b.py:7)``."""
    return " -> ".join([cycle[0].source, *(f"{edge.target} ({edge.file}:{edge.line})" for edge in cycle)])
