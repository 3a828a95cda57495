"""Cell-level (L0) capture inside compiled graphs, on CPU.

Python hooks do not run inside a compiled graph (GRAPH_MODE, or a ``mindspore.jit`` Cell called
from PyNative), and ``ops.TensorDump`` runs on Ascend only. What does run at every step on CPU is
``ops.Custom``: a ``func_type="pyfunc"`` op hands the real values, as numpy arrays, to a Python
function, an ``aot`` op to a compiled kernel (in GRAPH_MODE the kernels of ``_graph_probe.c``, when
built: see :mod:`msprobe.capture.cells.graph_probes`), and its ``bprop`` receives the gradient ``dout``. So each instrumented Cell gets an instance-level
``construct`` (:func:`msprobe.capture.cells.graph_probes.make_construct`) that shows

* its positional Tensor inputs (also inside tuple and list arguments) and its Tensor output(s) to an *observer*, beside the data path
  (:func:`msprobe.capture.cells.graph_probes.observe`: it sees ``stop_gradient`` of each tensor):
  forward ``input_args`` and ``output`` (+ ``parameters``, the Cell's own parameter values at
  ``start()``). A Cell without probed sub-Cells has one observer call for the whole call, after
  it; a Cell with probed sub-Cells has one for its inputs, before its sub-Cells run, and one for its
  outputs;
* its Tensor output(s) pass through a *mark*, a Cell whose ``bprop`` shows the gradients w.r.t. the
  outputs to a gradient probe (backward ``input``) and returns them unchanged.

The observers, marks and gradient probes are shared by every probed Cell (the Cell is named by a
constant input), so installing costs the same for any number of Cells. The mark adds no kernel to
the forward pass, and every consumer of the output sums its gradient into the mark's output as it
did into the tensor. A mark on the inputs would not be invisible: a tensor feeding the Cell and another
consumer would get ``g_other + (g_1 + g_2)`` (the Cell's internal consumers summed first) instead of
MindSpore's order, a last-bit change. So gradients w.r.t. a Cell's inputs (backward ``output``) are
not recorded in compiled graphs (a WARNING says so once).
Values are recorded through the :class:`msprobe.engine.runtime.Runtime` like PyNative L0 records:
same entry names (``Cell.{path}.{Class}.forward.{k}``, ``….backward.{k}``,
``….parameters_grad.{g}``), files, statistics, ``data_mode``, ``scope``/``list`` filters. Arrays are
copied into host ``mindspore.Tensor`` objects, so ``dump.json`` says ``"type": "mindspore.Tensor"``
and the MindSpore dtype name, as in PyNative.

Observers are ``side_effect_io`` ops, kept in program order although nothing computes with their
result; each gradient probe runs after the observer of its call (``ops.depend``). A graph call
returns before the graph runs, so :meth:`GraphDump.wait` (called by ``start``/``stop``/``step``)
waits for it. A probe runs on MindSpore's executor thread while the graph waits for it, so it only
copies its arrays and appends a report; :meth:`GraphCellCapture.drain`, in :meth:`GraphDump.wait`,
turns the reports into records on the thread that drives the dump (no flush, lock or file write
inside a graph).

Call numbering: probes run in execution order; the (input) observer of a call takes the next
forward number of its Cell and opens the call (also a call without Tensor positional inputs: its
``input_args`` holds its other arguments only), the (output) observer closes it (parents for ``construct.json`` come from the
stack of open calls). Backward runs in reverse: a gradient probe takes the latest un-paired forward
call of that Cell (LIFO).

Parameter gradients: inside a compiled graph a parameter read (``self.weight`` in the original
construct) cannot be intercepted, so the gradients are taken where they are consumed: the
``construct`` of every outermost ``nn.Optimizer`` that updates parameters of the model shows its
``gradients`` argument to an observer (same values as the gradient of each parameter in a single-process run;
with loss scaling or gradient accumulation the optimizer sees the processed gradients).

Positional arguments keep their PyNative positions: the Tensors inside tuple and list arguments are
probed too, and a compile-time note (``mindspore.ops.constexpr``, :meth:`GraphCellCapture._note_inputs`)
gives the arguments' structure, by which the probe's flat list is placed (``input_args`` nested for a
tuple, ``null`` for ``None``, a constant scalar as its value).

Limits (documented in the README): keyword arguments are not recorded (``input_kwargs`` is ``{}``),
nor the value of a scalar argument unknown at compile time (``mutable``: ``null``); only top-level Tensor items of a tuple output are probed; of
a boundary with more than :data:`~msprobe.capture.cells.graph_probes.MAX_ARITY` tensors only the first
:data:`~msprobe.capture.cells.graph_probes.MAX_ARITY` are (a WARNING says so when the graph compiles); a
Cell with a custom ``bprop`` has forward data only; the instrumentation is compiled into the graph,
so ``start(model)`` must come before the first step (a graph compiled earlier is reused by
MindSpore without the probes; a ``start(model)`` of a step that is not dumped installs them too)
and the probes stay in the graph until the process ends (while the dump is off they only return, a
pyfunc call each: one per Cell call, one per Cell call in the backward, one per optimizer call).
"""
from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import logging
import os
import threading
from collections import defaultdict

import numpy as np
from mindspore import Tensor, nn
from mindspore.ops import constexpr

from msprobe.capture.backward import _flatten_tensors
from msprobe.capture.cells import graph_lines, graph_probes
from msprobe.capture.cells.cell import is_jit_cell
from msprobe.format import naming
from msprobe.engine.handles import Handle
from msprobe.tensors import hotpath, stats

logger = logging.getLogger("msprobe")


def _host_tensor(array: np.ndarray) -> Tensor:
    """A host ``mindspore.Tensor`` holding a copy of a probe's array (the buffer is reused).

    ``Tensor.from_numpy`` wraps the copy without copying it again (~1 µs; ``Tensor(array)`` checks
    and copies, ~100 µs for a 150 KB array)."""
    return Tensor.from_numpy(np.array(array, copy=True, order="C"))


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


#: kinds of probe reports (:attr:`GraphCellCapture._reports`) besides the observers' kinds
#: (:data:`~msprobe.capture.cells.graph_probes.ENTER`, ``EXIT``, ``GRADIENTS``, a whole call ``k >= 0``)
_OUTPUT_GRADS, _HOOKED_GRADS = -4, -5


class _Direct:
    """Where :class:`GraphCellCapture` puts the records of the reports: the runtime's record methods,
    one by one (they decide selection-dependent file names, the user's failed values, ...)."""

    def __init__(self, rt):
        self.selector = rt.selector
        self.edge = rt.record_parent
        self.data = rt.record
        self.stack = functools.partial(rt.record_stack, compiled=True)
        self._param_grad = rt.record_param_grad

    def param_grad(self, entry: str, pname: str, grad) -> None:
        self._param_grad(entry, pname, Tensor.from_numpy(grad) if isinstance(grad, np.ndarray) else grad)

    def arrays(self, entry: str, key: str, arrays: list, category: str, keys=None, layout=None) -> None:
        """``data[entry][key]``: the probe's arrays (``None`` items stay ``None``) as host Tensors;
        with ``keys``, ``[{key: tensor}]``; with ``layout``, placed as the arguments were
        (:func:`_arranged`)."""
        tensors = [None if a is None else Tensor.from_numpy(a) for a in arrays]
        self.data(entry, key, _wrapped(tensors, keys) if layout is None else _arranged(tensors, layout, _same),
                  category)


class _Batch:
    """The records of the reports in a list, for :meth:`msprobe.engine.runtime.Runtime.queue_graph_records`
    (the same lines as :class:`_Direct` makes, queued at once). Values described already that follow
    their entry's stack use, with no other record between, go into that stack use's body (one line
    instead of one per key: the same ``dump.json``, see :func:`msprobe.format.journal.stack_ref`)."""

    def __init__(self):
        self.selector = _EVERY
        self.records: list = []
        self._body = None  # the stack use ``[entry, None, body, slots]`` taking the next values

    def edge(self, name: str, parent) -> None:
        self._body = None
        self.records.append((name, parent))

    def stack(self, entry: str) -> None:
        self._body = [entry, None, {}, []]
        self.records.append(self._body)

    def data(self, entry: str, key: str, value, category: str) -> None:
        kind = type(value)
        if (kind is dict or kind is tuple or kind is list) and not value:  # nothing to describe
            self.described(entry, key, {} if kind is dict else [], ())
            return
        self._body = None
        self.records.append((entry, key, value))

    def described(self, entry: str, key: str, value, slots) -> None:
        """``data[entry][key] = value``, described already (``slots``: its tensors)."""
        body = self._body
        if body is not None and body[0] == entry:
            body[2][key] = value
            body[3].extend(slots)
            return
        self._body = None
        self.records.append((entry, key, value, slots))

    def parameters(self, entry: str, cell_id: int, leaves: dict) -> None:
        """``data[entry]["parameters"]``: the leaves of the Cell's parameters read at ``start()``."""
        self.described(entry, "parameters", dict(leaves), ())

    def param_grad(self, entry: str, pname: str, grad) -> None:
        slots = hotpath.host_slots((grad,)) if type(grad) is np.ndarray else None
        if slots is None:
            self.data(entry, pname, [Tensor.from_numpy(grad) if type(grad) is np.ndarray else grad], "")
        else:
            self.described(entry, pname, list(slots), slots)

    def arrays(self, entry: str, key: str, arrays: list, category: str, keys=None, layout=None) -> None:
        """As :meth:`_Direct.arrays`, the arrays described straight into statistics slots
        (:func:`msprobe.tensors.hotpath.host_slots`: the leaves of their host Tensors, without making
        them) when the extension reads them all, else as host Tensors."""
        present = [a for a in arrays if a is not None]
        slots = hotpath.host_slots(present)
        if slots is None:
            tensors = [None if a is None else Tensor.from_numpy(a) for a in arrays]
            self.data(entry, key, _wrapped(tensors, keys) if layout is None else _arranged(tensors, layout, _same),
                      category)
            return
        if len(present) < len(arrays):
            made = iter(slots)
            described = [None if a is None else next(made) for a in arrays]
        else:
            described = list(slots)
        self.described(entry, key, _wrapped(described, keys) if layout is None else
                       _arranged(described, layout, _scalar_leaf), slots)


#: most drain recipes a capture keeps (graphs with different reports: shapes of a dynamic input, ...)
_RECIPES = 16


class _Recording(_Batch):
    """A :class:`_Batch` that also notes where each record's values come from, to make a
    :class:`_Recipe` of them (a step's first drain of a graph)."""

    def __init__(self, reports: list):
        super().__init__()
        #: id(array) -> (report, group, item) of every array of the reports
        self.origin = {id(a): (r, 2 + g, i) for r, report in enumerate(reports)
                       for g, group in enumerate(report[2:]) if type(group) is list
                       for i, a in enumerate(group)}
        self.cells: dict = {}  # id of a "parameters" value -> id of its Cell

    def parameters(self, entry: str, cell_id: int, leaves: dict) -> None:
        value = dict(leaves)
        self.cells[id(value)] = cell_id
        self.described(entry, "parameters", value, ())

    def recipe(self, capture) -> "_Recipe | None":
        """The :class:`_Recipe` of :attr:`records` and of the state the drain left, or ``None`` when a
        value is not one the recipe makes (a host Tensor, a value described another way)."""
        used: list = []  # positions of the arrays the records describe, in order
        index: dict = {}

        def spec(value):
            if type(value) is dict and id(value) in self.cells:
                return ("p", self.cells[id(value)])
            if (type(value) is dict or type(value) is list) and not value:
                return ("c", type(value))
            if type(value) is list and len(value) == 1 and type(value[0]) is dict:
                keys = tuple(value[0])
                places = [slot_place(v) for v in value[0].values()]
                if None not in places:
                    return ("d", keys, places)  # else a scalar argument's leaf (below)
            if type(value) is list and any(type(v) is list or type(v) is dict for v in value):
                tree = nested(value)  # arguments placed by their layout (_arranged)
                return None if tree is None else ("n", tree)
            if type(value) is list:
                places = [-1 if v is None else slot_place(v) for v in value]
                return None if None in places else ("s", places)
            return None

        def nested(value):
            if value is None:
                return -1
            if type(value) is list:
                items = [nested(v) for v in value]
                return None if None in items else items
            if type(value) is dict and tuple(value) == ("type", "value"):  # a scalar's leaf (_scalar_leaf)
                return ("v", value["type"], value["value"])
            if type(value) is dict:
                return None
            return slot_place(value)

        def slot_place(slot):
            where = self.origin.get(id(getattr(slot, "tensor", None)))
            if where is None:
                return None
            if where not in index:
                index[where] = len(used)
                used.append(where)
            return index[where]

        steps = []
        for record in self.records:
            if type(record) is list:  # a stack use with the values that follow it
                entry, _, body, _ = record
                items = [(k, spec(v)) for k, v in body.items()]
                if any(item is None for _, item in items):
                    return None
                steps.append((True, entry, items))
            elif len(record) == 2:  # a construct.json edge
                steps.append((None, record, None))
            elif len(record) == 4:
                entry, key, value, _ = record
                item = spec(value)
                if item is None:
                    return None
                steps.append((False, entry, [(key, item)]))
            else:
                return None
        state = (set(capture.entered), list(capture.stack),
                 {k: list(v) for k, v in capture.open.items() if v},
                 {k: list(v) for k, v in capture.done.items() if v}, dict(capture.rt.counters))
        return _Recipe(used, steps, state)


class _Recipe:
    """The records of a drain that starts a step, with the reports' arrays as the only values that
    change: names, ``construct.json`` edges and stack uses are the same at every run of a compiled
    graph. :meth:`queue` queues the journal lines of new reports with the same key
    (:meth:`GraphCellCapture._drain_key`), made by one compiled function
    (:class:`msprobe.capture.cells.graph_lines.Lines`), and leaves the capture and the runtime in the
    state the drain did (open and finished calls, call counters).

    Args:
        used: ``(report, group, item)`` of each array the records describe, in slot order.
        steps: the records as :class:`~msprobe.capture.cells.graph_lines.Lines` takes them.
        state: what the drain left: Cells entered, open stack, open and finished calls, counters.
    """

    def __init__(self, used: list, steps: list, state: tuple):
        self.used, self.steps, self.state = used, steps, state
        self._lines: dict = {}  # extra_info -> graph_lines.Lines, compiled at first use

    def queue(self, reports: list, capture) -> bool:
        """Queue the journal lines of ``reports`` into the capture's runtime
        (:meth:`msprobe.engine.runtime.Runtime.queue_graph_lines`) and restore the drain's state;
        ``False`` (nothing done): an array the statistics slots do not take, then the drain makes
        the records one by one."""
        slots = hotpath.host_slots([reports[r][g][i] for r, g, i in self.used])
        if slots is None:
            return False
        rt = capture.rt
        extra_info = bool(rt.config.extra_info)
        lines = self._lines.get(extra_info)
        if lines is None:
            lines = self._lines[extra_info] = graph_lines.Lines(self.steps, extra_info)
        entered, stack, open_calls, done, counters = self.state
        capture.entered = set(entered)
        capture.stack = list(stack)
        capture.open = defaultdict(list, {k: list(v) for k, v in open_calls.items()})
        capture.done = defaultdict(list, {k: list(v) for k, v in done.items()})
        rt.counters.update(counters)
        rt.queue_graph_lines(functools.partial(lines.make, slots, capture.param_leaves),
                             [slots[i] for i in lines.order], lines.asked, lines.first_stack)
        return True


class _EveryEntry:
    """The selection of a config that selects every entry and keeps no state (no ``scope``, no
    ``list``: :meth:`msprobe.engine.runtime.Runtime.takes_plain_records`), answering as
    :class:`msprobe.engine.filters.Selector` does then, without reading the names."""

    @staticmethod
    def selects(entry: str) -> bool:
        return True

    @staticmethod
    def selects_param_grad(cell_prefix: str, entry: str) -> bool:
        return True

    @staticmethod
    def enter_cell(entry: str) -> None:
        pass

    exit_cell = note_backward = enter_cell


_EVERY = _EveryEntry()


def _wrapped(values: list, keys):
    """``values``, or ``[{key: value}]`` with ``keys`` (a Cell's dict output)."""
    return values if keys is None else [dict(zip(keys, values))]


def _layout_tensors(layout) -> int:
    """How many Tensors an argument layout (:func:`msprobe.capture.cells.graph_probes.arguments_layout`)
    holds."""
    n = 0
    for item in layout:
        if type(item) is int:
            n += 1
        elif type(item) is tuple and item[0] == "n":
            n += _layout_tensors(item[1:])
    return n


def _arranged(values: list, layout, scalar) -> list:
    """The probe's Tensors ``values`` (flat, in order) placed as the positional arguments were
    (``layout``: :func:`msprobe.capture.cells.graph_probes.arguments_layout`): a nested list for a
    tuple or list argument, ``None`` for ``None`` and any value not known when the graph compiled,
    ``scalar(v)`` for a ``bool``/``int``/``float``/``str`` constant ``v``; Tensors beyond the probe's
    :data:`~msprobe.capture.cells.graph_probes.MAX_ARITY` are ``None``."""
    taken = iter(values)

    def build(items):
        placed = []
        for item in items:
            if type(item) is int:
                placed.append(next(taken, None))
            elif item is None:
                placed.append(None)
            elif item[0] == "n":
                placed.append(build(item[1:]))
            else:
                placed.append(scalar(item[1]))
        return placed

    return build(layout)


def _scalar_leaf(value) -> dict:
    """The ``dump.json`` value of a Python ``bool``/``int``/``float``/``str`` (as the describer makes it)."""
    return {"type": type(value).__name__, "value": value}


def _same(value):
    return value


class GraphCellCapture:
    """Installs the probes and turns their reports into records.

    A probe runs on MindSpore's executor thread while the graph waits for it, so it only copies its
    arrays (the buffers are reused) and appends a report; :meth:`drain`, called on the thread that
    starts and stops the dump once the graphs launched so far have run, turns the reports into
    records, in the order the probes ran. A flush never runs inside a probe (it could wait for the
    graph that waits for the probe).

    Args:
        rt: the :class:`msprobe.engine.runtime.Runtime` receiving the records; its ``running`` flag
            says whether forward data is reported now.
        tree: the tree of ``dump_path`` the records go to (``"graph"``), or ``None``: the main one.
    """

    #: the records of one :meth:`drain` are queued at once when the config selects every entry
    #: and names no file (:meth:`msprobe.engine.runtime.Runtime.takes_plain_records`); False: one by
    #: one through the runtime's record methods, always (the same files: ``tests/test_graph_probes.py``)
    batched = True

    def __init__(self, rt, tree: str | None = None):
        self.rt = rt
        self.tree = tree
        self.fwd_in, self.fwd_out, self.bwd_in, self.bwd_out = rt.data_flags()
        self.param_grads = self.bwd_in or self.bwd_out
        self._reports: list = []  # (kind, ...) appended by the probes, taken by drain()
        self._reports_lock = threading.Lock()
        #: True from begin_step() to end_step(): gradient probes report (also after stop())
        self.collecting = False
        self.step = None  # the step number whose calls are tracked (None: none since end_step())
        self.param_values: dict = {}  # id(cell) -> {name: host Tensor}, taken at begin of step
        #: id(cell) -> {name: dump.json leaf}, read at begin of step, instead of param_values when
        #: the records are queued at once (snapshot_parameters)
        self.param_leaves: dict = {}
        self._own_parameters = None  # [(id(cell), [(short name, Parameter)])] of the probed Cells
        self._output_kinds = defaultdict(set)  # (prefix, n tensors) -> {dict keys or None} (compile time)
        #: (prefix, n tensors) -> {positional arguments' layout or None} (compile time, _note_inputs)
        self._input_layouts = defaultdict(set)
        #: how many (prefix, n, keys) _output_kinds and _input_layouts hold (part of a drain's key)
        self._kinds_seen = 0
        #: the records of a step's first drain by what its reports are (:meth:`_drain_key`): a graph
        #: run again reports the same calls, so their names, edges and state are made once
        self._recipes: dict = {}
        #: how many drains made their records from a recipe (the benchmarks and tests read it)
        self.recipe_drains = 0
        self._observers = ()  # graph_probes.make_observers, shared by every probed Cell and optimizer
        self._probed: list = []  # (prefix, cell) of each probed Cell, indexed by its code
        self._chunks: list = []  # owners of each run of gradients an optimizer probe shows, by code
        #: the number of this capture's compiled probes (graph_probes.compiled), None: pyfunc probes
        self._compiled = None
        #: the forward entry of the compiled region (``Jit.….forward``) whose probes :meth:`drain` is
        #: turning into records: the parent of the Cells called at its top (None: no region recorded)
        self.region = None
        self._reset()

    def snapshot_parameters(self, cells, synced: bool) -> None:
        """Copy the Cells' own parameters to host (main thread, before the step runs); ``synced``:
        every operation launched so far has run, so their memory is read directly. When the step's
        records are queued at once (:meth:`_plain`) and synced, their statistics are taken now
        instead (:meth:`msprobe.engine.runtime.Runtime.parameter_leaves`: the same leaves the flush
        makes from a copy).

        A probe cannot read a Parameter while its graph runs (``asnumpy()`` there waits for the
        graph: deadlock), so forward ``parameters`` are the values at ``start()``: the values the
        step's forward sees when, as usual, the parameters are updated once per step after it.
        """
        if not self.fwd_out:
            return
        owned = self._own_parameters
        if owned is None:  # read once: a Cell's parameters are part of its compiled graph
            owned = self._own_parameters = [(id(cell), [(name.rsplit(".", 1)[-1], p) for name, p in
                                                        cell.parameters_and_names(expand=False)])
                                            for _, cell in cells]
        if synced and self._plain():  # statistics taken now, in place: no copy, no Tensor
            leaves = self.rt.parameter_leaves([dict(params) for _, params in owned])
            if leaves is not None:
                self.param_leaves, self.param_values = {key: got for (key, _), got in zip(owned, leaves)}, {}
                return
        self.param_leaves = {}
        self.param_values = {key: _own_parameter_values(params, synced) for key, params in owned}

    def _plain(self) -> bool:
        """Whether :meth:`drain` queues the step's records at once (:attr:`batched`)."""
        return self.batched and self.rt.takes_plain_records()

    def _reset(self) -> None:
        self.stack: list = []  # open forward calls, outermost first (construct.json parents)
        self.open = defaultdict(list)  # prefix -> open forward calls
        self.done = defaultdict(list)  # prefix -> finished forward calls awaiting their backward
        self.entered: set = set()  # prefixes whose input probe ran in this step

    def begin_step(self, step: int) -> None:
        """A dumped section of step ``step`` starts (``start()``): reports of graphs run before it
        are dropped; calls of an earlier step are forgotten."""
        self.take_reports()
        if self.step != step:
            self.step = step
            self._reset()
        self._collect(True)

    def end_step(self) -> None:
        """The step is over (``step()``): later reports are dropped until the next ``begin_step``."""
        self._collect(False)
        self.take_reports()
        self.step = None
        self.param_values, self.param_leaves = {}, {}
        self._reset()

    # ------------------------------------------------------------------ probe callbacks
    def _report(self, report: tuple) -> None:
        with self._reports_lock:
            self._reports.append(report)

    def _collect(self, on: bool) -> None:
        """Switch the probes' reports on or off (:attr:`collecting`). Compiled probes report forward
        data whenever they collect; :meth:`drain` drops what they saw while the runtime was not
        running."""
        self.collecting = on
        if self._compiled is not None:
            graph_probes.compiled().set_flags(self._compiled, on, on)

    def take_reports(self) -> list:
        """The probes' reports so far, in the order the probes ran (the compiled probes' first: the
        Python list holds hooked parameter gradients, which only pyfunc captures have)."""
        reports = []
        if self._compiled is not None:
            reports, lost = graph_probes.take_compiled(self._compiled)
            if lost:
                self.rt.tool_error(f"{lost} reports of compiled graph probes were dropped for want of memory: "
                                   "the step's records from compiled graphs are incomplete")
                self.rt.mark_abnormal("reports of compiled graph probes were lost (no memory)")
        with self._reports_lock:
            reports, self._reports = reports + self._reports, []
        return reports

    def _observed(self, values: tuple):
        """An observer ran (``values``: code, kind, arrays): report the arrays wanted."""
        if self.collecting and self.rt.running:
            code, kind = values[0], values[1]
            if kind >= 0:  # a whole call: ``kind`` inputs, then the outputs
                self._report((kind, code, _copies(values[2:2 + kind]) if self.fwd_in else None,
                              _copies(values[2 + kind:]) if self.fwd_out else None))
            elif kind == graph_probes.GRADIENTS or (self.fwd_in if kind == graph_probes.ENTER else self.fwd_out):
                self._report((kind, code, _copies(values[2:])))
            else:
                self._report((kind, code, None))
        return graph_probes.TOKEN

    def _gradients(self, values: tuple):
        """A gradient probe ran (``values``: code, gradients w.r.t. the Cell's outputs): report them;
        returns the gradients unchanged."""
        if self.collecting:
            self._report((_OUTPUT_GRADS, values[0], _copies(values[1:]) if self.bwd_in else None))
        return values[1] if len(values) == 2 else values[1:]

    # ------------------------------------------------------------------ records
    def drain(self, region: str | None = None) -> None:
        """Turn the probes' reports so far into records (call once the graphs have run, on the
        thread that starts and stops the dump).

        Args:
            region: the forward entry (``Jit.{name}.{n}.forward``) of the recorded compiled call
                whose graph made the reports, or None: the parent in ``construct.json`` of the Cells
                its graph called at its top (and of their backward entries)."""
        self.region = region
        reports = self.take_reports()
        if not reports:
            return
        rt = self.rt
        if rt.failed or rt.forked() or not rt.step_open:
            return
        if self._compiled is not None and not rt.running:  # forward data of graphs run after stop()
            reports = [r for r in reports if r[0] == _OUTPUT_GRADS]
        cells, chunks = self._probed, self._chunks
        with contextlib.ExitStack() as scope:
            if self.tree is not None and not scope.enter_context(rt.tree(self.tree)):
                return
            scope.enter_context(rt.bulk())
            scope.enter_context(rt.tool_code())
            plain = self._plain()
            key = self._drain_key(reports) if plain else None
            recipe = self._recipes.get(key) if key is not None else None
            if recipe is not None:
                if recipe.queue(reports, self):
                    self.recipe_drains += 1
                    return
            if not plain:
                sink = _Direct(rt)
            else:  # a step's first drain of a graph not seen yet: made into a recipe (while room is left)
                sink = _Recording(reports) if key is not None and len(self._recipes) < _RECIPES else _Batch()
            for kind, code, *arrays in reports:
                if kind >= 0:  # a whole call
                    prefix, cell = cells[code]
                    self._enter(sink, prefix, arrays[0])
                    self._exit(sink, prefix, cell, arrays[1])
                elif kind == graph_probes.ENTER:
                    self._enter(sink, cells[code][0], arrays[0])
                elif kind == graph_probes.EXIT:
                    self._exit(sink, *cells[code], arrays[0])
                elif kind == _OUTPUT_GRADS:
                    self._output_grads(sink, cells[code][0], arrays[0])
                elif kind == graph_probes.GRADIENTS:
                    self._param_grads(sink, chunks[code], arrays[0])
                else:  # _HOOKED_GRADS: code is the owners list
                    self._param_grads(sink, code, arrays[0])
            if isinstance(sink, _Recording):
                made = sink.recipe(self)
                if made is not None:
                    self._recipes[key] = made
            if isinstance(sink, _Batch):
                rt.queue_graph_records(sink.records)

    def _drain_key(self, reports: list):
        """What a drain's records depend on besides the reports' arrays, when it starts a step (no
        call numbered or open yet): each report's kind, Cell code and dtypes, the Cells' output
        kinds and whether parameters were read at ``start()``; ``None`` otherwise, and for pyfunc
        probes (their reports may hold Python numbers and hooked gradients)."""
        if self._compiled is None or self.entered or self.stack:
            return None
        # the step's call numbers so far (a compiled region's own, APIs before it at mix) and the
        # region: the recipe's names and edges depend on them
        return (self._kinds_seen, bool(self.param_leaves), self.region, tuple(self.rt.counters.items()),
                tuple([(r[0], r[1]) + tuple([None if g is None or type(g) is not list else
                                             tuple([a.dtype if type(a) is np.ndarray else type(a) for a in g])
                                             for g in r[2:]])
                       for r in reports]))

    def _enter(self, sink, prefix: str, arrays) -> None:
        rt = self.rt
        self.entered.add(prefix)
        k = rt.next_count(f"{prefix}.forward")
        fwd = naming.cell_entry(prefix, naming.FORWARD, k)
        parent = self.stack[-1] if self.stack else self.region
        sink.edge(fwd, parent)
        sink.stack(fwd)  # probes run on MindSpore's executor thread: no Python frames
        selected = sink.selector.selects(fwd)
        sink.selector.enter_cell(fwd)
        # the backward entry is selected as the call begins, as the PyNative Cell hooks select it: a
        # scope whose last bound is this Cell is still open (it closes as the call returns)
        backward = (self.bwd_in or self.bwd_out) and sink.selector.selects(naming.backward_of(fwd))
        if backward:
            sink.selector.note_backward(prefix)
        if selected and self.fwd_in:
            sink.arrays(fwd, "input_args", arrays, "input", layout=self._input_layout(prefix, len(arrays)))
            sink.data(fwd, "input_kwargs", {}, "kwargs")
        self.stack.append(fwd)
        self.open[prefix].append((fwd, selected, parent, backward))

    def _exit(self, sink, prefix: str, cell, arrays) -> None:
        frames = self.open[prefix]
        if not frames:  # no call open: the forward MindSpore recomputes in the backward for
            return      # Cell.recompute() re-runs the output probe (not the input probe): no call
        fwd, selected, parent, backward = frames.pop()
        if self.stack and self.stack[-1] == fwd:
            self.stack.pop()
        rt = self.rt
        sink.selector.exit_cell(fwd)
        if selected and self.fwd_out:
            sink.arrays(fwd, "output", arrays, "output", self._output_keys(prefix, len(arrays)))
            leaves = self.param_leaves.get(id(cell)) if isinstance(sink, _Batch) else None
            if leaves is not None:  # read at start() (snapshot_parameters)
                sink.parameters(fwd, id(cell), leaves)
            else:
                sink.data(fwd, "parameters", self.param_values.get(id(cell), {}), "parameters")
        if backward:
            # a region's backward runs inside its forward call (the grad function is compiled)
            self.done[prefix].append((naming.backward_of(fwd), parent if parent is None or parent == self.region
                                      else naming.backward_of(parent)))

    def _output_grads(self, sink, prefix: str, arrays) -> None:
        """bprop of the output probe: gradients w.r.t. the Cell's outputs (backward ``input``)."""
        pending = self.done.get(prefix)
        if not pending:
            return
        bwd, bparent = pending.pop()
        sink.edge(bwd, bparent)
        if self.bwd_in:
            # gradients of floating-point tensors only (as the PyNative probes: others give null);
            # numpy knows MindSpore's bfloat16 as a kind "V" type
            sink.arrays(bwd, "input", [a if a.dtype.kind == "f" or a.dtype.name == "bfloat16" else None
                                       for a in arrays], "input")

    def _param_grads(self, sink, owners: list, grads) -> None:
        """Gradients entering an optimizer (or reaching a Parameter's hook): ``owners[i]`` =
        (prefix, short name, first-of-Cell) or None."""
        rt = self.rt
        for owner, grad in zip(owners, grads):
            if owner is None:
                continue
            prefix, pname, first = owner
            key = f"{prefix}.parameters_grad"
            g = rt.next_count(key) if first else max(rt.counters[key] - 1, 0)
            entry = naming.param_grad_entry(prefix, g)
            if sink.selector.selects_param_grad(prefix, entry):
                sink.param_grad(entry, pname, grad)

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
        marks = self._make_probes(graph_mode)
        probed = {id(cell) for _, cell in cells}
        for prefix, cell in cells:
            if getattr(cell, "has_bprop", False):
                logger.info("msprobe: %s defines bprop: only its forward data is recorded in a graph", prefix)
            # a Cell without probed sub-Cells: nothing is probed between its inputs and its outputs
            whole = not any(id(sub) in probed for name, sub in cell.cells_and_names() if name)
            undo.append(_set_construct(cell, graph_probes.make_construct(
                self._observers, marks, self._code(len(self._probed)), whole,
                _too_many(prefix, "input"), _too_many(prefix, "output"), self._note_keys(prefix),
                self._note_inputs(prefix))))
            self._probed.append((prefix, cell))
        if self.param_grads and not graph_mode:
            self._hook_parameters(cells, undo)
        elif self.param_grads:
            self._instrument_optimizers(models, cells, undo)

        def remove():
            for fn in reversed(undo):
                fn()
            self._collect(False)

        return Handle(remove, "graph-mode Cell probes")

    def _make_probes(self, graph_mode: bool):
        """Make the shared observers (:attr:`_observers`); returns the marks (``None``: no gradient is
        wanted). In GRAPH_MODE the compiled probes when they are built and MindSpore takes their
        file (:func:`msprobe.capture.cells.graph_probes.compiled`), else pyfuncs. Under PyNative
        (children of jit Cells) pyfuncs: there the runtime's recording gate also changes between
        forward passes (``token_range``), which a pyfunc reads when it runs."""
        grads = self.bwd_in or self.bwd_out
        kernels = graph_probes.compiled() if graph_mode else None
        if kernels is not None:
            try:
                self._observers = graph_probes.make_observers(None)
                marks = graph_probes.make_marks(None) if grads else None
                self._compiled = kernels.new_capture(self.fwd_in, self.fwd_out, self.bwd_in)
                return marks
            except (TypeError, ValueError, OverflowError) as exc:  # MS_CUSTOM_AOT_WHITE_LIST elsewhere
                logger.info("msprobe: compiled graph probes not used (%s); Python probes instead", exc)
        self._observers = graph_probes.make_observers(self._observed)
        return graph_probes.make_marks(self._gradients) if grads else None

    def _code(self, number: int):
        """The constant naming Cell (or optimizer chunk) ``number`` in its probes' calls."""
        if self._compiled is not None:
            number = graph_probes.compiled_code(self._compiled, number)
        return graph_probes.code_tensor(number)

    def _hook_parameters(self, cells, undo: list) -> None:
        """PyNative (children of jit Cells): ``Parameter.register_hook`` on the Cells' own trainable
        parameters reports each gradient (recorded at the next :meth:`drain`)."""
        for param_id, (param, owner) in _parameter_owners(cells).items():
            def hook(grad, owner=owner):
                if self.collecting:
                    self._report((_HOOKED_GRADS, [owner], [grad]))
            undo.append(param.register_hook(hook).remove)

    def _note_keys(self, prefix: str):
        """The compile-time note (``mindspore.ops.constexpr``) of the kind of output a Cell returns:
        the keys of a dict's Tensor values, or ``None``; per Cell and number of tensors."""
        @constexpr
        def note_keys(keys):
            n = 1 if keys is None else len(keys)
            kinds = self._output_kinds[(prefix, n)]
            if keys not in kinds:
                kinds.add(keys)
                self._kinds_seen += 1
            return n
        return note_keys

    def _note_inputs(self, prefix: str):
        """The compile-time note (``mindspore.ops.constexpr``) of the structure of a Cell's positional
        arguments (:func:`msprobe.capture.cells.graph_probes.arguments_layout`), per Cell and number of
        Tensors in them. A layout of Tensors only is noted as ``None``: the probe's list as it is."""
        @constexpr
        def note_inputs(layout):
            try:
                n = min(_layout_tensors(layout), graph_probes.MAX_ARITY)  # the probe takes this many
                if all(item == graph_probes.TENSOR and type(item) is int for item in layout):
                    layout = None
                layouts = self._input_layouts[(prefix, n)]
                if layout not in layouts:
                    layouts.add(layout)
                    self._kinds_seen += 1
            except Exception as exc:  # the tool's failure must not stop the graph's compilation
                self.rt.tool_error(f"failed to note the arguments of {prefix} in a compiled graph: {exc!r}",
                                   key=("arguments", prefix))
            return 0
        return note_inputs

    def _input_layout(self, prefix: str, n: int):
        """The layout of forward ``input_args`` of a Cell call whose arguments hold ``n`` Tensors
        (:func:`_arranged`): the one every compiled call of the Cell with ``n`` Tensors has, else
        ``None`` (the probe's list of Tensors as it is)."""
        layouts = self._input_layouts.get((prefix, n), ())
        if len(layouts) == 1:
            (layout,) = layouts
            return layout
        return None

    def _output_keys(self, prefix: str, n: int):
        """The keys of forward ``output`` recorded as ``[{key: tensor}]``: where every compiled call
        of the Cell with ``n`` output tensors returns a dict with the same keys (as PyNative
        records); else ``None`` (a list of the tensors)."""
        kinds = self._output_kinds.get((prefix, n), set())
        if len(kinds) == 1:
            (keys,) = kinds
            if keys is not None and len(keys) == n:
                return keys
        return None

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
        owners_by_id = _parameter_owners(cells)
        params = list(optimizer.parameters)
        owners = [owners_by_id[id(p)][1] if id(p) in owners_by_id else None for p in params]
        if not any(owners):
            return None
        size = graph_probes.MAX_ARITY
        codes = []
        for start in range(0, len(params), size):
            codes.append(self._code(len(self._chunks)))
            self._chunks.append(owners[start:start + size])
        construct = graph_probes.make_grads_construct(self._observers, tuple(codes), len(params),
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


def _copies(arrays) -> list:
    """C-contiguous copies of a probe's arrays (MindSpore reuses their buffers after the probe)."""
    return [np.array(a, copy=True, order="C") for a in arrays]


def _parameter_owners(cells) -> dict:
    """``id(Parameter) -> (Parameter, (prefix, short name, first of its Cell))`` for the Cells' own
    trainable parameters (the first one of a Cell advances its ``parameters_grad`` count)."""
    owners = {}
    for prefix, cell in cells:
        items = [(name.rsplit(".", 1)[-1], p) for name, p in cell.parameters_and_names(expand=False)
                 if p.requires_grad]
        for i, (pname, p) in enumerate(items):
            owners[id(p)] = (p, (prefix, pname, i == 0))
    return owners


def _own_parameter_values(params: list, synced: bool) -> dict:
    """A Cell's own parameters (``params``: ``[(short name, Parameter)]``), copied to host now;
    ``synced``: every operation launched so far has run, so the memory holds the final values and
    is read directly (:func:`msprobe.tensors.stats.host_copy`; ``asnumpy()`` costs ~0.2 ms per
    Parameter here)."""
    values = {}
    for name, p in params:
        try:
            copy = stats.host_copy(p) if synced else None
            values[name] = Tensor.from_numpy(copy) if copy is not None else _host_tensor(p.asnumpy())
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

    * GRAPH_MODE: every sub-Cell is probed; records go to the runtime's main tree, so the layout is
      the PyNative one (``dump_path/step{N}/rank…``). The PyNative Cell hooks are not installed.
    * PyNative with ``mindspore.jit`` Cells: the descendants of each outermost jit Cell are probed and
      recorded into the runtime's ``graph`` tree (``dump_path/graph/step{N}/rank…``); everything else
      (including the jit Cell itself, recorded ONCE, as one unit) goes to the main tree, which is
      ``dump_path/pynative/`` then (the seed's two subtrees, see :func:`attach`).

    The probes are installed at the first ``start(model)``, of a dumped step or not
    (:meth:`install`), and stay compiled in until the process ends (:meth:`close`); removing them
    would only force a recompilation.

    Args:
        rt: the service's :class:`msprobe.engine.runtime.Runtime` (the one owner of dump state).
        graph_mode: True in GRAPH_MODE, False for children of jit Cells under PyNative.
        jit_cells: ``(model index, path)`` of the outermost jit Cells (PyNative only).
    """

    def __init__(self, rt, graph_mode: bool, jit_cells: set):
        self.rt = rt
        self.graph_mode = graph_mode
        self.jit_cells = jit_cells
        self.tree = None if graph_mode else "graph"
        self._capture = None
        self._handle = None
        self._cells: list = []
        #: the recorded compiled call (``Jit.….forward``) whose graph's reports the next drain records
        #: (:meth:`region_returned`), or None
        self._region = None

    def wait(self) -> None:
        """Wait until the compiled graphs launched so far have run, then record what their probes
        reported.

        A graph call returns before the graph runs (also under ``mindspore.runtime.launch_blocking``);
        the PyNative executor's ``sync`` waits for it (``mindspore.runtime.synchronize`` does not
        on CPU). An exception the graph raised propagates, as at the user's next read of a result.
        """
        if self._handle is not None:
            stats.pynative_executor().sync()
            region, self._region = self._region, None
            self._capture.drain(region)

    def begin_step(self, models) -> None:
        """Called by ``start()`` once the runtime's step is open: let graphs launched before it
        finish (their probes must not report into this step), open the ``graph`` tree's step
        directory (PyNative with jit Cells), install the probes (first time only; ``models``:
        ``[(index or None, Cell)]``) and copy the probed Cells' parameters."""
        self._region = None  # a compiled call of an earlier step
        if self._handle is not None:
            stats.pynative_executor().sync()
            if self._capture.step == self.rt.step:  # start() again in the same step: keep what came
                self._capture.drain()               # since stop() (gradients of its sections)
        if self.tree is not None:
            with self.rt.tree(self.tree):
                pass
        first = self.install(models)
        self._capture.begin_step(self.rt.step)
        on_cpu = stats.device_target() == "CPU"  # read now: the context may change between steps
        self._capture.snapshot_parameters(self._cells, synced=not first and on_cpu)

    @property
    def installed(self) -> bool:
        """The probes are installed (they stay until :meth:`close`)."""
        return self._handle is not None

    def install(self, models) -> bool:
        """Install the probes in the Cells of ``models`` (``[(index or None, Cell)]``) unless they are
        installed already; returns whether this call installed them. Installed, they report nothing
        until :meth:`begin_step` (``start()`` of a step that is not dumped installs them too: a graph
        compiled without them is reused without them)."""
        if self.installed:
            return False
        self._cells = list(graph_cells(models, None if self.graph_mode else self.jit_cells))
        self._capture = GraphCellCapture(self.rt, self.tree)
        self._handle = self._capture.install(self._cells, models, self.graph_mode)
        logger.info("msprobe: %d Cells probed inside compiled graphs (%s)", len(self._cells),
                    "GRAPH_MODE" if self.graph_mode else "children of mindspore.jit Cells")
        return True

    def note_unrecorded(self) -> None:
        """List in ``coverage.json`` (``not_recorded_in_graph``) the probed Cells none of whose
        probes ran in this step although others did (the graph ran). Call after :meth:`wait`,
        before the files are written."""
        capture = self._capture
        if capture is None or capture.step != self.rt.step or not capture.entered:
            return
        missing = [prefix for prefix, _ in self._cells if prefix not in capture.entered]
        with contextlib.ExitStack() as scope:
            if self.tree is not None and not scope.enter_context(self.rt.tree(self.tree)):
                return
            self.rt.add_note("not_recorded_in_graph", [
                {"cell": prefix, "note": "no probe of this Cell ran in the compiled graph in this step: "
                                         "it was not called (a container such as CellList, a branch not "
                                         "taken) or the compiler removed it; a compiled Cell's data "
                                         "exist only if it runs"}
                for prefix in missing])

    def region_returned(self, region: str, output) -> None:
        """GRAPH_MODE: the recorded compiled call ``region`` (its forward entry,
        ``Jit.{name}.{n}.forward``) returned ``output`` (what the call returned): the probes' reports of its
        graph become records with ``region`` as the parent of the Cells called at its top, at the
        next :meth:`wait` (``stop()``/``step()``), when no other compiled call came first (then now).

        In watch mode they are recorded now, inside the call, before its output: watch mode checks
        records in the order they are made, and the Cell that made a NaN must come before the call
        around it. Waiting here costs the training thread CPU (MindSpore's wait spins: ~20 ms per
        LeNet step on a loaded 2-core machine), so other dumps wait where they always did."""
        if not self.graph_mode or self._handle is None:
            return
        if self._region is not None:  # the reports so far are those of the earlier region's graph
            self._drain_region(())
        self._region = region
        if self.rt.watch is not None:
            self._drain_region(_flatten_tensors(output, [])[:1])

    def _drain_region(self, outputs) -> None:
        """Wait for the graphs launched so far (reading the first of ``outputs`` first, when given: a
        result's read waits without the executor's spinning ``sync``) and record their probes' reports
        as inside :attr:`_region`. A failure of the graph reaches the caller as at its next read of a
        result; a failure of the recording is reported as the tool's."""
        if outputs:
            try:
                outputs[0].asnumpy()
            except Exception as exc:  # the graph failed (kept for the user: MindSpore reports it
                self.rt.claim_user_failure(exc, outputs)  # once), or a dtype numpy lacks: the sync waits
        stats.pynative_executor().sync()
        region, self._region = self._region, None
        try:
            self._capture.drain(region)
        except Exception as exc:  # the tool's failure: keep training
            self.rt.tool_error(f"failed to record the Cells inside {region}: {exc!r}", key=("region", type(exc)))

    def end_step(self) -> None:
        """Before the runtime closes the step (``step()``): record the gradients reported since
        ``stop()`` and forget the step's calls."""
        if self._capture is not None:
            self.wait()
            self._capture.end_step()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def attach(rt, models):
    """The :class:`GraphDump` a dump at level L0/mix of ``models`` (``[(index or None, Cell)]``)
    needs, or ``False`` (nothing compiled to probe: PyNative without jit Cells). Call before the
    first step is opened: with jit Cells the runtime's main tree becomes ``dump_path/pynative``
    (:attr:`msprobe.engine.runtime.Runtime.tree_root`) beside the ``graph`` tree."""
    import mindspore as ms

    if models is None:
        return False
    if ms.get_context("mode") == ms.GRAPH_MODE:
        return GraphDump(rt, True, set())
    jit_cells = outermost_jit_cells(models)
    if not jit_cells:
        return False
    rt.tree_root = "pynative"
    return GraphDump(rt, False, jit_cells)
