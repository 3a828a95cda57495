"""Fixed-arity pieces of the graph-mode probes (:mod:`msprobe.capture.cells.graph_cell`), and the small
functions MindSpore compiles into the graph around each instrumented Cell.

Why fixed arity: ``ops.Custom(func_type="pyfunc")`` counts the inputs of its Python function from the
signature and reads its source (``inspect.getsource``), and a Primitive ``bprop`` must name every input
plus ``out`` and ``dout`` explicitly (``*args`` is refused by graph compilation). So one forwarder and
one bprop factory per arity, 1..:data:`MAX_ARITY`, generated from one template each at import
(:func:`_generate`). Each bprop waits for its probe's forward output (``ops.depend``):
the graph runs independent kernels concurrently, and a gradient probe that ran before the forward
probe of its call would find no forward call to pair with.

The functions at the end (:func:`through`, :func:`make_construct`, :func:`make_grads_construct`) are
parsed by MindSpore's graph compiler (GRAPH_MODE and ``mindspore.jit``): only constructs it supports
are used (``isinstance`` and ``len`` on compile-time values, tuple building, loops unrolled at compile time).
"""
from __future__ import annotations

import hashlib
import linecache
import os
import tempfile

from mindspore import Tensor, ops

#: most tensors passed through one probe (a Cell boundary with more is not probed)
MAX_ARITY = 16


def after(values, anchor):
    """``values`` (a tuple) with its first item made to wait for ``anchor``: a probe's bprop runs
    after the probe itself, so the backward record of a call always finds its forward call."""
    return (ops.depend(values[0], anchor),) + values[1:]


#: ``forwarder_{n}(fn)``: the pyfunc of a probe, ``forward(x0, ..., x{n-1})`` calling ``fn((x0, ...))``
_FORWARDER = """
def forwarder_{arity}(fn):
    def forward({args}):
        return fn(({args},))
    return forward
"""

#: ``bprop_of_{n}(grad)``: the bprop of a probe, passing ``dout`` (after the probe's own output) to ``grad``
_BPROP = """
def bprop_of_{arity}(grad):
    def bprop({args}, out, dout):
        return {result}
    return bprop
"""


def _generate() -> dict:
    """The functions of :data:`_FORWARDER` and :data:`_BPROP` for every arity 1..:data:`MAX_ARITY`,
    defined as if written in this module, from one generated source text.

    The text is kept in :mod:`linecache` (``inspect.getsource`` finds it: ``ops.Custom`` reads a
    pyfunc's source, the graph compiler parses a bprop from it) and, when the temporary directory
    is writable, in a file of its own, which MindSpore reads for the debug information of the
    compiled bprop (it logs an error for a source file that does not exist).
    """
    parts = []
    for n in range(1, MAX_ARITY + 1):
        args = ", ".join(f"x{i}" for i in range(n))
        parts.append(_FORWARDER.format(arity=n, args=args))
        parts.append(_BPROP.format(arity=n, args=args, result="(grad(ops.depend(dout, out)),)" if n == 1
                                   else "grad(*after(dout, out))"))
    source = "".join(parts)
    filename = _source_file(source)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": __name__, "after": after, "ops": ops}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own fixed templates
    return namespace


def _source_file(source: str) -> str:
    """The path of a file holding ``source`` (written once per content, atomically), or a name that
    says what it is when no file can be written."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    directory = os.path.join(tempfile.gettempdir(), f"msprobe-{os.getuid() if hasattr(os, 'getuid') else 0}")
    path = os.path.join(directory, f"graph_probe_arities_{digest}.py")
    try:
        if not os.path.exists(path):
            os.makedirs(directory, exist_ok=True)
            partial = f"{path}.{os.getpid()}.tmp"
            with open(partial, "w") as f:
                f.write(source)
            os.replace(partial, path)
    except OSError:
        return "<msprobe graph probe arities>"
    return path


_NAMESPACE = _generate()
#: ``_FORWARDERS[n]``/``_BPROPS[n]``: the factories for a probe of ``n`` tensors (index 0 unused)
_FORWARDERS = (None,) + tuple(_NAMESPACE[f"forwarder_{n}"] for n in range(1, MAX_ARITY + 1))
_BPROPS = (None,) + tuple(_NAMESPACE[f"bprop_of_{n}"] for n in range(1, MAX_ARITY + 1))


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


def through(probes, values, too_many):
    """Pass the Tensor items of the tuple ``values`` through ``probes[n]`` (n = their number); of
    more than :data:`MAX_ARITY` items only the first :data:`MAX_ARITY`, after ``too_many(n)`` (a
    ``mindspore.ops.constexpr`` function: it runs once, when the graph is compiled)."""
    found = tensors_of(values)
    n = len(found)
    if n == 0:
        return values
    if n == 1:
        return replace_tensors(values, (probes[1](found[0]),))
    if n > MAX_ARITY:
        too_many(n)
        return replace_tensors(values, probes[MAX_ARITY](*found[:MAX_ARITY]) + found[MAX_ARITY:])
    return replace_tensors(values, probes[n](*found))


#: the argument of the input probe of a call with no Tensor positional input (it is not recorded)
NO_TENSOR = Tensor(0)


def observe(probes, values, too_many):
    """Show the Tensor items of the tuple ``values`` to ``probes[n]`` (n = their number, as in
    :func:`through`; ``probes[0]`` gets :data:`NO_TENSOR`) *beside* the data path: each probe sees
    ``stop_gradient`` of the tensor and its result is unused (a ``side_effect_io`` probe is kept
    in program order anyway). The Cell computes on ``values`` themselves, so no node is added
    between a tensor and its consumers and MindSpore sums the gradients of a tensor with several
    consumers in the same order as without the probe."""
    found = tensors_of(values)
    n = len(found)
    if n == 0:
        probes[0](NO_TENSOR)
        return 0
    if n > MAX_ARITY:
        too_many(n)
        found = found[:MAX_ARITY]
        n = MAX_ARITY
    stopped = ()
    for v in found:
        stopped = stopped + (ops.stop_gradient(v),)
    if n == 1:
        probes[1](stopped[0])
    else:
        probes[n](*stopped)
    return n


#: instance attribute holding the construct a probe wrapper calls (see :func:`make_construct`)
INNER = "_msprobe_inner_construct"


def make_construct(probes_in, probes_out, too_many_in, too_many_out, note_keys):
    """An instance ``construct`` running the Cell's previous construct after a forward-only input
    probe (:func:`observe`, off the data path) and before an output probe (an identity on the
    data path: every consumer of the output sums its gradient into the probe's output as it did
    into the tensor, so the sum is unchanged). ``note_keys(keys)`` (a ``mindspore.ops.constexpr``
    function) is told, when the graph compiles, the keys of the Tensor values a dict output has
    (``None`` for a Tensor or tuple output), so the record can keep the dict's keys.

    The previous construct is reached as the bound method ``self._msprobe_inner_construct``
    (:data:`INNER`), not as a plain function called with ``self``: the graph compiler turns
    ``self.attr = value`` inside a construct into a Parameter update only when that construct runs
    as a method of the Cell; a function called as ``f(self, ...)`` loses such updates (``nn.Adam``
    and ``nn.AdaMax`` keep ``beta1_power`` that way) and runs them as Python fallback code, which
    cannot hold a probe. The wrapper's first parameter is literally ``self`` (graph compilation
    requires it). ``too_many_in``/``too_many_out``: see :func:`through`.
    """
    def construct(self, *args, **kwargs):
        observe(probes_in, args, too_many_in)
        out = self._msprobe_inner_construct(*args, **kwargs)
        if isinstance(out, Tensor):
            note_keys(None)
            return probes_out[1](out)
        if isinstance(out, tuple):
            note_keys(None)
            return through(probes_out, out, too_many_out)
        if isinstance(out, dict):
            return through_dict(probes_out, out, too_many_out, note_keys)
        return out
    return construct


def through_dict(probes, values, too_many, note_keys):
    """A new dict with the Tensor values of the dict ``values`` passed through ``probes`` (in the
    dict's order, as :func:`through`), same keys; ``note_keys`` gets the keys of the probed values."""
    keys = tuple(values.keys())
    probed = ()
    for k in keys:
        if isinstance(values[k], Tensor):
            probed = probed + (k,)
    note_keys(probed[:MAX_ARITY])
    new = through(probes, tuple(values.values()), too_many)
    result = {}
    for i in range(len(keys)):
        result[keys[i]] = new[i]
    return result


def make_grads_construct(chunk_probes, size, unprobed):
    """An optimizer ``construct(self, gradients, ...)`` whose gradients first pass through
    ``chunk_probes`` (one probe per run of :data:`MAX_ARITY` gradients, exact arity each), then
    go to the previous construct, a bound method as in :func:`make_construct`. A call whose first
    positional argument is not a tuple of ``size`` gradients (one per parameter of the optimizer;
    ``gradients=`` given by keyword, for instance) passes unprobed, after ``unprobed(0)`` (a
    ``mindspore.ops.constexpr`` function, run when the graph is compiled)."""
    def construct(self, *args, **kwargs):
        if not args or not isinstance(args[0], tuple) or len(args[0]) != size:
            unprobed(0)
            return self._msprobe_inner_construct(*args, **kwargs)
        grads = args[0]
        new = ()
        for c in range(len(chunk_probes)):
            part = grads[c * MAX_ARITY:(c + 1) * MAX_ARITY]
            if len(part) == 1:
                new = new + (chunk_probes[c](part[0]),)
            else:
                new = new + chunk_probes[c](*part)
        return self._msprobe_inner_construct(new, *args[1:], **kwargs)
    return construct
