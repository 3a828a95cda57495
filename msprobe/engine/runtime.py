"""Runtime: the one object that owns dump state (counters are record names, so one owner resets them).

It holds the step number, the per-step call counters (API, Primitive, Cell, parameter gradients),
the per-thread Cell stack and "inside tool code" depth, the recording gate (started, ``token_range``
forward passes), the pending batch of records, the outputs waiting for an asynchronous ``wait()``,
the rank, and the writer of the current step with its :attr:`Runtime.step_token`.
:meth:`Runtime._reset_step` is the single place where per-step state is reset (by ``step()`` and by
``set_init_step`` discarding an empty step); per-run state lives as long as the runtime.

Capture code talks to it through :meth:`record`, :meth:`record_item`, :meth:`next_count`,
:meth:`flush`, :meth:`tool_error`/:meth:`report_error`/:meth:`add_note` and the gate
:meth:`capturing`; it never touches the writer or files directly. Where step directories go is
:mod:`msprobe.engine.layout`.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
import time
import weakref
from collections import defaultdict

import numpy as np

from mindspore import Parameter, Tensor, ops

from msprobe.format import journal, naming
from msprobe.read import report
from msprobe.tensors import hotpath, stats
from msprobe.engine import layout
from msprobe.engine.budget import TensorBudget
from msprobe.engine.deferred import DeferredOutputs
from msprobe.engine.filters import Selector
from msprobe.engine.flush import (release_tensors, FlushTimer, encode_batch, materialize, raised_by_mindspore,
                                  replay_batch, wait_for_device)
from msprobe.tensors.records import Describer, describe_other
from msprobe.engine.stacks import MAX_WALK as STACK_WALK, StackTable
from msprobe.engine.step_files import StepExtras, write_step
from msprobe.engine.tensor_files import FileQueue
from msprobe.engine.watch import Watch, WatchAnomaly, WatchWriter
from msprobe.engine.writer import StepWriter

logger = logging.getLogger("msprobe")

_deepcopy = ops.deepcopy  # bound before any wrapper is installed: the tool's own snapshot op

#: flush when this many tensors are pending ...
FLUSH_SLOTS = 512
#: ... or they hold this many bytes (deferred tensors keep device memory alive) ...
FLUSH_BYTES = 64 << 20
#: ... or the oldest pending record is this many seconds old (checked at each record) ...
FLUSH_SECONDS = 0.5
#: ... or, when no record arrives to check it, this old (background :class:`FlushTimer`): a program
#: that hangs or is killed loses at most the records of the last ~FLUSH_DEADLINE seconds
FLUSH_DEADLINE = 0.75


def _no_file(path):
    return None


#: process state, not a run's: counts the forks this process descends from (``os.register_at_fork``),
#: so a runtime made before a fork knows it is in the child without a ``getpid()`` system call per
#: hook (~0.5 µs each on a shared machine)
_FORKS = [0]


def _count_fork() -> None:
    _FORKS[0] += 1


os.register_at_fork(after_in_child=_count_fork)


def _holds_failed_tensor(value, depth: int = 0) -> bool:
    """True when a Tensor in ``value`` (nested lists, tuples, dicts) cannot even tell its shape:
    MindSpore's sign that the operation producing it failed (asynchronous launch)."""
    if isinstance(value, Tensor):
        try:
            value.shape  # noqa: B018 - the read is the test
        except Exception:
            return True
        return False
    if depth > 8:
        return False
    if isinstance(value, (list, tuple)):
        return any(_holds_failed_tensor(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(_holds_failed_tensor(v, depth + 1) for v in value.values())
    return False


def _first_line_of(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    """An exception's message up to its first line (MindSpore appends its C++ call stack)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def _snapshot(tensor):
    """Parameters change in place (optimizer) before the flush reads them: a copy on device (an op,
    ~45 µs, no synchronisation)."""
    if isinstance(tensor, Parameter):
        return _deepcopy(tensor)
    return tensor


def _host_snapshot(tensor):
    """:func:`_snapshot` on CPU with synchronous launch, where a Parameter's data are final: a host
    copy (a memcpy, ~10 µs)."""
    if isinstance(tensor, Parameter):
        copy = stats.host_copy(tensor)
        return copy if copy is not None else _deepcopy(tensor)
    return tensor


def _unchanged(tensor):
    """A Parameter kept as it is (its statistics are taken at once)."""
    return tensor


def _append_lines(appends: list) -> None:
    """Append each writer's journal lines of one batch (``[(writer, lines)]``)."""
    for writer, lines in appends:
        if not writer.closed:
            writer.append(lines)


#: what records the inside of compiled graphs (level L1 in GRAPH_MODE records none of it)
def unrecorded_jit_text(functions: list) -> str:
    """What level L0 misses of the ``mindspore.jit`` functions ``functions`` (their ``__name__``, str)
    that ran while recording, and what records them: for the WARNING and an empty step's
    ``empty_reason``."""
    names = ", ".join(functions)
    entries = " / ".join(f"Jit.{name}.{{n}}" for name in functions)
    which = "function" if len(functions) == 1 else "functions"
    return (f"level L0: the mindspore.jit {which} {names} ran compiled, so the Cells called inside it are "
            f"not recorded (level mix records each call as one {entries} entry; level L2 records its kernels)")


GRAPH_L1_ADVICE = ("(in GRAPH_MODE msprobe records Cells at L0 and mix, kernels at L2): use level L0 or mix, with "
                   "debugger.start(model) before the first step, for the Cells they run, or L2 for their kernels")
#: the note of a step at L1 in GRAPH_MODE without a ``Jit`` entry (the network, e.g. Model.train's,
#: ran as a compiled Cell), also added to an empty step's reason
GRAPH_L1_NOTE = ("level L1 in GRAPH_MODE: Cells called in GRAPH_MODE (a training Cell, Model.train's network) "
                 "run as compiled graphs, and the APIs and Primitives inside a compiled graph are not recorded "
                 + GRAPH_L1_ADVICE)
#: added to an empty step's reason at L1 when ``start()`` was given no model
NO_MODEL_REASON = ("; start() was given no model, and at level L1 the Primitives called inside Cells "
                   "(such as those of nn.Dense or nn.ReLU) are recorded only with start(model)")


class Runtime:
    """Dump state for one process.

    Args:
        config: a :class:`msprobe.engine.config.DumpConfig`.
    """

    def __init__(self, config):
        self.config = config
        self.loop = 0
        self.init_step = 0
        #: recording is on now (read through :meth:`capturing`; set only by the methods of the
        #: "recording gate" section and :meth:`disk_failure`)
        self.running = False
        #: capture is installed for the open step (``start()`` until ``stop()``)
        self.active = False
        #: the last configured step is over: the dump is off for good
        self.finished = False
        #: numbers of the steps a step directory was opened for in this run (unreached_steps)
        self.opened_steps: set = set()
        #: the directories of earlier runs this run moved aside (the first one is said at once,
        #: all of them counted at the end: :meth:`msprobe.engine.layout.Moves.summary`)
        self.moves = layout.Moves()
        #: ``(first, last)`` forward passes of the root model recorded per started section, or None
        self.token_range = None
        self.forward_passes = 0  # root-model forward passes since start() (token_range)
        self.rank = None
        self.rank_override = None
        self.counters: dict = defaultdict(int)
        self.selector = Selector(config)
        self.save_tensors = config.task == "tensor"
        self.budget = TensorBudget(config)  # tensor_budget_mb: switch to statistics when reached
        self.records_data = config.task in ("statistics", "tensor")
        self.track_parents = config.extra_info and config.level in ("L0", "mix")
        self.stacks = StackTable()
        #: how Parameters are copied when recorded (chosen per step, see open_step)
        self.snapshot = _snapshot
        self._parameters_now = False  # see open_step
        #: the writer of the open step; capture code never uses it (it holds :attr:`step_token`)
        self.writer: StepWriter | None = None
        #: sub-directory of ``dump_path`` holding the step directories: ``"pynative"`` when the Cells
        #: compiled inside ``mindspore.jit`` Cells are written to a ``graph`` tree beside it (seed:
        #: the ``graph`` and ``pynative`` directories), else ``""``; decided before the first step
        self.tree_root = ""
        #: writers of the open step in the other trees of ``dump_path``, by tree name (:meth:`tree`)
        self.trees: dict = {}
        self._tree_stacks: dict = {}  # tree name -> stack ids written into its stack.json this step
        self._bulk = 0  # > 0 inside bulk(): no batch-size, age or deadline flushes
        self._token = 0  # :attr:`step_token` of the newest opened step (one more per opened step)
        self._tree_extras: dict = {}  # tree name -> the StepExtras of its open step directory
        #: what the open step's files say beyond its records (coverage notes, abnormal end)
        self.extras = StepExtras()
        self._tls = threading.local()
        self._lock = threading.RLock()
        #: held for a whole flush (take batch, read, append), so batches reach the journal in order
        self._flush_lock = threading.Lock()
        self._flushing = False
        self._pending: list = []
        self._pending_slots: list = []
        self._pending_bytes = 0
        self._oldest: float | None = None  # time.monotonic() of the oldest pending record
        #: the exception of a failed user operation that a flush inside tool code caught, raised to
        #: the user when the outermost tool section of a user thread ends (:meth:`leave`)
        self._user_error: BaseException | None = None
        self._timer: FlushTimer | None = None
        #: writes the .npy files of flushed batches off the flushing thread (made at the first file)
        self._files: FileQueue | None = None
        self._step_failure: str | None = None  # the first user failure of this step, for messages
        self._asked = 0  # values handed to record*() in this step (for empty_reason)
        self._graph_mode = False  # the open step runs in GRAPH_MODE (dump.json "mode", L1's note)
        #: at L1 with a ``list``: how many APIs and Primitives are hooked (only those a list item can
        #: name are; set by the service at install, for empty_reason), else None
        self.hooked_apis: int | None = None
        #: whether the Primitives called inside Cells are hooked (False at L1 when start() was given
        #: no model; set by the service at install, for empty_reason)
        self.primitives_hooked = True
        #: in GRAPH_MODE at L0/mix: why the probes are missing from a graph compiled before the first
        #: ``start(model)`` (set by the service at that install, for empty_reason), else None
        self.precompiled: str | None = None
        #: at L0: the ``mindspore.jit`` functions that ran (their Cells unrecorded) in the open step
        #: (noted by the service, for empty_reason)
        self.unrecorded_jit: list = []
        self._emitted_stacks: set = set()
        self._fork = _FORKS[0]  # another value in a forked child (forked())
        #: handles of the tool's tensor hooks (Parameters, outputs of recorded calls: capture/backward.py,
        #: capture/cells/cell.py), removed at the end of the step: MindSpore keeps an entry per hook
        #: until it is removed
        self.tensor_hooks: list = []
        #: the tool's autograd-node hooks of the open step, one MindSpore hook per node
        #: (:func:`msprobe.capture.backward.register_node_hook`), forgotten at the end of the step
        self.node_hooks: dict = {}
        #: > 0 while MindSpore re-runs a recomputed forward (:meth:`replaying`)
        self.recomputing = 0
        #: tool-failure key -> repeats not written again (tool_error)
        self.reported_errors: dict = {}
        self.late_pieces = 0
        #: calls whose output is recorded after an asynchronous ``wait()`` (capture/async_handles.py)
        self.deferred = DeferredOutputs()
        self._noted: set = set()  # keys of the run's once-only messages (first_time)
        #: set by the first failed write (disk full, file too large, ...): dumping is off for good
        self.failed = False
        #: watch mode (README "Watch mode"): run-wide history and anomaly state, or None
        self.watch = (Watch(config.watch, config.dump_path, config.level, self.moves)
                      if config.watch is not None else None)
        self._watch_names = self.watch is not None and config.watch.save_tensors

    # ------------------------------------------------------------------ state queries
    @property
    def step_open(self) -> bool:
        """True from ``start()`` until ``step()`` closes the step (also after ``stop()``: backward data
        of the step may still arrive)."""
        writer = self.writer
        return writer is not None and not writer.closed

    @property
    def step_token(self):
        """Which step a record belongs to: an opaque value, new for every opened step, ``None`` when
        no step is open. Code that records later than it decides to (gradients, the output of an
        asynchronous call after its ``wait()``) keeps the token of the step it started in and passes
        it back (:meth:`record_item`, :meth:`record_at`, ``record(..., token=)``); a record whose
        step was closed meanwhile is dropped as late (counted, one WARNING), never written into
        another step."""
        writer = self.writer
        return self._token if writer is not None and not writer.closed else None

    def _writer_of(self, token):
        """The writer for records of ``token`` (``None``: the open step); ``None`` when that step is
        closed (the record is then counted as late at the flush)."""
        if token is None or token == self._token:
            return self.writer
        return None

    def report_error(self, message: str, token=None) -> None:
        """Write ``message`` into ``dump_error_info.log`` of the step of ``token`` (default: the open
        step), every time (unlike :meth:`tool_error`); a WARNING only when that step is closed."""
        writer = self._writer_of(token)
        if writer is not None and not writer.closed:
            writer.error(message)
        else:
            logger.warning("msprobe: %s", message)

    @property
    def step_dir(self) -> str | None:
        """Directory of the open step, ``None`` when none is open."""
        writer = self.writer
        return writer.directory if writer is not None and not writer.closed else None

    @property
    def step_in_graph_mode(self) -> bool:
        """Whether the open step was opened in GRAPH_MODE (its ``dump.json`` says ``"mode":
        "GRAPH_MODE"``)."""
        return self._graph_mode

    def tool_error(self, message: str, key=None) -> None:
        """Report a failure of the tool itself (the training goes on): written to the step's
        ``dump_error_info.log`` the first time ``key`` (default: the message) is seen in the process;
        repeats are counted and their number is written when the step closes."""
        key = message if key is None else key
        seen = self.reported_errors.get(key)
        if seen is not None:
            self.reported_errors[key] = seen + 1
            return
        self.reported_errors[key] = 0
        if self.writer is not None and not self.writer.closed:
            self.writer.error(message)
        else:
            logger.warning("msprobe: %s", message)

    @contextlib.contextmanager
    def replaying(self, counters: dict, cell_stack: list):
        """``with runtime.replaying(counters, stack):`` — MindSpore re-runs a forward it ran before
        (``Cell.recompute()``): calls get the numbers and Cell parents they had the first time
        (``counters``, ``cell_stack``: copies taken then), forward data is not recorded again
        (:attr:`recomputing`), only the backward data the re-run forward makes possible. Afterwards
        the step's own counters and stack are back; parameter-gradient counts made during the
        re-run are kept."""
        real, real_stack = self.counters, self.cell_stack
        self.counters = defaultdict(int, counters)
        self._tls.cell_stack = list(cell_stack)
        self.recomputing += 1
        try:
            yield
        finally:
            self.recomputing -= 1
            replayed, self.counters = self.counters, real
            self._tls.cell_stack = real_stack
            for key, n in replayed.items():
                if key.endswith(".parameters_grad") and n > real[key]:
                    real[key] = n

    @property
    def step(self) -> int:
        """Current step number (``set_init_step`` offset plus completed ``step()`` calls)."""
        return self.init_step + self.loop

    # ------------------------------------------------------------------ the recording gate
    def capturing(self) -> bool:
        """The gate of every hook and wrapper: True when recording is on (between ``start()`` and
        ``stop()``, inside ``token_range``) and this thread is neither in tool code nor inside an
        already-recorded call, in the process that made the runtime. False: call the original."""
        return self.running and getattr(self._tls, "depth", 0) == 0 and _FORKS[0] == self._fork

    def busy(self) -> bool:
        """True inside tool code or inside an already-recorded call on this thread (skip hooks)."""
        return getattr(self._tls, "depth", 0) > 0 or _FORKS[0] != self._fork

    def begin_capture(self) -> None:
        """``start()`` installed the capture: recording is on (from the first forward pass of
        ``token_range`` when one is set)."""
        self.active = True
        self.forward_passes = 0
        self.running = self.token_range is None

    def end_capture(self) -> None:
        """``stop()`` (or a discarded step): recording is off until the next :meth:`begin_capture`."""
        self.active = False
        self.running = False

    def forward_pass_begins(self) -> None:
        """A forward pass of the root model starts: with ``token_range``, recording is on for the
        passes ``first..last`` (0-based, counted since ``start()``)."""
        first, last = self.token_range
        self.running = first <= self.forward_passes <= last

    def forward_pass_ends(self) -> None:
        self.running = False
        self.forward_passes += 1

    def finish(self) -> None:
        """The last configured step is over: nothing is recorded any more in this run."""
        self.finished = True
        self.close_timer()

    def unreached_steps(self) -> list:
        """The configured ``step`` values no step directory was opened for in this run (sorted)."""
        return sorted(set(self.config.step) - self.opened_steps)

    def first_time(self, key) -> bool:
        """True the first time ``key`` (hashable) is asked in this run: messages given once per run."""
        with self._lock:
            if key in self._noted:
                return False
            self._noted.add(key)
            return True

    def forked(self) -> bool:
        """True in a child process forked after the runtime was created: it never writes files."""
        return _FORKS[0] != self._fork

    def enter(self) -> None:
        self._tls.depth = getattr(self._tls, "depth", 0) + 1

    def leave(self) -> None:
        """End a tool section; the outermost one on a user thread raises a failure of the user's
        computation that tool code met meanwhile (:meth:`raise_user_error`)."""
        depth = self._tls.depth = self._tls.depth - 1
        if depth == 0 and self._user_error is not None:
            self.raise_user_error()

    def raise_user_error(self, final: bool = False) -> None:
        """Raise, unchanged, the exception of a failed user operation that a flush or a tensor read
        in tool code caught (MindSpore reports an asynchronous failure at the next synchronisation
        or read, which may be the tool's). Does nothing on the flush thread, inside tool code, or
        while another exception propagates (it is raised at the next chance instead: the next
        recorded call, ``stop()`` or ``step()``); ``final`` (``step()``): then it is dropped with a
        WARNING instead, so no failure is carried into a later step."""
        exc = self._user_error
        if exc is None or getattr(self._tls, "depth", 0) > 0:
            return
        if self._timer is not None and threading.current_thread() is self._timer.thread:
            return
        if sys.exc_info()[1] is not None:
            if final:  # never carried into a later step
                self._user_error = None
                logger.warning("msprobe: the program's computation failed (%s) while another "
                               "exception was being handled; that one goes on", _first_line_of(exc))
            return
        self._user_error = None
        raise exc

    def _watch_raise(self, exc: BaseException) -> None:
        """Watch mode with ``on_anomaly: "raise"``: raised like a user failure (end of the hooked
        call, ``stop()`` or ``step()``), after the anomaly's files are written."""
        if self._user_error is None:
            self._user_error = exc

    def raise_watch_anomaly(self) -> None:
        """Raise now the :class:`WatchAnomaly` of ``on_anomaly: "raise"`` if one is waiting (its files
        are written). Called before a call that writes tensors (in-place APIs, compiled regions such
        as an optimizer's update), so training stops with the Parameters as they were."""
        exc = self._user_error
        if isinstance(exc, WatchAnomaly):
            self._user_error = None
            raise exc

    def wait_for_device(self) -> None:
        """Wait for every queued MindSpore operation before tool code reads a user's tensor outside a
        flush. A failure of the user's operation met there (asynchronous launch) is kept and raised
        to the user at the next chance (:meth:`raise_user_error`), never swallowed."""
        failure = wait_for_device()
        if failure is not None:
            self._user_failed(failure)

    def take_user_error(self):
        """The failure of the user's computation not raised yet (and forget it), or ``None``."""
        exc, self._user_error = self._user_error, None
        return exc

    def claim_user_failure(self, exc: BaseException, value, compiled: bool = False) -> bool:
        """Tool code that caught ``exc`` while handling the user's ``value`` (arguments, outputs)
        asks whether it is the user's: True when MindSpore raised it and a Tensor in ``value``
        cannot tell its shape (the operation producing it failed, asynchronous launch). Then it is
        kept and raised to the user when the outermost tool section ends (:meth:`leave`); the
        caller must not report it as its own failure. ``compiled``: ``exc`` came out of the compiled
        per-call path, which reads MindSpore's tensor attributes without a Python frame of
        MindSpore's, so only the failed tensor tells."""
        if not ((compiled or raised_by_mindspore(exc)) and _holds_failed_tensor(value)):
            return False
        self._user_failed(exc)
        return True

    def _user_failed(self, exc: BaseException) -> None:
        if self._step_failure is None:
            self._step_failure = _first_line_of(exc)
        if self._user_error is None:
            self._user_error = exc

    @contextlib.contextmanager
    def tool_code(self):
        """``with runtime.tool_code():`` — hooks ignore calls made inside (restored even on error).
        Hot paths use :meth:`enter`/:meth:`leave` with ``try/finally`` directly."""
        self.enter()
        try:
            yield
        finally:
            self.leave()

    @property
    def cell_stack(self) -> list:
        stack = getattr(self._tls, "cell_stack", None)
        if stack is None:
            stack = self._tls.cell_stack = []
        return stack

    def data_flags(self) -> tuple:
        """``(forward input, forward output, backward input, backward output)``: what ``data_mode``
        lets capture record; backward needs a task that records data."""
        cfg = self.config
        return (cfg.allows("forward", "input"), cfg.allows("forward", "output"),
                cfg.allows("backward", "input") and self.records_data,
                cfg.allows("backward", "output") and self.records_data)

    def cell_frames(self) -> list:
        """Per-thread stack of open Cell calls (forward hook bookkeeping)."""
        frames = getattr(self._tls, "cell_frames", None)
        if frames is None:
            frames = self._tls.cell_frames = []
        return frames

    def next_count(self, key: str) -> int:
        """Return the call index of ``key`` in this step and advance it."""
        with self._lock:  # threads recording concurrently must not share a call number
            n = self.counters[key]
            self.counters[key] = n + 1
        return n

    # ------------------------------------------------------------------ step directories
    def resolve_rank(self):
        """This process's rank: ``start(rank_id=...)`` when given, else :func:`layout.current_rank`
        (``None`` until ``mindspore.communication.init()`` has run)."""
        if self.rank_override is not None:
            return self.rank_override
        return layout.current_rank()

    def step_directory(self, tree: str | None = None) -> str:
        """Directory of the current step and rank (:func:`layout.step_directory`) in the main tree,
        or in the tree ``tree`` of ``dump_path``."""
        return layout.step_directory(os.path.join(self.config.dump_path, tree or self.tree_root),
                                     self.step, self.rank)

    @contextlib.contextmanager
    def tree(self, name: str):
        """``with runtime.tree("graph"):`` — records made inside, on this thread, go to the open
        step's directory in the tree ``{dump_path}/{name}/`` (same step, rank and counters; opened at
        the first use in a step, closed with the step). Yields False (and records nothing there)
        when no step is open. Used from the thread that starts and ends steps, while no other thread
        records: what is pending is flushed on entry and on exit, so no batch mixes two trees."""
        main = self.writer
        if main is None or main.closed or self.failed or self.forked():
            yield False
            return
        self.flush_quietly()
        writer = self.trees.get(name)
        if writer is None:
            directory = self.step_directory(name)
            try:
                if self.watch is None:  # watch mode makes room only when it writes (_new_writer)
                    layout.clear_for(directory, self.rank, self.moves)
                extras = self._tree_extras[name] = StepExtras()
                writer = self.trees[name] = self._new_writer(directory, extras)
            except OSError as exc:
                self.disk_failure(exc, directory)
                yield False
                return
        emitted, self._emitted_stacks = self._emitted_stacks, self._tree_stacks.setdefault(name, set())
        main_extras, self.extras = self.extras, self._tree_extras[name]
        self.writer = writer
        try:
            yield True
        finally:
            try:
                self.flush_quietly()
            finally:
                self._emitted_stacks = emitted
                self.writer, self.extras = main, main_extras

    def open_step(self):
        """Create (once per step) the writer of the current step and rank.

        A directory left by an earlier run is moved aside first (:func:`layout.clear_for`). Returns the
        step's :attr:`step_token`, ``None`` when the dump is switched off after a write error
        (:meth:`disk_failure`).
        """
        if self.failed or self.forked():
            return None
        if self.writer is None or self.writer.closed:
            self.rank = self.resolve_rank()
            directory = self.step_directory()
            self._token += 1  # before the new writer exists: records of older tokens never reach it
            try:
                self.extras = StepExtras()
                if self.watch is None:  # watch mode makes room only when it writes (_new_writer)
                    layout.clear_for(directory, self.rank, self.moves)
                self.writer = self._new_writer(directory, self.extras)
            except OSError as exc:
                self.disk_failure(exc, directory)
                return None
            self._emitted_stacks = set()
            self.opened_steps.add(self.step)
            self.snapshot = _host_snapshot if stats.synchronous_cpu() else _snapshot
            #: a Cell's own Parameters are read at its forward hook, where their data are final: one
            #: read by the statistics kernel instead of a host copy now and a read of that at the flush
            self._parameters_now = self.snapshot is _host_snapshot and not self.config.stat_counts
        return self.step_token

    def _new_writer(self, directory: str, extras: StepExtras):
        """The writer of one step directory (memory only until an anomaly in watch mode); ``extras``
        collects what its files say beyond the records."""
        header = {"task": self.config.task, "level": self.config.level, "framework": "mindspore"}
        self._graph_mode = stats.graph_mode()
        if self._graph_mode:  # PyNative dumps carry no field: the files PyNative writes stay as they were
            header["mode"] = "GRAPH_MODE"
        debug = self.config.level == "debug"

        def make_writer(path, tensor_data=self.save_tensors or bool(self.config.tensor_list)):
            return StepWriter(path, header, tensor_data=tensor_data,
                              extra_info=self.config.extra_info and not debug,
                              data_file="debug.json" if debug else "dump.json", line_encoder=encode_batch,
                              line_replayer=replay_batch)

        if self.watch is not None:  # memory only until an anomaly (engine/watch.py)
            rooms = self.watch.rooms  # directories this run has made room for (once each)

            def make_room(path):  # an earlier run's directory is moved aside only when written
                if path not in rooms:
                    rooms.add(path)
                    layout.clear_for(path, self.rank, self.moves)

            def make_watch_writer(path):
                make_room(path)
                return make_writer(path, self.config.watch.save_tensors)

            return WatchWriter(self.watch, self.step, directory, self.rank, make_watch_writer,
                               extras, on_raise=self._watch_raise, level=self.config.level,
                               make_room=make_room, recording=lambda: self.active)
        return make_writer(directory)

    def refresh_rank(self) -> None:
        """Late rank discovery: ``init()`` ran after ``start()`` opened this step as ``proc{pid}``.

        Called at every ``start()``, ``stop()`` and ``step()``: once a rank is known, the open step
        directory is renamed to ``rank{N}`` (an earlier run's ``rank{N}`` is moved aside first) and the
        journal continues there, so no step of a rank ends up under ``proc{pid}`` after ``init()``.
        """
        if self.rank is not None or self.writer is None or self.writer.closed or self.forked():
            return
        rank = self.resolve_rank()
        if rank is None:
            return
        self.flush_quietly()
        old = self.writer.directory
        self.rank = rank
        target = self.step_directory()
        try:
            layout.clear_for(target, rank, self.moves)
            self.writer.relocate(target)
            for name, writer in self.trees.items():
                layout.clear_for(self.step_directory(name), rank, self.moves)
                writer.relocate(self.step_directory(name))
        except OSError as exc:
            self.disk_failure(exc)
            return
        logger.info("msprobe: rank %d known after start(); %s renamed to %s", rank, old, target)

    def disk_failure(self, exc: OSError, directory: str | None = None) -> None:
        """The first failed write (ENOSPC, EFBIG, EACCES, ...): log ONE error (also into
        ``dump_error_info.log`` if that still works), drop what is pending and switch dumping off for
        the rest of the run. Training goes on; what was written stays loadable (the step's journal
        is kept, so ``msprobe.dump.load`` returns it with ``complete=False``)."""
        if self.failed:
            return
        self.failed = True
        self.running = False
        with self._lock:
            self._pending, self._pending_slots, self._pending_bytes = [], [], 0
            self._oldest = None
        if self._files is not None:
            self._files.cancel()  # queued files and the journal lines naming them are not written
        writer = self.writer
        where = writer.directory if writer is not None else directory
        message = (f"writing the dump failed in {where}: {exc!r}. Dumping is switched off for the rest "
                   "of this run; training goes on. What was written so far stays readable with "
                   "msprobe.dump.load (the unfinished step loads with complete=False)")
        logger.error("msprobe: %s", message)
        for other in [writer] + [w for w in self.trees.values() if w is not writer]:
            if other is not None:
                other.abandon(message)

    # ------------------------------------------------------------------ recording
    def _saves(self, entry: str) -> bool:
        if self._watch_names:  # file names known, written only for the producer (core/watch.py)
            return True
        if self.save_tensors:
            return self.budget.allows()
        names = self.config.tensor_list
        return bool(names) and any(item in entry for item in names)

    def record(self, entry: str, key: str, value, category: str, token=None) -> None:
        """Queue ``data[entry][key] = describe(value)``; ``category`` names its ``.npy`` files.
        ``token``: the :attr:`step_token` of the step it belongs to (default: the open step)."""
        self._describe_and_queue(journal.key_line, (entry, key), value, entry, category, (),
                                 self._writer_of(token))

    def record_item(self, entry: str, key: str, index: int, size: int, tensor, category: str,
                    token) -> None:
        """Queue item ``index`` of the list ``data[entry][key]`` (backward gradients, one by one) for
        the step of ``token`` (a :attr:`step_token`); dropped as late when that step is closed."""
        if self._is_late(entry, token):
            return
        self._describe_and_queue(journal.item_line, (entry, key, index, size), tensor, entry,
                                 category, (index,), self.writer)

    def record_items(self, entry: str, items: list, token) -> None:
        """:meth:`record_item` for several items of one backward entry at once, ``items`` a list of
        ``(key, index, size, value)`` in recording order (what one autograd node hook receives):
        the same journal lines in the same order, described in C and queued together (one lock,
        one batch-size check); so are the tensor task's, their ``.npy`` files named in C as
        :meth:`record_item` names them, while no ``tensor_budget_mb`` counts them. ``tensor_list``,
        watch mode saving tensors, a tensor budget, a late token, a closed dump, no extension, or a
        value that cannot be described this way take :meth:`record_item` one by one, which decides
        each case."""
        ext, lines, slots = hotpath.ext, None, []
        if token is not None and token == self.step_token:
            named = self._names_plain_lines()
            try:  # journal.item_line of each item, its value described, in one C call
                if named:
                    lines = ext.item_lines(entry, items, self.snapshot, slots, describe_other, True)
                elif self._queues_plain_lines():
                    lines = ext.item_lines(entry, items, self.snapshot, slots, describe_other)
            except Exception:  # the general path decides (the user's failed operation, or the tool's)
                lines = None
        if lines is None:
            for key, index, size, value in items:
                self.record_item(entry, key, index, size, value, key, token)
            return
        self._asked += len(items)
        writer = self.writer
        with self._lock:
            self._pending.extend([(writer, line) for line in lines])
            full = self._added_to_batch(slots)
        if full:
            self.flush(wait=False)

    def record_param_grad(self, entry: str, pname: str, grad) -> None:
        """Queue ``data[entry][pname] = [describe(grad)]`` (file ``{entry}.{pname}.npy``)."""
        self._describe_and_queue(journal.key_line, (entry, pname), grad, entry, "", (pname,),
                                 self.writer, as_list=True, fixed_name=True)

    def _queues_plain_lines(self) -> bool:
        """Whether a gradient's line may be described in C and queued at once (:meth:`record_items`,
        :meth:`queue_param_grad`): the extension runs, the dump is open and not failed, no value names
        a ``.npy`` file (tensor task, ``tensor_list``, watch mode saving tensors), not a forked child."""
        return not (hotpath.ext is None or not self.records_data or self.failed or self.save_tensors
                    or self.config.tensor_list or self._watch_names
                    or _FORKS[0] != self._fork)  # (forked(), inline)

    def _names_plain_lines(self) -> bool:
        """Whether a gradient's line may be described in C with its ``.npy`` files named there
        (:meth:`record_items`): the tensor task without ``tensor_budget_mb`` (every tensor is
        saved: nothing to count or decide per value), no ``tensor_list`` or watch mode naming files,
        and what :meth:`_queues_plain_lines` asks besides the files."""
        return (self.save_tensors and self.budget.limit is None and hotpath.ext is not None
                and self.records_data and not self.failed and not self.config.tensor_list
                and not self._watch_names and _FORKS[0] == self._fork)

    def queue_param_grad(self, entry: str, pname: str, grad) -> bool:
        """:meth:`record_param_grad` in one step for a plain statistics dump (no ``.npy`` file: no
        tensor task, ``tensor_list`` or watch mode saving tensors): ``grad`` described in C and its
        line (``data[entry][pname] = [leaf]``) added to the batch under one lock, the line
        :meth:`record_param_grad` makes. Returns False, with nothing queued, when that path does not
        apply (no compiled extension, a closed or failed dump, a forked child, files named) or
        describing raised; the caller then calls :meth:`record_param_grad`, which decides the case."""
        if not self._queues_plain_lines():
            return False
        ext, slots = hotpath.ext, []
        try:
            described = ext.describe(grad, self.snapshot, slots, describe_other)
        except Exception:  # the general path decides (the user's failed operation, or the tool's)
            return False
        line = journal.key_line(entry, pname, [described])
        self._asked += 1
        writer = self.writer
        with self._lock:
            self._pending.append((writer, line))
            full = self._added_to_batch(slots)
        if full:
            self.flush(wait=False)
        return True

    def record_value(self, entry: str, value, token=None) -> None:
        """Queue ``data[entry] = describe(value)`` (debug level; files ``{entry}.{index path}.npy``)."""
        self._describe_and_queue(journal.value_line, (entry,), value, entry, "", (), self._writer_of(token))

    def record_at(self, entry: str, path: tuple, tensor, file_entry: str, token) -> None:
        """Queue a nested item of ``data[entry]`` at ``path`` (debug-level gradients) for the step of
        ``token``; dropped as late when that step is closed."""
        if self._is_late(entry, token):
            return
        self._describe_and_queue(journal.path_line, (entry, path), tensor, file_entry, "", (), self.writer,
                                 fixed_name=True)

    def _is_late(self, entry: str, token) -> bool:
        if token is not None and token == self.step_token:
            return False
        self.late_pieces += 1
        if self.late_pieces == 1:
            logger.warning("msprobe: gradient data for %s arrived after its step was closed; call "
                           "debugger.step() after the backward pass", entry)
        return True

    def _describe_and_queue(self, make_line, args: tuple, value, entry: str, category: str, index: tuple,
                            writer, as_list: bool = False, fixed_name: bool = False) -> None:
        """Describe ``value`` and queue the journal line ``make_line(*args, described)``."""
        if not self.records_data or self.failed or self.forked():
            return
        self._asked += 1
        if type(value) in (dict, tuple, list) and not value:  # e.g. no keyword arguments: no tensors
            empty = {} if type(value) is dict else []
            self._queue(make_line(*args, [empty] if as_list else empty), (), writer)
            return
        ext, prefix, name_for = hotpath.ext, None, _no_file
        if self._saves(entry):
            if fixed_name:
                name = naming.data_file_name(entry, category, index)
                name_for = lambda path: name  # noqa: E731 - one tensor, one fixed file name
            elif ext is not None:  # named in C, as data_file_name names them
                prefix = naming.file_prefix(entry, category, index)
            else:
                name_for = lambda path: naming.data_file_name(entry, category, index + path)  # noqa: E731
        describer = Describer(name_for, self.snapshot) if ext is None or name_for is not _no_file else None
        slots = [] if describer is None else describer.slots
        try:
            if describer is None:  # the same walk in C (tensors/hotpath.py)
                described = ext.describe(value, self.snapshot, slots, describe_other, prefix)
            else:
                described = describer.describe(value)
        except Exception as exc:
            if not self.claim_user_failure(exc, value, compiled=describer is None):
                raise  # the tool's own failure: the capture code reports it
            return
        if (prefix is not None or name_for is not _no_file) and self.budget.limit is not None:
            self.budget.spend(slots)
        self._queue(make_line(*args, [described] if as_list else described), slots, writer)

    def record_stack(self, entry: str, token=None, compiled: bool = False) -> None:
        """Attach the caller's stack to ``entry`` (stack.json), when ``extra_info`` is on;
        ``compiled``: the call ran inside a compiled graph, it has no Python stack (no frames)."""
        if not self.config.extra_info or self.failed:
            return
        writer = self._writer_of(token)
        with self._lock:  # stack ids and "emitted" marks are shared by all threads
            sid = self.stacks.empty() if compiled else self.stacks.current()
            self._pending.extend(self._stack_lines(writer, entry, sid))
            self._started_pending()

    def _stack_lines(self, writer, entry: str, sid: int, body: dict | None = None) -> list:
        """Call with :attr:`lock` held: the ``(writer, line)`` pairs that give ``entry`` the stack
        ``sid`` (its frames the first time ``sid`` is used, then the reference, with ``body`` as
        :func:`journal.stack_ref` takes it). ``sid`` comes from the caller, so the stack is read at its
        frame."""
        frames = self._frames_on_first_use(sid)
        pairs = [] if frames is None else [(writer, frames)]
        pairs.append((writer, journal.stack_ref(entry, sid, body)))
        return pairs

    def _frames_on_first_use(self, sid: int):
        """Call with :attr:`lock` held: the :func:`journal.stack_frames` line of stack ``sid`` the first
        time the step uses it (marking it used), else ``None``."""
        if sid in self._emitted_stacks:
            return None
        self._emitted_stacks.add(sid)
        return journal.stack_frames(sid, self.stacks.rendered[sid])

    def record_raised(self, entry: str, exc: BaseException) -> None:
        """Queue ``data[entry]["error"] = "the call raised {type}: {first line of its message}"``: the
        forward call of ``entry`` raised ``exc`` (to the program, unchanged) and has no output."""
        if not self.records_data or self.failed:
            return
        with self._lock:
            self._pending.append((self.writer, journal.key_line(entry, "error",
                                                                f"the call raised {_first_line_of(exc)}")))
            self._started_pending()

    def record_parent(self, name: str, parent, token=None) -> None:
        """Add a ``construct.json`` edge (``name`` -> its parent Cell entry or ``None``)."""
        if not self.config.extra_info or self.failed:
            return
        with self._lock:
            self._pending.append((self._writer_of(token), journal.construct_edge(name, parent)))
            self._started_pending()

    # ------------------------------------------------------------------ one API call in one line
    def takes_whole_calls(self) -> bool:
        """Whether this run's config lets a plain API call take the one-line path of
        :class:`msprobe.capture.calls.CallRecorder` (:meth:`begin_call`, :meth:`end_call`):
        statistics (no ``.npy`` file, no watch mode saving tensors), forward inputs and outputs recorded, and a
        selector that selects every entry without keeping state (no ``scope``, no ``list``)."""
        cfg = self.config
        return (self.records_data and not self.save_tensors and not cfg.tensor_list and not self._watch_names
                and not self.selector.scope and not self.selector.items
                and cfg.allows("forward", "input") and cfg.allows("forward", "output"))

    def compiled_call_parts(self) -> dict:
        """What the compiled per-call path (``hotpath.ext.Recorder``, ``CallWrapper``) reads of this
        runtime besides its attributes: the fork marks of :meth:`capturing`, the lock of the batch,
        the stack table and its walk limit, the describer's fallback, the config's switches of
        :meth:`end_call` (``extra_info``) and of the construct edges (``track_parents``), and what
        reading a Parameter at once takes (``unchanged``, ``md5``: while :attr:`_parameters_now`, a
        call's Parameters are read when it is described, as :meth:`_describe_parameters` reads a
        Cell's)."""
        return {"forks": _FORKS, "lock": self._lock, "stacks": self.stacks, "max_walk": STACK_WALK,
                "fallback": describe_other, "extra_info": bool(self.config.extra_info),
                "track_parents": bool(self.track_parents), "unchanged": _unchanged,
                "md5": bool(self.config.md5)}

    def begin_call(self, api: str, args: tuple, kwargs: dict):
        """``(n, body, slots)``: the call number of ``api`` (advanced, as :meth:`next_count`) and the
        call's inputs described as :meth:`record` describes them into ``body``
        (``{"input_args", "input_kwargs"}``; ``.npy`` files are never named here, see
        :meth:`takes_whole_calls`), not queued yet (:meth:`end_call`). ``body`` is ``None`` when
        describing raised: the caller then records the inputs through :meth:`record`, which decides
        about the failure."""
        with self._lock:  # threads recording concurrently must not share a call number
            counters = self.counters
            n = counters[api]
            counters[api] = n + 1
        slots: list = []
        snapshot = self.snapshot
        ext = hotpath.ext
        try:
            if ext is not None:
                a = ext.describe(args, snapshot, slots, describe_other) if args else []
                k = ext.describe(kwargs, snapshot, slots, describe_other) if kwargs else {}
            else:
                describer = Describer(_no_file, snapshot)
                a = describer.describe(args) if args else []
                k = describer.describe(kwargs) if kwargs else {}
                slots = describer.slots
        except Exception:
            return n, None, None
        self._asked += 2
        return n, {"input_args": a, "input_kwargs": k}, slots

    def end_call(self, entry: str, body: dict, slots: list, output=None, edges: tuple = ()) -> None:
        """Queue a whole forward call begun by :meth:`begin_call`: ``output`` (the call's forward
        ``output`` list; ``None``: none is recorded now) is described into ``body``, then the call's
        stack (when ``extra_info`` is on) and ``body`` are queued as one stack-use line
        (:func:`msprobe.format.journal.stack_ref`), then the ``construct.json`` ``edges``
        (``(name, parent)`` pairs): the records of :meth:`record_stack`, :meth:`record_parent` and
        one :meth:`record` per key, in that order. Called by the caller of the API, whose stack is
        recorded. Describing the output may meet the failure of the user's own operation (kept for
        the user, no output, as :meth:`record` does) or raise the tool's (the inputs are queued)."""
        failure = None
        if output is not None:
            self._asked += 1
            ext = hotpath.ext
            try:
                if type(output) in (tuple, list) and not output:
                    body["output"] = []
                elif ext is not None:
                    body["output"] = ext.describe(output, self.snapshot, slots, describe_other)
                else:
                    describer = Describer(_no_file, self.snapshot)
                    body["output"] = describer.describe(output)
                    slots.extend(describer.slots)
            except Exception as exc:
                if not self.claim_user_failure(exc, output, compiled=ext is not None):
                    failure = exc
        if self.failed:
            return
        writer = self.writer
        with self._lock:
            pending = self._pending
            if self.config.extra_info:
                pending.extend(self._stack_lines(writer, entry, self.stacks.current(), body))
            else:
                pending.extend([(writer, journal.key_line(entry, key, value)) for key, value in body.items()])
            for name, parent in edges:
                pending.append((writer, journal.construct_edge(name, parent)))
            full = self._added_to_batch(slots)
        if full:
            self.flush(wait=False)
        if failure is not None:
            raise failure

    def queue_cell_lines(self, entry: str, values: tuple, edges: tuple = (), stack: bool = False,
                         after: tuple = (), parameters: dict | None = None) -> bool:
        """The records of one Cell hook added to the batch at once (the Cell hooks take this when
        :meth:`takes_whole_calls`): the ``construct.json`` ``edges`` (``(name, parent)`` pairs), the
        caller's stack for ``entry`` when ``stack``, then ``data[entry][key]`` for each ``(key,
        value)`` of ``values``, described as :meth:`record` describes them, then the ``after``
        edges (a Cell's backward entry under its parent's). The same journal lines,
        in the same order, as :meth:`record_parent`, :meth:`record_stack` and :meth:`record` make
        one by one, under one lock and one batch-size check. ``parameters`` (``{short name:
        Parameter}``, the Cell's own, read as its call begins) is recorded as
        ``data[entry]["parameters"]`` after ``values``; on CPU with synchronous launch their statistics are taken now, in place
        (``fill_parameters`` of the extension: the same numbers the flush computes from a host
        copy), the others are snapshotted as :meth:`record` does.

        Returns:
            False, with nothing queued, when there is no compiled extension or a value cannot be
            described this way (the user's failed operation, or the tool's failure): the caller
            then makes the same records through those methods, which decide each case.
        """
        ext = hotpath.ext
        if ext is None or self.failed or self.forked():
            return False
        snapshot, key_line, slots, lines = self.snapshot, journal.key_line, [], []
        try:
            for key, value in values:
                kind = type(value)
                if (kind is dict or kind is tuple or kind is list) and not value:
                    lines.append(key_line(entry, key, {} if kind is dict else []))
                else:
                    lines.append(key_line(entry, key, ext.describe(value, snapshot, slots, describe_other)))
            if parameters is not None:
                lines.append(key_line(entry, "parameters", self._describe_parameters(ext, parameters, slots)))
        except Exception:
            return False
        writer = self.writer
        with self._lock:
            pending = self._pending
            if self.config.extra_info:
                for name, parent in edges:
                    pending.append((writer, journal.construct_edge(name, parent)))
                if stack:
                    pending.extend(self._stack_lines(writer, entry, self.stacks.current()))
            pending.extend([(writer, line) for line in lines])
            if self.config.extra_info:
                for name, parent in after:
                    pending.append((writer, journal.construct_edge(name, parent)))
            full = self._added_to_batch(slots)
        self._asked += len(values) + (parameters is not None)
        if full:
            self.flush(wait=False)
        return True

    def takes_plain_records(self) -> bool:
        """Whether every entry is selected without keeping state and no value names a ``.npy``
        file (statistics, no ``scope``, no ``list``, no ``tensor_list``, no watch mode saving
        tensors): then the records of a compiled graph's probes may be queued at once
        (:meth:`queue_graph_records`). ``data_mode`` may leave keys out."""
        return (self.records_data and not self.save_tensors and not self.config.tensor_list
                and not self._watch_names and not self.selector.scope and not self.selector.items)

    def queue_graph_records(self, records: list) -> None:
        """The records a compiled graph's probes reported, in order, added to the batch under one
        lock and one batch-size check (call when :meth:`takes_plain_records`): the journal lines
        :meth:`record_parent`, :meth:`record_stack` (``compiled=True``) and :meth:`record` would
        queue one by one, in the same order. ``records``: tuples

        * ``(name, parent)``: a ``construct.json`` edge (``extra_info``);
        * ``(entry,)``: ``entry`` ran inside a compiled graph, so its stack has no frames (``extra_info``);
        * ``(entry, key, value)``: ``data[entry][key] = describe(value)``;
        * ``(entry, key, described, slots)``: ``data[entry][key] = described``, a value described
          already (:func:`msprobe.tensors.hotpath.host_slots`, :meth:`parameter_leaves`), ``slots``
          its tensors waiting for statistics;
        * ``(entry, None, body, slots)``: ``(entry,)`` followed by ``data[entry][key] = described`` for
          each item of ``body`` (described already), as one stack-use line with a body
          (:func:`journal.stack_ref`) when ``extra_info`` is on.

        A value that cannot be described this way (the tool's failure) and a run without the compiled
        extension go through :meth:`record`, which decides the case; the records before it are queued
        first, the ones after it then."""
        ext = hotpath.ext
        if self.failed or self.forked():
            return
        extra_info, writer = self.config.extra_info, self.writer
        snapshot, key_line, edge_line, stack_ref = self.snapshot, journal.key_line, journal.construct_edge, \
            journal.stack_ref
        lines, slots, asked, sid = [], [], 0, None
        for record in records:
            size = len(record)
            if size == 4:
                entry, key, value, described_slots = record
                slots.extend(described_slots)
                if key is not None:
                    lines.append(key_line(entry, key, value))
                    asked += 1
                    continue
                asked += len(value)
                if not extra_info:
                    lines.extend([key_line(entry, k, v) for k, v in value.items()])
                    continue
                if sid is None:
                    with self._lock:
                        sid = (self.stacks.empty(), len(lines))
                lines.append(stack_ref(entry, sid[0], value or None))
            elif size == 3:
                entry, key, value = record
                kind = type(value)
                if (kind is dict or kind is tuple or kind is list) and not value:
                    lines.append(key_line(entry, key, {} if kind is dict else []))
                else:
                    try:
                        if ext is None:
                            raise LookupError("no compiled extension")
                        lines.append(key_line(entry, key, ext.describe(value, snapshot, slots, describe_other)))
                    except Exception:  # the lines so far, then this record the general way
                        self._queue_lines(writer, lines, slots, asked, sid)
                        lines, slots, asked, sid = [], [], 0, None
                        self.record(entry, key, value, "")
                        continue
                asked += 1
            elif not extra_info:
                continue
            elif size == 2:
                lines.append(edge_line(record[0], record[1]))
            else:
                if sid is None:
                    with self._lock:
                        sid = (self.stacks.empty(), len(lines))
                lines.append(stack_ref(record[0], sid[0]))
        self._queue_lines(writer, lines, self._read_host_copies(slots), asked, sid)

    def queue_graph_lines(self, make, slots: list, asked: int, first_stack: int | None) -> None:
        """The journal lines of a drain recipe (:class:`msprobe.capture.cells.graph_lines.Lines`), added to
        the batch as :meth:`queue_graph_records` adds the lines of the recipe's records (call when
        :meth:`takes_plain_records`).

        Args:
            make: ``callable(stack id)`` -> the lines (``stack id``: the stack without frames, or
                ``None`` when ``first_stack`` is ``None``).
            slots: the lines' statistics slots (the probes' host copies), in the records' order.
            asked: how many values the lines record.
            first_stack: index of the first stack-use line, or ``None`` (no stack use).
        """
        if self.failed or self.forked():
            return
        stack = None
        if first_stack is not None:
            with self._lock:
                stack = (self.stacks.empty(), first_stack)
        lines = make(None if stack is None else stack[0])
        self._queue_lines(self.writer, lines, self._read_host_copies(slots), asked, stack)

    def _read_host_copies(self, slots: list) -> list:
        """Statistics of the slots of host arrays (the probes' own copies, :func:`hotpath.host_slots`)
        taken now, by the kernel the flush would use on CPU (``fill``: the same leaves, from the same
        bytes): nothing the user computes is read, so no device synchronisation is needed, and a
        batch of such slots only is encoded at the flush. Returns the slots left for the flush (the
        others, one the kernel leaves to the Python rules, all of them when the config counts values
        or the device target is not CPU, where the flush computes them in NumPy)."""
        ext = hotpath.ext
        if ext is None or not slots or self.config.stat_counts or stats.device_target() != "CPU":
            return slots
        ndarray = np.ndarray
        host = [slot for slot in slots if type(slot.tensor) is ndarray]
        ext.fill(host, self.config.md5)
        rest = [slot for slot in slots if slot.leaf is None]
        for slot in host:
            if slot.leaf is not None:
                slot.tensor = None  # read: the copy is freed now, not with the batch
        return rest

    def parameter_leaves(self, groups: list) -> list | None:
        """``[{short name: dump.json leaf}]`` of several Cells' ``{short name: Parameter}`` (``groups``,
        one dict per Cell), their statistics taken now from their memory by the extension
        (``fill_parameters``, once for all: the leaves the flush makes from a host copy of the same
        bytes). Call when every operation launched so far has run. ``None`` when one of them cannot
        be read that way, the extension does not run, or the config asks for more (``summary_mode``
        counts, ``.npy`` files: :meth:`takes_plain_records`)."""
        ext = hotpath.ext
        if ext is None or self.config.stat_counts or not self.takes_plain_records():
            return None
        own: list = []
        described = ext.describe(groups, _unchanged, own, describe_other)
        if ext.fill_parameters(own, self.config.md5) < len(own):
            return None
        return [{name: slot.leaf for name, slot in group.items()} for group in described]

    def _queue_lines(self, writer, lines: list, slots: list, asked: int, stack) -> None:
        """Add ``lines`` (described values, ``slots`` their tensors, ``asked`` values handed to the
        runtime) to the batch; ``stack``: ``(sid, i)``, the first line referring to stack ``sid``
        is ``lines[i]`` (its frames line goes before it the first time the step uses it), or None."""
        if not lines:
            return
        with self._lock:
            frames = None if stack is None else self._frames_on_first_use(stack[0])
            if frames is not None:
                lines.insert(stack[1], frames)
            self._pending.extend([(writer, line) for line in lines])
            full = self._added_to_batch(slots)
        self._asked += asked
        if full:
            self.flush(wait=False)

    def _describe_parameters(self, ext, parameters: dict, slots: list):
        """The record of a Cell's ``{short name: Parameter}`` (its slots appended to ``slots``): read
        now when :attr:`_parameters_now`, else (and for a Parameter the extension does not read)
        snapshotted for the flush."""
        if not parameters:
            return {}
        if not self._parameters_now:
            return ext.describe(parameters, self.snapshot, slots, describe_other)
        own: list = []
        described = ext.describe(parameters, _unchanged, own, describe_other)
        if ext.fill_parameters(own, self.config.md5) < len(own):
            snapshot = self.snapshot
            for slot in own:
                if slot.leaf is None:
                    slot.tensor = snapshot(slot.tensor)
        slots.extend(own)
        return described

    @contextlib.contextmanager
    def bulk(self):
        """``with runtime.bulk():`` — many records made at once on this thread (what the probes of a
        compiled graph reported, once it has run): the batch is read once, on exit, instead of by
        the size and age rules and the deadline thread (nothing is gained by reading part of it
        earlier)."""
        self._bulk += 1
        try:
            yield
        finally:
            self._bulk -= 1
            if not self._bulk:
                self.flush_quietly()

    def _queue(self, line: dict, slots: list, writer) -> None:
        with self._lock:
            self._pending.append((writer, line))
            full = self._added_to_batch(slots)
        if full:
            self.flush(wait=False)

    def _added_to_batch(self, slots: list) -> bool:
        """Call with :attr:`lock` held after adding lines to the batch: adds ``slots`` to it (starting
        its deadline when it was empty) and returns whether it is now due for reading by the size
        and age rules. With ``async_dump`` nothing is read during the step except before an in-place
        op (guard), and a :meth:`bulk` batch is read on its exit."""
        # a batch already started has its deadline: only the clock is read (what _started_pending returns)
        now = self._started_pending() if self._oldest is None else time.monotonic()
        if slots:
            self._pending_slots.extend(slots)
            ext = hotpath.ext
            self._pending_bytes += sum([s.nbytes() for s in slots]) if ext is None else ext.slots_nbytes(slots)
        return not self.config.async_dump and not self._bulk and (
            len(self._pending_slots) >= FLUSH_SLOTS or self._pending_bytes >= FLUSH_BYTES
            or now - self._oldest >= FLUSH_SECONDS)

    def _started_pending(self) -> float:
        """Call with :attr:`lock` held after adding to the batch: the first addition to an empty
        batch starts its deadline (and wakes the flush thread). Returns ``time.monotonic()``."""
        now = time.monotonic()
        if self._oldest is None:
            self._oldest = now
            if not self.config.async_dump and not self._bulk and not self.forked():
                self._deadline_timer().wake()
        return now

    def _deadline_timer(self) -> FlushTimer:
        timer = self._timer
        if timer is None or not timer.alive:
            with self._lock:
                if self._timer is None or not self._timer.alive:
                    self._timer = FlushTimer(self, FLUSH_DEADLINE)
                timer = self._timer
        return timer

    def flush_due(self, delay: float):
        """Background deadline (:class:`FlushTimer`): flush when the oldest pending record is
        ``delay`` seconds old. Returns the seconds to wait before asking again, ``None`` when
        nothing is pending."""
        if self.failed or self.forked():
            return None
        with self._lock:
            if self._oldest is None:
                return None
            age = time.monotonic() - self._oldest
        if age < delay:
            return delay - age
        if not self.flush(wait=False):
            return 0.05  # another flush is running: ask again shortly
        return 0.0

    def close_timer(self) -> None:
        """End the background flush thread and the file thread (process exit, debugger finished);
        what the file thread still had queued is written first."""
        if self._timer is not None:
            self._timer.close()
            self._timer = None
        if self._files is not None and not self.forked():
            self._files.close()

    @property
    def lock(self):
        return self._lock

    def queue_line(self, line: dict, token) -> None:
        """Queue a journal line that holds no tensors for the step of ``token`` (call with
        :attr:`lock` held)."""
        self._pending.append((self._writer_of(token), line))
        self._started_pending()

    @property
    def has_pending(self) -> bool:
        """Tensors wait to be read (or a flush is reading them), or queued files read a tensor's
        memory in place: flush before mutating any."""
        return bool(self._pending_slots) or self._flushing or (self._files is not None and self._files.holds_views)

    def flush(self, wait: bool = True, settle: bool = True, written=None) -> bool:
        """Compute statistics of everything pending and append it to the journals.

        Args:
            wait: wait for a flush running on another thread (then flush what is left), so that
                on return every record queued before the call is read; ``False``: return at once
                if one runs (opportunistic flushes: batch full, background deadline).
            settle: with ``wait``, also wait until the ``.npy`` files and journal lines of every
                flushed batch are on disk; ``False`` (the mutation guard: only the reading must
                happen before the tensor changes) leaves them to the file thread, after copying
                what queued files read of tensors in place (:meth:`FileQueue.protect`).
            written: with ``settle=False``, what the coming mutation may write, as
                :meth:`FileQueue.protect` takes it (``None``: anything).

        Returns:
            False when ``wait`` is False and another flush was running, else True.

        A failure of the user's computation met while synchronising (asynchronous launch) is
        raised to the user when the outermost tool section ends (:meth:`leave`), or at once when
        called from user code (the mutation guard): never swallowed.
        """
        if not self.flush_quietly(wait, settle, written):
            return False
        if wait:
            self.raise_user_error()  # only outside tool code (see raise_user_error)
        return True

    def flush_quietly(self, wait: bool = True, settle: bool = True, written=None) -> bool:
        """:meth:`flush` that keeps a user failure for later (``stop()``/``step()`` raise it once
        their files are written). With ``wait`` and ``settle``, also waits until the ``.npy`` files
        and journal lines of every flushed batch are on disk (:class:`FileQueue`)."""
        if self.forked():  # the child never writes (and a lock held by the parent's flush thread
            return True    # at fork time stays held here)
        if not self._flush_lock.acquire(blocking=wait):
            return False
        try:
            self._flushing = True
            self._flush_batch()
        finally:
            self._flushing = False
            self._flush_lock.release()
        if wait and self._files is not None:
            if settle:
                self._files.drain()
            else:  # a mutation follows: queued files must not read the tensors it may change
                self._files.protect(written)
        return True

    def _flush_batch(self) -> None:
        with self._lock:
            pending, slots = self._pending, self._pending_slots
            self._pending, self._pending_slots, self._pending_bytes = [], [], 0
            self._oldest = None
        if not pending or self.failed or self.forked():
            return
        self.enter()
        try:
            by_writer: dict = {}
            for writer, line in pending:
                group = by_writer.get(id(writer))
                if group is None:
                    group = by_writer[id(writer)] = (writer, [])
                group[1].append(line)
            files: list = []
            if slots:
                target = pending[0][0]
                failure = materialize(slots, md5=self.config.md5,
                                      tensor_dir=target.tensor_dir if target else None,
                                      on_error=target.error if target else logger.warning,
                                      release=not self._watch_names, counts=self.config.stat_counts,
                                      files=files)
                if failure is not None:
                    self._user_failed(failure)
            appends = []
            for writer, lines in by_writer.values():
                if writer is None or writer.closed:
                    self.late_pieces += len(lines)
                else:
                    appends.append((writer, lines))
            if files or (self._files is not None and self._files.busy):
                # the files first, then the lines that name them; batches stay in order
                self._file_queue().submit(files, functools.partial(_append_lines, appends))
            else:
                _append_lines(appends)
        except OSError as exc:  # disk full, file too large, ...: the dump stops, training goes on
            self.disk_failure(exc)
        except Exception as exc:  # the tool's own failure (a value it cannot encode): training goes on
            self._batch_error(exc, len(pending))
        finally:
            if self._watch_names and slots:
                release_tensors(slots)
            self._tls.depth -= 1  # not leave(): the caller decides where a user error is raised

    def _batch_error(self, exc: Exception, records: int | None = None) -> None:
        what = f"a batch of {records} records" if records is not None else "a batch of records"
        self.tool_error(f"could not write {what}: {exc!r}", key=("flush", type(exc)))

    def _file_queue(self) -> FileQueue:
        if self._files is None:  # held weakly by the queue's thread, which ends with the runtime
            self._files = FileQueue(on_failure=weakref.WeakMethod(self.disk_failure),
                                    on_error=weakref.WeakMethod(self._batch_error))
            weakref.finalize(self, self._files.close)
        return self._files

    # ------------------------------------------------------------------ lifecycle
    def write_files(self) -> None:
        """Flush and write the seed's JSON files for the current step (``stop()``)."""
        if self.forked():
            return
        self.refresh_rank()
        self.flush_quietly()
        for writer, extras in self._step_writers():
            self._write_step(writer, extras)
        self._release_live_states()

    def _release_live_states(self) -> None:
        """The open step's writers forget their live mirror of the journal (``stop()``, after its files
        are written): the step's records are freed while the GC window is open
        (:meth:`StepWriter.release_live_state`)."""
        for writer, _ in self._step_writers():
            target = writer.target if writer is not None else None
            if target is not None and not target.closed:
                target.release_live_state()

    def _step_writers(self) -> list:
        """``[(writer, extras)]`` of the open step: its main tree, then the other trees (:meth:`tree`)."""
        return [(self.writer, self.extras)] + [(w, self._tree_extras[name]) for name, w in self.trees.items()]

    def _write_step(self, writer, extras) -> None:
        """Write one step directory's files from its replayed records (:func:`write_step`), with its
        extras and the reason it is empty, given as data."""
        if writer is not None and not writer.closed:
            extras.set_note(self._compiled_only_note())
            try:
                write_step(writer, extras, self._empty_reason())
            except OSError as exc:
                self.disk_failure(exc)

    def add_note(self, key: str, items: list) -> None:
        """List ``items`` (JSON objects) under ``key`` in the open step's ``coverage.json``."""
        if self.step_open:
            self.extras.add_note(key, items)

    def mark_abnormal(self, reason: str) -> None:
        """Record in the open step's ``dump.json["abnormal"]`` why it ended abnormally (first reason
        kept); in watch mode the history is written then (the flight recorder)."""
        if not self.step_open:
            return
        self.extras.mark_abnormal(reason)
        if self.watch is not None:
            self.writer.mark_abnormal(reason)

    def _empty_reason(self) -> str:
        """Why a step's ``dump.json`` has no data (written only when it has none). Names only causes
        that are known to have happened in this step."""
        cfg = self.config
        if cfg.task == "structure":
            return "task 'structure' records the call structure (construct.json, stack.json), no data"
        if cfg.level == "debug":
            return "no debugger.save() call in this step"
        calls = sum(self.counters.values())
        hooked = self.hooked_apis
        if not calls and hooked:
            return (f"none of the {hooked} APIs and Primitives the config's list {list(cfg.api_list)} can "
                    "name (at level L1 only those are hooked) was called between start() and stop()")
        if not calls:
            if self.precompiled is not None:
                return f"{report.EMPTY_REASON}: {self.precompiled}"
            if self.unrecorded_jit:
                return f"{report.EMPTY_REASON}: {unrecorded_jit_text(self.unrecorded_jit)}"
            return report.EMPTY_REASON + self._nothing_ran_cause()
        causes = []
        if self._step_failure is not None:
            causes.append(f"the program's computation failed ({self._step_failure})")
        errors = self.writer.error_count if self.writer is not None else 0
        if errors:
            causes.append(f"the tool failed to record {errors} time(s), see dump_error_info.log")
        filters = [f"{name} {list(value)}" for name, value in (
            ("list", cfg.api_list), ("scope", cfg.scope), ("data_mode", cfg.data_mode))
            if value and tuple(value) != ("all",)]
        if filters and not self._asked:
            causes.append(f"the config's {', '.join(filters)} selected none of them")
        if not causes:
            causes.append("none of them produced a record")
        return f"{self._calls_that_ran(calls, hooked)}, but " + "; ".join(causes)

    def _compiled_only_note(self) -> str | None:
        """At level L1 in GRAPH_MODE: when compiled calls ran in the step, that each is one entry with
        nothing inside it, else that Cells run compiled (:data:`GRAPH_L1_NOTE`), and what records
        their inside (``dump.json["note"]``, and a WARNING once per run at the end of the step);
        ``None`` otherwise."""
        if self.config.level != "L1" or not self._graph_mode:
            return None
        jit = sorted(key for key, n in self.counters.items() if key.startswith("Jit.") and n)
        if not jit:
            return GRAPH_L1_NOTE
        functions = ", ".join(f"{key} (the mindspore.jit function {key[len('Jit.'):]})" for key in jit)
        return (f"level L1 in GRAPH_MODE: {functions} ran as one compiled graph per call, each call "
                "recorded as one entry; the APIs and Primitives inside a compiled graph are not recorded "
                + GRAPH_L1_ADVICE)

    def _nothing_ran_cause(self) -> str:
        """What an empty step's reason adds when no hooked call ran: at L1 in GRAPH_MODE that the
        calls inside compiled graphs are not recorded (the step's note, :data:`GRAPH_L1_NOTE`, says
        what records them), else that ``start()`` was given no model when
        that may explain it (:data:`NO_MODEL_REASON`), else ``""``."""
        if self.config.level == "L1" and self._graph_mode:  # the step's note says what records them
            return "; at level L1 in GRAPH_MODE the calls inside compiled graphs are not recorded (see \"note\")"
        return NO_MODEL_REASON if self._no_model_may_explain() else ""

    def _no_model_may_explain(self) -> bool:
        """Whether a step in which no hooked call ran may be empty because ``start()`` was given no
        model: at L1 without a ``list`` (a list that names nothing is said to be the cause instead)."""
        return not self.primitives_hooked and self.hooked_apis is None

    def _calls_that_ran(self, calls: int, hooked: int | None) -> str:
        """The empty reason's count of the step's ``calls``; with a ``list`` at L1 (``hooked``: the
        number of APIs and Primitives it can name), compiled jit calls, hooked whatever the list,
        are counted apart."""
        if hooked is None:
            return f"{calls} hooked call{'s' if calls != 1 else ''} ran in this step"
        jit = {key: n for key, n in self.counters.items() if key.startswith("Jit.") and n}
        compiled = sum(jit.values())
        jit_part = f"{compiled} compiled jit call{'s' if compiled != 1 else ''} ({', '.join(sorted(jit))})"
        if not hooked and compiled == calls:
            return (f"{jit_part} ran in this step; the config's list names none of the APIs and "
                    "Primitives level L1 hooks, so no other call was hooked")
        apis = calls - compiled
        return (f"{apis} call{'s' if apis != 1 else ''} of the {hooked} APIs and Primitives the config's list can "
                f"name{' and ' + jit_part if compiled else ''} ran in this step (at level L1 only those "
                "are hooked)")

    def end_step(self) -> None:
        """Close the current step and reset every per-step state (``step()``)."""
        self._release_deferred()  # listed in this step's coverage.json, written when it closes
        if self.forked():
            return
        self.refresh_rank()
        repeats = sum(self.reported_errors.values())
        if repeats and self.writer is not None and not self.writer.closed:
            self.writer.error(f"tool failures already reported in this run (this log or an earlier "
                              f"step's) happened {repeats} more times in this step")
        for key in self.reported_errors:
            self.reported_errors[key] = 0
        self._warn_nothing_selected()
        note = self._compiled_only_note() if self.step_open else None
        if note is not None and self.first_time(("L1 in GRAPH_MODE",)):
            logger.warning("msprobe: step %d: %s", self.step, note)
        self.close_writer()
        if self.late_pieces:
            logger.warning("msprobe: %d gradient records arrived after their step was closed and were "
                           "not written", self.late_pieces)
        self._reset_step()
        self.loop += 1

    def _warn_nothing_selected(self) -> None:
        """One WARNING per run when a ``scope`` bound matched no call of a step in which hooked
        calls ran, one naming the ``list`` items no entry name of such a step contained (each item
        named once per run), and one per cause when no hooked
        call ran without a model (:meth:`_nothing_ran_cause`; at L1 in GRAPH_MODE the note's WARNING
        says why)."""
        if not self.step_open:
            return
        if not sum(self.counters.values()):
            cause = self._nothing_ran_cause()  # at L1 in GRAPH_MODE the note's WARNING says it
            if cause and not self._graph_mode and self.first_time(("nothing ran", cause)):
                logger.warning("msprobe: step %d: %s%s", self.step, report.EMPTY_REASON, cause)
            return
        what = self.selector.unmatched_scope()
        if what is not None and self.first_time(("scope bound matched no call",)):
            logger.warning("msprobe: step %d: %s (scope names whole entries such as "
                           "'Functional.relu.0.forward' or 'Cell.layer1.Dense.forward.0')", self.step, what)
        missed = [item for item in self.selector.unmatched_items()
                  if self.first_time(("list item matched nothing", item))]
        if missed:
            one = len(missed) == 1
            logger.warning("msprobe: step %d: the config's list %s matched nothing in step %d: no entry name "
                           "of the step's hooked calls contains %s (list items are substrings of entry names "
                           "such as 'Functional.relu.0.forward' or 'Cell.layer1.Dense.forward.0')", self.step,
                           ("item " if one else "items ") + ", ".join(map(repr, missed)), self.step,
                           "it" if one else "any of them")

    def discard_empty_step(self) -> bool:
        """``set_init_step`` while the step is open: when nothing but its header was journaled, the
        step directory is deleted, recording stops (:meth:`end_capture`) and per-step state is reset
        without counting a step. Returns False (nothing changed) when the step holds records (or no
        step is open); a user failure met by the flush is raised by the next ``stop()``/``step()``."""
        self.flush_quietly()
        writer = self.writer
        if writer is None or not writer.discard_if_empty():
            return False
        self.end_capture()
        self._reset_step()
        return True

    def renumber(self, step: int) -> None:
        """``set_init_step(step)``: the current step is numbered ``step``, later ones count on."""
        self.init_step = step
        self.loop = 0

    def _reset_step(self) -> None:
        """The one reset of per-step state: the writer and its token, late-record count, the tool's
        tensor hooks (on the user's Parameters and the outputs of recorded calls), waiting asynchronous
        outputs, call counters, Cell selection, the step's user failure, per-thread Cell stacks and
        tool depth. (The writer is closed or discarded by the caller first.)"""
        self._release_deferred()
        self.writer = None
        self.late_pieces = 0
        while self.tensor_hooks:
            self.tensor_hooks.pop().remove()
        self.node_hooks = {}
        self.counters.clear()
        self.selector.reset()
        self._step_failure = None
        self._asked = 0
        self.unrecorded_jit = []
        self._tls = threading.local()

    def _release_deferred(self) -> None:
        """Release the asynchronous calls never waited (one WARNING; ``coverage.json``
        ``unwaited_async_handles`` of the open step)."""
        if not len(self.deferred):
            return
        names = self.deferred.release()
        logger.warning("msprobe: %d async handle(s) were never waited before step end, their "
                       "outputs are not recorded: %s", len(names), ", ".join(names))
        self.add_note("unwaited_async_handles",
                      [{"entry": n, "note": "handle never waited; output not recorded"} for n in names])

    def close_writer(self) -> None:
        """Flush and close the current step's writer (``step()``, process exit)."""
        if self.forked():
            return
        self.flush_quietly()
        writers = self._step_writers()
        self.trees, self._tree_stacks, self._tree_extras = {}, {}, {}
        for writer, extras in writers:
            if writer is not None:
                self._write_step(writer, extras)
                try:
                    writer.close()
                except OSError as exc:
                    self.disk_failure(exc)
