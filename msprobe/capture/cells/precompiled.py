"""Graphs that MindSpore compiled before the L0 probes were installed.

The probes (:mod:`msprobe.capture.cells.graph_cell`) are compiled into a graph. MindSpore keeps
each compiled graph (in GRAPH_MODE in the calling Cell's ``compile_cache``; for a ``mindspore.jit``
Cell under PyNative in the Cell's ``phase_cache``) and reuses it when the Cell is called again with
arguments of the same kind, so a graph compiled before the first ``start(model)`` (the network run
before the debugger was started) runs without the probes: in GRAPH_MODE its steps are dumped empty,
and the Cells inside a jit Cell are not recorded. :func:`precompiled_warning` says so, naming the
Cells (:func:`compiled_holders`, :func:`compiled_jit_cells`).
"""
from __future__ import annotations

import gc

from mindspore import nn


def compiled_holders(models) -> list:
    """The Cells already compiled in GRAPH_MODE that are, or hold, a Cell of ``models``
    (``[(index or None, Cell)]``), outermost first as found; ``[]`` when MindSpore has compiled no
    Cell yet (then nothing is scanned).

    Reads MindSpore's table of every Cell's compile cache (``mindspore.graph.api.cells_compile_cache``)
    and, only when one is not empty, the objects the garbage collector tracks, once."""
    try:
        from mindspore.graph.api import cells_compile_cache
    except ImportError:  # another MindSpore layout: nothing to tell
        return []
    if not any(cells_compile_cache.values()):
        return []
    ours = {id(cell) for _, root in models for _, cell in root.cells_and_names()}
    holders = []
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance asks a weak proxy for __class__, which raises once
        # its referent is gone
        if issubclass(type(obj), nn.Cell) and obj.__dict__.get("_compile_cache"):
            if any(id(cell) in ours for _, cell in obj.cells_and_names()):
                holders.append(obj)
    inner = {id(cell) for holder in holders for name, cell in holder.cells_and_names() if name}
    return [holder for holder in holders if id(holder) not in inner]


def compiled_jit_cells(models, jit_cells) -> list:
    """The ``mindspore.jit`` Cells among ``jit_cells`` (``(model index, path)``, as
    :func:`msprobe.capture.cells.graph_cell.outermost_jit_cells` gives them) that MindSpore has
    compiled already under PyNative: ``[(index, path, Cell)]`` by index and path."""
    roots = dict(models)
    found = []
    for index, path in sorted(jit_cells, key=lambda key: (-1 if key[0] is None else key[0], key[1])):
        cell = dict(roots[index].cells_and_names()).get(path) if index in roots else None
        if cell is not None and getattr(cell, "phase_cache", None):
            found.append((index, path, cell))
    return found


_WHAT_TO_DO = "Call debugger.start(model) before the first call of the network (before the first training step)"


def precompiled_warning(models, graph_mode: bool, jit_cells=()) -> str | None:
    """The WARNING for graphs compiled before the first install of the L0 probes, or None when no
    graph of ``models`` (``[(index or None, Cell)]``) was compiled yet.

    Args:
        graph_mode: GRAPH_MODE (the Cells holding the model, :func:`compiled_holders`); else PyNative,
            where only the ``mindspore.jit`` Cells ``jit_cells`` (``(model index, path)``) are
            compiled (:func:`compiled_jit_cells`).
    """
    if graph_mode:
        holders = compiled_holders(models)
        if not holders:
            return None
        roots = {id(root) for _, root in models}
        named = ", ".join(f"{type(h).__name__} ({'the model' if id(h) in roots else 'it holds the model'})"
                          for h in holders)
        return (f"msprobe: GRAPH_MODE: {named} was compiled before start(model) installed the L0 probes; "
                "MindSpore reuses a compiled graph without them, so its calls record nothing (empty "
                f"dumps). {_WHAT_TO_DO}, or build the Cell that is called after start()")
    compiled = compiled_jit_cells(models, jit_cells)
    if not compiled:
        return None
    named = ", ".join(f"{path if index is None else f'{index}.{path}'} ({type(cell).__name__})"
                      for index, path, cell in compiled)
    many = len(compiled) > 1
    return (f"msprobe: the mindspore.jit Cell{'s' * many} {named} {'were' if many else 'was'} compiled "
            f"before start(model) installed the L0 probes inside {'them' if many else 'it'}; MindSpore "
            "reuses a compiled graph without them, so the Cells inside "
            f"{'them' if many else 'it'} are not recorded (the dump's graph/ tree holds none of them; "
            f"the jit Cell itself is recorded as one call). {_WHAT_TO_DO}")
