"""Fixed-arity pieces of the graph-mode probes (:mod:`msprobe.capture.cells.graph_cell`), and the small
functions MindSpore compiles into the graph around each instrumented Cell.

Two kinds of pieces, shared by every probed Cell (a Cell is named by a constant int32 Tensor, its
*code*, passed as the first input):

* an *observer* (``ops.Custom`` pyfunc, marked ``side_effect_io``) takes ``(code, kind, x0, …)``:
  the tensors of one Cell boundary, or of a whole call (inputs and outputs in one call of the
  Python function), each as ``stop_gradient`` of the tensor, beside the data path; it returns a
  one-element int32 *token*, which nothing computes with;
* a *mark* (a Cell with a ``bprop``) returns its tensors unchanged; its ``bprop`` passes the
  gradients ``dout`` through a *gradient probe* (an identity pyfunc ``(code, d0, …)``) once the
  observer's token exists (``ops.depend``: the graph runs independent kernels concurrently, and the
  gradient w.r.t. a Cell's output may not need any forward value computed after that Cell, so a
  gradient probe could otherwise run before the observer of its own call and find no forward call
  to pair with). The mark adds no kernel to the forward pass.

Why fixed arity: ``ops.Custom(func_type="pyfunc")`` counts the inputs of its Python function from the
signature and reads its source (``inspect.getsource``), and a ``bprop`` must name every input plus
``out`` and ``dout`` explicitly (``*args`` is refused by graph compilation). So one forwarder, one
bprop and one mark class per arity, generated from one template each at import (:func:`_generate`).

The functions at the end (:func:`make_construct`, :func:`make_grads_construct` and their helpers) are
parsed by MindSpore's graph compiler (GRAPH_MODE and ``mindspore.jit``): only constructs it supports
are used (``isinstance`` and ``len`` on compile-time values, tuple building, loops unrolled at compile
time).

Compiled probes: when the extension ``msprobe.capture.cells._graph_probe`` (``_graph_probe.c``) is
built, the observers and gradient probes can be ``ops.Custom(func_type="aot")`` kernels of that file
instead of pyfuncs (:func:`compiled`): same inputs, outputs and bprops, so the same graph, but a
probe takes no Python lock and runs no Python code: it copies the tensors wanted into memory of its
own and queues a report, which :func:`take_compiled` hands to Python. A pyfunc costs ~30 µs per call
plus the conversion of its arrays, and each call waits for the interpreter lock held by the thread
driving the graph.
"""
from __future__ import annotations

import hashlib
import linecache
import os
import tempfile

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

try:
    from msprobe.capture.cells import _graph_probe
except ImportError:  # not compiled (no C compiler at install time): pyfunc probes only
    _graph_probe = None

#: most tensors of one Cell boundary (inputs, outputs) that are probed
MAX_ARITY = 16
#: most inputs of one pyfunc: code, kind and the inputs and outputs of a call
MAX_INPUTS = 2 * MAX_ARITY + 2

#: ``forwarder_{m}(fn)``: a pyfunc ``forward(x0, ..., x{m-1})`` calling ``fn((x0, ...))``
_FORWARDER = """
def forwarder_{arity}(fn):
    def forward({args}):
        return fn(({args},))
    return forward
"""

#: ``zeros_bprop_{m}``: the bprop of a pyfunc of ``m`` inputs that no gradient goes through
_ZEROS_BPROP = """
def zeros_bprop_{arity}({args}, out, dout):
    return ({zeros},)
"""

#: ``Mark{n}``: ``n`` tensors unchanged, their gradients through ``self.probe`` (see the module docstring)
_MARK = """
class Mark{arity}(nn.Cell):
    def __init__(self, probe):
        super().__init__()
        self.probe = probe

    def construct(self, code, {args}, token):
        return {values}

    def bprop(self, code, {args}, token, out, dout):
        return {grads}
"""


def _generate() -> dict:
    """The functions and classes of :data:`_FORWARDER`, :data:`_ZEROS_BPROP` (arities
    1..:data:`MAX_INPUTS`) and :data:`_MARK` (1..:data:`MAX_ARITY`), defined as if written in this
    module, from one generated source text.

    The text is kept in :mod:`linecache` (``inspect.getsource`` finds it: ``ops.Custom`` reads a
    pyfunc's source, the graph compiler parses a bprop and a mark's methods from it) and, when the
    temporary directory is writable, in a file of its own, which MindSpore reads for the debug
    information of the compiled functions (it logs an error for a source file that does not exist).
    """
    parts = []
    for m in range(1, MAX_INPUTS + 1):
        args = ", ".join(f"x{i}" for i in range(m))
        parts.append(_FORWARDER.format(arity=m, args=args))
        parts.append(_ZEROS_BPROP.format(arity=m, args=args,
                                         zeros=", ".join(f"ops.zeros_like(x{i})" for i in range(m))))
    for n in range(1, MAX_ARITY + 1):
        args = ", ".join(f"x{i}" for i in range(n))
        if n == 1:
            grads = "ops.zeros_like(code), self.probe(ops.depend(code, token), dout), ops.zeros_like(token)"
        else:
            grads = ("(ops.zeros_like(code),) + self.probe(ops.depend(code, token), *dout) + "
                     "(ops.zeros_like(token),)")
        parts.append(_MARK.format(arity=n, args=args, values="x0" if n == 1 else f"({args},)", grads=grads))
    source = "".join(parts)
    filename = _source_file(source)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": __name__, "ops": ops, "nn": nn}
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
#: ``_FORWARDERS[m]``/``_ZEROS_BPROPS[m]``: a pyfunc of ``m`` inputs and its bprop (index 0 unused)
_FORWARDERS = (None,) + tuple(_NAMESPACE[f"forwarder_{m}"] for m in range(1, MAX_INPUTS + 1))
_ZEROS_BPROPS = (None,) + tuple(_NAMESPACE[f"zeros_bprop_{m}"] for m in range(1, MAX_INPUTS + 1))
#: ``_MARKS[n]``: the mark class of ``n`` tensors (index 0 unused)
_MARKS = (None,) + tuple(_NAMESPACE[f"Mark{n}"] for n in range(1, MAX_ARITY + 1))

#: the token an observer returns (MindSpore copies it into the op's output)
TOKEN = np.zeros(1, np.int32)

#: observer kinds (the second input): a call's inputs (a Cell with probed sub-Cells: before they
#: run), its outputs (after), the gradients an optimizer receives; a kind ``k >= 0`` is a whole call
#: of a Cell without probed sub-Cells, ``k`` inputs then its outputs
ENTER, EXIT, GRADIENTS = -1, -2, -3
_KINDS = {kind: Tensor(kind, ms.int32) for kind in (ENTER, EXIT, GRADIENTS)}
ENTER_KIND, EXIT_KIND, GRADIENTS_KIND = _KINDS[ENTER], _KINDS[EXIT], _KINDS[GRADIENTS]
#: ``CALL_KINDS[k]``: the kind of a whole call with ``k`` probed inputs
CALL_KINDS = tuple(Tensor(k, ms.int32) for k in range(MAX_ARITY + 1))


def code_tensor(code: int) -> Tensor:
    """The constant naming a probed Cell (or optimizer chunk) in its probes' calls."""
    return Tensor(code, ms.int32)


def _token_shape(*shapes):
    return (1,)


def _token_dtype(*dtypes):
    return ms.int32


def _same_shape(code, *shapes):
    return shapes[0] if len(shapes) == 1 else shapes


def make_observers(callback) -> tuple:
    """``observers[n]``: the observer of ``n`` tensors (0..:data:`MAX_INPUTS` - 2), each calling
    ``callback((code, kind, array, ...))``, which returns :data:`TOKEN`; ``callback`` ``None``: the
    compiled kernel ``msprobe_observe`` (:func:`compiled`; raises ``TypeError`` when MindSpore refuses
    the file, see ``MS_CUSTOM_AOT_WHITE_LIST``).

    Marked ``side_effect_io`` (as ``ops.Print`` is): the graph compiler keeps an observer, in program
    order, although nothing uses its result; without the mark it is removed as dead code and the
    call is silently missing."""
    observers = []
    for n in range(MAX_INPUTS - 1):
        op = _probe_op(callback, "msprobe_observe", n + 2, _token_shape, _token_dtype)
        op.add_prim_attr("side_effect_io", True)
        observers.append(op)
    return tuple(observers)


def make_marks(callback) -> tuple:
    """``marks[n]``: the mark of ``n`` tensors (1..:data:`MAX_ARITY`; index 0 ``None``), whose gradient
    probe calls ``callback((code, d0, ...))``, which returns the gradients unchanged (the array, or a
    tuple of them); ``callback`` ``None``: the compiled kernel ``msprobe_gradient``, which copies them
    to its outputs. The gradient probes are not marked ``side_effect_io``: a gradient nothing needs
    is not computed, as in PyNative."""
    marks = [None]
    for n in range(1, MAX_ARITY + 1):
        marks.append(_MARKS[n](_probe_op(callback, "msprobe_gradient", n + 1, _same_shape, _same_shape)))
    return tuple(marks)


def _probe_op(callback, kernel: str, inputs: int, out_shape, out_dtype):
    """A probe of ``inputs`` inputs: a pyfunc calling ``callback``, or (``callback`` ``None``) the
    compiled ``kernel``; either with the bprop that gives no gradient to its inputs."""
    if callback is None:
        op = ops.Custom(f"{os.path.realpath(_graph_probe.__file__)}:{kernel}", out_shape=out_shape,
                        out_dtype=out_dtype, func_type="aot", bprop=_ZEROS_BPROPS[inputs])
        # probes of one kernel differ in their attributes only: without this one the graph compiler
        # takes them for one primitive, and one arity's bprop for every call
        op.add_prim_attr("msprobe_inputs", inputs)
        return op
    return ops.Custom(_FORWARDERS[inputs](callback), out_shape=out_shape, out_dtype=out_dtype,
                      func_type="pyfunc", bprop=_ZEROS_BPROPS[inputs])


def compiled():
    """The compiled probes' extension module, or ``None`` when it is not built or
    ``MSPROBE_PURE_PYTHON=1`` is set (then the probes are pyfuncs)."""
    if _graph_probe is None or os.environ.get("MSPROBE_PURE_PYTHON") == "1":
        return None
    return _graph_probe


def compiled_code(capture: int, code: int) -> int:
    """The ``code`` input of a compiled probe: the capture's number (``_graph_probe.new_capture``) in
    the high bits, the Cell's or optimizer chunk's number in the low ones."""
    if code >= 1 << _graph_probe.CODE_BITS:
        raise OverflowError(f"more than {1 << _graph_probe.CODE_BITS} probed Cells")
    return capture << _graph_probe.CODE_BITS | code


def _numpy_dtypes() -> dict:
    """dtype name of the compiled kernels -> numpy dtype (bfloat16: MindSpore's numpy type, as a
    pyfunc receives it)."""
    names = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
             "uint32", "uint64", "bool", "complex64", "complex128")
    dtypes = {name: np.dtype(name) for name in names}
    dtypes.update({"float": np.dtype("float32"), "int": np.dtype("int32"), "uint": np.dtype("uint32")})
    dtypes["bfloat16"] = Tensor(np.zeros(1, np.float32), ms.bfloat16).asnumpy().dtype
    return dtypes


_DTYPES: dict = {}


def take_compiled(capture: int) -> tuple:
    """``(reports, lost)``: the reports the compiled probes of ``capture`` made so far, in the order
    they ran, each ``(kind, code, arrays or None, ...)`` as a pyfunc observer's or gradient probe's
    callback reports them (the arrays numpy views of the probes' copies); ``lost``: how many were
    dropped for want of memory."""
    reports, lost = _graph_probe.take(capture)
    if not reports:
        return reports, lost
    if not _DTYPES:
        _DTYPES.update(_numpy_dtypes())
    dtypes, ndarray = _DTYPES, np.ndarray
    return [(kind, code, *(None if group is None else [ndarray(shape, dtypes[dtype], buffer)
                                                         for buffer, dtype, shape in group]
                           for group in groups))
            for kind, code, *groups in reports], lost


def tensors_of(values):
    """The Tensor items of a tuple, in order (evaluated at compile time in a graph)."""
    found = ()
    for v in values:
        if isinstance(v, Tensor):
            found = found + (v,)
    return found


def nested_tensors(values):
    """The Tensor items of a tuple, those of nested tuples and lists in their place, in order
    (evaluated at compile time in a graph): a Cell's positional Tensor inputs."""
    found = ()
    for v in values:
        if isinstance(v, Tensor):
            found = found + (v,)
        elif isinstance(v, (tuple, list)):
            found = found + nested_tensors(v)
    return found


#: an argument layout's item for a Tensor (see :func:`arguments_layout`)
TENSOR = 0


def arguments_layout(values):
    """The structure of a Cell's positional arguments ``values`` (a tuple), as a constant the graph
    compiler hands to a ``mindspore.ops.constexpr`` function: per argument :data:`TENSOR`, a tuple
    ``("n", item, ...)`` for a tuple or list, ``("v", value)`` for a ``bool``, ``int``, ``float`` or
    ``str`` known when the graph compiles, ``None`` for anything else (``None``, a ``mutable``
    scalar, another object). The Tensors are those of :func:`nested_tensors`, in the same order."""
    layout = ()
    for v in values:
        if isinstance(v, Tensor):
            layout = layout + (TENSOR,)
        elif isinstance(v, (tuple, list)):
            layout = layout + (("n",) + arguments_layout(v),)
        elif isinstance(v, (bool, int, float, str)) and ops.isconstant(v):
            layout = layout + (("v", v),)
        else:
            layout = layout + (None,)
    return layout


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


def at_most(found, too_many):
    """The first :data:`MAX_ARITY` items of the tuple ``found``; with more, after ``too_many(n)`` (a
    ``mindspore.ops.constexpr`` function: it runs once, when the graph is compiled)."""
    n = len(found)
    if n > MAX_ARITY:
        too_many(n)
        return found[:MAX_ARITY]
    return found


def observe(observers, code, kind, values):
    """Show the tensors of the tuple ``values`` to ``observers[len(values)]`` beside the data path:
    it sees ``stop_gradient`` of each, so no node is added between a tensor and its consumers and
    MindSpore sums the gradients of a tensor with several consumers in the same order as without
    the probe. Returns the observer's token."""
    stopped = ()
    for v in values:
        stopped = stopped + (ops.stop_gradient(v),)
    return observers[len(values)](code, kind, *stopped)


def probe_outputs(observers, marks, code, whole, ins, outs):
    """Observe the output tensors ``outs`` (a tuple, 1..:data:`MAX_ARITY`): with ``whole``, together
    with the call's inputs ``ins`` in one observer call. Returns the tuple of the tensors to use in
    their place: each made to wait for the observer (``ops.depend``; otherwise a call whose outputs
    are constants is folded away with its observer when the graph compiles), then passed through
    the mark of their number (``marks`` ``None``: no gradient is wanted)."""
    if whole:
        token = observe(observers, code, CALL_KINDS[len(ins)], ins + outs)
    else:
        token = observe(observers, code, EXIT_KIND, outs)
    held = ()
    for v in outs:
        held = held + (ops.depend(v, token),)
    if marks is None:
        return held
    if len(held) == 1:
        return (marks[1](code, held[0], token),)
    return marks[len(held)](code, *held, token)


def through(observers, marks, code, whole, ins, values, too_many):
    """``values`` (a tuple) with its Tensor items probed (:func:`probe_outputs`); of more than
    :data:`MAX_ARITY` only the first :data:`MAX_ARITY` (see :func:`at_most`), the others pass as they
    are. Without a Tensor item, with ``whole``, the call's inputs are observed alone (the call is
    recorded without output)."""
    found = tensors_of(values)
    n = len(found)
    if n == 0:
        if whole:
            observe(observers, code, ENTER_KIND, ins)
        return values
    probed = at_most(found, too_many)
    return replace_tensors(values, probe_outputs(observers, marks, code, whole, ins, probed) + found[len(probed):])


#: instance attribute holding the construct a probe wrapper calls (see :func:`make_construct`)
INNER = "_msprobe_inner_construct"


def make_construct(observers, marks, code, whole, too_many_in, too_many_out, note_keys, note_inputs):
    """An instance ``construct`` running the Cell's previous construct with its positional Tensor
    inputs (:func:`nested_tensors`: also those inside tuple and list arguments) and its Tensor outputs observed (:func:`observe`) and its outputs passed through a mark
    (:func:`probe_outputs`; ``marks`` ``None``: no gradient probe).

    ``whole`` (a Cell without probed sub-Cells): inputs and outputs go to one observer, after the
    call (nothing else is probed between the two). Otherwise the inputs are observed before the
    previous construct runs (the call opens before its sub-Cells' calls) and the outputs after it.
    ``code``: the Cell's constant (:func:`code_tensor`). ``note_keys(keys)`` (a
    ``mindspore.ops.constexpr`` function) is told, when the graph compiles, the keys of the Tensor
    values a dict output has (``None`` for a Tensor or tuple output), so the record can keep the
    dict's keys. ``note_inputs(layout)`` (a ``mindspore.ops.constexpr`` function) is told, when the
    graph compiles, the structure of the positional arguments (:func:`arguments_layout`), so the
    record can give each Tensor its argument's position. ``too_many_in``/``too_many_out``: see
    :func:`at_most`.

    The previous construct is reached as the bound method ``self._msprobe_inner_construct``
    (:data:`INNER`), not as a plain function called with ``self``: the graph compiler turns
    ``self.attr = value`` inside a construct into a Parameter update only when that construct runs
    as a method of the Cell; a function called as ``f(self, ...)`` loses such updates (``nn.Adam``
    and ``nn.AdaMax`` keep ``beta1_power`` that way) and runs them as Python fallback code, which
    cannot hold a probe. The wrapper's first parameter is literally ``self`` (graph compilation
    requires it).
    """
    def construct(self, *args, **kwargs):
        note_inputs(arguments_layout(args))
        ins = at_most(nested_tensors(args), too_many_in)
        if not whole:
            observe(observers, code, ENTER_KIND, ins)
        out = self._msprobe_inner_construct(*args, **kwargs)
        if isinstance(out, Tensor):
            note_keys(None)
            return probe_outputs(observers, marks, code, whole, ins, (out,))[0]
        if isinstance(out, tuple):
            note_keys(None)
            return through(observers, marks, code, whole, ins, out, too_many_out)
        if isinstance(out, dict):
            return through_dict(observers, marks, code, whole, ins, out, too_many_out, note_keys)
        if whole:
            observe(observers, code, ENTER_KIND, ins)
        return out
    return construct


def through_dict(observers, marks, code, whole, ins, values, too_many, note_keys):
    """A new dict with the Tensor values of the dict ``values`` probed (in the dict's order, as
    :func:`through`), same keys; ``note_keys`` gets the keys of the probed values."""
    keys = tuple(values.keys())
    probed = ()
    for k in keys:
        if isinstance(values[k], Tensor):
            probed = probed + (k,)
    note_keys(probed[:MAX_ARITY])
    new = through(observers, marks, code, whole, ins, tuple(values.values()), too_many)
    result = {}
    for i in range(len(keys)):
        result[keys[i]] = new[i]
    return result


def make_grads_construct(observers, chunk_codes, size, unprobed):
    """An optimizer ``construct(self, gradients, ...)`` whose gradients are first shown to an
    observer (kind :data:`GRADIENTS`, one per run of :data:`MAX_ARITY` gradients, named by
    ``chunk_codes[c]``), then go, unchanged, to the previous construct, a bound method as in
    :func:`make_construct`. A call whose first positional argument is not a tuple of ``size``
    gradients (one per parameter of the optimizer; ``gradients=`` given by keyword, for instance)
    passes unprobed, after ``unprobed(0)`` (a ``mindspore.ops.constexpr`` function, run when the
    graph is compiled)."""
    def construct(self, *args, **kwargs):
        if not args or not isinstance(args[0], tuple) or len(args[0]) != size:
            unprobed(0)
            return self._msprobe_inner_construct(*args, **kwargs)
        grads = args[0]
        for c in range(len(chunk_codes)):
            observers[len(grads[c * MAX_ARITY:(c + 1) * MAX_ARITY])](
                chunk_codes[c], GRADIENTS_KIND, *grads[c * MAX_ARITY:(c + 1) * MAX_ARITY])
        return self._msprobe_inner_construct(*args, **kwargs)
    return construct
