"""Backward capture for one call (API, Primitive or Cell), without Cell backward-hook machinery.

* gradients w.r.t. the call's outputs (backward ``input``): ``Tensor.register_hook`` on each
  floating-point output tensor (about 1 µs each);
* gradients w.r.t. the call's positional inputs (backward ``output``): the floating-point inputs are
  passed together through one ``ops.HookBackward`` identity whose hook sees exactly the gradients
  flowing back through this call, not the sums over all users of the tensors. One node per call
  (about 120 µs forward + backward) rather than one per input; MindSpore then computes the gradient
  of every input of the node when any of them needs one (a data input next to a weight included).

Both leave gradient values untouched (hooks return ``None``).
"""
from __future__ import annotations

from mindspore import Tensor, ops
from mindspore.common.api import _pynative_executor

_FLOAT_DTYPES = None


def _is_float(t) -> bool:
    global _FLOAT_DTYPES
    if _FLOAT_DTYPES is None:
        import mindspore as ms

        _FLOAT_DTYPES = {ms.float16, ms.float32, ms.float64, ms.bfloat16}
    return isinstance(t, Tensor) and t.dtype in _FLOAT_DTYPES


def grad_enabled() -> bool:
    """True while MindSpore records operations for a gradient (inside ``ms.grad``/``value_and_grad``)."""
    return _pynative_executor.requires_grad()


def _flatten_tensors(value, out: list) -> list:
    if isinstance(value, Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _flatten_tensors(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _flatten_tensors(v, out)
    return out


class BackwardProbe:
    """Collects the backward entry of one call.

    Args:
        runtime: the :class:`msprobe.core.runtime.Runtime`.
        entry: backward entry name (e.g. ``Functional.relu.0.backward``).
        want_input: record gradients w.r.t. outputs (``data_mode`` allows backward input).
        want_output: record gradients w.r.t. inputs (``data_mode`` allows backward output).
    """

    __slots__ = ("runtime", "entry", "writer", "want_input", "want_output")

    def __init__(self, runtime, entry: str, want_input: bool, want_output: bool):
        self.runtime = runtime
        self.entry = entry
        self.writer = runtime.writer
        self.want_input = want_input
        self.want_output = want_output

    def wrap_inputs(self, args: tuple) -> tuple:
        """Route floating-point positional tensors through a HookBackward identity."""
        if not self.want_output:
            return args
        indexes = [i for i, a in enumerate(args) if _is_float(a)]
        if not indexes:
            return args
        # one identity node for all of the call's float inputs (a HookBackward node costs ~120 µs
        # forward+backward; most calls have two float inputs)
        hooked = ops.HookBackward(self._input_grads_hook(indexes, len(args)))(*(args[i] for i in indexes))
        if len(indexes) == 1:
            hooked = (hooked,)
        wrapped = list(args)
        for i, t in zip(indexes, hooked):
            wrapped[i] = t
        return tuple(wrapped)

    def watch_outputs(self, out) -> None:
        """Register gradient hooks on the floating-point output tensors."""
        if not self.want_input:
            return
        tensors = _flatten_tensors(out, [])
        size = len(tensors)
        for i, t in enumerate(tensors):
            if _is_float(t):
                t.register_hook(self._output_grad_hook(i, size))

    def _input_grads_hook(self, indexes: list, size: int):
        def hook(grads):
            grads = grads if isinstance(grads, tuple) else (grads,)
            for index, grad in zip(indexes, grads):
                if grad is not None:
                    self.runtime.record_item(self.entry, "output", index, size, grad, "output", self.writer)
        return hook

    def _output_grad_hook(self, index: int, size: int):
        def hook(grad):
            self.runtime.record_item(self.entry, "input", index, size, grad, "input", self.writer)
        return hook
