"""Cell-level (L0) capture (seed "L0级别"): inputs and stacks are
recorded at forward-pre-hook time, before the Cell can modify them).

Per Cell call ``Cell.{path}.{Class}.forward.{k}``: ``input_args``, ``input_kwargs`` and ``parameters``
(pre-hook: the values the call begins with, also for a Cell that updates its parameters in its
forward, as BatchNorm does its moving statistics), ``output`` (forward hook). Backward ``Cell.{path}.{Class}.backward.{k}`` is taken
through tensor probes (:mod:`msprobe.capture.backward`) attached at forward time, not through
MindSpore's Cell backward hooks, so in-place ops after a Cell, custom ``bprop`` and user hooks behave
as without the tool. Parameter gradients ``Cell.{path}.{Class}.parameters_grad.{g}`` come from
``Parameter.register_hook``. The root Cell passed to ``start`` is not recorded, only its
descendants (seed: "传入的当前层不会被dump").
"""
from __future__ import annotations

import contextlib
import logging
import sys
import weakref

from msprobe.capture.backward import BackwardProbe, first_grad_input, grad_enabled, watermark
from msprobe.capture.semantics import as_output_list
from msprobe.format import naming
from msprobe.engine.handles import Handle, HandleSet

logger = logging.getLogger("msprobe")


def iter_cells(models, runtime):
    """Yield ``(prefix, cell)`` for every descendant Cell, each object once, depth first.

    Args:
        models: ``list[(index or None, root Cell)]``.
        runtime: the :class:`~msprobe.engine.runtime.Runtime` (its once-per-run messages).

    A Cell whose ``construct`` is decorated with ``mindspore.jit`` is yielded (captured as one unit)
    but its sub-Cells are not: they run inside the compiled graph, where Python hooks
    would run at trace time only. A note is logged once per such Cell and run.
    """
    seen = set()
    for index, root in models:
        seen.add(id(root))
        compiled: list = []  # paths of jit Cells, whose descendants are skipped
        for name, cell in root.cells_and_names():
            if not name or id(cell) in seen:
                continue
            if any(name.startswith(p + ".") for p in compiled):
                continue
            seen.add(id(cell))
            prefix = naming.cell_prefix(name, type(cell).__name__, index)
            if is_jit_cell(cell):
                compiled.append(name)
                if runtime.first_time(("jit cell", prefix, id(cell))):
                    logger.info("msprobe: %s has a mindspore.jit construct: captured as one unit, its "
                                "sub-Cells run compiled and are not hooked", prefix)
            yield prefix, cell


def is_jit_cell(cell) -> bool:
    """True when the Cell's ``construct`` is wrapped by ``mindspore.jit`` (a ``JitConfig`` in a
    closure of the function or of the functions it wraps)."""
    construct = vars(cell).get("construct") or type(cell).construct
    return _has_jit_config(getattr(construct, "__func__", construct), 0)


def _has_jit_config(fn, depth: int) -> bool:
    if depth > 4 or not callable(fn):
        return False
    for cell_ref in getattr(fn, "__closure__", None) or ():
        try:
            value = cell_ref.cell_contents
        except ValueError:  # empty closure cell
            continue
        if type(value).__name__ == "JitConfig":
            return True
        if callable(value) and hasattr(value, "__code__") and _has_jit_config(value, depth + 1):
            return True
    wrapped = getattr(fn, "__wrapped__", None)
    return wrapped is not None and _has_jit_config(wrapped, depth + 1)


#: :attr:`CellCapture._param_token` before any step reached a Cell call under a gradient (never a
#: step token, nor ``None``, the token when no step is open)
_NO_STEP = -1


class CellCapture:
    """Installs forward and parameter-gradient hooks on every descendant Cell of the models.

    Args:
        runtime: the :class:`~msprobe.engine.runtime.Runtime`.
        param_hooks: the :class:`~msprobe.engine.handles.HandleSet` the parameter-gradient hooks are
            registered into (the service's, which decides when they are removed); a new one when
            not given.
    """

    def __init__(self, runtime, param_hooks: HandleSet | None = None):
        self.rt = runtime
        self.fwd_in, self.fwd_out, self.bwd_in, self.bwd_out = runtime.data_flags()
        # parameter gradients: not collected when only forward data is asked for
        self.param_grads = self.bwd_in or self.bwd_out
        #: (models key, [(prefix, weakref to the Cell, pre-hook, post-hook, [(weakref to a Parameter,
        #: hook)])], ForwardHookTable of the plain Cells): user objects are held weakly, so the plan
        #: never keeps a network alive
        self._plan = None
        #: ``{id: (take off, put back)}`` of the installed custom-bprop Cell wrappers (:meth:`paused`)
        self._bprop_wrappers: dict = {}
        #: step token of the step that reached its first Cell call under a gradient: the
        #: parameter-gradient hooks record only while it is the open step's token
        self._param_token = _NO_STEP
        self._param_hook_set = HandleSet() if param_hooks is None else param_hooks
        self._param_handle: Handle | None = None  # this plan's registered hooks, in _param_hook_set
        #: every entry recorded, statistics only (:meth:`Runtime.takes_whole_calls`): a hook's records
        #: are queued at once (:meth:`Runtime.queue_cell_lines`); set at each install
        self._whole = False

    def install(self, models) -> HandleSet:
        """Register the hooks on every descendant Cell of ``models`` (``list[(index or None, Cell)]``).

        The Cell tree and the hook functions are read and built at the first install for a given
        ``models`` list; later installs (one per dumped step) only register them.
        """
        key = [(index, id(root)) for index, root in models]
        if self._plan is None or self._plan[0] != key:
            plan = self._build_plan(models)
            if not plan and self.rt.config.level == "L0" and self.rt.first_time(("no sub-Cells", tuple(key))):
                names = ", ".join(type(root).__name__ for _, root in models)
                logger.warning("msprobe: level L0 records the Cells inside the model given to start(); %s "
                               "has none, so nothing is recorded (level L1 or mix records its API calls)",
                               names)
            self._plan = (key, plan, ForwardHookTable([(ref, pre, post) for _, ref, pre, post, _ in plan
                                                       if pre is not None and pre != "recompute"]))
        self._whole = self.rt.takes_whole_calls()
        handles = HandleSet()
        table = self._plan[2]
        for prefix, cell_ref, pre, post, param_hooks in self._plan[1]:
            if pre is not None and pre != "recompute" and table.direct:
                continue  # registered together below
            cell = cell_ref()
            if cell is None:
                continue
            if pre == "recompute":
                handles.add(self._install_recompute_cell(prefix, cell))
                continue
            if pre is None:
                # MindSpore ignores register_forward_hook on a Cell with a custom bprop (it returns a
                # dummy handle), so the forward hook would never pop the pre-hook's frame: wrap the
                # instance's construct (forward output) and bprop (backward entry) instead.
                handles.add(self._install_bprop_cell(prefix, cell))
                continue
            handles.add(_hook_handle(cell.register_forward_pre_hook(pre, with_kwargs=True)))
            handles.add(_hook_handle(cell.register_forward_hook(post, with_kwargs=True, always_call=True)))
        if table.direct:
            handles.add(table.install())
        return handles

    def paused(self):
        """Context in which the forward hooks of the Cells are off (a no-op when none is installed).

        For a ``mindspore.jit`` function called while the hooks are on: MindSpore compiles the forward
        hooks of the Cells such a function calls into its graph. Ours are Python its parser rejects
        (the user's call would raise), and a graph compiled with them would keep running them after
        ``stop()``. Off, the graph is the one compiled without the tool; the Cells inside it are not
        recorded (as those of a Cell with a ``jit`` construct). Only the hooks registered together
        (:class:`ForwardHookTable`, MindSpore 2.x) are taken off."""
        table = self._plan[2] if self._plan is not None else None
        on = table is not None and table.installed
        if not on and not self._bprop_wrappers:
            return contextlib.nullcontext()
        return self._all_off(table if on else None)

    @contextlib.contextmanager
    def _all_off(self, table):
        """:meth:`paused` with the hook table ``table`` (or ``None``) and the custom-bprop Cell
        wrappers (their ``construct`` and ``bprop`` too: MindSpore compiles a Cell's bprop
        into a ``jit`` function's graph and its parser rejects ours) taken off."""
        wrappers = list(self._bprop_wrappers.values())
        with table.off() if table is not None else contextlib.nullcontext():
            for take_off, _ in wrappers:
                take_off()
            try:
                yield
            finally:
                for _, put_back in wrappers:
                    put_back()

    def _hook_parameters(self) -> None:
        """The step reached its first Cell call under a gradient: the parameter-gradient hooks record
        from here until ``step()`` (a forward-only step records none; a backward run after ``stop()``,
        seed: start -> forward -> stop -> backward -> step, is still recorded). The planned hooks are
        registered here when they are not already: they stay registered from one dumped step to the
        next while the service keeps the capture parked (each returns at once outside the steps it
        records), and the service removes them (:attr:`_param_hook_set`)."""
        rt = self.rt
        token = rt.step_token
        if self._param_token == token or self._plan is None:
            return
        self._param_token = token
        if self._param_handle is not None and self._param_handle.active:
            return
        registered = []  # held by the handle first: a failure part-way leaves nothing untracked
        handle = self._param_handle = self._param_hook_set.add(
            Handle(lambda: _remove_each(registered), "parameter-gradient hooks"))
        try:
            for _, _, _, _, param_hooks in self._plan[1]:
                for param_ref, hook in param_hooks:
                    param = param_ref()
                    if param is not None:
                        registered.append(param.register_hook(hook))
        except BaseException:  # the caller reports it; the next step registers them again
            self._param_handle = None
            handle.remove()
            raise

    def release_parameter_hooks(self, later: list | None = None) -> None:
        """Remove this plan's parameter-gradient hooks (the plan is dropped); with ``later`` (the
        runtime's ``tensor_hooks`` while a step is open), hand them to it instead, to be removed
        when the step ends."""
        handle, self._param_handle = self._param_handle, None
        if handle is None or not handle.active:
            return
        if later is None:
            handle.remove()
        else:
            later.append(handle)

    def _build_plan(self, models) -> list:
        plan = []
        for prefix, cell in iter_cells(models, self.rt):
            kind = _recompute_kind(cell)
            if kind == "wrapper":  # MindSpore's own wrapper of the recomputed construct: not a layer
                continue
            ref = weakref.ref(cell)
            if kind == "recompute":
                plan.append((prefix, ref, "recompute", None, ()))
                continue
            if getattr(cell, "has_bprop", False):
                plan.append((prefix, ref, None, None, ()))
                continue
            param_hooks = [(weakref.ref(param), hook) for param, hook in self._param_hooks(prefix, cell)] \
                if self.param_grads else []
            plan.append((prefix, ref, self._pre_hook(prefix), self._post_hook(prefix), param_hooks))
        return plan

    # ------------------------------------------------------------------ forward
    def _pre_hook(self, prefix: str, bprop_probes: list | None = None):
        rt = self.rt
        frames = rt.cell_frames
        counter = naming.cell_counter(prefix)

        def pre_hook(cell, args, kwargs):
            if not rt.capturing():
                frames().append(None)
                return None
            rt.enter()
            fwd = entered = None
            try:
                k = rt.next_count(counter)
                fwd = naming.cell_entry(prefix, naming.FORWARD, k)
                stack = rt.cell_stack
                parent = stack[-1] if stack else None
                # construct.json has every Cell call (a selected Cell keeps its ancestors);
                # stack.json only the dumped entries; a recomputed forward was recorded the first time
                replay = rt.recomputing
                selected = not replay and rt.selector.selects(fwd)
                rt.selector.enter_cell(fwd)
                entered = fwd
                grad = (self.bwd_in or self.bwd_out) and grad_enabled()
                bwd = naming.cell_entry(prefix, naming.BACKWARD, k) if grad else None
                # the Cell's own parameters are read (or snapshotted) as the call begins: a Cell
                # updating them in its forward (BatchNorm's moving statistics) is recorded with the
                # values it was called with; they ride on the forward output under data_mode
                params = _own_parameters(cell) if selected and self.fwd_out else None
                queued = selected and self._whole and rt.queue_cell_lines(
                    fwd, (("input_args", args), ("input_kwargs", kwargs)) if self.fwd_in else (),
                    ((fwd, parent),), stack=True, after=((bwd, naming.backward_of(parent)),) if grad else (),
                    parameters=params)
                if not queued:
                    if not replay:
                        rt.record_parent(fwd, parent)
                    if selected:
                        rt.record_stack(fwd)
                        if self.fwd_in:
                            rt.record(fwd, "input_args", args, "input")
                            rt.record(fwd, "input_kwargs", kwargs, "kwargs")
                        if params is not None:
                            rt.record(fwd, "parameters", params, "parameters")
                probe = mark = None
                if grad:
                    if self.param_grads and self._param_token != rt.step_token:
                        self._hook_parameters()
                    if not queued:
                        rt.record_parent(bwd, naming.backward_of(parent))
                    if rt.selector.selects(bwd):
                        rt.selector.note_backward(prefix)
                        probe = BackwardProbe(rt, bwd, self.bwd_in, self.bwd_out)
                        if bprop_probes is None and self.bwd_out:
                            first = first_grad_input(args)
                            if first is not None:  # every node the Cell makes from now on is newer
                                mark = watermark(first)
                    if bprop_probes is not None:
                        # custom bprop: its wrapper records both sides (a selected backward) and is
                        # the parent of the calls the bprop makes (every backward)
                        bprop_probes.append((rt.step_token, bwd, probe))
                        probe = None
                stack.append(fwd)
                frames().append((fwd, probe, selected, mark))
                entered = None
                return None
            except Exception as exc:  # tool failure: reported, the Cell runs as without the tool
                if not rt.claim_user_failure(exc, (args, kwargs)):
                    rt.tool_error(f"failed to record {fwd or prefix}: {exc!r}", key=(prefix, type(exc)))
                if entered is not None:
                    rt.selector.exit_cell(entered)
                frames().append(None)
                return None
            finally:
                rt.leave()

        return pre_hook

    def _post_hook(self, prefix: str):
        rt = self.rt
        frames = rt.cell_frames
        #: whether this Cell's next call tries the compiled common case of BackwardProbe.observe: off
        #: once a call of it declined (a Cell made of several autograd nodes), which only chooses
        #: the implementation (the general path makes the same hooks and records)
        plain = [True]

        def post_hook(cell, args, kwargs, output):
            frame_list = frames()
            frame = frame_list.pop() if frame_list else None
            if frame is None:
                return None
            fwd, probe, selected, mark = frame
            stack = rt.cell_stack
            if stack and stack[-1] == fwd:
                stack.pop()
            rt.selector.exit_cell(fwd)
            rt.enter()
            try:
                raised = _raised_in(sys._getframe(1)) if output is None else None
                if raised is not None:  # MindSpore calls the hook as the Cell's exception goes on
                    if selected and self.fwd_out:
                        rt.record_raised(fwd, raised)
                elif selected and self.fwd_out:
                    # the parameters (inputs of the call) were journaled by the pre-hook, so a
                    # reader (watch mode) deciding at the output whether the inputs were finite has them
                    outs = as_output_list(output)
                    if not (self._whole and rt.queue_cell_lines(fwd, (("output", outs),))):
                        rt.record(fwd, "output", outs, "output")
                if probe is not None and not probe.observe(args, output, mark, plain[0]):
                    plain[0] = False
            except Exception as exc:  # tool failure: reported once, the Cell's output goes on
                if not rt.claim_user_failure(exc, output):
                    rt.tool_error(f"failed to record {fwd}: {exc!r}", key=(prefix, type(exc)))
            finally:
                rt.leave()
            return None

        return post_hook

    # ------------------------------------------------------------------ Cell.recompute()
    def _install_recompute_cell(self, prefix: str, cell) -> Handle:
        return install_recompute_replay(self.rt, prefix, cell)

    # ------------------------------------------------------------------ Cells with a custom bprop
    def _install_bprop_cell(self, prefix: str, cell) -> Handle:
        """Capture a Cell defining ``bprop``.

        Forward: the pre-hook works as for other Cells; the output is taken by an instance-level
        ``construct`` wrapper (it runs once per hooked call, inside ``Cell.__call__``). Backward:
        an instance-level ``bprop`` wrapper records ``dout`` as backward ``input`` and the bprop's
        return value as backward ``output``. Backward calls are matched to forward calls last-in
        first-out (reverse execution order). While the bprop runs, the Cell's backward entry is the
        innermost Cell call: the calls the bprop makes have it as ``construct.json`` parent.
        """
        rt = self.rt
        #: (step token, backward entry, BackwardProbe or None when that entry is not selected) per
        #: forward call under grad, matched LIFO in bprop
        probes: list = []
        armed = [0]  # hooked calls whose construct has not returned yet
        pre = self._pre_hook(prefix, probes)
        post = self._post_hook(prefix)

        def armed_pre_hook(c, args, kwargs):
            armed[0] += 1
            token = rt.step_token
            if probes and probes[0][0] != token:  # forward without backward, earlier step
                probes[:] = [p for p in probes if p[0] == token]
            return pre(c, args, kwargs)

        pre_handle = cell.register_forward_pre_hook(armed_pre_hook, with_kwargs=True)
        orig_construct = cell.construct  # bound method
        orig_bprop = cell.bprop
        had_construct = "construct" in vars(cell)
        had_bprop = "bprop" in vars(cell)

        def construct(*args, **kwargs):
            out = orig_construct(*args, **kwargs)
            if armed[0] > 0:  # a direct cell.construct(x) call bypasses hooks: nothing to pop
                armed[0] -= 1
                post(cell, args, kwargs, out)
            return out

        construct.__defaults__ = orig_construct.__func__.__defaults__ if hasattr(
            orig_construct, "__func__") else None
        construct.__kwdefaults__ = getattr(getattr(orig_construct, "__func__", None), "__kwdefaults__", None)
        construct.__wrapped__ = orig_construct

        def bprop(*args):
            token, bwd, probe = probes.pop() if probes else (None, None, None)
            # the calls the bprop makes run in this Cell's backward: their construct.json parent
            stack = rt.cell_stack if token is not None and token == rt.step_token else None
            if stack is not None:
                stack.append(bwd)
            try:
                result = orig_bprop(*args)
            finally:
                if stack and stack[-1] == bwd:
                    stack.pop()
            if probe is not None and rt.records_data:
                rt.enter()
                try:
                    probe.record_bprop(args[-1], result)
                except Exception as exc:  # tool failure: the bprop's result goes on unchanged
                    rt.tool_error(f"failed to record {probe.entry}: {exc!r}", key=(prefix, type(exc)))
                finally:
                    rt.leave()
            return result

        bprop.__wrapped__ = orig_bprop
        handle = [pre_handle]

        def put_back():
            if handle[0] is None:
                handle[0] = cell.register_forward_pre_hook(armed_pre_hook, with_kwargs=True)
            object.__setattr__(cell, "construct", construct)
            object.__setattr__(cell, "bprop", bprop)

        def take_off():
            if handle[0] is not None:
                handle[0].remove()
                handle[0] = None
            for name, had, orig in (("construct", had_construct, orig_construct),
                                    ("bprop", had_bprop, orig_bprop)):
                if had:
                    object.__setattr__(cell, name, orig)
                else:
                    vars(cell).pop(name, None)

        put_back()
        key = id(take_off)
        self._bprop_wrappers[key] = (take_off, put_back)

        def undo():
            self._bprop_wrappers.pop(key, None)
            take_off()
            probes.clear()

        return Handle(undo, f"{prefix} (custom bprop)")

    # ------------------------------------------------------------------ parameter gradients
    def _param_hooks(self, prefix: str, cell) -> list:
        """``[(Parameter, hook)]`` recording ``{prefix}.parameters_grad.{g}`` for the Cell's own
        trainable parameters (``g`` counts the Cell's backward passes in the step)."""
        params = [(name, p) for name, p in _own_parameter_items(cell) if p.requires_grad]
        if not params:
            return []
        first = params[0][0]
        rt, capture = self.rt, self
        key = naming.param_grad_counter(prefix)
        hooks = []
        for pname, param in params:
            def hook(grad, pname=pname):
                # no open step, or it has not reached its first Cell call under a gradient
                if rt.step_token != capture._param_token:
                    return None
                if pname == first:
                    g = rt.next_count(key)
                else:
                    g = max(rt.counters[key] - 1, 0)
                entry = naming.param_grad_entry(prefix, g)
                if rt.selector.selects_param_grad(prefix, entry) and not rt.queue_param_grad(entry, pname, grad):
                    rt.record_param_grad(entry, pname, grad)
                return None

            hooks.append((param, hook))
        return hooks


def install_recompute_replay(rt, prefix: str, cell) -> Handle:
    """MindSpore's ``_RecomputeCell`` of a Cell under ``Cell.recompute()`` runs the Cell's forward
    without a gradient, then again inside its ``bprop`` to compute the gradients. The first run is
    recorded as usual; the re-run gets the same call numbers and parents and records only backward
    data (:meth:`Runtime.replaying`), so backward ``k`` pairs with forward ``k``."""
    saved: list = []  # per forward call under a gradient: (counters, Cell stack) when it started
    orig_construct, orig_bprop = cell.construct, cell.bprop
    had = {name: name in vars(cell) for name in ("construct", "bprop")}

    def construct(*args, **kwargs):
        if rt.running and not rt.recomputing:
            saved.append((dict(rt.counters), list(rt.cell_stack)))
        return orig_construct(*args, **kwargs)

    def bprop(*args):
        if not saved:
            return orig_bprop(*args)
        counters, stack = saved.pop()
        with rt.replaying(counters, stack):
            return orig_bprop(*args)

    construct.__wrapped__, bprop.__wrapped__ = orig_construct, orig_bprop
    object.__setattr__(cell, "construct", construct)
    object.__setattr__(cell, "bprop", bprop)

    def undo():
        for name, orig in (("construct", orig_construct), ("bprop", orig_bprop)):
            if had[name]:
                object.__setattr__(cell, name, orig)
            else:
                vars(cell).pop(name, None)

    return Handle(undo, f"{prefix} (recompute)")


def recompute_cells(models, runtime) -> list:
    """``[(prefix, weakref to the Cell)]`` of MindSpore's ``Cell.recompute()`` wrappers in ``models``
    (``list[(index or None, root Cell)]``); ``runtime`` as for :func:`iter_cells`."""
    return [(prefix, weakref.ref(cell)) for prefix, cell in iter_cells(models, runtime)
            if _recompute_kind(cell) == "recompute"]


def install_recompute_replays(rt, cells: list) -> HandleSet:
    """:func:`install_recompute_replay` on each of ``cells`` (from :func:`recompute_cells`): what L1
    needs when only APIs are hooked."""
    handles = HandleSet()
    for prefix, ref in cells:
        cell = ref()
        if cell is not None:
            handles.add(install_recompute_replay(rt, prefix, cell))
    return handles


def _recompute_kind(cell):
    """``"recompute"`` for MindSpore's ``_RecomputeCell`` (made by ``Cell.recompute()``), ``"wrapper"``
    for the ``_WrapCell`` inside it, else ``None``."""
    name = type(cell).__name__
    if name in ("_RecomputeCell", "_WrapCell") and type(cell).__module__ == "mindspore.common.recompute":
        return "recompute" if name == "_RecomputeCell" else "wrapper"
    return None


def _raised_in(caller):
    """The exception a Cell's forward raised, when MindSpore calls its forward hook (registered with
    ``always_call``) from the ``except`` block of ``Cell._run_construct`` (frame ``caller``) as the
    exception goes on; ``None`` for a forward that returned: the exception being handled, if any,
    must have come through ``caller`` (a Cell called inside the program's own ``except`` block sees
    the program's exception, which did not)."""
    exc = sys.exc_info()[1]
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None:
        if tb.tb_frame is caller:
            return exc
        tb = tb.tb_next
    return None


def _own_parameter_items(cell):
    """``(short name, Parameter)`` of the Cell's own parameters (not its sub-Cells')."""
    return [(name.rsplit(".", 1)[-1], p) for name, p in cell.parameters_and_names(expand=False)]


def _own_parameters(cell) -> dict:
    """``{short name: Parameter}`` of :func:`_own_parameter_items`, read from ``Cell._params`` as
    ``Cell.parameters_and_names(expand=False)`` reads it (an initialised Parameter's
    ``inited_param`` stands for it, each Parameter once), without its generator (per Cell call)."""
    params = cell._params
    if not params:
        return {}
    own, seen = {}, set()
    for name, param in params.items():
        if param is not None and param.inited_param is not None:
            param = param.inited_param
        if param is not None and id(param) not in seen:
            seen.add(id(param))
            own[name.rsplit(".", 1)[-1]] = param
    return own


def _hook_handle(ms_handle) -> Handle:
    return Handle(ms_handle.remove)


def _remove_each(ms_handles: list) -> None:
    """Remove MindSpore hook handles (``Parameter.register_hook``'s), last registered first."""
    while ms_handles:
        ms_handles.pop().remove()


def _hook_dicts():
    """``(HookHandle, _update_hook_version)`` of MindSpore when ``Cell`` keeps its forward hooks in the
    dictionaries ``Cell.register_forward_pre_hook``/``register_forward_hook`` fill (MindSpore 2.x), else
    ``None``."""
    try:
        from mindspore.common.hook_handle import HookHandle, _update_hook_version
        from mindspore.nn import Cell
    except ImportError:  # pragma: no cover - other MindSpore layouts
        return None
    names = ("_forward_pre_hook", "_forward_pre_hook_with_kwargs", "_forward_hook", "_forward_hook_with_kwargs",
             "_forward_hook_always_called")
    if not isinstance(getattr(HookHandle, "unique_id", None), int) or not all(
            isinstance(getattr(Cell, name, None), property) for name in names):
        return None
    return HookHandle, _update_hook_version


class ForwardHookTable:
    """The forward pre-hook and forward hook of many Cells, registered and removed together.

    Args:
        entries: ``[(weakref to a Cell, pre_hook(cell, args, kwargs), hook(cell, args, kwargs, output))]``.

    :meth:`install` does to each Cell's hook dictionaries what ``Cell.register_forward_pre_hook(pre,
    with_kwargs=True)`` and ``Cell.register_forward_hook(hook, with_kwargs=True, always_call=True)`` do
    (the same entries, appended in the same order after the hooks already there, under ids reserved from
    MindSpore's ``HookHandle`` counter once, when the table is built), and its handle what
    ``HookHandle.remove`` does; MindSpore's hook version is bumped once per install and once per removal
    rather than once per hook. It makes one object per install (the public calls make two handles per Cell:
    ~13 us per hook and removal, 0.36 ms per TinyLM step against 0.10 ms here). :attr:`direct` is False
    on a MindSpore whose Cells keep hooks otherwise; the caller then registers them one by one.
    """

    __slots__ = ("direct", "installed", "_entries", "_bump")

    def __init__(self, entries: list):
        found = _hook_dicts()
        self.direct = found is not None
        #: the hooks are on the Cells (between :meth:`install` and its handle's removal)
        self.installed = False
        self._entries = []
        self._bump = None
        if found is None:
            return
        hook_handle, self._bump = found
        for ref, pre, post in entries:
            first = hook_handle.unique_id
            hook_handle.unique_id = first + 2
            self._entries.append((ref, first, pre, first + 1, post))

    def install(self) -> Handle:
        """Register every hook on the Cells still alive; the handle removes them."""
        self._add()
        return Handle(self._remove, "Cell forward hooks")

    @contextlib.contextmanager
    def off(self):
        """Context: the hooks are taken off the Cells and put back (under the same ids) on exit,
        whatever it raises. Use only while they are installed."""
        self._remove()
        try:
            yield
        finally:
            self._add()

    def _add(self) -> None:
        for ref, pre_id, pre, post_id, post in self._entries:
            cell = ref()
            if cell is None:
                continue
            cell._forward_pre_hook[pre_id] = pre
            cell._forward_pre_hook_with_kwargs[pre_id] = True
            cell._forward_hook[post_id] = post
            cell._forward_hook_with_kwargs[post_id] = True
            cell._forward_hook_always_called[post_id] = True
        self.installed = True
        self._bump()

    def _remove(self) -> None:
        self.installed = False
        for ref, pre_id, _, post_id, _ in self._entries:
            cell = ref()
            if cell is None:
                continue
            cell._forward_pre_hook.pop(pre_id, None)
            cell._forward_pre_hook_with_kwargs.pop(pre_id, None)
            cell._forward_hook.pop(post_id, None)
            cell._forward_hook_with_kwargs.pop(post_id, None)
            cell._forward_hook_always_called.pop(post_id, None)
        self._bump()
