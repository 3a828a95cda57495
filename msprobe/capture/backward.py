"""Backward capture for one call (API, Primitive or Cell), without Cell backward-hook machinery.

Two ways to see the gradients of one call, both leaving values untouched (hooks return ``None``):

* **Node hook** (APIs and Primitives that run as one autograd node): the call's output tensors share
  one ``BackwardNode`` (``Tensor._grad_node``) whose edges lead straight to the call's arguments.
  ``BackwardNode.register_hook(hook(grad_inputs, grad_outputs))`` then sees, per edge, exactly the
  gradient this call sends to each argument (backward ``output``) and the gradient of its outputs
  (backward ``input``). No node is added to the graph; about 35 µs per call, forward plus backward.
  :func:`call_edges` checks that shape of graph after each call; edges through an automatic
  ``Contiguous`` (a view passed to a kernel) count as leading to the view.
* **Identity node** (Cells, composite APIs, and each API's first call, which learns whether the node
  hook applies): the floating-point positional inputs that take part in a gradient pass together
  through one ``ops.HookBackward`` identity whose hook sees the gradients flowing back through this
  call (not the sums over all users of the tensors), about 120-280 µs per call; gradients w.r.t.
  outputs come from ``Tensor.register_hook`` on each floating-point output tensor (about 15 µs each).

Either way an input whose gradient MindSpore would not compute (a data batch, a constant, a value
computed from those alone) has none recorded (``null``): the identity's gradients are held until the
input's producer shows it needs one. So the two ways give the same dump. Cells whose inputs each have
one consumer inside use that consumer's node hook (:func:`consumer_edges`, at the end).
"""
from __future__ import annotations

from mindspore import Parameter, Tensor, ops
from mindspore.common import dtype as _mstype

from msprobe.core.stats import pynative_executor

_pynative_executor = pynative_executor()

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


def signature(api: str, args: tuple, kwargs: dict) -> tuple:
    """What decides which autograd nodes a call of ``api`` creates, short of running it: the API, the
    dtype of each tensor argument, the types of the others (dtype arguments by value, one level into
    tuples and lists, e.g. the indexes of ``__getitem__``) and the keyword names."""
    sig = [api]
    for a in args:
        if isinstance(a, Tensor):
            sig.append(a.dtype)
        elif isinstance(a, (tuple, list)):
            sig.append(tuple(x.dtype if isinstance(x, Tensor) else type(x) for x in a))
        elif isinstance(a, _mstype.Type):
            sig.append(a)
        else:
            sig.append(type(a))
    if kwargs:
        for k, v in kwargs.items():
            sig.append(k)
            sig.append(v.dtype if isinstance(v, Tensor) else v if isinstance(v, _mstype.Type) else type(v))
    return tuple(sig)


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

    __slots__ = ("runtime", "entry", "writer", "want_input", "want_output", "held")

    def __init__(self, runtime, entry: str, want_input: bool, want_output: bool):
        self.runtime = runtime
        self.entry = entry
        self.writer = runtime.writer
        self.want_input = want_input
        self.want_output = want_output
        self.held = None  # input index -> gradient awaiting its producer's confirmation (wrap_inputs)

    def wrap_inputs(self, args: tuple) -> tuple:
        """Route floating-point positional tensors through a HookBackward identity."""
        if not self.want_output:
            return args
        # only inputs that take part in a gradient: routing a data batch through the identity would
        # make MindSpore compute a gradient nobody asked for, and give the calls inside (mix) inputs
        # that need one, so dumps would differ by level and by which call learned the signature
        indexes = [i for i, _ in grad_inputs(args)]
        if not indexes:
            return args
        # One identity node for all of the call's float inputs (a HookBackward node costs ~120 µs
        # forward+backward; most calls have two float inputs). MindSpore computes the gradient w.r.t.
        # an input only if the input's producer needs it (the node hook reports exactly those);
        # through the identity every input gets one. So each gradient but a Parameter's is held
        # back until the producer shows it needs it: its node hook runs, or for a leaf (an argument
        # of the differentiated function, e.g. the data batch, needing a gradient only under
        # grad_position) the leaf's own hook (removed at step end).
        held = [i for i in indexes if not isinstance(args[i], Parameter)]
        for i in held:
            node = args[i]._grad_node
            if node.is_leaf():
                self.runtime.leaf_hooks.append(args[i].register_hook(self._release_hook(i, len(args))))
            else:
                node.register_hook(self._release_hook(i, len(args)))
        hooked = ops.HookBackward(self._input_grads_hook(indexes, len(args), set(held)))(
            *(args[i] for i in indexes))
        if len(indexes) == 1:
            hooked = (hooked,)
        wrapped = list(args)
        for i, t in zip(indexes, hooked):
            wrapped[i] = t
        return tuple(wrapped)

    def report_lost_inputs(self, why: str) -> None:
        """Say in ``dump_error_info.log`` that this call's input gradients could not be captured
        (``why``: what differed from the first call that taught the capture mode)."""
        self.writer.error(f"{self.entry}: gradients w.r.t. the inputs not captured ({why}); later such "
                          f"calls go through an identity node")

    def watch_outputs(self, out) -> None:
        """Register gradient hooks on the floating-point output tensors."""
        if not self.want_input:
            return
        tensors = _flatten_tensors(out, [])
        size = len(tensors)
        for i, t in enumerate(tensors):
            if _is_float(t):
                t.register_hook(self._output_grad_hook(i, size))

    def hook_node(self, edges) -> None:
        """Record both sides from the autograd node found by :func:`call_edges`."""
        node, mapping, size, n_out = edges
        self._hook_edges(node, mapping if self.want_output else (), size, n_out if self.want_input else None)

    def hook_consumers(self, consumers: list, size: int) -> None:
        """Record backward ``output`` item ``index`` from the node hook of its one consumer inside a
        Cell; ``consumers`` = ``[(index, node, edge index)]`` (see :func:`consumer_edges`)."""
        by_node: dict = {}
        for index, node, j in consumers:
            by_node.setdefault(node._unique_id(), (node, []))[1].append((j, index))
        for node, mapping in by_node.values():
            self._hook_edges(node, mapping, size, None)

    def _hook_edges(self, node, mapping, size: int, n_out) -> None:
        """One node hook: the gradient on edge ``j`` is backward ``output`` item ``index`` of ``size``
        for each ``(j, index)`` of ``mapping``; with ``n_out``, the node's output gradients are the
        backward ``input`` items too."""
        record = self._record

        def hook(grad_inputs, grad_outputs):
            if n_out is not None:
                for i, grad in enumerate(grad_outputs):
                    if grad is not None:
                        record("input", i, n_out, grad)
            for j, index in mapping:
                grad = grad_inputs[j]
                if grad is not None:
                    record("output", index, size, grad)

        node.register_hook(hook)

    def _record(self, side: str, index: int, size: int, grad) -> None:
        """Item ``index`` of backward ``side`` (``input``: w.r.t. outputs, ``output``: w.r.t. inputs)."""
        self.runtime.record_item(self.entry, side, index, size, grad, side, self.writer)

    def _input_grads_hook(self, indexes: list, size: int, held: set):
        def hook(grads):
            grads = grads if isinstance(grads, tuple) else (grads,)
            for index, grad in zip(indexes, grads):
                if grad is None:
                    continue
                if index in held:
                    if self.held is None:
                        self.held = {}
                    self.held[index] = grad
                else:
                    self._record("output", index, size, grad)
        return hook

    def _release_hook(self, index: int, size: int):
        """Tensor hook (one argument) or node hook (two): the producer of input ``index`` needs its
        gradient, so the one held back for it is recorded."""
        def hook(*_grads):
            grad = self.held.pop(index, None) if self.held else None
            if grad is not None:
                self._record("output", index, size, grad)
        return hook

    def _output_grad_hook(self, index: int, size: int):
        def hook(grad):
            self._record("input", index, size, grad)
        return hook


#: :func:`call_edges` results when there is nothing to watch: no floating-point output tensor (a
#: property of the API, e.g. ``shape`` or a comparison), or float outputs outside any gradient
NO_FLOAT_OUTPUT = "no floating-point output"
NO_GRADIENT = "no gradient"


def takes_gradient(args: tuple) -> bool:
    """Whether a positional tensor argument takes part in a gradient (has an autograd node)."""
    for a in args:
        if isinstance(a, Tensor) and a._grad_node is not None:
            return True
    return False


def call_edges(args: tuple, out):
    """``(node, [(edge index, argument index)], len(args), number of outputs)`` when ``out`` came from
    ``args`` through a single autograd node (see the module docstring); :data:`NO_FLOAT_OUTPUT` or
    :data:`NO_GRADIENT` when no output is a floating-point tensor taking part in a gradient; else
    ``None``.

    Accepted: every floating-point output tensor has the same node, which is not the node of any
    argument, and which has exactly as many outputs (all floating-point); every edge of that node
    that carries a gradient leads to a positional tensor argument (directly or through an automatic ``Contiguous``). Edges to
    the same producer are matched to the arguments with that producer in order (``x * x``).
    """
    outs = _flatten_tensors(out, [])
    floats = [t for t in outs if _is_float(t)]
    if not floats:
        return NO_FLOAT_OUTPUT
    if all(t._grad_node is None for t in floats):
        return NO_GRADIENT
    node = outs[0]._grad_node
    if node is None or len(floats) != len(outs):
        return None
    uid = node._unique_id()
    for t in outs[1:]:
        other = t._grad_node
        if other is None or other._unique_id() != uid:
            return None
    if len(node._input_metadata) != len(outs):
        return None
    producers: dict = {}
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            g = a._grad_node
            if g is not None:
                a_uid = g._unique_id()
                if a_uid == uid:  # the call returned an argument (or a view sharing its node)
                    return None
                producers.setdefault(a_uid, []).append(i)
    mapping = []
    used: dict = {}
    for j, (edge_node, _) in enumerate(node.next_functions):
        if edge_node is None:
            continue
        e_uid = edge_node._unique_id()
        if e_uid not in producers and edge_node.name() == "Contiguous":
            inner = edge_node.next_functions
            if len(inner) == 1 and inner[0][0] is not None:
                e_uid = inner[0][0]._unique_id()
        candidates = producers.get(e_uid)
        k = used.get(e_uid, 0)
        if candidates is None or k >= len(candidates):
            return None
        used[e_uid] = k + 1
        mapping.append((j, candidates[k]))
    return node, mapping, len(args), len(outs)


# ---------------------------------------------------------------------------------------------- Cells
# A Cell is many nodes. Its input gradients are the gradients its internal consumers send to each
# input; when each input has exactly one consumer edge inside the Cell, that consumer's node hook gives
# them exactly, as for a one-node API call. The inside is found by walking back from the outputs,
# bounded by a watermark: nodes are numbered in creation order (``_sequence_nr``), and a node made
# just before the Cell ran (a view of an input, never used) marks where the Cell's own nodes begin.

#: most nodes walked for one Cell call before giving up (the identity node is used instead)
MAX_WALK = 4096

try:  # the raw view primitive: the tool's own node, never a wrapped API
    from mindspore.ops.auto_generate.gen_ops_prim import view_op as _view_op
except ImportError:  # pragma: no cover - other MindSpore layouts
    _view_op = None


def grad_inputs(args: tuple) -> list:
    """``[(index, tensor)]`` of the floating-point positional arguments that take a gradient."""
    return [(i, a) for i, a in enumerate(args) if _is_float(a) and a._grad_node is not None]


def watermark(tensor) -> int | None:
    """Sequence number of a new node (a view of ``tensor``, discarded): every node the Cell creates
    from now on has a larger one. ``None`` when no such node can be made."""
    if _view_op is None:
        return None
    node = _view_op(tensor, tuple(tensor.shape))._grad_node
    return None if node is None else node._sequence_nr()


def consumer_edges(outputs, targets: dict, mark: int):
    """Edges from the nodes made after ``mark`` (walked back from ``outputs``) into ``targets``
    (node unique id -> anything): ``{(target id, producer output index): [(node, edge index)]}``.
    ``None`` when the walk exceeds :data:`MAX_WALK` nodes."""
    stack = [t._grad_node for t in _flatten_tensors(outputs, []) if _is_float(t) and t._grad_node is not None]
    seen = set()
    found: dict = {}
    while stack:
        node = stack.pop()
        uid = node._unique_id()
        if uid in seen or uid in targets:
            continue
        seen.add(uid)
        if len(seen) > MAX_WALK:
            return None
        for j, (edge, out_index) in enumerate(node.next_functions):
            if edge is None:
                continue
            e_uid = edge._unique_id()
            if e_uid in targets:
                found.setdefault((e_uid, out_index), []).append((node, j))
            elif not edge.is_leaf() and edge._sequence_nr() > mark:
                stack.append(edge)
    return found
