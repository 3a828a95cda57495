"""Cell-level (L0) capture (seed "L0级别"; spec §3.3 with its [HEAD-BUG] fixed: inputs and stacks are
recorded at forward-pre-hook time, before the Cell can modify them).

Per Cell call ``Cell.{path}.{Class}.forward.{k}``: ``input_args``, ``input_kwargs`` (pre-hook),
``output`` and ``parameters`` (forward hook). Backward ``Cell.{path}.{Class}.backward.{k}`` is taken
through tensor probes (:mod:`msprobe.capture.backward`) attached at forward time, not through
MindSpore's Cell backward hooks, so in-place ops after a Cell, custom ``bprop`` and user hooks behave
as without the tool. Parameter gradients ``Cell.{path}.{Class}.parameters_grad.{g}`` come from
``Parameter.register_hook``. The root Cell passed to ``start`` is not recorded, only its
descendants (seed: "传入的当前层不会被dump").
"""
from __future__ import annotations

from msprobe.capture.backward import BackwardProbe, grad_enabled
from msprobe.core import naming
from msprobe.core.handles import Handle, HandleSet


def iter_cells(models):
    """Yield ``(prefix, cell)`` for every descendant Cell, each object once, depth first.

    Args:
        models: ``list[(index or None, root Cell)]``.
    """
    seen = set()
    for index, root in models:
        seen.add(id(root))
        for name, cell in root.cells_and_names():
            if not name or id(cell) in seen:
                continue
            seen.add(id(cell))
            yield naming.cell_prefix(name, type(cell).__name__, index), cell


class CellCapture:
    """Installs forward and parameter-gradient hooks on every descendant Cell of the models."""

    def __init__(self, runtime):
        self.rt = runtime
        cfg = runtime.config
        self.fwd_in = cfg.allows("forward", "input")
        self.fwd_out = cfg.allows("forward", "output")
        self.bwd_in = cfg.allows("backward", "input") and runtime.records_data
        self.bwd_out = cfg.allows("backward", "output") and runtime.records_data
        # parameter gradients: not collected when only forward data is asked for (spec §2.5)
        self.param_grads = self.bwd_in or self.bwd_out

    def install(self, models) -> HandleSet:
        handles = HandleSet()
        for prefix, cell in iter_cells(models):
            handles.add(_hook_handle(cell.register_forward_pre_hook(self._pre_hook(prefix), with_kwargs=True)))
            handles.add(_hook_handle(cell.register_forward_hook(self._post_hook(prefix), with_kwargs=True,
                                                                always_call=True)))
            if self.param_grads:
                self._hook_params(prefix, cell, handles)
        return handles

    # ------------------------------------------------------------------ forward
    def _pre_hook(self, prefix: str):
        rt = self.rt
        frames = rt.cell_frames

        def pre_hook(cell, args, kwargs):
            if not rt.running or rt.busy():
                frames().append(None)
                return None
            rt.enter()
            try:
                k = rt.next_count(f"{prefix}.forward")
                fwd = naming.cell_entry(prefix, naming.FORWARD, k)
                stack = rt.cell_stack
                parent = stack[-1] if stack else None
                rt.record_parent(fwd, parent)
                rt.record_stack(fwd)
                selected = rt.selector.selects(fwd)
                if selected and self.fwd_in:
                    rt.record(fwd, "input_args", args, "input")
                    rt.record(fwd, "input_kwargs", kwargs, "kwargs")
                probe = None
                if (self.bwd_in or self.bwd_out) and grad_enabled():
                    bwd = naming.cell_entry(prefix, naming.BACKWARD, k)
                    rt.record_parent(bwd, parent.replace(".forward.", ".backward.") if parent else None)
                    if rt.selector.selects(bwd):
                        probe = BackwardProbe(rt, bwd, self.bwd_in, self.bwd_out)
                        new_args = probe.wrap_inputs(args)
                stack.append(fwd)
                frames().append((fwd, probe, selected))
                if probe is not None and any(a is not b for a, b in zip(new_args, args)):
                    return new_args, kwargs
                return None
            finally:
                rt.leave()

        return pre_hook

    def _post_hook(self, prefix: str):
        rt = self.rt
        frames = rt.cell_frames

        def post_hook(cell, args, kwargs, output):
            frame_list = frames()
            frame = frame_list.pop() if frame_list else None
            if frame is None:
                return None
            fwd, probe, selected = frame
            stack = rt.cell_stack
            if stack and stack[-1] == fwd:
                stack.pop()
            rt.enter()
            try:
                if selected and self.fwd_out:
                    rt.record(fwd, "output", output, "output")
                    rt.record(fwd, "parameters", _own_parameters(cell), "parameters")
                if probe is not None:
                    probe.watch_outputs(output)
            finally:
                rt.leave()
            return None

        return post_hook

    # ------------------------------------------------------------------ parameter gradients
    def _hook_params(self, prefix: str, cell, handles: HandleSet) -> None:
        params = [(name, p) for name, p in _own_parameter_items(cell) if p.requires_grad]
        if not params:
            return
        first = params[0][0]
        rt = self.rt
        key = f"{prefix}.parameters_grad"

        for pname, param in params:
            def hook(grad, pname=pname):
                if not rt.running:
                    return None
                if pname == first:
                    g = rt.next_count(key)
                else:
                    g = max(rt.counters[key] - 1, 0)
                entry = naming.param_grad_entry(prefix, g)
                if rt.selector.selects(entry) or rt.selector.selects(prefix):
                    rt.record_param_grad(entry, pname, grad)
                return None

            handles.add(_hook_handle(param.register_hook(hook)))


def _own_parameter_items(cell):
    """``(short name, Parameter)`` of the Cell's own parameters (not its sub-Cells')."""
    return [(name.rsplit(".", 1)[-1], p) for name, p in cell.parameters_and_names(expand=False)]


def _own_parameters(cell) -> dict:
    return dict(_own_parameter_items(cell))


def _hook_handle(ms_handle) -> Handle:
    return Handle(ms_handle.remove)
