"""The layering docs/ARCHITECTURE.md describes, checked on the source: imports between the packages of
``msprobe`` only go downward, and no modules import each other in a cycle (function-level imports
included). No MindSpore needed: the files are parsed, not imported."""
from __future__ import annotations

import ast
import os
from collections import defaultdict

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "msprobe")

#: package -> the packages it may import (besides itself). Top-level modules count as packages.
ALLOWED = {
    "_version": set(),                               # the tool's version (msprobe/_version.py)
    "format": {"_version"},                          # the on-disk contract: schemas, names, journal, .npy
    "tensors": {"format"},                           # describing values, host access, exact statistics
    "read": {"format"},                              # reading dumps and per-step reports
    "engine": {"tensors", "read", "format"},         # config, runtime state, flush policy, writer, watch
    "capture": {"engine", "tensors", "format"},      # hooks and wrappers on MindSpore
    "mindspore": {"capture", "engine"},              # the seed's facade (PrecisionDebugger, ...)
    "dump": {"read", "format"},                      # the public reader
    "compare": {"dump", "format"},                   # analysis reads dumps through the reader only
    "cli": {"compare", "dump", "format"},            # the msprobe command
    "": {"dump", "mindspore", "_version"},           # msprobe/__init__.py
}


def _modules() -> dict:
    found = {}
    for directory, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                found[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return found


def _imports(modules: dict) -> dict:
    """module -> the msprobe modules it imports (anywhere in the file)."""
    edges = defaultdict(set)
    for module, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # "from msprobe.format import naming" imports the module msprobe.format.naming
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
                targets = subs or [node.module]
            for target in targets:
                if not target.startswith("msprobe"):
                    continue
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    edges[module].add(target)
    return edges


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_packages_only_import_downward():
    edges = _imports(_modules())
    wrong = sorted((a, b) for a, targets in edges.items() for b in targets
                   if _package(a) != _package(b) and _package(b) not in ALLOWED.get(_package(a), set()))
    assert not wrong, "imports against the layering (ALLOWED in this file, docs/ARCHITECTURE.md): " + \
        ", ".join(f"{a} -> {b}" for a, b in wrong)
    assert set(map(_package, _modules())) <= set(ALLOWED), "a new package needs its place in ALLOWED"


def test_no_import_cycles():
    modules = _modules()
    edges = _imports(modules)
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    # a package's __init__ re-exporting its modules is not a cycle between those modules
    cycles = [c for c in cycles if not all(m == c[0] or m.startswith(c[0] + ".") for m in c)]
    assert not cycles, f"modules importing each other: {cycles}"


def test_the_rule_can_fail(tmp_path):
    """The checker itself sees an upward import (guards against a test that cannot fail)."""
    assert "capture" not in ALLOWED["engine"]
    edges = _imports({"msprobe.engine.x": _write(tmp_path, "from msprobe.capture import calls\n"),
                      "msprobe.capture.calls": _write(tmp_path, "")})
    assert edges["msprobe.engine.x"] == {"msprobe.capture.calls"}


def _write(tmp_path, text):
    path = tmp_path / f"m{len(list(tmp_path.iterdir()))}.py"
    path.write_text(text)
    return str(path)
