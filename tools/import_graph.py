#!/usr/bin/env python3
"""Read the import graph of the project's Python packages and report what breaks the layering.

Three things are reported:

- upward imports: a package importing one of a layer above its own (`LAYERS`, lowest first), or a
  package missing from `LAYERS`; with strict layers no two packages can import each other in a circle;
- import cycles: strongly connected groups of modules that import one another at run time, at
  import or later inside a function (imports under ``if TYPE_CHECKING:`` never run: their cycles
  are listed, not counted as failures);
- deferred imports: a project module imported inside a function (outside ``if TYPE_CHECKING:``),
  usually to dodge a cycle.

``python tools/import_graph.py`` prints both and exits 1 if either exists; ``--summary`` prints the
counts only. ``tests/project/test_layering.py`` runs the same checks.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SRC = REPO_ROOT / "src"
PACKAGES = ("dra_gpu", "cdi")
SKIP = ("dra_gpu._proto",)  # generated code

LAYERS: tuple[tuple[str, ...], ...] = (
    # the driver's name and version; the CDI library; helpers that import nothing of the project
    ("dra_gpu", "cdi", "quantity", "text", "logs"),
    # the limiter's files, as the native library reads them (the configuration takes its names from there)
    ("limiter_abi",),
    # shared vocabulary and file formats; the Kubernetes API, configuration, GPUs
    (
        "flags",
        "proto",
        "vocabulary",
        "http_endpoint",
        "kube",
        "config",
        "inventory",
    ),
    # what the controller and the node agent are built of (host: GPU commands, driver root, cgroups)
    ("allocator", "monitor", "host"),
    # the kinds of device (a whole GPU, a MIG instance): how each is published and what a prepared one needs
    ("devicekinds",),
    ("controller", "plugin", "slices"),
    ("usage", "manifests", "node_agent"),
    ("demo",),
    ("commands",),
    ("cli",),
)
"""The packages of `src/` (a top-level module counts as a package), lowest first. A package imports only
packages of lower layers; a new package gets its place here before the layering test passes."""


@dataclass(frozen=True)
class DeferredImport:
    """A project import inside a function body."""

    module: str
    line: int
    target: str


@dataclass
class Graph:
    """Run-time import edges between project modules, and the deferred imports found."""

    modules: dict[str, Path] = field(default_factory=dict)
    edges: dict[str, set[str]] = field(default_factory=dict)
    deferred: list[DeferredImport] = field(default_factory=list)
    typing_edges: dict[str, set[str]] = field(default_factory=dict)

    def all_edges(self, *, typing: bool = False) -> dict[str, set[str]]:
        """Module-level edges plus the deferred ones (and those under TYPE_CHECKING if `typing`)."""
        out = {name: set(targets) for name, targets in self.edges.items()}
        for item in self.deferred:
            out[item.module].add(item.target)
        if typing:
            for name, targets in self.typing_edges.items():
                out[name] |= targets
        return out


def _module_name(src: Path, path: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    """Project modules an import statement loads (the named submodule where it is one)."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = _resolve(module, is_package, node)
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            names.append(sub if sub in known else base)
    out = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name.split(".")[0] in PACKAGES and not name.startswith(SKIP):
            out.append(name)
    return out


class _Visitor(ast.NodeVisitor):
    def __init__(self, graph: Graph, module: str, is_package: bool) -> None:
        self.graph = graph
        self.module = module
        self.is_package = is_package
        self.depth = 0  # function nesting
        self.typing = False  # under `if TYPE_CHECKING:`

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self.typing = True
            for child in node.body:
                self.visit(child)
            self.typing = False
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function
    visit_Lambda = _function

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        for target in _targets(self.module, self.is_package, node, set(self.graph.modules)):
            if target == self.module:
                continue
            if self.typing:
                self.graph.typing_edges[self.module].add(target)
            elif self.depth:
                item = DeferredImport(self.module, node.lineno, target)
                if item not in self.graph.deferred:
                    self.graph.deferred.append(item)
            else:
                self.graph.edges[self.module].add(target)

    visit_Import = _import
    visit_ImportFrom = _import


def build(src: Path = SRC) -> Graph:
    """Parse every project module under `src` and collect its imports."""
    graph = Graph()
    for package in PACKAGES:
        for path in sorted((src / package).rglob("*.py")):
            name = _module_name(src, path)
            if not name.startswith(SKIP):
                graph.modules[name] = path
    for name, path in graph.modules.items():
        graph.edges[name] = set()
        graph.typing_edges[name] = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        _Visitor(graph, name, path.name == "__init__.py").visit(tree)
    return graph


def package_of(module: str) -> str:
    """`dra_gpu.plugin.sharing.modes.limiter` -> `plugin`; `dra_gpu` -> `dra_gpu`; `cdi.spec` -> `cdi`."""
    parts = module.split(".")
    if parts[0] != "dra_gpu":
        return parts[0]
    return parts[1] if len(parts) > 1 else parts[0]


def layer_of(layers: tuple[tuple[str, ...], ...] = LAYERS) -> dict[str, int]:
    return {package: n for n, layer in enumerate(layers) for package in layer}


def undeclared(graph: Graph, layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """Packages of the graph that `layers` does not place."""
    known = layer_of(layers)
    return sorted({package_of(m) for m in graph.modules} - set(known))


def upward(graph: Graph, layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[tuple[str, str]]:
    """(module, target) for every import, run-time or deferred, of a package of the same or a higher
    layer (TYPE_CHECKING imports included: an annotation names the package it depends on)."""
    layer = layer_of(layers)
    found = []
    for module, targets in sorted(graph.all_edges(typing=True).items()):
        here = package_of(module)
        for target in sorted(targets):
            there = package_of(target)
            if here != there and here in layer and there in layer and layer[there] >= layer[here]:
                found.append((module, target))
    return found


def package_edges(graph: Graph) -> dict[str, set[str]]:
    """Imports between packages (run-time and deferred)."""
    out: dict[str, set[str]] = {}
    for module, targets in graph.all_edges().items():
        here = package_of(module)
        out.setdefault(here, set())
        for target in targets:
            if package_of(target) != here:
                out[here].add(package_of(target))
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of two or more modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(edges[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop(0)
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(edges.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--summary", action="store_true", help="print the counts only")
    args = parser.parse_args(argv)
    graph = build()
    run_time = cycles(graph.edges)
    with_deferred = cycles(graph.all_edges())
    with_typing = cycles(graph.all_edges(typing=True))
    against_layers = upward(graph)
    missing = undeclared(graph)
    package_cycles = cycles(package_edges(graph))
    if not args.summary:
        for module, target in against_layers:
            print(f"upward import: {module} imports {target} (see LAYERS)")
        for package in missing:
            print(f"package not in LAYERS: {package}")
        for group in package_cycles:
            print("package cycle: " + " <-> ".join(group))
        for group in with_deferred:
            print("cycle: " + " <-> ".join(group))
        for group in with_typing:
            if group not in with_deferred:
                print("cycle through TYPE_CHECKING imports (not a failure): " + " <-> ".join(group))
        for item in graph.deferred:
            path = graph.modules[item.module].relative_to(REPO_ROOT)
            print(f"deferred import: {path}:{item.line} imports {item.target}")
    print(
        f"modules: {len(graph.modules)}  cycles: {len(run_time)} at import time, "
        f"{len(with_deferred)} with deferred imports, {len(with_typing)} with TYPE_CHECKING imports  "
        f"deferred imports: {len(graph.deferred)}  upward imports: {len(against_layers)}  "
        f"package cycles: {len(package_cycles)}"
    )
    return 1 if with_deferred or graph.deferred or against_layers or missing or package_cycles else 0


if __name__ == "__main__":
    sys.exit(main())
