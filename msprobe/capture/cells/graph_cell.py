"""Cell-level (L0) capture inside compiled graphs, on CPU.

Python hooks do not run inside a compiled graph (GRAPH_MODE, or a ``mindspore.jit`` Cell called
from PyNative), and ``ops.TensorDump`` runs on Ascend only. What does run at every step on CPU is
``ops.Custom(func_type="pyfunc")``: it hands the real values, as numpy arrays, to a Python function,
and its ``bprop`` receives the gradient ``dout``. So each instrumented Cell gets an instance-level
``construct`` (:func:`msprobe.capture.cells.graph_probes.make_construct`) that passes

* its positional Tensor inputs to a forward-only *input probe* beside the data path
  (:func:`msprobe.capture.cells.graph_probes.observe`: it sees ``stop_gradient`` of each input and its
  result is unused): forward ``input_args``;
* its Tensor output(s) through an *output probe*: forward ``output`` (+ ``parameters``, the Cell's own
  parameter values at that moment); bprop: gradients w.r.t. the outputs (backward ``input``).

The output probe is an identity (the Python function returns the arrays it received), so results are
unchanged, and every consumer of the output sums its gradient into the probe's output as it did into
the tensor. An identity on the inputs would not be invisible: a tensor feeding the Cell and another
consumer would get ``g_other + (g_1 + g_2)`` (the Cell's internal consumers summed first) instead of
MindSpore's order, a last-bit change. So gradients w.r.t. a Cell's inputs (backward ``output``) are
not recorded in compiled graphs (a WARNING says so once).
Values are recorded through the :class:`msprobe.engine.runtime.Runtime` like PyNative L0 records:
same entry names (``Cell.{path}.{Class}.forward.{k}``, ``….backward.{k}``,
``….parameters_grad.{g}``), files, statistics, ``data_mode``, ``scope``/``list`` filters. Arrays are
copied into host ``mindspore.Tensor`` objects, so ``dump.json`` says ``"type": "mindspore.Tensor"``
and the MindSpore dtype name, as in PyNative.

Forward probes are ``side_effect_io`` ops, kept in program order even where their result is unused;
each gradient probe runs after its forward probe (``ops.depend`` in the bprop). A graph call
returns before the graph runs, so :meth:`GraphDump.wait` (called by ``start``/``stop``) waits for it.

Call numbering: probes run in execution order; the input probe of a call takes the next forward
number of its Cell and opens the call (a call without Tensor positional inputs shows the probe a
constant, and records ``input_args`` ``[]``), the output probe closes it (parents for
``construct.json`` come from the stack of open calls). Backward runs in reverse: the output probe's
bprop takes the latest un-paired forward call of that Cell (LIFO).

Parameter gradients: inside a compiled graph a parameter read (``self.weight`` in the original
construct) cannot be intercepted, so the gradients are taken where they are consumed: the
``construct`` of every outermost ``nn.Optimizer`` that updates parameters of the model gets a probe
on its ``gradients`` argument (same values as the gradient of each parameter in a single-process run;
with loss scaling or gradient accumulation the optimizer sees the processed gradients).

Limits (documented in the README): non-Tensor positional arguments and keyword arguments are not
recorded (``input_kwargs`` is ``{}``); only top-level Tensor items of a tuple output are probed; of
a boundary with more than :data:`~msprobe.capture.cells.graph_probes.MAX_ARITY` tensors only the first
:data:`~msprobe.capture.cells.graph_probes.MAX_ARITY` are (a WARNING says so when the graph compiles); a
Cell with a custom ``bprop`` has forward data only; the instrumentation is compiled into the graph,
so ``start(model)`` must come before the first step (a graph compiled earlier is reused by
MindSpore without the probes) and the probes stay in the graph until the process ends (while the
dump is off they only pass values through, ~30 µs each).
"""
from __future__ import annotations

import gc
import inspect
import logging
import os
import threading
from collections import defaultdict

import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.ops import constexpr

from msprobe.capture.cells import graph_probes
from msprobe.capture.cells.cell import is_jit_cell
from msprobe.format import naming
from msprobe.engine.handles import Handle

logger = logging.getLogger("msprobe")


def _host_tensor(array: np.ndarray) -> Tensor:
    """A host ``mindspore.Tensor`` holding a copy of a probe's array (the buffer is reused)."""
    return Tensor(np.array(array, copy=True))


def _same_shape(*shapes):
    return shapes[0] if len(shapes) == 1 else shapes


def _make_probe(callback, arity: int, grad_callback=None, side_effect: bool = True):
    """An identity ``ops.Custom`` pyfunc op of ``arity`` tensors calling ``callback(arrays)``; with
    ``grad_callback`` its bprop passes ``dout`` through a second identity probe calling it, else
    the bprop returns ``dout`` as it is.

    With ``side_effect`` the op is marked ``side_effect_io`` (as ``ops.Print`` is): the graph
    compiler then keeps it, in program order, even where nothing uses its result (the outputs of a
    network differentiated by ``mindspore.grad``, a Cell whose output only feeds unused code);
    without the mark such a probe is removed as dead code and the call is silently missing.
    Gradient probes are not marked: a gradient nothing needs is not computed, as in PyNative.
    """
    def forward(arrays):
        callback(arrays)
        return arrays[0] if len(arrays) == 1 else arrays

    # a bprop is always given (a Custom op without one fails to compile under a gradient)
    if grad_callback is None:
        grad = graph_probes.pass_through
    else:
        grad = _make_probe(grad_callback, arity, side_effect=False)
    bprop = graph_probes._BPROPS[arity](grad)
    op = ops.Custom(graph_probes._FORWARDERS[arity](forward), out_shape=_same_shape,
                    out_dtype=_same_shape, func_type="pyfunc", bprop=bprop)
    if side_effect:
        op.add_prim_attr("side_effect_io", True)
    return op


def graph_cells(models, inside=None):
    """``(prefix, cell)`` of every descendant Cell (not the roots), each object once, depth first.

    With ``inside`` (a set of ``(model index, path)`` of jit Cells), only the descendants of those
    Cells are yielded (the jit Cells themselves are captured by the PyNative hooks).
    """
    seen = set()
    for index, root in models:
        seen.add(id(root))
        for name, cell in root.cells_and_names():
            if not name or id(cell) in seen:
                continue
            if inside is not None and not any(
                    i == index and name.startswith(path + ".") for i, path in inside):
                continue
            seen.add(id(cell))
            yield naming.cell_prefix(name, type(cell).__name__, index), cell


class GraphCellCapture:
    """Installs the probes and turns their calls into records.

    Args:
        gate: runtime whose ``running`` flag says whether forward data is recorded now.
        sink: runtime that receives the records (``gate`` itself, or the ``graph/`` tree's runtime).
    """

    def __init__(self, gate, sink):
        self.gate = gate
        self.rt = sink
        self.fwd_in, self.fwd_out, self.bwd_in, self.bwd_out = sink.data_flags()
        self.param_grads = self.bwd_in or self.bwd_out
        self._lock = threading.RLock()
        self._writer = None
        self.param_values: dict = {}  # id(cell) -> {name: host Tensor}, taken at begin of step
        self._output_kinds = defaultdict(set)  # (prefix, n tensors) -> {dict keys or None} (compile time)
        self._reset()

    def snapshot_parameters(self, cells) -> None:
        """Copy the Cells' own parameters to host (main thread, before the step runs).

        A probe cannot read a Parameter while its graph runs (``asnumpy()`` there waits for the
        graph: deadlock), so forward ``parameters`` are the values at ``start()``: the values the
        step's forward sees when, as usual, the parameters are updated once per step after it.
        """
        if not self.fwd_out:
            return
        self.param_values = {id(cell): _own_parameter_values(cell) for _, cell in cells}

    def _reset(self) -> None:
        self.stack: list = []  # open forward calls, outermost first (construct.json parents)
        self.open = defaultdict(list)  # prefix -> open forward calls
        self.done = defaultdict(list)  # prefix -> finished forward calls awaiting their backward
        self.entered: set = set()  # prefixes whose input probe ran in this step

    def _recording(self) -> bool:
        rt = self.rt
        if not self.gate.running or rt.failed or rt.forked() or rt.writer is None or rt.writer.closed:
            return False
        if self._writer is not rt.writer:  # a new step: calls of the previous one are forgotten
            self._writer = rt.writer
            self._reset()
        return True

    # ------------------------------------------------------------------ probe callbacks
    def _enter(self, prefix: str, arrays) -> None:
        with self._lock:
            if not self._recording():
                return
            rt = self.rt
            self.entered.add(prefix)
            with rt.tool_code():
                k = rt.next_count(f"{prefix}.forward")
                fwd = naming.cell_entry(prefix, naming.FORWARD, k)
                parent = self.stack[-1] if self.stack else None
                rt.record_parent(fwd, parent)
                rt.record_stack(fwd)
                selected = rt.selector.selects(fwd)
                rt.selector.enter_cell(fwd)
                if selected and self.fwd_in:
                    rt.record(fwd, "input_args", [_host_tensor(a) for a in arrays], "input")
                    rt.record(fwd, "input_kwargs", {}, "kwargs")
                self.stack.append(fwd)
                self.open[prefix].append((fwd, selected, parent))

    def _exit(self, prefix: str, cell, arrays) -> None:
        with self._lock:
            if not self._recording():
                return
            frames = self.open[prefix]
            if not frames:  # no call open: the forward MindSpore recomputes in the backward for
                return      # Cell.recompute() re-runs the output probe (not the input probe): no call
            fwd, selected, parent = frames.pop()
            if self.stack and self.stack[-1] == fwd:
                self.stack.pop()
            rt = self.rt
            rt.selector.exit_cell(fwd)
            with rt.tool_code():
                if selected and self.fwd_out:
                    rt.record(fwd, "output", self._output_record(prefix, arrays), "output")
                    rt.record(fwd, "parameters", self.param_values.get(id(cell), {}), "parameters")
                if self.bwd_in or self.bwd_out:
                    bwd = fwd.replace(".forward.", ".backward.")
                    if rt.selector.selects(bwd):
                        rt.selector.note_backward(prefix)
                        bparent = parent.replace(".forward.", ".backward.") if parent else None
                        self.done[prefix].append((bwd, bparent, rt.writer))

    def _output_grads(self, prefix: str, arrays) -> None:
        """bprop of the output probe: gradients w.r.t. the Cell's outputs (backward ``input``)."""
        with self._lock:
            pending = self.done.get(prefix)
            if not pending:
                return
            bwd, bparent, writer = pending.pop()
            rt = self.rt
            if writer is not rt.writer:
                return
            with rt.tool_code():
                rt.record_parent(bwd, bparent)
                if self.bwd_in:
                    _record_grads(rt, bwd, "input", arrays, writer)

    def _param_grads(self, owners: list, arrays) -> None:
        """Gradients entering an optimizer: ``owners[i]`` = (prefix, short name, first-of-Cell) or None."""
        with self._lock:
            if not self._recording():
                return
            rt = self.rt
            with rt.tool_code():
                for owner, array in zip(owners, arrays):
                    if owner is None:
                        continue
                    prefix, pname, first = owner
                    key = f"{prefix}.parameters_grad"
                    g = rt.next_count(key) if first else max(rt.counters[key] - 1, 0)
                    entry = naming.param_grad_entry(prefix, g)
                    if rt.selector.selects_param_grad(prefix, entry):
                        rt.record_param_grad(entry, pname, _host_tensor(array))

    # ------------------------------------------------------------------ installation
    def install(self, cells, models, graph_mode: bool = True) -> Handle:
        """Instrument ``cells`` (``(prefix, cell)``) and, in GRAPH_MODE, the optimizers of ``models``'
        parameters. Under PyNative (children of jit Cells) parameter gradients come from
        ``Parameter.register_hook`` as at PyNative L0 (they fire for parameters used in a jit graph;
        a probe in an optimizer ``construct`` would run twice there: once eagerly, once compiled)."""
        _allow_graph_parsing()
        if self.bwd_out:
            _note_no_input_gradients()
        undo = []
        for prefix, cell in cells:
            if getattr(cell, "has_bprop", False):
                logger.info("msprobe: %s defines bprop: only its forward data is recorded in a graph", prefix)
            undo.append(self._instrument(prefix, cell))
        if self.param_grads and not graph_mode:
            from msprobe.capture.cells.cell import CellCapture
            from msprobe.engine.handles import HandleSet

            hooks = HandleSet()
            capture = CellCapture(self.rt)
            for prefix, cell in cells:
                capture._hook_params(prefix, cell, hooks)
            undo.append(hooks.remove)
        elif self.param_grads:
            self._instrument_optimizers(models, cells, undo)

        def remove():
            for fn in reversed(undo):
                fn()

        return Handle(remove, "graph-mode Cell probes")

    def _instrument(self, prefix: str, cell):
        arities = range(1, graph_probes.MAX_ARITY + 1)
        probes_in = (_make_probe(lambda a, p=prefix: self._enter(p, ()), 1),) + tuple(
            _make_probe(lambda a, p=prefix: self._enter(p, a), n) for n in arities)
        probes_out = (None,) + tuple(
            _make_probe(lambda a, p=prefix, c=cell: self._exit(p, c, a), n,
                        (lambda a, p=prefix: self._output_grads(p, a)) if (self.bwd_in or self.bwd_out) else None)
            for n in arities)
        return _set_construct(cell, graph_probes.make_construct(
            probes_in, probes_out, _too_many(prefix, "input"), _too_many(prefix, "output"),
            self._note_keys(prefix)))

    def _note_keys(self, prefix: str):
        """The compile-time note (``mindspore.ops.constexpr``) of the kind of output a Cell returns:
        the keys of a dict's Tensor values, or ``None``; per Cell and number of tensors."""
        @constexpr
        def note_keys(keys):
            n = 1 if keys is None else len(keys)
            self._output_kinds[(prefix, n)].add(keys)
            return n
        return note_keys

    def _output_record(self, prefix: str, arrays) -> list:
        """Forward ``output``: the tensors, or ``[{key: tensor}]`` where every compiled call of the
        Cell with that many output tensors returns a dict with the same keys (as PyNative records)."""
        values = [_host_tensor(a) for a in arrays]
        kinds = self._output_kinds.get((prefix, len(values)), set())
        if len(kinds) == 1:
            (keys,) = kinds
            if keys is not None and len(keys) == len(values):
                return [dict(zip(keys, values))]
        return values

    def _instrument_optimizers(self, models, cells, undo: list) -> None:
        """Probe the gradients entering each optimizer of the models' parameters (GRAPH_MODE)."""
        optimizers = _optimizers_of(models)
        if not optimizers:
            logger.warning("msprobe: no mindspore.nn.Optimizer holding the model's parameters exists at "
                           "start(); in GRAPH_MODE parameter gradients are taken where an optimizer "
                           "receives them, so no parameters_grad entries are written")
        for optimizer in optimizers:
            if not _takes_gradients(optimizer):
                logger.warning("msprobe: %s.construct does not take the gradients as its first argument: "
                               "the gradients it receives are not recorded (parameters_grad)",
                               type(optimizer).__name__)
                continue
            restore = self._instrument_optimizer(optimizer, cells)
            if restore is not None:
                undo.append(restore)

    def _instrument_optimizer(self, optimizer, cells):
        owners_by_id = {}
        for prefix, cell in cells:
            items = [(name.rsplit(".", 1)[-1], p) for name, p in cell.parameters_and_names(expand=False)
                     if p.requires_grad]
            for i, (pname, p) in enumerate(items):
                owners_by_id[id(p)] = (prefix, pname, i == 0)
        params = list(optimizer.parameters)
        owners = [owners_by_id.get(id(p)) for p in params]
        if not any(owners):
            return None
        size = graph_probes.MAX_ARITY
        chunk_probes = tuple(
            _make_probe(lambda a, o=owners[start:start + size]: self._param_grads(o, a),
                        len(params[start:start + size]))
            for start in range(0, len(params), size))
        construct = graph_probes.make_grads_construct(chunk_probes, len(params),
                                                      _unprobed_optimizer(type(optimizer).__name__, len(params)))
        return _set_construct(optimizer, construct)


_NOTED_BOUNDARIES: set = set()  # (prefix, side) already warned about (each graph compile calls again)


def _note_no_input_gradients() -> None:
    """WARNING, once per process, that backward ``output`` is not recorded inside compiled graphs."""
    if "input gradients" in _NOTED_BOUNDARIES:
        return
    _NOTED_BOUNDARIES.add("input gradients")
    logger.warning("msprobe: inside compiled graphs (GRAPH_MODE, children of mindspore.jit Cells) the "
                   "gradients w.r.t. a Cell's inputs (backward 'output') are not recorded: a probe there "
                   "would change how MindSpore sums the gradient of a tensor with several consumers. "
                   "Backward 'input' (gradients w.r.t. the outputs) and parameters_grad are recorded")


def _too_many(prefix: str, side: str):
    """The compile-time note (``mindspore.ops.constexpr``) of a boundary with too many tensors,
    a WARNING once per Cell and side."""
    @constexpr
    def too_many(n):
        if (prefix, side) in _NOTED_BOUNDARIES:
            return n
        _NOTED_BOUNDARIES.add((prefix, side))
        logger.warning("msprobe: %s has %d Tensor %ss in a compiled graph; a graph probe takes %d, so "
                       "only the first %d are recorded", prefix, n, side, graph_probes.MAX_ARITY,
                       graph_probes.MAX_ARITY)
        return n
    return too_many


def _unprobed_optimizer(name: str, size: int):
    """The compile-time note (``mindspore.ops.constexpr``) of an optimizer call the gradient probe
    cannot take, a WARNING once per optimizer class."""
    @constexpr
    def unprobed(n):
        if (name, "gradients") in _NOTED_BOUNDARIES:
            return n
        _NOTED_BOUNDARIES.add((name, "gradients"))
        logger.warning("msprobe: %s is called in a compiled graph without a tuple of its %d gradients as "
                       "first positional argument: the gradients it receives there are not recorded "
                       "(parameters_grad)", name, size)
        return n
    return unprobed


def _set_construct(cell, construct):
    """Make ``construct`` the instance's ``construct``, with the current one (instance override or
    the class's, bound) kept as ``cell._msprobe_inner_construct`` for it to call; returns the
    function that undoes both."""
    state = vars(cell)
    if graph_probes.INNER in state:  # probed already (by another debugger): keep the first probes
        logger.warning("msprobe: %s is probed already; it is not probed a second time", type(cell).__name__)
        return lambda: None
    saved = {name: state[name] for name in ("construct", graph_probes.INNER) if name in state}
    object.__setattr__(cell, graph_probes.INNER, cell.construct)
    object.__setattr__(cell, "construct", construct.__get__(cell))

    def restore():
        for name in ("construct", graph_probes.INNER):
            if name in saved:
                object.__setattr__(cell, name, saved[name])
            else:
                state.pop(name, None)

    return restore


def _record_grads(rt, entry: str, key: str, arrays, writer) -> None:
    """Gradients of floating-point tensors only (as the PyNative probes: others give null items)."""
    size = len(arrays)
    for i, array in enumerate(arrays):
        if array.dtype.kind == "f":
            rt.record_item(entry, key, i, size, _host_tensor(array), key, writer)


def _own_parameter_values(cell) -> dict:
    """The Cell's own parameters, copied to host now."""
    values = {}
    for name, p in cell.parameters_and_names(expand=False):
        try:
            values[name.rsplit(".", 1)[-1]] = _host_tensor(p.asnumpy())
        except Exception:  # a parameter that cannot be read here is left out
            continue
    return values


def _optimizers_of(models) -> list:
    """The outermost ``nn.Optimizer`` instances updating parameters of ``models`` (found once, at
    install). An optimizer held by another one (as ``nn.LARS`` holds its inner optimizer) is left
    out: the outer one receives the parameters' gradients, the inner one what the outer passes on."""
    wanted = {id(p) for _, root in models for p in root.get_parameters()}
    found = []
    for obj in gc.get_objects():
        try:
            if isinstance(obj, nn.Optimizer) and any(id(p) in wanted for p in obj.parameters):
                found.append(obj)
        except ReferenceError:  # a dead weak proxy among the tracked objects
            continue
    inner = {id(cell) for opt in found for name, cell in opt.cells_and_names() if name}
    return [opt for opt in found if id(opt) not in inner]


def _takes_gradients(optimizer) -> bool:
    """Whether ``optimizer.construct`` takes the gradients as its first positional argument (as
    every ``mindspore.nn`` optimizer does: ``construct(self, gradients)``)."""
    try:
        params = list(inspect.signature(optimizer.construct).parameters.values())
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD,
                                               params[0].VAR_POSITIONAL)


def _allow_graph_parsing() -> None:
    """Let the graph compiler parse msprobe's wrapper functions when msprobe is installed as a
    third-party package (``MS_JIT_MODULES``, as the reference tool does)."""
    modules = [m for m in os.environ.get("MS_JIT_MODULES", "").split(",") if m]
    if "msprobe" not in modules:
        os.environ["MS_JIT_MODULES"] = ",".join(modules + ["msprobe"])


def outermost_jit_cells(models) -> set:
    """``(model index, path)`` of the jit Cells that are not inside another jit Cell."""
    found = set()
    for index, root in models:
        paths: list = []
        for name, cell in root.cells_and_names():
            if name and not any(name.startswith(p + ".") for p in paths) and is_jit_cell(cell):
                paths.append(name)
                found.add((index, name))
    return found


class GraphDump:
    """The graph part of an L0/mix dump, driven by :class:`msprobe.mindspore.service.DumpService`.

    * GRAPH_MODE: every sub-Cell is probed; records go to the service's runtime, so the layout is the
      PyNative one (``dump_path/step{N}/rank…``). The PyNative Cell hooks are not installed.
    * PyNative with ``mindspore.jit`` Cells: the descendants of each outermost jit Cell are probed and
      recorded into a second runtime writing ``dump_path/graph/step{N}/rank…``; everything else
      (including the jit Cell itself, recorded ONCE, as one unit) goes to
      ``dump_path/pynative/step{N}/rank…`` (the seed's two subtrees).

    The probes are installed at the first dumped ``start()`` and stay compiled in until the process
    ends (:meth:`close`); removing them would only force a recompilation.
    """

    def __init__(self, service, graph_mode: bool, jit_cells: set):
        from msprobe.engine.runtime import Runtime

        self.service = service
        self.graph_mode = graph_mode
        self.jit_cells = jit_cells
        rt = service.runtime
        # Records made by probes are never flushed from inside the probe (it runs on MindSpore's
        # executor thread while the graph waits; a flush there can block on the graph): the
        # graph's records are flushed at stop()/step() (the runtime's async_dump behaviour).
        if graph_mode:
            self.sink = rt
            rt.config = rt.config.model_copy(update={"async_dump": True})
        else:
            base = rt.config.dump_path
            self.sink = Runtime(rt.config.model_copy(update={"dump_path": os.path.join(base, "graph"),
                                                             "async_dump": True}))
            rt.config = rt.config.model_copy(update={"dump_path": os.path.join(base, "pynative")})
        self._handle = None

    def wait(self) -> None:
        """Wait until the compiled graphs launched so far have run, so their probes have reported.

        A graph call returns before the graph runs (also under ``mindspore.runtime.launch_blocking``);
        the PyNative executor's ``sync`` waits for it (``mindspore.runtime.synchronize`` does not
        on CPU). An exception the graph raised propagates, as at the user's next read of a result.
        """
        if self._handle is not None:
            from msprobe.tensors.stats import pynative_executor

            pynative_executor().sync()

    def begin_step(self) -> None:
        """Called by ``start()`` once the service's step is open: let graphs launched before it
        finish (their probes must not report into this step), open the graph tree's step (same
        number and rank) and install the probes (first time only)."""
        self.wait()
        rt, sink = self.service.runtime, self.sink
        if sink is not rt:
            if sink.writer is not None and not sink.writer.closed and sink.step != rt.step:
                sink.end_step()
            sink.init_step, sink.loop, sink.rank_override = rt.init_step, rt.loop, rt.rank_override
            sink.open_step()
            sink.running = True  # parameter-gradient hooks of jit children check it
        if self._handle is None:
            models = self.service.models
            self._cells = list(graph_cells(models, None if self.graph_mode else self.jit_cells))
            self._capture = GraphCellCapture(rt, sink)
            self._handle = self._capture.install(self._cells, models, self.graph_mode)
            logger.info("msprobe: %d Cells probed inside compiled graphs (%s)", len(self._cells),
                        "GRAPH_MODE" if self.graph_mode else "children of mindspore.jit Cells")
        self._capture.snapshot_parameters(self._cells)

    def note_unrecorded(self) -> None:
        """List in ``coverage.json`` (``not_recorded_in_graph``) the probed Cells none of whose
        probes ran in this step although others did (the graph ran). Call before the files are
        written."""
        capture, writer = getattr(self, "_capture", None), self.sink.writer
        if capture is None or writer is None or writer.closed or capture._writer is not writer \
                or not capture.entered:
            return
        missing = [prefix for prefix, _ in self._cells if prefix not in capture.entered]
        self.sink.add_note("not_recorded_in_graph", [
            {"cell": prefix, "note": "no probe of this Cell ran in the compiled graph in this step: it "
                                     "was not called (a container such as CellList, a branch not "
                                     "taken) or the compiler removed it; a compiled Cell's data exist "
                                     "only if it runs"}
            for prefix in missing])

    def write_files(self) -> None:
        if self.sink is not self.service.runtime:
            self.sink.running = False
            self.sink.write_files()

    def end_step(self) -> None:
        if self.sink is not self.service.runtime:
            self.sink.end_step()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self.sink is not self.service.runtime:
            self.sink.close_writer()


def attach(service):
    """The :class:`GraphDump` a service at level L0/mix needs, or ``False`` (nothing compiled to
    probe: PyNative without jit Cells)."""
    import mindspore as ms

    if service.models is None:
        return False
    if ms.get_context("mode") == ms.GRAPH_MODE:
        return GraphDump(service, True, set())
    jit_cells = outermost_jit_cells(service.models)
    if not jit_cells:
        return False
    return GraphDump(service, False, jit_cells)
