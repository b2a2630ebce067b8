"""Import circles among recprof's and the tuner's modules, found on grimp's import graph (the one
import-linter checks the layers on): every group of modules that import each other, directly or
through others. `python tests/import_cycles.py` prints them and exits 1 when there is one."""

from __future__ import annotations

import sys

import grimp


def import_cycles(*packages: str) -> list[list[str]]:
    """The strongly connected groups of two or more modules (Tarjan's algorithm)."""
    graph = grimp.build_graph(*packages)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in edges.get(module, []):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges) + 100))
    for module in sorted(edges):
        if module not in index:
            visit(module)
    return sorted(cycles)


if __name__ == "__main__":
    found = import_cycles("recprof", "tuner")
    for cycle in found:
        print("import circle: " + " <-> ".join(cycle))
    sys.exit(1 if found else 0)
