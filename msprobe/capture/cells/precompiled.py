"""Graphs that MindSpore compiled before the L0 probes were installed.

The probes (:mod:`msprobe.capture.cells.graph_cell`) are compiled into a graph. MindSpore keeps
each compiled graph (in GRAPH_MODE in the calling Cell's ``compile_cache``; for a ``mindspore.jit``
Cell under PyNative in the Cell's ``phase_cache``) and reuses it when the Cell is called again with
arguments of the same kind, so a graph compiled before the first ``start(model)`` (the network run
before the debugger was started) runs without the probes: in GRAPH_MODE its steps are dumped empty,
and the Cells inside a jit Cell are not recorded. :func:`precompiled_warning` says so, naming the
Cells (:func:`compiled_holders`, :func:`compiled_jit_cells`), and in GRAPH_MODE gives an empty step's
reason.
"""
from __future__ import annotations

import gc
import types

from mindspore import nn


def compiled_holders(models) -> list:
    """The graphs already compiled in GRAPH_MODE that run a Cell of ``models`` (``[(index or None,
    Cell)]``), as ``[(name, Cell)]``, outermost first as found; ``[]`` when MindSpore has compiled
    nothing yet (then nothing is scanned). A graph is one of

    * a Cell that is, or holds, a Cell of the models (``name`` None), compiled when it was called;
    * a ``mindspore.jit`` function that reaches such a Cell (``name``: the function's name, e.g.
      ``after_grad``, the function ``mindspore.value_and_grad`` and ``mindspore.grad`` make in
      GRAPH_MODE), compiled when it was called: the Cell is the one it differentiates.

    Reads MindSpore's tables of compiled graphs (``mindspore.graph.api.cells_compile_cache`` and
    ``ms_compile_cache``) and, only when one is not empty, the objects the garbage collector tracks,
    once."""
    try:
        from mindspore.graph.api import cells_compile_cache, ms_compile_cache
    except ImportError:  # another MindSpore layout: nothing to tell
        return []
    cells_compiled = any(cells_compile_cache.values())
    if not cells_compiled and not ms_compile_cache:
        return []
    ours = {id(cell) for _, root in models for _, cell in root.cells_and_names()}

    def holds_ours(cell) -> bool:
        return any(id(inner) in ours for _, inner in cell.cells_and_names())

    holders, functions = [], []
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance asks a weak proxy for __class__, which raises once
        # its referent is gone
        kind = type(obj)
        if cells_compiled and issubclass(kind, nn.Cell) and obj.__dict__.get("_compile_cache"):
            if holds_ours(obj):
                holders.append(obj)
        elif ms_compile_cache and kind is types.FunctionType and obj.__dict__.get("__wrapped_by_jit__"):
            found = _compiled_jit_function(obj, ms_compile_cache, holds_ours)
            if found is not None:
                functions.append(found)
    inner = {id(cell) for holder in holders for name, cell in holder.cells_and_names() if name}
    return [(None, holder) for holder in holders if id(holder) not in inner] + functions


def _compiled_jit_function(wrapper, compiled, holds_ours):
    """``(name, Cell)`` when the ``mindspore.jit`` function ``wrapper`` reaches a Cell for which
    ``holds_ours(Cell)`` is true (:func:`_reached`) and MindSpore compiled it already (a phase of ``compiled`` starts with
    the name MindSpore gives its graphs: module, name, file, line and the decoration's ``hash_obj``);
    else None."""
    bound = _closure(wrapper)
    func, stamp = bound.get("func"), bound.get("hash_obj")
    if not isinstance(func, types.FunctionType) or stamp is None:
        return None
    cell = next((value for value in _reached(func)
                 if issubclass(type(value), nn.Cell) and holds_ours(value)), None)
    if cell is None:
        return None
    code = func.__code__
    prefix = f"{func.__module__}.{func.__name__}.{code.co_filename}.{code.co_firstlineno}.{stamp}."
    return (func.__name__, cell) if any(phase.startswith(prefix) for phase in compiled) else None


def _reached(func) -> list:
    """The values ``func`` closes over and, for each that is a function (the ``fn`` given to
    ``mindspore.value_and_grad``, e.g. ``def forward_fn(x, y): return loss_fn(net(x), y)``), the
    values that function closes over and the module globals it names."""
    values = list(_closure(func).values())
    for value in list(values):
        if type(value) is types.FunctionType:
            values += _closure(value).values()
            scope = value.__globals__
            values += [scope[name] for name in value.__code__.co_names if name in scope]
    return values


def _closure(func) -> dict:
    """The values ``func`` closes over, by name (empty cells left out)."""
    values = {}
    for name, cell in zip(func.__code__.co_freevars, func.__closure__ or ()):
        try:
            values[name] = cell.cell_contents
        except ValueError:  # a cell not yet filled
            pass
    return values


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


def _graph_name(function: str | None, cell, is_model: bool) -> str:
    """How the WARNING names one graph of :func:`compiled_holders`."""
    whose = "the model" if is_model else "it holds the model"
    if function is None:
        return f"{type(cell).__name__} ({whose})"
    made = "; made by mindspore.value_and_grad or mindspore.grad" if function == "after_grad" else ""
    return f"the jit function {function} of {type(cell).__name__} ({whose}{made})"


def precompiled_warning(models, graph_mode: bool, jit_cells=()) -> tuple[str | None, str | None]:
    """The WARNING for graphs compiled before the first install of the L0 probes and, in GRAPH_MODE,
    the cause an empty step's ``empty_reason`` adds; ``(None, None)`` when no graph of ``models``
    (``[(index or None, Cell)]``) was compiled yet.

    Args:
        graph_mode: GRAPH_MODE (the Cells holding the model and the jit functions differentiating
            it, :func:`compiled_holders`); else PyNative, where only the ``mindspore.jit`` Cells
            ``jit_cells`` (``(model index, path)``) are compiled (:func:`compiled_jit_cells`; their
            steps are not empty: no reason).
    """
    if graph_mode:
        holders = compiled_holders(models)
        if not holders:
            return None, None
        roots = {id(root) for _, root in models}
        named = ", ".join(_graph_name(name, cell, id(cell) in roots) for name, cell in holders)
        many = len(holders) > 1
        what = "the Cell or the gradient function" if any(name for name, _ in holders) else "the Cell"
        cause = f"{named} {'were' if many else 'was'} compiled before start(model) installed the L0 probes"
        return (f"msprobe: GRAPH_MODE: {cause}; MindSpore reuses a compiled graph without them, so "
                f"{'their' if many else 'its'} calls record nothing (empty dumps). {_WHAT_TO_DO}, or "
                f"build {what} that is called after start()",
                f"{cause}, and MindSpore runs the graph compiled without them (call start(model) before "
                "the first training step)")
    compiled = compiled_jit_cells(models, jit_cells)
    if not compiled:
        return None, None
    named = ", ".join(f"{path if index is None else f'{index}.{path}'} ({type(cell).__name__})"
                      for index, path, cell in compiled)
    many = len(compiled) > 1
    return (f"msprobe: the mindspore.jit Cell{'s' * many} {named} {'were' if many else 'was'} compiled "
            f"before start(model) installed the L0 probes inside {'them' if many else 'it'}; MindSpore "
            "reuses a compiled graph without them, so the Cells inside "
            f"{'them' if many else 'it'} are not recorded (the dump's graph/ tree holds none of them; "
            f"the jit Cell itself is recorded as one call). {_WHAT_TO_DO}"), None
