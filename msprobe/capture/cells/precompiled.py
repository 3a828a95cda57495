"""GRAPH_MODE: graphs that MindSpore compiled before the L0 probes were installed.

The probes (:mod:`msprobe.capture.cells.graph_cell`) are compiled into a Cell's graph. MindSpore
keeps each compiled graph in the calling Cell's ``compile_cache`` and reuses it when the Cell is
called again with arguments of the same kind, so a graph compiled before the first
``start(model)`` (a training step run before the debugger was started) runs without the probes:
its steps are dumped empty. :func:`compiled_holders` finds those Cells so the service can say so.
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
