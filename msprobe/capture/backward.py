"""Backward capture for one call (API, Primitive or Cell) by observation only: nothing is added to the
autograd graph, so MindSpore sums every gradient in the same order as without the tool.

After a call has run under a gradient (``ms.grad``/``value_and_grad``), :meth:`BackwardProbe.observe`
looks at the autograd graph the call built and hooks what is already there:

* **One node** (most APIs and Primitives): the call's output tensors share one ``BackwardNode``
  (``Tensor._grad_node``) whose edges lead to the call's arguments. ``BackwardNode.register_hook(
  hook(grad_inputs, grad_outputs))`` sees, per edge, exactly the gradient this call sends to each
  argument (backward ``output``) and the gradient of its outputs (backward ``input``).
* **Several nodes** (Cells, composite APIs such as ``ops.cross_entropy``): the nodes the call made are
  found by walking back from its outputs, bounded by a watermark (nodes are numbered in creation
  order, ``_sequence_nr``; everything the call made is newer). Each edge from those nodes into an
  argument is hooked on its node; an argument's backward ``output`` is the sum of what the call's
  nodes send it (added by the tool, in arrival order, once every part has arrived or the argument's
  producer runs). Gradients w.r.t. the outputs come from ``Tensor.register_hook`` on each output
  tensor that takes part in the gradient.
* **Alias** (a call that returns an argument itself, such as a same-dtype ``Cast``): MindSpore keeps
  one tensor, so there is one gradient; it is recorded on both sides.

A gradient MindSpore does not compute (a data batch, a constant, a value computed from those alone)
is never computed for the dump either: its item is ``null``. Nothing is recorded for outputs that take
no gradient (a slice of a constant table, ``ops.ones``), and no hook is registered on them.
"""
from __future__ import annotations

from mindspore import Tensor, ops

from msprobe.format import naming
from msprobe.tensors import hotpath
from msprobe.tensors.stats import pynative_executor

_pynative_executor = pynative_executor()
_add = ops.add  # bound at import, before any wrapper exists: the tool's own sum of gradient parts

_FLOAT_DTYPES = None
_F32 = None  # mindspore.float32: MindSpore's dtype objects are singletons, so most checks are ``is``


def _float_dtypes() -> frozenset:
    global _FLOAT_DTYPES, _F32
    import mindspore as ms

    _FLOAT_DTYPES = hotpath.float_dtypes()
    _F32 = ms.float32
    return _FLOAT_DTYPES


def _node_of(t):
    """The autograd node of ``t`` when it is a floating-point tensor that is part of the graph being
    differentiated (a hook may be put on it), else ``None``. Each attribute is read once: they are
    properties computed by MindSpore on every read."""
    if not isinstance(t, Tensor):
        return None
    node = t._grad_node  # first: constants (data, masks) have none
    if node is None:
        return None
    dtype = t.dtype
    if dtype is not _F32 and dtype not in (_FLOAT_DTYPES or _float_dtypes()):
        return None
    if not t._requires_grad:
        return None
    return node


#: ``_pynative_executor.requires_grad``'s body: the C++ executor's method (one Python frame less per call)
_requires_grad = getattr(getattr(_pynative_executor, "_executor", None), "requires_grad", None) \
    or _pynative_executor.requires_grad


def grad_enabled() -> bool:
    """True while MindSpore records operations for a gradient (inside ``ms.grad``/``value_and_grad``)."""
    return _requires_grad()


def grad_enabled_fn():
    """:func:`grad_enabled` as MindSpore's own callable (no Python frame): what compiled code calls."""
    return _requires_grad


#: exact builtin types, none of them a Tensor: looked up before ``isinstance(value, Tensor)``, which asks
#: the ``abc`` machinery of ``mindspore.Tensor`` in Python for every value that is not a Tensor
_NOT_TENSORS = frozenset((type(None), int, float, bool, str, tuple, list, dict))


def _flatten_tensors(value, out: list) -> list:
    kind = type(value)
    if kind is Tensor or (kind not in _NOT_TENSORS and isinstance(value, Tensor)):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _flatten_tensors(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _flatten_tensors(v, out)
    return out


def _targets(args: tuple) -> list:
    """The positional arguments, and the tensors directly inside list/tuple arguments
    (``ops.concat([a, b])``), that take part in the gradient, each with its node and key
    ``(node id, output index)``: ``[(position, element or None, tensor, node, key)]`` (walked in C
    when :mod:`msprobe.tensors.hotpath` is built: ``grad_targets``, the same attributes read in the
    same order)."""
    ext = hotpath.ext
    if ext is not None:
        return ext.grad_targets(args)
    found = []
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            node = _node_of(a)
            if node is not None:
                found.append((i, None, a, node, (node._unique_id(), a._output_index)))
        elif isinstance(a, (list, tuple)):
            for k, t in enumerate(a):
                node = _node_of(t)
                if node is not None:
                    found.append((i, k, t, node, (node._unique_id(), t._output_index)))
    return found


def _is_argument(value, args: tuple) -> bool:
    """Whether ``value`` is one of the positional arguments ``args`` itself (identity)."""
    for a in args:
        if a is value:
            return True
    return False


def first_grad_input(args: tuple):
    """The first floating-point positional argument that takes a gradient, or ``None``."""
    for a in args:
        if _node_of(a) is not None:
            return a
    return None


class _Part:
    """Backward ``output`` item of one argument slot (position, list element): the sum of ``expected``
    gradient parts, recorded once all arrived (or when the argument's producer runs)."""

    __slots__ = ("expected", "arrived", "total", "done")

    def __init__(self, expected: int):
        self.expected, self.arrived, self.total, self.done = expected, 0, None, False


class BackwardProbe:
    """Collects the backward entry of one call.

    Args:
        runtime: the :class:`msprobe.engine.runtime.Runtime`.
        entry: backward entry name (e.g. ``Functional.relu.0.backward``).
        want_input: record gradients w.r.t. outputs (``data_mode`` allows backward input).
        want_output: record gradients w.r.t. inputs (``data_mode`` allows backward output).
    """

    __slots__ = ("runtime", "entry", "token", "want_input", "want_output", "size", "parts", "lists")

    def __init__(self, runtime, entry: str, want_input: bool, want_output: bool):
        self.runtime = runtime
        self.entry = entry
        self.token = runtime.step_token  # the step this call belongs to (its gradients come later)
        self.want_input = want_input
        self.want_output = want_output
        self.size = 0          # number of positional arguments (length of backward ``output``)
        self.parts = None      # (position, element) -> _Part, for arguments with several parts
        self.lists = None      # position -> [expected, arrived, gradients], list arguments

    # ------------------------------------------------------------------ after the call
    def observe(self, args: tuple, out, mark: int | None = None, plain: bool = True) -> bool:
        """Hook the gradients of this call, which has just run: ``args`` its positional arguments,
        ``out`` its return value; ``mark`` a watermark (see :func:`watermark`) taken before a Cell
        ran, ``None`` for API calls (the newest argument node bounds the walk). With the extension
        built, a call that ends in no hook, the alias hook or one node's plain hook is observed in C
        (``hotpath.ext.observe_plain``: the same attributes read, the same hooks, as compiled objects).
        ``plain=False`` skips that attempt (:meth:`observe_general` hooks those cases too, with the
        same records): for a caller whose earlier calls all declined it, such as a Cell made of
        several autograd nodes, where it would read the call's nodes twice.

        Returns:
            True when the compiled common case took the call, False when :meth:`observe_general` did.

        Raises nothing MindSpore does not raise on ``register_hook``; callers treat any exception as a
        tool failure."""
        ext = hotpath.ext
        if plain and ext is not None and not self.entry.startswith(naming.JIT_PREFIX) \
                and ext.observe_plain(self, args, out):
            return True  # the common cases below (no hook, the alias hook, one node's plain hook) in C
        self.observe_general(args, out, mark)
        return False

    def observe_general(self, args: tuple, out, mark: int | None = None) -> None:
        """:meth:`observe` without its compiled common case: every call, in Python. The compiled
        recorder (``hotpath.ext.Recorder``) observes the common case of the calls it records itself
        and hands the others here. Arguments and exceptions as :meth:`observe`."""
        ext = hotpath.ext
        node_of = _node_of if ext is None else ext.grad_node  # the same function in C
        targets = None
        if type(out) is Tensor or (type(out) not in _NOT_TENSORS and isinstance(out, Tensor)):
            if self.want_input and self.want_output and _is_argument(out, args):
                # the call returned an argument itself (a same-dtype Cast): when it is the one argument
                # taking a gradient, its node and key are that argument's, so :meth:`_hook_alias`'s
                # checks hold by identity; when it takes none, neither does the output
                targets = _targets(args) if ext is None else ext.grad_targets(args)
                if len(targets) == 1 and targets[0][2] is out and targets[0][1] is None:
                    self.size = len(args)
                    self._hook_alias_at(out, targets[0][0])
                    return
                if not any(target[2] is out for target in targets):
                    return
            outs = [out]
            nodes = [node_of(out)]
            if nodes[0] is None:  # nothing this call made takes a gradient: no backward entry exists
                return
        else:
            outs = _flatten_tensors(out, [])
            nodes = [node_of(t) for t in outs]
            if nodes.count(None) == len(nodes):
                return
        if targets is None:
            targets = _targets(args) if ext is None else ext.grad_targets(args)
        self.size = len(args)
        if None not in nodes:
            mapping = _single_mapping(nodes, targets) if ext is None else ext.single_mapping(nodes, targets)
            if mapping is not None:
                self._hook_single(nodes[0], mapping, targets if self.want_output else [], len(outs))
                return
        if len(targets) == 1 and len(outs) == 1 and self.want_input and self.want_output \
                and self._hook_alias(outs[0], nodes[0], targets[0]):
            return
        if self.want_input:
            n_out = len(outs)
            for i, t in enumerate(outs):
                if nodes[i] is not None:
                    self._hook_tensor(t, self._output_grad_hook(i, n_out))
        if targets and self.want_output:
            self._hook_walk(targets, outs, nodes, mark)

    def _hook_alias(self, out, node, target) -> bool:
        """The call returned its one gradient-taking positional argument itself (a same-dtype
        ``Cast``): one tensor hook records the one gradient as backward ``input`` 0 and ``output``
        ``position``, the items the output-gradient hook and the alias hook of :meth:`_hook_walk`
        record, in their order. False (nothing hooked) for any other call."""
        position, element, _, _, key = target
        if element is not None or node is None or (node._unique_id(), out._output_index) != key:
            return False
        self._hook_alias_at(out, position)
        return True

    def _hook_alias_at(self, out, position: int) -> None:
        """The tensor hook of :meth:`_hook_alias` on ``out``, positional argument ``position``."""
        record_items, entry, token, size = self.runtime.record_items, self.entry, self.token, self.size

        def hook(grad):
            items = [("input", 0, 1, grad)]
            if grad is not None:
                items.append(("output", position, size, grad))
            record_items(entry, items, token)  # what _record_items does, one frame less
        self._hook_tensor(out, hook)

    def _hook_single(self, node, mapping: list, targets: list, n_out: int) -> None:
        """One node made every output: ``mapping`` ``[(edge index, (position, element))]`` from
        :func:`_single_mapping`; ``targets`` the arguments whose gradients are recorded."""
        if not targets:
            mapping = ()
        else:
            for t in targets:
                if t[1] is not None:  # a list argument: its item waits for every element
                    self._prepare_lists(targets)
                    mapped = {slot_key for _, slot_key in mapping}
                    for i, k, _, _, _ in targets:
                        if (i, k) not in mapped:  # no edge leads to it: MindSpore sends it nothing
                            self._slot_value(i, k, None)
                    break
        want_input = self.want_input
        if not want_input and not mapping:
            return  # the hook would record nothing
        record = self._record
        n_edges = len(node.next_functions)
        uneven = self.report_uneven

        if self.lists is None:  # every slot a positional tensor argument, one edge each
            size = self.size
            plain = [(j, i) for j, (i, _) in mapping]
            record_items, entry, token = self.runtime.record_items, self.entry, self.token

            def hook(grad_inputs, grad_outputs):
                # the items _record would make one by one, in the same order, queued together
                items = []
                if want_input:
                    for i, grad in enumerate(grad_outputs):
                        if grad is not None:
                            items.append(("input", i, n_out, grad))
                if len(grad_inputs) != n_edges:
                    uneven(len(grad_inputs), n_edges)
                else:
                    for j, i in plain:
                        grad = grad_inputs[j]
                        if grad is not None:
                            items.append(("output", i, size, grad))
                if items:
                    record_items(entry, items, token)  # what _record_items does, one frame less
        else:
            slot = self._slot_value

            def hook(grad_inputs, grad_outputs):
                if want_input:
                    for i, grad in enumerate(grad_outputs):
                        if grad is not None:
                            record("input", i, n_out, grad)
                if len(grad_inputs) != n_edges:
                    uneven(len(grad_inputs), n_edges)
                    return
                for j, (i, k) in mapping:
                    slot(i, k, grad_inputs[j])

        self._hook_node(node, hook)

    def _hook_walk(self, targets: list, outs: list, nodes: list, mark) -> None:
        """Several nodes: hook each edge from the call's own nodes into an argument."""
        by_key: dict = {}
        aliased = {}
        out_keys = {(node._unique_id(), t._output_index): n
                    for n, (t, node) in enumerate(zip(outs, nodes)) if node is not None}
        for i, k, _, _, key in targets:
            by_key.setdefault(key, []).append((i, k))
            if key in out_keys:
                aliased[(i, k)] = out_keys[key]
        if mark is None:
            mark = max((node._sequence_nr() for _, _, _, node, _ in targets if not node.is_leaf()),
                       default=-1)
        uids = {key[0] for key in by_key}
        found = consumer_edges([node for node in nodes if node is not None], uids, mark)
        if found is None:  # more nodes than MAX_WALK: say so rather than guess
            self.report_lost_inputs(f"the call made more than {MAX_WALK} autograd nodes")
            return
        self._prepare_lists(targets)
        per_node: dict = {}
        for key, slots in by_key.items():
            edges = found.get(key, [])
            for slot_key in slots:
                if slot_key in aliased and not edges:
                    # the call returned this argument itself: one tensor, one gradient
                    n = aliased[slot_key]
                    self._hook_tensor(outs[n], self._alias_hook(*slot_key))
                    continue
                if not edges:
                    self._slot_value(*slot_key, None)  # nothing inside the call uses it
                    continue
                # (the same tensor at several positions: each position gets the call's total for it)
                if len(edges) > 1:
                    if self.parts is None:
                        self.parts = {}
                    self.parts[slot_key] = _Part(len(edges))
                    self._release_on_producer(targets, slot_key)
                for node, j in edges:
                    per_node.setdefault(node._unique_id(), (node, []))[1].append((j, slot_key))
        for node, mapping in per_node.values():
            self._hook_node(node, self._edges_hook(mapping, len(node.next_functions)))

    def _edges_hook(self, mapping: list, n_edges: int):
        """The hook of a node with ``n_edges`` edges, ``mapping`` ``[(edge index, (position, element))]``."""
        slot = self._slot_value

        def hook(grad_inputs, _grad_outputs):
            if len(grad_inputs) != n_edges:
                self.report_uneven(len(grad_inputs), n_edges)
                return
            for j, (i, k) in mapping:
                slot(i, k, grad_inputs[j])
        return hook

    def report_uneven(self, handed: int, n_edges: int) -> None:
        """A node's backward hook was handed ``handed`` gradients for its ``n_edges`` edges (a node of
        a compiled region leaves out the edges that take no gradient): which gradient belongs to which
        argument is unknown, so none is recorded, and ``dump_error_info.log`` says so."""
        self.report_lost_inputs(f"MindSpore handed a backward hook {handed} gradients for the {n_edges} "
                                f"inputs of its autograd node")

    def _release_on_producer(self, targets: list, slot_key: tuple) -> None:
        """When the argument's producer runs, every part the call will send it has arrived."""
        tensor, node = next((t, node) for i, k, t, node, _ in targets if (i, k) == slot_key)
        release = self._release_hook(slot_key)
        if node.is_leaf():
            self._hook_tensor(tensor, release)
        else:
            self._hook_node(node, release)

    def _hook_node(self, node, hook) -> None:
        """``node.register_hook(hook)`` through :func:`register_node_hook` (one MindSpore hook per
        autograd node for the tool's hooks of the step)."""
        register_node_hook(self.runtime.node_hooks, node, hook)

    def _hook_tensor(self, tensor, hook) -> None:
        """``Tensor.register_hook(hook)`` on ``tensor``, removed at step end."""
        handle = tensor.register_hook(hook)
        # removed at step end: a leaf's hook lives as long as the tensor, and MindSpore keeps an
        # entry for every tensor hook until it is removed, even after the tensor is gone
        self.runtime.tensor_hooks.append(handle)

    # ------------------------------------------------------------------ gradient arrival
    def _prepare_lists(self, targets: list) -> None:
        """List arguments: ``lists[position] = [expected elements, arrived, [gradient per element]]``."""
        for i, k, *_ in targets:
            if k is not None:
                if self.lists is None:
                    self.lists = {}
                entry = self.lists.setdefault(i, [0, 0, []])
                entry[0] += 1
                if len(entry[2]) <= k:
                    entry[2].extend([None] * (k + 1 - len(entry[2])))

    def _slot_value(self, i: int, k, grad) -> None:
        """One part of the gradient the call sends to argument ``i`` (element ``k`` of a list)."""
        part = self.parts.get((i, k)) if self.parts else None
        if part is not None:
            if part.done:
                return
            part.arrived += 1
            if grad is not None:
                part.total = grad if part.total is None else _sum(part.total, grad)
            if part.arrived < part.expected:
                return
            part.done = True
            grad = part.total
        if k is not None:
            self._list_item(i, k, grad)
        elif grad is not None:
            self._record("output", i, self.size, grad)

    def _list_item(self, i: int, k: int, grad) -> None:
        """Backward ``output`` item ``i`` is a list (one gradient per element of a list argument),
        recorded once every element that takes part in the gradient has its value."""
        entry = self.lists[i]
        entry[1] += 1
        entry[2][k] = grad
        if entry[1] == entry[0] and any(g is not None for g in entry[2]):
            self._record("output", i, self.size, entry[2])

    def _release_hook(self, slot_key: tuple):
        def hook(*_grads):
            part = self.parts.get(slot_key) if self.parts else None
            if part is None or part.done:
                return
            part.done = True
            i, k = slot_key
            if k is not None:
                self._list_item(i, k, part.total)
            elif part.total is not None:
                self._record("output", i, self.size, part.total)
        return hook

    def _alias_hook(self, i: int, k):
        def hook(grad):
            self._slot_value(i, k, grad)
        return hook

    def _output_grad_hook(self, index: int, size: int):
        def hook(grad):
            self._record("input", index, size, grad)
        return hook

    def _record(self, side: str, index: int, size: int, grad) -> None:
        """Item ``index`` of backward ``side`` (``input``: w.r.t. outputs, ``output``: w.r.t. inputs)."""
        self._record_items([(side, index, size, grad)])

    def _record_items(self, items: list) -> None:
        """Several items at once, ``[(side, index, size, gradient)]`` in recording order."""
        self.runtime.record_items(self.entry, items, self.token)

    def report_lost_inputs(self, why: str) -> None:
        """Say in ``dump_error_info.log`` that this call's input gradients could not be captured."""
        self.runtime.report_error(f"{self.entry}: gradients w.r.t. the inputs not captured ({why})",
                                  self.token)

    # ------------------------------------------------------------------ custom bprop Cells
    def record_bprop(self, douts, result) -> None:
        """A Cell with a custom ``bprop``: ``douts`` (gradients w.r.t. its outputs) and the bprop's
        return value (gradients w.r.t. its inputs)."""
        douts = douts if isinstance(douts, (tuple, list)) else (douts,)
        if self.want_input:
            for i, g in enumerate(douts):
                self._record("input", i, len(douts), g)
        if self.want_output:
            grads = result if isinstance(result, (tuple, list)) else (result,)
            for i, g in enumerate(grads):
                self._record("output", i, len(grads), g)


def register_node_hook(registry: dict, node, hook) -> None:
    """Have ``hook(grad_inputs, grad_outputs)`` called when autograd node ``node`` runs, as
    ``node.register_hook(hook)`` does, with one MindSpore hook per node for all the hooks given here
    in a step: the first registers a hook calling, in registration order, the list kept in
    ``registry`` (the runtime's :attr:`~msprobe.engine.runtime.Runtime.node_hooks`, emptied when the
    step ends); later ones join that list. A node feeding the arguments of nested calls (a Dense
    inside an MLP, both given the same input) is hooked by each of them: MindSpore then converts its
    gradients to Python and dispatches once instead of once per call.

    The hooks run in the order they would have run as separate MindSpore hooks: the tool's only
    other hook on a node (the compiled per-call path's, ``hotpath.ext.observe_plain``) is registered
    when the call that made the node returns, before any hook given here for that node (those come
    from calls enclosing it, from later consumers of its output, or from that same call on the
    Python path). The key is the node's address with its sequence number (addresses are reused
    once a node is freed; sequence numbers only grow), so no node of the user's is kept.

    Args:
        registry: ``{(node address, sequence number): [hook]}`` of the open step.
        node: a MindSpore ``BackwardNode``.
        hook: ``callable(grad_inputs: tuple, grad_outputs: tuple) -> None``.

    Raises:
        whatever MindSpore's ``BackwardNode.register_hook`` raises (a new node only).
    """
    key = (node._unique_id(), node._sequence_nr())
    hooks = registry.get(key)
    if hooks is not None:
        hooks.append(hook)
        return
    hooks = [hook]
    node.register_hook(_calling_each(hooks))
    registry[key] = hooks  # after MindSpore took the hook: a failed registration leaves no entry


def _calling_each(hooks: list):
    """A node hook that calls each of ``hooks`` (a list that may grow) with its gradients."""

    def hook(grad_inputs, grad_outputs):
        for each in hooks:
            each(grad_inputs, grad_outputs)
    return hook


def _sum(a, b):
    """``a + b`` computed by the tool (not recorded: tool code runs with hooks ignoring it)."""
    return _add(a, b)


def _edge_key(edge_node, out_index: int, keys: dict):
    """The ``(node id, output index)`` an edge leads to; an automatic ``Contiguous`` (a view passed to
    a kernel) counts as leading to the view's producer."""
    key = (edge_node._unique_id(), out_index)
    if key not in keys and edge_node.name() == "Contiguous":
        inner = edge_node.next_functions
        if len(inner) == 1 and inner[0][0] is not None:
            key = (inner[0][0]._unique_id(), inner[0][1])
    return key


def _single_mapping(nodes: list, targets: list):
    """When one autograd node made every output of the call from its arguments: which of its edges
    leads to which argument, ``[(edge index, (position, element))]``; else ``None``.

    ``nodes``: the node of each output (all not ``None``); ``targets``: from :func:`_targets`.
    Accepted: every output is of the same node, which has exactly as many outputs and is not the node
    of any argument (an alias), and every edge of it that carries a gradient leads to an argument
    (directly or through an automatic ``Contiguous``) or to a leaf (a Parameter the call uses itself,
    not an argument: not ours to report). An argument given several times (``x * x``) takes one edge
    per occurrence, in argument order. (Compiled as ``single_mapping`` of :mod:`msprobe.tensors.hotpath`,
    which reads the same attributes in the same order.)"""
    node = nodes[0]
    uid = node._unique_id()
    for other in nodes[1:]:
        if other._unique_id() != uid:
            return None
    if len(node._input_metadata) != len(nodes):
        return None
    slots: dict = {}
    for i, k, _, _, key in targets:
        if key[0] == uid:
            return None
        slots.setdefault(key, []).append((i, k))
    mapping = []
    used: dict = {}
    for j, (edge_node, out_index) in enumerate(node.next_functions):
        if edge_node is None:
            continue
        key = _edge_key(edge_node, out_index, slots)
        candidates = slots.get(key)
        if candidates is None:
            if edge_node.is_leaf():
                continue
            return None
        n = used.get(key, 0)
        if n < len(candidates):
            used[key] = n + 1
            mapping.append((j, candidates[n]))
    return mapping


# ---------------------------------------------------------------------------------------------- walk
#: most nodes walked for one call before giving up (reported in dump_error_info.log)
MAX_WALK = 200_000

try:  # the raw view primitive: the tool's own node, never a wrapped API
    from mindspore.ops.auto_generate.gen_ops_prim import view_op as _view_op
except ImportError:  # pragma: no cover - other MindSpore layouts
    _view_op = None


def watermark(tensor) -> int | None:
    """Sequence number of a new node (a view of ``tensor``, discarded, never part of any gradient):
    every node made from now on has a larger one. ``None`` when no such node can be made."""
    if _view_op is None:
        return None
    node = _view_op(tensor, tuple(tensor.shape))._grad_node
    return None if node is None else node._sequence_nr()


def consumer_edges(nodes: list, targets: set, mark: int):
    """Edges from the nodes made after ``mark`` (walked back from ``nodes``, those of the call's
    outputs) into nodes whose unique
    id is in ``targets``: ``{(target id, producer output index): [(node, edge index)]}``; an edge
    through an automatic ``Contiguous`` made after ``mark`` counts as the ``Contiguous``'s own edge.
    ``None`` when the walk exceeds :data:`MAX_WALK` nodes. (Walked in C when :mod:`msprobe.tensors.hotpath`
    is built: ``consumer_edges``, the same attributes read in the same order.)"""
    ext = hotpath.ext
    if ext is not None:
        return ext.consumer_edges(nodes, targets, mark, MAX_WALK)
    stack = []
    seen = set()
    for node in nodes:
        uid = node._unique_id()
        if uid not in seen and uid not in targets:
            seen.add(uid)
            stack.append(node)
    found: dict = {}
    while stack:
        node = stack.pop()
        for j, (edge, out_index) in enumerate(node.next_functions):
            if edge is None:
                continue
            e_uid = edge._unique_id()
            if e_uid in targets:
                found.setdefault((e_uid, out_index), []).append((node, j))
            elif e_uid not in seen and edge._sequence_nr() > mark and not edge.is_leaf():
                seen.add(e_uid)
                if len(seen) > MAX_WALK:
                    return None
                stack.append(edge)
    return found
