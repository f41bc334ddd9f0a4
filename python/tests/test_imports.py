"""The Python package's own imports form no circle: read from the sources with ``ast``, imports
at module level and inside functions alike, and the dynamic ones (``importlib.import_module``,
``__import__``, a reach into ``sys.modules``) too. Needs no build: nothing is imported."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pipeprof"


def module_name(path, root):
    """``pipeprof._auto`` for ``ROOT/_auto.py``, ``pipeprof`` for ``ROOT/__init__.py``."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _target(name, modules):
    """The package module ``name`` stands for (its longest known prefix), or None."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _dynamic_name(node):
    """The module a call or subscript names at run time: ``importlib.import_module("x")``,
    ``__import__("x")``, ``sys.modules.get("x")``, ``sys.modules["x"]``; else None."""
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        on_modules = isinstance(f, ast.Attribute) and f.attr == "get" and ast.unparse(f.value) == "sys.modules"
        if name in ("import_module", "__import__") or on_modules:
            return node.args[0].value if isinstance(node.args[0].value, str) else None
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "sys.modules":
        key = node.slice
        return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None
    return None


def imports_of(source, name, package, modules):
    """The package modules that module ``name`` (of ``package``) imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from pipeprof import _auto` imports the module `pipeprof._auto`; `from pipeprof
            # import span` the package itself.
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            dynamic = _dynamic_name(node)
            names = [dynamic] if dynamic else []
        for n in names:
            t = _target(n, modules)
            if t is not None and t != name:
                found.add(t)
    return found


def import_graph(root):
    """Who imports whom among the modules under ``root`` (a package folder)."""
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = imports_of(path.read_text(), name, package, files)
    return graph


def circles(graph):
    """The circles a depth-first walk of ``graph`` meets (one per edge back onto its path: none
    exactly when the graph has no circle), each as its modules from the smallest name."""
    found = set()

    def walk(node, path, on_path):
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_path:
                loop = path[path.index(nxt) :]
                i = loop.index(min(loop))
                found.add(tuple(loop[i:] + loop[:i]))
            elif nxt not in done:
                walk(nxt, path + [nxt], on_path | {nxt})
        done.add(node)

    done = set()
    for start in sorted(graph):
        if start not in done:
            walk(start, [start], {start})
    return sorted(found)


def _package(tmp_path, files):
    root = tmp_path / "pkg"
    root.mkdir()
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_the_graph_sees_imports_inside_functions_relative_and_dynamic(tmp_path):
    root = _package(
        tmp_path,
        {
            "__init__.py": "from . import _a\n",
            "_a.py": "import os\n\ndef f():\n    from pkg import _b\n",
            "_b.py": "import importlib\nimportlib.import_module('pkg._c')\n",
            "_c.py": "import sys\nT = sys.modules.get('pkg._a')\n",
            "_d.py": "from pkg._c import T\nfrom pkg import f\n",
        },
    )
    graph = import_graph(root)
    assert graph == {
        "pkg": {"pkg._a"},
        "pkg._a": {"pkg._b"},
        "pkg._b": {"pkg._c"},
        "pkg._c": {"pkg._a"},
        "pkg._d": {"pkg._c", "pkg"},
    }
    assert circles(graph) == [("pkg._a", "pkg._b", "pkg._c")]


def test_a_graph_without_circles_has_none(tmp_path):
    root = _package(tmp_path, {"__init__.py": "", "_a.py": "from . import _b\n", "_b.py": "import pkg\n"})
    assert circles(import_graph(root)) == []


# The package's notebook entry points (`pipeprof.profile`, `pipeprof.last`,
# `load_ipython_extension`, which `%load_ext pipeprof` needs on the package itself) import
# their module when called, never at import. They are the one exception, named here; the
# fix that removes it is a core module (`_api`) that the hook modules import instead of the
# package, so that the package is a facade nothing inside imports.
LAZY_ENTRY_POINTS = {("pipeprof", "pipeprof._profile"), ("pipeprof", "pipeprof.notebook")}


def test_no_import_circles_in_pipeprof():
    graph = import_graph(PACKAGE)
    # The graph is read, not empty: the start-up hook's own imports are in it.
    assert "pipeprof._torch_loop" in graph.get("pipeprof._auto", ()), graph
    for a, b in LAZY_ENTRY_POINTS:
        assert b in graph.get(a, ()), (a, b, "no longer imported: drop it from LAZY_ENTRY_POINTS")
        graph[a] = graph[a] - {b}
    found = circles(graph)
    assert found == [], "import circles: " + "; ".join(" → ".join(c + (c[0],)) for c in found)
