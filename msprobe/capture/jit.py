"""Calls of ``mindspore.jit``-compiled functions and Cells at L1/mix (seed: jit notes under
"动态图场景").

A compiled region runs as one graph: hooks inside it never fire, and the tool's Cell hooks are
taken off the Cells while it compiles and runs (MindSpore would compile them into it). While the dump
runs:

* each call of a ``jit`` function compiled from its source (``capture_mode="ast"``, the default) is
  recorded as one API entry ``Jit.{name}.{n}.forward`` / ``.backward`` with its positional inputs and
  outputs, so the region is visible in the dump rather than silently absent. ``name`` is the
  function's ``__name__``, or the Cell class name for a jit-decorated ``construct``;
* each call of a ``capture_mode="bytecode"`` function is recorded the same way, and compiles as
  without the tool: its body runs with every wrapper and hook of the tool off, since MindSpore
  captures the bytecode of whatever the body calls (run as plain PyNative instead, the body computes
  other bits than its graph). Its inside is not recorded API by API.

At L0 nothing is recorded for a compiled call: it runs (and compiles) with the Cell hooks paused, a
``capture_mode="bytecode"`` function's body also with the in-place guard off, as at L1/mix.
"""
from __future__ import annotations

import contextlib

try:
    from mindspore.graph.api import _JitExecutor
except ImportError:  # older MindSpore layouts
    from mindspore.common.api import _JitExecutor

from mindspore.nn import Cell

from msprobe.capture.backward import _flatten_tensors
from msprobe.engine.handles import HandleSet, patch_attribute
from msprobe.format import naming

try:
    from mindspore.graph._utils.pijit_context import PIJitCaptureContext
except ImportError:  # no bytecode capture in this MindSpore
    PIJitCaptureContext = None


def _region_name(executor) -> str:
    if executor.obj is not None:
        return type(executor.obj).__name__
    return getattr(executor.fn, "__name__", "jit")


def _cell_writes(obj, args: tuple, kwargs: dict):
    """What a compiled region may write, as ``CallRecorder.call``'s ``mutates`` takes it: for a Cell's
    compiled ``construct``, a callable returning the Cell's Parameters (its sub-Cells' and
    ``ParameterTuple`` attributes' too: an optimizer's includes the network's weights and its
    moments) and the tensors among the arguments; ``True`` (anything) for a ``jit`` function, which
    may reach any Parameter."""
    if not isinstance(obj, Cell):
        return True

    def written() -> list:
        return [*obj.get_parameters(), *_flatten_tensors((args, kwargs), [])]

    return written


def _may_call_cells(obj) -> bool:
    """Whether a compiled call may run Cells (and so compile their forward hooks): a ``jit`` function,
    or a Cell's ``construct`` when the Cell has sub-Cells (an optimizer has none: its compiled update
    runs with the hooks left on, ~0.3 ms less per step on the benchmark LM at L0)."""
    return not isinstance(obj, Cell) or bool(obj._cells)


def install_jit_capture(recorder=None, inside=None, pause=None, unhooked=None, runtime=None) -> HandleSet:
    """Patch ``_JitExecutor.__call__`` (and, where MindSpore has bytecode capture,
    ``PIJitCaptureContext``) so compiled calls are recorded by ``recorder`` and run with the Cell hooks
    paused.

    Args:
        recorder: ``None`` (nothing recorded), or the :class:`msprobe.capture.calls.CallRecorder`
            recording each call made while it records.
        inside: ``None``, or a callable taking the forward entry name of a compiled call
            (``"Jit.{name}.{n}.forward"``, str) and what the call returned, called once the
            region has returned and before its output is recorded: in GRAPH_MODE the Cells probed
            inside it are recorded with it as their ``construct.json`` parent (in watch mode there
            and then, before its output).
        pause: ``None``, or a callable returning the context manager in which every compiled call
            runs (and compiles): the tool's Cell hooks off
            (:meth:`msprobe.capture.cells.cell.CellCapture.paused`). Its argument is the ``jit``
            function's ``__name__`` (str), or ``None`` for a Cell's compiled ``construct``.
        unhooked: ``None``, or a callable without arguments returning the context in which the body
            of a ``capture_mode="bytecode"`` function called while recording runs: every wrapper and
            hook of the tool off, so MindSpore captures the bytecode it captures without the tool.
        runtime: without ``recorder`` (L0), the :class:`msprobe.engine.runtime.Runtime` whose
            recording decides when a ``capture_mode="bytecode"`` function's body runs in ``pause``
            and ``unhooked``; ``None`` with neither: bytecode capture is left alone.

    Returns:
        The :class:`msprobe.engine.handles.HandleSet` that gives MindSpore's methods back.
    """
    original = _JitExecutor.__call__
    rt = recorder.rt if recorder is not None else runtime

    def recorded(self, *args, **kwargs):
        if recorder is None or not rt.capturing():
            return original(self, *args, **kwargs)
        head, call_args = (args[:1], args[1:]) if self.obj is not None else ((), args)
        api = naming.JIT_PREFIX + _region_name(self)

        def run(*inputs, **kw):
            out = original(self, *head, *inputs, **kw)
            if inside is not None:  # the call's number was taken before it ran
                inside(naming.api_entry(api, rt.counters[api] - 1, naming.FORWARD), out)
            return out

        # a compiled region may assign Parameters (an optimizer's update): tensors recorded so far,
        # views of Parameters among them, are read before it runs
        return recorder.call(api, run, call_args, kwargs,
                             mutates=_cell_writes(self.obj, call_args, kwargs))

    if pause is None:
        __call__ = recorded
    else:
        def __call__(self, *args, **kwargs):
            if not _may_call_cells(self.obj):
                return recorded(self, *args, **kwargs)
            with pause(_region_name(self) if self.obj is None else None):
                return recorded(self, *args, **kwargs)

    handles = HandleSet()
    handles.add(patch_attribute(_JitExecutor, "__call__", __call__))
    if PIJitCaptureContext is not None and rt is not None:
        handles.add(_bytecode_jit(rt, recorder, pause, unhooked))
    return handles


def _bytecode_jit(rt, recorder, pause, unhooked) -> HandleSet:
    """While ``rt`` records, a call of a ``capture_mode="bytecode"`` function is compiled as without
    the tool, and recorded as one ``Jit.{__name__}.{n}`` entry by ``recorder`` when there is one
    (L1/mix; at L0 nothing is recorded): its body runs with the Cell hooks paused (``pause``) and
    every wrapper off (``unhooked``), since MindSpore captures the bytecode of whatever the body calls.
    Run as plain PyNative, or through the tool's wrappers (which it cannot compile, so the graph
    breaks at each call), the body would compute other bits than the graph compiled without the tool
    (a Parameter's gradient summed in another order). MindSpore's bytecode capture runs no Cell
    forward hook, so at L0 the Cells it calls would not be recorded either way; a custom-``bprop``
    Cell's wrappers would run, and record it alone."""
    enter, exit_ = PIJitCaptureContext.__enter__, PIJitCaptureContext.__exit__

    def __enter__(self):
        fn = self.fn
        if fn is None or not rt.capturing() or "_msprobe_fn" in vars(self):
            return enter(self)
        out = enter(self)  # registers ``fn`` for compilation; ``_fn`` calls ``self.fn`` next
        name = getattr(fn, "__name__", "jit")

        def body(*args, **kwargs):
            with unhooked() if unhooked is not None else contextlib.nullcontext():
                return fn(*args, **kwargs)

        def recorded(*args, **kwargs):
            with pause(name) if pause is not None else contextlib.nullcontext():
                if recorder is None:
                    return body(*args, **kwargs)
                return recorder.call(naming.JIT_PREFIX + name, body, args, kwargs, mutates=True)

        self._msprobe_fn, self.fn = fn, recorded
        return out

    def __exit__(self, *exc):
        fn = vars(self).pop("_msprobe_fn", None)
        if fn is not None:
            self.fn = fn
        return exit_(self, *exc)

    handles = HandleSet()
    handles.add(patch_attribute(PIJitCaptureContext, "__enter__", __enter__))
    handles.add(patch_attribute(PIJitCaptureContext, "__exit__", __exit__))
    return handles
