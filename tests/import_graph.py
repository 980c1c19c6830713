"""The project's import graph read from its source (AST, no imports executed), for the structural tests.

Every `import` / `from ... import` statement counts, at module level or inside a function (a function-level
import ties two files together as much as a top-level one). Relative imports are resolved against the file's
package. An edge a -> b means module a imports module b (or a name defined in it); an import of a package's
submodule counts as an import of that submodule, not of the package's __init__.
"""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("jaxinfer", "serving", "pallas_kernels")


def modules(packages=PACKAGES) -> dict[str, str]:
    """Dotted module name -> file path, for every .py file under the packages (a package is its __init__)."""
    out = {}
    for pkg in packages:
        for d, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(d, f)
                    name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    out[name.removesuffix(".__init__")] = path
    return out


def imported_names(path: str, module: str) -> list[tuple[str, int]]:
    """(dotted name, line) of everything a file imports, relative imports resolved; `from a import b` gives both
    'a' and 'a.b' (b may be a submodule)."""
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            names += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names += [(base, node.lineno)] + [(f"{base}.{a.name}", node.lineno) for a in node.names]
    return names


def graph(packages=PACKAGES) -> dict[str, dict[str, int]]:
    """module -> {imported project module: line of the first such import}; imports of the module's own parent
    packages (implicit in Python) are left out."""
    mods = modules(packages)
    out = {}
    for m, path in mods.items():
        deps: dict[str, int] = {}
        for name, line in imported_names(path, m):
            while name and name not in mods:
                name = name.rpartition(".")[0]
            if name and name != m and not m.startswith(name + "."):
                deps.setdefault(name, line)
        out[m] = deps
    return out


def strongly_connected(g: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's algorithm: the import circles (components of more than one module), each sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found
