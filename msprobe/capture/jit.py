"""Calls of ``mindspore.jit``-compiled functions and Cells at L1/mix (seed: jit notes under
"动态图场景"; spec §3.4 "Jit").

A compiled region runs as one graph: hooks inside it never fire. While the dump runs, each call of a
``jit`` function (``capture_mode="ast"``) is recorded as one API entry ``Jit.{name}.{n}.forward`` /
``.backward`` with its positional inputs and outputs, so the region is visible in the dump rather than
silently absent. ``name`` is the function's ``__name__``, or the Cell class name for a jit-decorated
``construct``.
"""
from __future__ import annotations

try:
    from mindspore.graph.api import _JitExecutor
except ImportError:  # older MindSpore layouts
    from mindspore.common.api import _JitExecutor

from msprobe.core.handles import HandleSet, patch_attribute


def _region_name(executor) -> str:
    if executor.obj is not None:
        return type(executor.obj).__name__
    return getattr(executor.fn, "__name__", "jit")


def install_jit_capture(recorder) -> HandleSet:
    """Patch ``_JitExecutor.__call__`` so compiled calls are recorded by ``recorder``."""
    original = _JitExecutor.__call__
    rt = recorder.rt

    def __call__(self, *args, **kwargs):
        if not rt.running or rt.busy():
            return original(self, *args, **kwargs)
        head, call_args = (args[:1], args[1:]) if self.obj is not None else ((), args)

        def run(*inputs, **kw):
            return original(self, *head, *inputs, **kw)

        return recorder.call(f"Jit.{_region_name(self)}", run, call_args, kwargs)

    handles = HandleSet()
    handles.add(patch_attribute(_JitExecutor, "__call__", __call__))
    return handles
