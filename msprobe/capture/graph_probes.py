"""Fixed-arity pieces of the graph-mode probes (:mod:`msprobe.capture.graph_cell`), and the small
functions MindSpore compiles into the graph around each instrumented Cell.

Why fixed arity: ``ops.Custom(func_type="pyfunc")`` counts the inputs of its Python function from the
signature and reads its source (``inspect.getsource``), and a Primitive ``bprop`` must name every input
plus ``out`` and ``dout`` explicitly (``*args`` is refused by graph compilation). So one forwarder and
one bprop factory per arity, 1..:data:`MAX_ARITY`, written out below (mechanically expanded; keep them
in sync with :data:`MAX_ARITY`).

The functions at the end (:func:`through`, :func:`make_construct`, :func:`make_grads_construct`) are
parsed by MindSpore's graph compiler (GRAPH_MODE and ``mindspore.jit``): only constructs it supports
are used (``isinstance`` and ``len`` on compile-time values, tuple building, loops unrolled at compile time).
"""
from __future__ import annotations

from mindspore import Tensor

#: most tensors passed through one probe (a Cell boundary with more is not probed)
MAX_ARITY = 16


def _forward_1(fn):
    def forward(x0):
        return fn((x0,))
    return forward


def _bprop_1(grad):
    def bprop(x0, out, dout):
        return (grad(dout),)
    return bprop


def _forward_2(fn):
    def forward(x0, x1):
        return fn((x0, x1))
    return forward


def _bprop_2(grad):
    def bprop(x0, x1, out, dout):
        return grad(*dout)
    return bprop


def _forward_3(fn):
    def forward(x0, x1, x2):
        return fn((x0, x1, x2))
    return forward


def _bprop_3(grad):
    def bprop(x0, x1, x2, out, dout):
        return grad(*dout)
    return bprop


def _forward_4(fn):
    def forward(x0, x1, x2, x3):
        return fn((x0, x1, x2, x3))
    return forward


def _bprop_4(grad):
    def bprop(x0, x1, x2, x3, out, dout):
        return grad(*dout)
    return bprop


def _forward_5(fn):
    def forward(x0, x1, x2, x3, x4):
        return fn((x0, x1, x2, x3, x4))
    return forward


def _bprop_5(grad):
    def bprop(x0, x1, x2, x3, x4, out, dout):
        return grad(*dout)
    return bprop


def _forward_6(fn):
    def forward(x0, x1, x2, x3, x4, x5):
        return fn((x0, x1, x2, x3, x4, x5))
    return forward


def _bprop_6(grad):
    def bprop(x0, x1, x2, x3, x4, x5, out, dout):
        return grad(*dout)
    return bprop


def _forward_7(fn):
    def forward(x0, x1, x2, x3, x4, x5, x6):
        return fn((x0, x1, x2, x3, x4, x5, x6))
    return forward


def _bprop_7(grad):
    def bprop(x0, x1, x2, x3, x4, x5, x6, out, dout):
        return grad(*dout)
    return bprop


def _forward_8(fn):
    def forward(x0, x1, x2, x3, x4, x5, x6, x7):
        return fn((x0, x1, x2, x3, x4, x5, x6, x7))
    return forward


def _bprop_8(grad):
    def bprop(x0, x1, x2, x3, x4, x5, x6, x7, out, dout):
        return grad(*dout)
    return bprop


def _forward_9(fn):
    def forward(x0, x1, x2, x3, x4, x5, x6, x7, x8):
        return fn((x0, x1, x2, x3, x4, x5, x6, x7, x8))
    return forward


def _bprop_9(grad):
    def bprop(x0, x1, x2, x3, x4, x5, x6, x7, x8, out, dout):
        return grad(*dout)
    return bprop


def _forward_10(fn):
    def forward(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9):
        return fn((x0, x1, x2, x3, x4, x5, x6, x7, x8, x9))
    return forward


def _bprop_10(grad):
    def bprop(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, out, dout):
        return grad(*dout)
    return bprop


def _forward_11(fn):
    def forward(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10):
        return fn((x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10))
    return forward


def _bprop_11(grad):
    def bprop(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, out, dout):
        return grad(*dout)
    return bprop


def _forward_12(fn):
    def forward(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11):
        return fn((x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11))
    return forward


def _bprop_12(grad):
    def bprop(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, out, dout):
        return grad(*dout)
    return bprop


def _forward_13(fn):
    def forward(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12):
        return fn((x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12))
    return forward


def _bprop_13(grad):
    def bprop(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, out, dout):
        return grad(*dout)
    return bprop


def _forward_14(fn):
    def forward(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13):
        return fn((x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13))
    return forward


def _bprop_14(grad):
    def bprop(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, out, dout):
        return grad(*dout)
    return bprop


def _forward_15(fn):
    def forward(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14):
        return fn((x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14))
    return forward


def _bprop_15(grad):
    def bprop(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, out, dout):
        return grad(*dout)
    return bprop


def _forward_16(fn):
    def forward(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15):
        return fn((x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15))
    return forward


def _bprop_16(grad):
    def bprop(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15, out, dout):
        return grad(*dout)
    return bprop


_FORWARDERS = (None, _forward_1, _forward_2, _forward_3, _forward_4, _forward_5, _forward_6, _forward_7, _forward_8, _forward_9, _forward_10, _forward_11, _forward_12, _forward_13, _forward_14, _forward_15, _forward_16)
_BPROPS = (None, _bprop_1, _bprop_2, _bprop_3, _bprop_4, _bprop_5, _bprop_6, _bprop_7, _bprop_8, _bprop_9, _bprop_10, _bprop_11, _bprop_12, _bprop_13, _bprop_14, _bprop_15, _bprop_16)


def pass_through(*values):
    """The gradient of a probe whose backward data is not wanted: ``dout`` unchanged."""
    if len(values) == 1:
        return values[0]
    return values


def tensors_of(values):
    """The Tensor items of a tuple, in order (evaluated at compile time in a graph)."""
    found = ()
    for v in values:
        if isinstance(v, Tensor):
            found = found + (v,)
    return found


def replace_tensors(values, new):
    """``values`` with its Tensor items replaced, in order, by the items of ``new``."""
    result = ()
    j = 0
    for v in values:
        if isinstance(v, Tensor):
            result = result + (new[j],)
            j = j + 1
        else:
            result = result + (v,)
    return result


def through(probes, values):
    """Pass the Tensor items of the tuple ``values`` through ``probes[n]`` (n = their number)."""
    found = tensors_of(values)
    n = len(found)
    if n == 0 or n > MAX_ARITY:
        return values
    if n == 1:
        return replace_tensors(values, (probes[1](found[0]),))
    return replace_tensors(values, probes[n](*found))


def make_construct(original, probes_in, probes_out):
    """An instance ``construct`` running ``original`` between an input and an output probe.

    ``original`` is the Cell's own construct bound to the Cell (a method): the graph compiler then
    parses it with ``self`` known, so conditions on Cell attributes (``if self.flag:``) are constants
    and a name assigned in one branch only compiles as it does without the probes. (Called as a
    plain function with ``self`` passed, such a construct fails: "The local variable ... is not
    defined in false branch".) The wrapper's first parameter is literally ``self`` (graph
    compilation requires it).
    """
    def construct(self, *args, **kwargs):
        args = through(probes_in, args)
        out = original(*args, **kwargs)
        if isinstance(out, Tensor):
            return probes_out[1](out)
        if isinstance(out, tuple):
            return through(probes_out, out)
        return out
    return construct


def make_grads_construct(original, chunk_probes):
    """An optimizer ``construct(self, gradients, ...)`` whose gradients first pass through
    ``chunk_probes`` (one probe per run of :data:`MAX_ARITY` gradients, exact arity each);
    ``original`` is the optimizer's construct bound to it (see :func:`make_construct`)."""
    def construct(self, *args, **kwargs):
        grads = args[0]
        new = ()
        for c in range(len(chunk_probes)):
            part = grads[c * MAX_ARITY:(c + 1) * MAX_ARITY]
            if len(part) == 1:
                new = new + (chunk_probes[c](part[0]),)
            else:
                new = new + chunk_probes[c](*part)
        return original(new, *args[1:], **kwargs)
    return construct
