"""DumpService: what gets installed for each level, and the start/stop/step lifecycle (seed: "start", "stop", "step").

* ``start()`` on a dumped step and rank installs the capture for the level and switches recording on:
  L1 -> API wrappers (+ Primitive hooks when a model was given); L0 -> Cell hooks; mix -> both. A
  mutation guard is installed at every level. Everything installed goes into one ``HandleSet``.
  On a step that is not dumped ``start()`` installs nothing, except the graph probes (L0/mix, GRAPH_MODE
  or ``mindspore.jit`` Cells), which must be in a graph when MindSpore first compiles it: they are
  installed at the first ``start(model)`` of a dumped rank and report nothing until a dumped step.
* ``stop()`` switches recording off, removes the per-window pieces (Cell hooks and instance patches,
  token counter, GC window) and writes the seed's files for what was recorded so far. The rest of
  the capture (API wrappers, jit capture, Primitive hooks, in-place guard: :attr:`_capture`) is
  *parked* when the next step is dumped too: it stays installed, passing every call straight
  through while not recording, and the next ``start()`` only switches recording on. It is removed
  at the ``stop()`` before a step that is not dumped, by ``start()`` on a step or rank that is not
  dumped or with another model, when another debugger starts, by ``restore_custom_api`` between
  steps, when the model is collected, at ``close()``/exit and when the service is collected. The
  Cell hooks are not parked: a jit function calling the Cell between steps would compile them into
  its graph (and fail). Gradient probes already attached to tensors still report, so
  ``start - forward - stop - backward - step`` captures the backward too (seed: 采集指定代码块的前反向数据).
  The parameter-gradient hooks (L0, mix) are registered at the first dumped step's first Cell call
  under a gradient and stay registered while the capture is parked: each records only from its
  step's first Cell call under a gradient until that step's ``step()`` and returns at once
  otherwise. They are removed at the ``step()`` after which the capture is not parked, when it is
  released between steps, and at ``close()``/exit.
* ``step()`` closes the step directory and resets per-step state.
Calling ``start`` twice, or ``stop`` without ``start``, does nothing.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import weakref

from mindspore import nn

from msprobe.capture import debug_save
from msprobe.capture.cells import graph_cell
from msprobe.capture.cells.precompiled import precompiled_warning
from msprobe.capture.api import alias_targets, build_wrappers, load_api_list, make_wrapper, resolve_targets
from msprobe.capture.calls import CallRecorder
from msprobe.capture.coverage import note_stale_bindings
from msprobe.capture.cells.cell import CellCapture, install_recompute_replays, recompute_cells
from msprobe.capture.guard import guard_patches, inplace_targets
from msprobe.capture.jit import install_jit_capture
from msprobe.capture.primitive import install_primitive_hooks, primitive_targets
from msprobe.capture.primitive import unhooked as primitives_unhooked
from msprobe.engine.config import ConfigError
from msprobe.engine.gc_window import widen_gen0
from msprobe.engine.handles import AttributePatches, Handle, HandleSet, patch_attribute
from msprobe.engine.messages import announce
from msprobe.engine.runtime import Runtime, unrecorded_jit_text
from msprobe.mindspore.step_windows import StepWindows

logger = logging.getLogger("msprobe")

_CELL_LEVELS = ("L0", "mix")
_API_LEVELS = ("L1", "mix")


class DumpService:
    """Owns the runtime and the installed capture of one :class:`PrecisionDebugger`.

    The service keeps what it installs (hook plans, patches, handles, the models held weakly); the
    dump's state — step, recording gate, started/finished, ``token_range`` — is the runtime's
    (:class:`msprobe.engine.runtime.Runtime`), which :attr:`active`, :attr:`finished` and
    :attr:`token_range` read."""

    def __init__(self, config):
        self.config = config
        self.runtime = Runtime(config)
        self.recorder = CallRecorder(self.runtime)
        #: the model(s) of ``start(model)``, held weakly: ``[(index or None, weakref to Cell)]``
        self._model_refs: list | None = None
        #: what is installed for the open recording window only, removed at every stop()
        self._installed = HandleSet()
        #: the GC window (gc_window.py) of the recording window: closed at stop() after the step's
        #: files are written and its records freed (Runtime.write_files), so none is promoted
        self._gc_window = HandleSet()
        #: the capture proper (API wrappers, jit capture, Primitive hooks, in-place guard):
        #: kept installed ("parked") from one dumped step to the next, see _stop(); one object for
        #: the service's life, so the finalizer below can remove it without holding the service
        self._capture = HandleSet()
        self._capture_models = None  # models key (weak) the capture's hooks were installed for
        #: what the coverage scan found at the start() that installed the capture (listed again by the
        #: start() of each step it stays parked for, without scanning: _note_stale_bindings)
        self._stale_found = None
        self._api_targets = None
        self._api_aliases = None  # other public names of the listed functions (F.cast, ...)
        self._said_list_hooks_nothing = False  # the WARNING of an L1 list that names no API, said once
        self._said_unrecorded_jit: set = set()  # jit functions run at L0, said once each
        self._checked_precompiled = False  # graphs compiled before the probes, looked for once
        self._custom: dict = {}
        self._api_patches: AttributePatches | None = None  # built once, applied at each start()
        self._guard: AttributePatches | None = None  # likewise
        #: the parameter-gradient hooks of the Cell capture (L0, mix): registered at a step's first
        #: Cell call under a gradient, kept registered while the capture is parked (one object for the
        #: service's life, so the finalizer below can remove them); removed by _release_capture between
        #: steps, at the step() after which the capture is not parked, and at close()
        self._param_hooks = HandleSet()
        self._cells = CellCapture(self.runtime, self._param_hooks)  # plan built at the first start(model)
        self._primitives = None  # (models key, primitive_targets) read at the first start(model)
        self._recompute = None  # recompute_cells(models), read at the first start(model) at L1
        self._kernel_dump = None
        self._graph = None  # GraphDump (GRAPH_MODE or jit Cells at L0/mix), False: none needed
        self._process_state = _ProcessState()
        self._windows = StepWindows()  # says once when start()/stop() windows look like training steps
        atexit.register(_close_at_exit, weakref.ref(self))
        _LIVE_SERVICES.add(self)
        _install_excepthook()
        if config.watch is not None:  # the flight recorder also writes its history on SIGTERM
            self._process_state.keep_signal(signal.SIGTERM, _sigterm_handler(weakref.ref(self)))
        # collected without close() (the debugger was dropped): give back what was changed
        weakref.finalize(self, self._process_state.restore)
        weakref.finalize(self, self._capture.remove)
        weakref.finalize(self, self._param_hooks.remove)
        weakref.finalize(self, self._gc_window.remove)
        # dropped with a step open (a debugger made inside a function): the step is written then
        weakref.finalize(self, _finish_runtime, self.runtime)

    @property
    def active(self) -> bool:
        """Capture is installed for the open step (``start()`` until ``stop()``)."""
        return self.runtime.active

    @property
    def finished(self) -> bool:
        """The last configured step is over: the dump is off for good."""
        return self.runtime.finished

    @property
    def token_range(self):
        """``(first, last)`` forward passes dumped per ``start()``, or ``None``."""
        return self.runtime.token_range

    # ------------------------------------------------------------------ models
    def set_model(self, model) -> None:
        """Remember the model(s) to hook: a Cell, or a list/tuple of Cells (names get the index).

        Held weakly: when the user drops the model, the hook plans built for it (Cells, Parameters,
        Primitives) are dropped too, so the tool keeps nothing of the user's alive.
        """
        if isinstance(model, nn.Cell):
            models = [(None, model)]
        elif isinstance(model, (list, tuple)) and model and all(isinstance(m, nn.Cell) for m in model):
            models = list(enumerate(model))
        else:
            raise TypeError("start(model=...): model must be a mindspore.nn.Cell or a list/tuple of "
                            f"mindspore.nn.Cell, got {type(model).__name__}")
        if self._model_refs is not None and len(models) == len(self._model_refs) and all(
                m is ref() for (_, m), (_, ref) in zip(models, self._model_refs)):
            return
        self._model_refs = [(i, weakref.ref(m)) for i, m in models]
        self._drop_plans()
        if not self.active:  # parked hooks are on the previous model(s)
            self._release_capture()
        me = weakref.ref(self)
        for _, m in models:
            weakref.finalize(m, _model_gone, me, self._model_refs)

    @property
    def models(self) -> list | None:
        """``[(index or None, Cell)]`` of the last ``start(model)``, ``None`` if none was given or
        one of them no longer exists."""
        refs = self._model_refs
        if refs is None:
            return None
        models = [(i, ref()) for i, ref in refs]
        return None if any(m is None for _, m in models) else models

    def _models_key(self):
        """The models of ``start(model)`` as weak references (equal while the same Cells live)."""
        models = self.models
        return None if models is None else [(index, weakref.ref(root)) for index, root in models]

    def _drop_plans(self) -> None:
        """Forget everything read from a model (Cell hook plan, Primitive targets). The dropped plan's
        parameter-gradient hooks are removed, at the end of the step when one is open (a backward
        after ``stop()`` is still recorded)."""
        rt = self.runtime
        self._cells.release_parameter_hooks(rt.tensor_hooks if rt.step_open else None)
        self._cells = CellCapture(rt, self._param_hooks)
        self._primitives = None
        self._recompute = None  # recompute_cells(models), read at the first start(model) at L1

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> bool:
        """Switch recording on for the current step if it is dumped. Returns whether it is on.

        A capture parked by the previous dumped step's ``stop()`` is reused as it is when this step
        is dumped for the same models; otherwise (not dumped, another rank, the dump is off,
        another model, an error) it is removed here."""
        try:
            return self._start()
        finally:
            if not self.active:
                self._release_capture()

    def _start(self) -> bool:
        rt, cfg = self.runtime, self.config
        if cfg.level == "L2":
            return self._start_kernel_dump()
        if cfg.level == "debug":
            return False
        if self.finished or self.active:
            return self.active
        if cfg.last_step is not None and rt.step > cfg.last_step:
            self._finish()
            return False
        if not cfg.dumps_step(rt.step):
            self._install_dormant_probes()
            return False
        if cfg.level in _CELL_LEVELS and self.models is None:
            gone = " (the model given earlier no longer exists)" if self._model_refs else ""
            raise ValueError(f"level {cfg.level!r} needs the model{gone}: call debugger.start(model) "
                             "with the network (a mindspore.nn.Cell or a list of Cells)")
        if rt.failed or rt.forked():  # a write failed earlier (disk full), or a forked child
            return False
        if os.environ.get("MS_ROLE") == "MS_SCHED":  # msrun's scheduler runs the script too; no rank
            return False
        if self._graph is None and cfg.level in _CELL_LEVELS:
            self._attach_graph()  # before open_step: may set the pynative/ tree
        rt.refresh_rank()  # init() may have run since this step was opened as proc{pid}
        rank = rt.resolve_rank()
        if not cfg.dumps_rank(rank):
            if rt.first_time(("rank left out",)):
                logger.warning("msprobe: this process is rank %s, which the config's rank list %s leaves "
                               "out: nothing is dumped here", 0 if rank is None else rank, list(cfg.rank))
            return False
        if rt.open_step() is None:
            return False
        if not self._capture:
            _release_other_captures(self)  # before the originals are read (targets, coverage scan)
        if cfg.level in _API_LEVELS:  # names bound to an API before start() are not captured: list them
            self._note_stale_bindings(rt)
        self._install()
        self._windows.window_starts(rt.step, self.models, rt.wait_for_device)
        rt.begin_capture()
        logger.info("msprobe: dump started at step %d (%s)", rt.step, rt.step_dir)
        return True

    def _attach_graph(self) -> None:
        """Decide whether the models' Cells run in compiled graphs (:func:`graph_cell.attach`), once."""
        self._process_state.keep_env("MS_JIT_MODULES")  # graph_cell may extend it
        self._graph = graph_cell.attach(self.runtime, self.models)

    def _install_dormant_probes(self) -> None:
        """``start(model)`` of a step that is not dumped, at L0/mix, in GRAPH_MODE or with
        ``mindspore.jit`` Cells: install the graph probes now if they are not yet. MindSpore compiles
        a graph at its first call and reuses it for every later step, so probes installed only at the
        first dumped step would never be in it. Until a dumped step's ``start()`` they report nothing
        (a compiled probe only checks its capture's flags, a Python probe returns at once)."""
        cfg, rt = self.config, self.runtime
        if self._graph is False or (self._graph and self._graph.installed):
            return
        if cfg.level not in _CELL_LEVELS or self.models is None:
            return
        if rt.failed or rt.forked() or os.environ.get("MS_ROLE") == "MS_SCHED":
            return
        rank = rt.resolve_rank()  # None before init(): the rank may still be a dumped one
        if rank is not None and not cfg.dumps_rank(rank):
            return
        if self._graph is None:
            self._attach_graph()
        if self._graph:
            self._install_graph_probes()

    def _install_graph_probes(self) -> None:
        """Install the graph probes (:meth:`graph_cell.GraphDump.install`; nothing when they are
        installed already); the first time, say which graphs (GRAPH_MODE, or ``mindspore.jit`` Cells
        under PyNative) were compiled before."""
        if not self._checked_precompiled:
            self._checked_precompiled = True
            self._warn_precompiled()
        self._graph.install(self.models)

    def _note_stale_bindings(self, rt) -> None:
        """List in the open step's ``coverage.json`` the names bound to an API before ``start()``
        (:func:`~msprobe.capture.coverage.note_stale_bindings`). While the capture stays parked for the
        same models, the list that the scan at its installation found is listed again without scanning
        (the scan reads every user module's names: 0.2–0.7 ms per ``start()``): with the wrappers in
        place, a name bound since then holds a wrapper, which the scan does not list."""
        parked = bool(self._capture) and self._capture_models == self._models_key()
        self._stale_found = note_stale_bindings(rt, self._listed_targets(), self.models, self._aliases(),
                                                found=self._stale_found if parked else None)

    def _install(self) -> None:
        """Install the capture for the open step: a parked capture (same models) is kept as it is;
        the Cell hooks and patches, the token counter and the GC window are per recording window
        (:attr:`_installed`)."""
        level = self.config.level
        key = self._models_key()
        if self._capture and self._capture_models != key:
            self._capture.remove()
        if not self._capture:
            self._install_capture()
            self._capture_models = key
        if level in _API_LEVELS and self.models is not None and level not in _CELL_LEVELS:
            # at mix the Cell hooks replay recomputed forwards
            if self._recompute is None:
                self._recompute = recompute_cells(self.models, self.runtime)
            self._installed.add(install_recompute_replays(self.runtime, self._recompute))
        if level in _CELL_LEVELS:
            # Python hooks do not run in a graph. Not parked between steps: a graph compiled from
            # the Cell (a jit function calling it) would compile the hooks too, and fail
            if not (self._graph and self._graph.graph_mode):
                self._installed.add(self._cells.install(self.models))
            if self._graph:
                self._install_graph_probes()
                self._graph.begin_step(self.models)
        if self.token_range is not None:
            self._installed.add(self._install_token_counter(self.models[0][1]))
        if not self._gc_window:
            self._gc_window.add(widen_gen0())

    def _warn_precompiled(self) -> None:
        """First install of the graph probes (the first ``start(model)`` of a dumped rank, dumped
        step or not): a graph compiled before (a Cell holding the model in GRAPH_MODE, a
        ``mindspore.jit`` Cell of it under PyNative) runs without them; say so once, with what to do
        (:func:`msprobe.capture.cells.precompiled.precompiled_warning`), and keep the cause for the
        empty steps' ``empty_reason`` (:attr:`Runtime.precompiled`)."""
        graph = self._graph
        try:
            text, reason = precompiled_warning(self.models, graph.graph_mode, graph.jit_cells)
        except Exception as exc:  # a hint only: never in the way of the dump
            logger.debug("msprobe: looking for graphs compiled before start() failed: %r", exc)
            return
        if text:
            logger.warning("%s", text)
        self.runtime.precompiled = reason

    def _install_capture(self) -> None:
        """Install what may stay from one dumped step to the next into :attr:`_capture`: API
        wrappers, jit capture, Primitive hooks (L1/mix), the in-place guard. Every piece passes
        calls straight through while not recording."""
        level, capture = self.config.level, self._capture
        wrapped = set()
        if level in _API_LEVELS:
            targets = self._listed_targets()
            if self._api_patches is None:
                self._api_patches = AttributePatches(build_wrappers(self.runtime, targets, self.recorder,
                                                                    self._aliases()))
            # a custom registration of the same attribute takes precedence over the yaml list
            self._api_patches.apply(skip=self._custom)
            capture.add(Handle(self._api_patches.undo, "support_wrap_ops.yaml wrappers"))
            wrapped = {(owner, attr) for owner, attr, _ in targets + self._aliases()}
            prims = self._primitive_targets() if self.models is not None else []
            capture.add(install_jit_capture(self.recorder, inside=_inside_compiled_call(weakref.ref(self)),
                                            pause=self._jit_pause(), unhooked=self._unhooked(prims)))
            self.runtime.primitives_hooked = self.models is not None
            if self.models is not None:
                capture.add(install_primitive_hooks(self.recorder, prims))
            if level == "L1" and self.runtime.selector.items:  # for the empty dump's reason
                self.runtime.hooked_apis = len({t[2] for t in targets + self._aliases()}
                                               | {api for _, api in prims})
                if not self.runtime.hooked_apis and not self._said_list_hooks_nothing:
                    self._said_list_hooks_nothing = True
                    logger.warning("msprobe: the config's list %s names no API or Primitive that level L1 "
                                   "hooks (an item is a substring of entry names such as "
                                   "'Functional.relu.0.forward'; at L1 only the APIs an item can name "
                                   "are hooked): nothing is dumped", list(self.config.api_list))
        elif self._jit_pause() is not None:  # L0: compiled calls only run with the Cell hooks off
            capture.add(install_jit_capture(pause=self._jit_pause(), unhooked=self._unhooked([]),
                                            runtime=self.runtime))
        if self._guard is None:  # the wrapped set is the same at every start (one level per service)
            self._guard = guard_patches(self.runtime, inplace_targets(wrapped))
        self._guard.apply()
        capture.add(Handle(self._guard.undo, "in-place guard"))

    def note_unrecorded_jit(self, function: str) -> None:
        """At L0 a ``mindspore.jit`` function (``function``: its ``__name__``) ran while recording: the
        Cells it calls run compiled and are not recorded. Said once per function in a WARNING, listed
        in the step's ``coverage.json["jit_functions_not_recorded"]`` and kept for its ``empty_reason``
        (:attr:`Runtime.unrecorded_jit`)."""
        if function not in self.runtime.unrecorded_jit:
            self.runtime.unrecorded_jit.append(function)
            self.runtime.add_note("jit_functions_not_recorded",
                                  [{"function": function, "note": unrecorded_jit_text([function])}])
        if function not in self._said_unrecorded_jit:
            self._said_unrecorded_jit.add(function)
            logger.warning("msprobe: %s", unrecorded_jit_text([function]))

    def _jit_pause(self):
        """What compiled calls run in where PyNative Cell hooks are installed (L0, mix):
        :func:`_paused_cells`; ``None`` elsewhere."""
        if self.config.level not in _CELL_LEVELS or (self._graph and self._graph.graph_mode):
            return None
        return _paused_cells(weakref.ref(self))

    def _unhooked(self, prims: list):
        """What the body of a bytecode-capture ``jit`` function called while recording runs in: the
        API wrappers (L1, mix), the in-place guard and the hooks of the Primitives ``prims`` off (calls
        on other threads meanwhile are not recorded either)."""
        api, guard = self._api_patches, weakref.ref(self)

        @contextlib.contextmanager
        def unhooked():
            service = guard()
            with contextlib.ExitStack() as stack:
                if api is not None:
                    stack.enter_context(api.suspended())
                if service is not None and service._guard is not None:
                    stack.enter_context(service._guard.suspended())
                stack.enter_context(primitives_unhooked(prims))
                yield
        return unhooked

    def _release_capture(self) -> None:
        """Remove the parked capture (nothing when none is installed), and the parameter-gradient
        hooks when no step is open (in an open step they record until its ``step()``, which removes
        them when the capture is not parked by then)."""
        if self._capture:
            self._capture.remove()
        self._capture_models = None
        if not self.runtime.step_open:
            self._param_hooks.remove()

    def _primitive_targets(self) -> list:
        """Primitives held by the model's Cells, read at the first ``start(model)`` of a model."""
        # weak references compare like their (alive) referents: an id of a dropped model reused by a
        # new one does not match
        key = [(index, weakref.ref(root)) for index, root in self.models]
        if self._primitives is None or self._primitives[0] != key:
            cells = [cell for _, root in self.models for _, cell in root.cells_and_names()]
            self._primitives = (key, primitive_targets(cells, self.runtime.selector.may_record_api))
        return self._primitives[1]

    def _listed_targets(self) -> list:
        """support_wrap_ops.yaml targets that exist, resolved once; with an L1 ``list``, only APIs
        that could ever be recorded (the others are not wrapped at all)."""
        if self._api_targets is None:
            selector = self.runtime.selector
            self._api_targets = [t for t in resolve_targets(load_api_list())
                                 if selector.may_record_api(t[2])]
        return self._api_targets

    def _aliases(self) -> list:
        """Other public bindings of the listed functions (``mindspore.ops.functional.cast`` for
        ``mindspore.ops.cast``), found once; wrapped with them and named after them."""
        if self._api_aliases is None:
            self._api_aliases = alias_targets(self._listed_targets())
        return self._api_aliases

    # ------------------------------------------------------------------ inference token range
    def set_token_range(self, token_range) -> None:
        """Dump only forward passes ``start..end`` (inclusive, 0-based) of the root model (seed: "推理模型采集指定token_range").

        Raises:
            ConfigError: not a list/tuple of two ints with 0 <= start <= end, or no model given.
        """
        ok = (isinstance(token_range, (list, tuple)) and len(token_range) == 2
              and all(isinstance(v, int) and not isinstance(v, bool) for v in token_range)
              and 0 <= token_range[0] <= token_range[1])
        if not ok:
            raise ConfigError("token_range", token_range, "[start, end] with integers 0 <= start <= end",
                              kind="argument")
        if self.models is None:
            raise ConfigError("token_range", token_range, "token_range together with model=...",
                              reason="token_range needs the model whose forward passes are counted",
                              kind="argument")
        if len(self.models) > 1:
            logger.warning("msprobe: token_range counts forward passes of the first model only")
        self.runtime.token_range = tuple(token_range)

    def _install_token_counter(self, root) -> HandleSet:
        rt = self.runtime

        def pre_hook(cell, args):
            rt.forward_pass_begins()

        def post_hook(cell, args, output):
            rt.forward_pass_ends()

        handles = HandleSet()
        # the token gate must run before the Cell capture hooks of the root's children
        handles.add(Handle(root.register_forward_pre_hook(pre_hook).remove))
        handles.add(Handle(root.register_forward_hook(post_hook).remove))
        return handles

    # ------------------------------------------------------------------ custom APIs and debug save
    def register_custom_api(self, module, api: str, api_prefix: str | None = None) -> None:
        """Capture ``module.api`` at L1 as ``{api_prefix}.{api}.{n}.forward/backward``."""
        if api_prefix is None:
            api_prefix = getattr(module, "__name__", "Custom")
        if not isinstance(api_prefix, str) or not api_prefix:
            raise ConfigError("api_prefix", api_prefix, "a non-empty str", kind="argument")
        if not callable(getattr(module, api, None)):
            raise ConfigError("api", api, f"the name of a function of {module!r}", kind="argument")
        key = (id(module), api)
        if key in self._custom:
            self._custom.pop(key).remove()
        if self._api_patches is not None:  # registered while started: unwrap the yaml wrapper
            self._api_patches.undo_one(module, api)  # first, so the custom one wraps MindSpore's own
        wrapper = make_wrapper(self.runtime, self.recorder, getattr(module, api), f"{api_prefix}.{api}")
        self._custom[key] = patch_attribute(module, api, wrapper)
        logger.info("msprobe: custom API registered: %s.%s as %s", getattr(module, "__name__", module),
                    api, api_prefix)

    def restore_custom_api(self, module, api: str) -> None:
        """Put back the original ``module.api``; does nothing if it was not registered."""
        handle = self._custom.pop((id(module), api), None)
        if handle is not None:
            handle.remove()
            if self.active and self._api_patches is not None:  # the yaml list applies again
                self._api_patches.apply_one(module, api)
            elif self._capture:  # parked between steps: MindSpore's own function is back, as
                self._release_capture()  # restore says (the next start() installs again)

    def save(self, variable, name, save_backward=True) -> None:
        """Debug level ``save``; ignored at other levels (a warning once)."""
        if self.config.level != "debug" or self.config.task not in ("statistics", "tensor"):
            logger.warning("msprobe: save() records only with level 'debug' and task statistics/tensor")
            return
        debug_save.save(self.runtime, variable, name, save_backward)

    def _start_kernel_dump(self) -> bool:
        """L2: MindSpore's native dump, configured once, before the first graph is compiled."""
        if self._kernel_dump is None:
            from msprobe.capture.kernel.kernel_dump import KernelDump

            self._kernel_dump = KernelDump(self.config)
            self._installed_kernel = self._kernel_dump.install()
            # dropped without close() (a debugger made inside a function): collect the kernel files
            # then, or at exit
            weakref.finalize(self, _finish_kernel_dump, self._kernel_dump, self._installed_kernel)
        return True

    def stop(self) -> None:
        """Switch recording off and write the step's files so far. A failure of the user's
        computation that the tool met (asynchronous launch) is raised here, after the files."""
        self._stop()
        self.runtime.raise_user_error()

    def _stop(self) -> None:
        if self._kernel_dump is not None:
            self._kernel_dump.collect()
            return
        rt = self.runtime
        if not self.active:
            return
        try:  # compiled graphs run asynchronously: their probes report while the dump is still on
            if self._graph:
                self._graph.wait()
        finally:
            rt.end_capture()
            self._installed.remove()
            if not self._next_step_dumped() or self._capture_models != self._models_key():
                self._release_capture()
            if self._graph:
                self._graph.note_unrecorded()
            try:
                rt.write_files()
            finally:
                self._gc_window.remove()

    def _next_step_dumped(self) -> bool:
        """The step after the current one is in the config's ``step`` list (the capture is then
        parked at ``stop()`` rather than removed)."""
        cfg, nxt = self.config, self.runtime.step + 1
        return (cfg.last_step is None or nxt <= cfg.last_step) and cfg.dumps_step(nxt)

    def set_init_step(self, step: int) -> None:
        """Number the current step ``step`` (``set_init_step``/``MsprobeInitStep``).

        If the dump is already running (``start(model)`` called before ``Model.train``), the step
        opened under the old number is moved: discarded when nothing was recorded yet, else closed,
        and recording restarts under the new number.
        """
        rt = self.runtime
        was_running = self.active and self._kernel_dump is None
        if was_running:
            if rt.discard_empty_step():  # nothing recorded yet: the step directory is deleted
                self._installed.remove()
                self._gc_window.remove()
            else:
                self._stop()
                rt.end_step()
        rt.renumber(step)
        if was_running:
            self.start()
        elif not self.config.dumps_step(rt.step):
            self._release_capture()

    def note_abnormal(self, reason: str) -> None:
        """Mark the open step abnormal (its records so far are flushed when it is closed)."""
        self.runtime.mark_abnormal(reason)

    def step(self) -> None:
        rt = self.runtime
        directory = rt.step_dir
        step = rt.step
        exc = sys.exc_info()[1]
        # step() while recording: stop() was skipped, usually by an exception; in GRAPH_MODE (any
        # level) the seed's own examples end the step with step() alone
        graph_mode = (self._graph and self._graph.graph_mode) or rt.step_in_graph_mode
        if self.active and (exc is not None or not graph_mode):
            self.note_abnormal(f"step() called without stop(){': ' + repr(exc) if exc else ''} "
                               "(an exception in the step?); records up to that point are kept")
            if rt.first_time(("step without stop",)):
                logger.warning("msprobe: step() was called while step %d was still recording (no stop() "
                               "after start()); its records so far are kept and its dump.json is "
                               "marked \"abnormal\" (said once)", step)
        self._stop()
        if self._graph:  # gradients the graph probes reported since stop()
            self._graph.end_step()
        rt.end_step()
        self._windows.reset()
        if not self.config.dumps_step(rt.step):  # parked by a stop() before a renumbering
            self._release_capture()
        if directory is not None:  # size estimate after the first dumped step
            rt.budget.estimate_after_step(directory, step, len(self.config.step))
        if self.config.last_step is not None and rt.step > self.config.last_step:
            self._finish()
        if not self._capture:  # the parameter-gradient hooks stay only while the capture is parked
            self._param_hooks.remove()
        rt.raise_user_error(final=True)

    def _finish(self) -> None:
        if self.finished:
            return
        self.runtime.finish()
        self._release_capture()
        # graph probes stay compiled in (and need MS_JIT_MODULES) until close()
        self._process_state.restore(env=not self._graph)
        logger.info("msprobe: the last configured step (%s) is over; the dump is switched off",
                    self.config.last_step)

    def close(self) -> None:
        """Flush and close everything (``PrecisionDebugger.close()``, process exit): the open step
        is written, and every wrapper, hook and patch the service installed is removed (custom APIs
        too). Calling it again does nothing new."""
        self._stop()
        self._say_unreached_steps()
        self._release_capture()
        while self._custom:
            self._custom.popitem()[1].remove()
        if self._kernel_dump is not None:
            self._installed_kernel.remove()
            if self.runtime.first_time(("kernel dump place",)):
                announce(self._kernel_dump.place())
        if self._graph:
            self._graph.close()
        self.runtime.close_writer()
        moved = self.runtime.moves.summary()
        if moved and self.runtime.first_time(("moved aside",)):
            logger.warning(moved)
        self._param_hooks.remove()  # after the step is written: a backward until then is recorded
        self.runtime.close_timer()
        self._process_state.restore()


    def _say_unreached_steps(self) -> None:
        """WARNING (once) naming the configured steps nothing was dumped for: the run ended before
        them, or no ``start()`` ran in them. (Not for L2, whose kernel dump numbers its own steps,
        nor watch mode, which writes only the steps with an anomaly.)"""
        rt = self.runtime
        if self._kernel_dump is not None or self.config.watch is not None or rt.failed:
            return
        missing = rt.unreached_steps()
        if missing and rt.first_time(("unreached steps",)):
            logger.warning("msprobe: nothing was dumped for configured step(s) %s: no start() ran in "
                           "them (the step counter stood at %d at the end; steps count from 0, one per "
                           "step() call)", missing, rt.step)


def _finish_runtime(runtime) -> None:
    """The service was collected: write and close its open step (idempotent after close())."""
    _quietly("finish the dump", runtime.close_writer, runtime.close_timer)


def _finish_kernel_dump(kernel_dump, installed) -> None:
    """The L2 service was collected: collect the kernel dump files and remove the native dump set-up."""
    _quietly("collect the kernel dump", kernel_dump.collect, installed.remove)


def _quietly(what: str, *calls) -> None:
    """Run ``calls`` in order; a failure is logged (never fail garbage collection or interpreter exit)."""
    try:
        for call in calls:
            call()
    except Exception as exc:
        logger.warning("msprobe: could not %s: %r", what, exc)


def _model_gone(service_ref, refs) -> None:
    """A model of ``start(model)`` was collected: drop the plans built for it (they hold its Cells,
    Parameters and Primitives)."""
    service = service_ref()
    if service is not None and service._model_refs is refs:
        service._drop_plans()
        if not service.active:  # the parked Primitive hooks hold the model's Primitives
            service._release_capture()


_LIVE_SERVICES: "weakref.WeakSet" = weakref.WeakSet()

# weakref registers its exit function (it runs the finalizers still pending at exit, those made in
# DumpService.__init__ among them) with atexit at the process's first finalize(). One made at import
# registers it before any DumpService registers _close_at_exit, so at exit (atexit runs the last
# registered first) _close_at_exit runs before those finalizers: the process ends as by close(), and a
# step still recording is marked abnormal while it is open.
weakref.finalize(_LIVE_SERVICES, int).atexit = False


def _release_other_captures(service) -> None:
    """Before ``service`` installs its capture: remove the capture other debuggers parked, so
    the originals it reads and wraps are MindSpore's own (one parked capture per process)."""
    for other in list(_LIVE_SERVICES):
        if other is not service and not other.active:
            other._release_capture()


class _ProcessState:
    """Process-wide settings a debugger changes, given back when it is done: ``sys.excepthook``
    (through :func:`_install_excepthook`) once it is closed, finished with its last configured
    step, or collected; environment variables noted with :meth:`keep_env` (``MS_JIT_MODULES`` for
    graph probes) once no probe that needs them remains (close or collection)."""

    def __init__(self):
        self._env: dict = {}
        self._signals: dict = {}  # signal number -> the handler that was there before ours
        self.hook_released = False

    def keep_signal(self, signum: int, handler) -> None:
        """Install ``handler`` for ``signum`` (main thread only; elsewhere nothing is changed),
        remembering the previous handler to give back."""
        if threading.current_thread() is not threading.main_thread() or signum in self._signals:
            return
        try:
            self._signals[signum] = signal.signal(signum, handler)
        except (ValueError, OSError):  # not allowed here (embedded interpreter): no flight record
            pass

    def keep_env(self, name: str) -> None:
        """Remember ``os.environ[name]`` (or its absence) as it is now, once."""
        self._env.setdefault(name, os.environ.get(name))

    def restore(self, env: bool = True) -> None:
        """Release the excepthook; with ``env``, put noted environment variables back."""
        for signum, previous in list(self._signals.items()):
            try:
                if threading.current_thread() is threading.main_thread():
                    signal.signal(signum, previous)
                    del self._signals[signum]
            except (ValueError, OSError):
                pass
        if env:
            for name, value in self._env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            self._env.clear()
        if not self.hook_released:
            self.hook_released = True
            _release_excepthook()


def _install_excepthook() -> None:
    """While a debugger runs: an exception that ends the program marks every open step abnormal
    before the exit handler closes it; the exception itself is reported by the previous hook,
    unchanged. Installed once, removed by :func:`_release_excepthook`."""
    previous = sys.excepthook
    if getattr(previous, "_msprobe", False):
        return

    def excepthook(exc_type, exc, tb):
        for service in list(_LIVE_SERVICES):
            try:
                service.note_abnormal(f"the program ended with {exc_type.__name__}: {exc}")
            except Exception:  # never hide the user's exception
                pass
        previous(exc_type, exc, tb)

    excepthook._msprobe = True
    excepthook._previous = previous
    sys.excepthook = excepthook


def _release_excepthook() -> None:
    """Put the previous ``sys.excepthook`` back once no debugger needs ours (if someone replaced
    ours meanwhile, theirs is left in place; ours then only passes exceptions on)."""
    live = [s for s in list(_LIVE_SERVICES) if not s._process_state.hook_released]
    hook = sys.excepthook
    if not live and getattr(hook, "_msprobe", False):
        sys.excepthook = hook._previous


def _inside_compiled_call(ref):
    """What a recorded compiled call (forward entry ``region``) does once it returned: in GRAPH_MODE
    the Cells its graph ran are recorded with it as their parent
    (:meth:`msprobe.capture.cells.graph_cell.GraphDump.region_returned`). ``ref``: a weak reference to the
    service (the patch lives in MindSpore's class and must not keep the service alive)."""
    def inside(region: str, output) -> None:
        service = ref()
        if service is not None and service._graph:
            service._graph.region_returned(region, output)
    return inside


def _paused_cells(ref):
    """The context a ``mindspore.jit`` call runs in: the service's Cell hooks off
    (:meth:`msprobe.capture.cells.cell.CellCapture.paused`); at L0 a recorded call of a ``jit``
    function is noted (:meth:`MindsporeService.note_unrecorded_jit`). ``ref``: a weak reference to the
    service (the patch lives in MindSpore's class)."""
    def paused(function):
        service = ref()
        if service is None:
            return contextlib.nullcontext()
        if function is not None and service.config.level == "L0" and service.runtime.capturing():
            service.note_unrecorded_jit(function)
        return service._cells.paused()
    return paused


def _sigterm_handler(ref):
    """SIGTERM in watch mode: mark the open step abnormal (the flight recorder writes its history),
    close the dump, give the previous handler back and deliver the signal to it."""
    def handler(signum, frame):
        service = ref()
        if service is not None:
            try:
                service.note_abnormal("the process received SIGTERM")
                service.close()
            except Exception as exc:  # never keep the process from ending
                logger.warning("msprobe: could not finish the dump on SIGTERM: %r", exc)
            service._process_state.restore(env=False)
        previous = signal.getsignal(signum)  # given back by restore() above
        if previous is signal.SIG_IGN:
            return
        if callable(previous) and previous is not handler:
            previous(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)  # the default action: the process ends
        os.kill(os.getpid(), signum)
    return handler


def _close_at_exit(ref) -> None:
    service = ref()
    if service is not None:
        try:
            # a step still recording: the program ended before stop() or step() (SystemExit,
            # sys.exit(), the script's end; an uncaught exception was noted first by the
            # excepthook), in PyNative and GRAPH_MODE alike; L2's kernel dump has no step of its
            # own to mark
            if service.active and service._kernel_dump is None:
                service.note_abnormal("the program ended while the step was recording (no stop() after "
                                      "start(): the script ended, or sys.exit() or SystemExit); records "
                                      "up to that point are kept")
            service.close()
        except Exception as exc:  # never fail interpreter exit
            logger.warning("msprobe: could not finish the dump at exit: %r", exc)
        failure = service.runtime.take_user_error()
        if failure is not None:
            logger.error("msprobe: the program's computation failed (%r); the tool met the failure "
                         "while finishing the dump at exit, too late to raise it", failure)
