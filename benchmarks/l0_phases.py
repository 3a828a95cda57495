"""Where an L0 step's excess goes, by phase of the step and by part of the capture switched off.

    PYTHONPATH=. .venv/bin/python benchmarks/l0_phases.py [--rounds 30] [--level L0] [--watch]

One process, ``overhead.py``'s TinyLM step (``ms.set_device("CPU"); ms.runtime.launch_blocking()``)
written out so that the training thread's CPU time (``time.thread_time``) is read between its phases:
``start()``, forward (``net`` and the loss, inside ``value_and_grad``), backward (the rest of
``value_and_grad``), the optimizer, ``stop()`` and ``step()``. Variants, run in turn (order reversed
every other round, so a drift of the machine's load hits them alike):

* ``off``: the bare step (``off again``: the same, a second time per round, which shows the noise);
* ``all``: the level as configured;
* ``no backward probes``: ``BackwardProbe.observe`` does nothing (no tensor or node hook: the Cells'
  backward entries are missing);
* ``no parameter hooks``: ``CellCapture._hook_parameters`` registers nothing and removes the hooks an
  earlier variant's steps left registered (no ``parameters_grad``);
* ``neither``: both of the above;
* ``no watermark``: no view is made before a Cell runs (the walk is bounded by the newest argument's
  node instead: inexact on purpose), what a cheaper watermark could save at most;
* ``no sum``: the tool's sum of an argument's gradient parts returns the first part (wrong on purpose):
  whether the ``ops.add`` calls cost the step what their timers say;
* ``separate node hooks``: one MindSpore hook per call on a node several calls hook (the registration
  before ``backward.register_node_hook``);
* ``no jit pause``: ``CellCapture.paused`` does nothing (the Cell hooks stay on the Cells while a
  compiled call, such as the optimizer's, runs);
* ``hooks only``: a second debugger whose ``list`` selects nothing (every hook installed and running,
  the parameter-gradient hooks too; only the ``construct.json`` edges are recorded);
* ``no-op hooks``: no tool, MindSpore's ``register_forward_pre_hook(with_kwargs=True)`` and
  ``register_forward_hook(with_kwargs=True, always_call=True)`` of functions that do nothing, on every
  Cell the tool hooks (what MindSpore's hook dispatch alone costs in the step).

Printed: per variant and phase the median over ``--rounds`` of the CPU ms, and the excess over
``off``; with ``--pair A,B`` also the median and quartiles of B's minus A's CPU ms within each round,
and each one's minimum over the rounds (the least disturbed step: on a loaded machine the steadier
figure). The files of the switched-off variants are incomplete on purpose: this measures, it does not
dump.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import overhead  # noqa: E402

PHASES = ("start", "forward", "backward", "optimizer", "stop", "step", "total")


def _patched(owner, name, replacement):
    """Set ``owner.name`` to ``replacement``; returns the function that puts the original back."""
    original = owner.__dict__[name]
    setattr(owner, name, replacement)
    return lambda: setattr(owner, name, original)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--level", default="L0")
    p.add_argument("--watch", action="store_true", help="watch mode (default settings)")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--pair", default="", help="two variants 'A,B': also print the quartiles of B - A per "
                   "round, by phase (the two ran within the same round)")
    p.add_argument("--variants", default="off,off again,all,no backward probes,no parameter hooks,neither,"
                   "hooks only,no-op hooks", help="comma-separated, from the list above")
    args = p.parse_args(argv)
    import mindspore as ms

    net, batches, _ = overhead._setup()
    sys.path.insert(0, overhead.EXAMPLES)
    import models
    from mindspore import nn

    loss_fn = models.LMCrossEntropy()
    optimizer = nn.Adam(net.trainable_params(), learning_rate=3e-3)
    marks: list = []

    def forward_fn(data, label):
        loss = loss_fn(net(data), label)
        marks.append(time.thread_time())
        return loss

    grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters)
    x, y = (ms.Tensor(v) for v in batches[0])

    spec = {"task": "statistics", "level": args.level}
    if args.watch:
        spec["watch"] = {}
    from msprobe.capture import backward
    from msprobe.capture.cells import cell
    from msprobe.mindspore import PrecisionDebugger

    dbg = PrecisionDebugger(config_path=overhead.write_config(tempfile.mkdtemp(prefix="msprobe_phases_"), spec))
    idle = PrecisionDebugger(config_path=overhead.write_config(
        tempfile.mkdtemp(prefix="msprobe_phases_"), {**spec, "list": ["Cell.selects.nothing"]}))
    cells = [c for name, c in net.cells_and_names() if name]

    def noop_pre(cell, args, kwargs):
        return None

    def noop_post(cell, args, kwargs, output):
        return None

    def noop_hooks():
        handles = [h for c in cells for h in (c.register_forward_pre_hook(noop_pre, with_kwargs=True),
                                              c.register_forward_hook(noop_post, with_kwargs=True,
                                                                      always_call=True))]
        return lambda: [h.remove() for h in handles]

    def no_observe(self, args, out, mark=None, plain=True):
        return True

    def no_params(self):  # and none left registered by an earlier variant's steps
        self.release_parameter_hooks()

    def no_pause(self):
        return contextlib.nullcontext()

    switches = {
        "all": (),
        "no watermark": ((cell, "watermark", lambda tensor: None),),
        "no sum": ((backward, "_sum", lambda a, b: a),),
        "separate node hooks": ((backward, "register_node_hook",
                                 lambda registry, node, hook: node.register_hook(hook)),),
        "no jit pause": ((cell.CellCapture, "paused", no_pause),),
        "no backward probes": ((backward.BackwardProbe, "observe", no_observe),),
        "no parameter hooks": ((cell.CellCapture, "_hook_parameters", no_params),),
        "neither": ((backward.BackwardProbe, "observe", no_observe),
                    (cell.CellCapture, "_hook_parameters", no_params)),
    }

    def run(variant: str) -> dict:
        tool = idle if variant == "hooks only" else dbg
        on = variant not in ("off", "off again", "no-op hooks")
        undo = [_patched(*s) for s in switches.get(variant, ())]
        if variant == "no-op hooks":
            undo.append(noop_hooks())
        try:
            marks.clear()
            t = [time.thread_time()]
            if on:
                tool.start(net)
            t.append(time.thread_time())
            loss, grads = grad_fn(x, y)
            t_bwd = time.thread_time()
            optimizer(grads)
            t_opt = time.thread_time()
            if on:
                tool.stop()
            t_stop = time.thread_time()
            if on:
                tool.step()
            t_step = time.thread_time()
            loss.asnumpy()
        finally:
            for u in undo:
                u()
        fwd = marks[0]
        values = (t[1] - t[0], fwd - t[1], t_bwd - fwd, t_opt - t_bwd, t_stop - t_opt, t_step - t_stop,
                  t_step - t[0])
        return dict(zip(PHASES, values))

    variants = [v.strip() for v in args.variants.split(",")]
    for _ in range(3):
        for v in variants:
            run(v)
    rows = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in (variants if r % 2 else variants[::-1]):
            rows[v].append(run(v))
    print(overhead.HEADER)
    print(f"level {args.level}{' watch' if args.watch else ''}: training-thread CPU ms per step, median of "
          f"{args.rounds} rounds (excess over off in brackets); loadavg {os.getloadavg()[0]:.2f}")
    print(f"  {'variant':20s}" + "".join(f"{ph:>16s}" for ph in PHASES))
    base = {ph: statistics.median(r[ph] for r in rows["off"]) for ph in PHASES} if "off" in rows else None
    for v in variants:
        cells = []
        for ph in PHASES:
            m = statistics.median(r[ph] for r in rows[v])
            cells.append(f"{1e3 * m:7.2f}" + (f" ({1e3 * (m - base[ph]):+6.2f})" if base else ""))
        print(f"  {v:20s}" + "".join(f"{c:>16s}" for c in cells))
    if args.pair:
        first, second = (v.strip() for v in args.pair.split(","))
        print(f"  {second} - {first}, per round, quartiles (ms):")
        for ph in PHASES:
            diffs = sorted(1e3 * (b[ph] - a[ph]) for a, b in zip(rows[first], rows[second]))
            q1, q2, q3 = statistics.quantiles(diffs, n=4)
            print(f"    {ph:10s} {q2:+7.2f}  [{q1:+7.2f}, {q3:+7.2f}]   minima {1e3 * min(r[ph] for r in rows[first]):7.2f} "
                  f"/ {1e3 * min(r[ph] for r in rows[second]):7.2f}")
    dbg.service.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
