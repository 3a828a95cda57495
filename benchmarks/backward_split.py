"""Where backward capture's cost goes on the TinyLM step: forward side (``BackwardProbe.observe``,
hook registration) and backward side (hooks running), wall and main-thread CPU.

    .venv/bin/python benchmarks/backward_split.py --level L1 --rounds 30
    .venv/bin/python benchmarks/backward_split.py --level L1 --baseline /tmp/old_backward.py
    (git show HEAD~3:msprobe/capture/backward.py > /tmp/old_backward.py)

One process, ``ms.set_device("CPU"); ms.runtime.launch_blocking()`` (as ``overhead.py``); the variants
run one step each in rotation for ``--rounds`` rounds. The train step is ``overhead.py``'s, split
where ``value_and_grad`` finishes the forward (``fw``) and where it returns the gradients (``bw``);
``cpu`` columns are the main thread's CPU time (``time.thread_time``), ``observe`` the CPU time
inside ``BackwardProbe.observe``. Statistics are not computed (``Runtime._describe_and_queue`` and
``Runtime.record_items`` are no-ops) unless ``--describe``, so the rows isolate the capture itself. Variants (BackwardProbe
subclasses the call and Cell recorders are pointed to, step by step):

* ``off``: no tool;
* ``baseline``: the ``BackwardProbe`` of ``--baseline`` (a backward.py file), when given;
* ``capture``: the current ``BackwardProbe``;
* ``hooks fire``: hooks registered and running, gradients not recorded;
* ``no hooks``: ``observe`` runs, ``register_hook`` is a no-op;
* ``no observe``: ``observe`` is a no-op (the rest of the tool's cost).
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overhead  # noqa: E402


class _NoHandle:
    def remove(self):
        pass


def _module_from(path: str, name: str, no_hooks: bool = False):
    source = open(path, encoding="utf-8").read()
    if no_hooks:
        source = source.replace("node.register_hook(", "_no_hook(").replace(
            "tensor.register_hook(hook)", "_no_hook(hook)").replace(
            "ext.observe_plain(self, args, out)", "False")  # the compiled observe registers its own hooks
    module = types.ModuleType(name)
    module.__dict__["_no_hook"] = lambda hook: _NoHandle()
    exec(compile(source, path, "exec"), module.__dict__)
    return module


def _variants(baseline: str | None) -> dict:
    from msprobe.capture import backward

    def noop(*_a, **_k):
        return None

    variants = {"off": None}
    if baseline:
        variants["baseline"] = type("Baseline", (_module_from(baseline, "baseline").BackwardProbe,),
                                    {"__slots__": ()})
    variants["capture"] = type("Capture", (backward.BackwardProbe,), {"__slots__": ()})
    variants["hooks fire"] = type("HooksFire", (backward.BackwardProbe,),
                                  {"__slots__": (), "_record": noop, "_record_items": noop,
                                   "_slot_value": noop})
    no_hooks = _module_from(backward.__file__, "no_hooks", no_hooks=True)
    variants["no hooks"] = type("NoHooks", (no_hooks.BackwardProbe,), {"__slots__": ()})
    variants["no observe"] = type("NoObserve", (backward.BackwardProbe,), {"__slots__": (), "observe": noop})
    return variants


def _timed_observe(cls, acc: list) -> None:
    inner = cls.observe

    def observe(self, *args, **kwargs):
        t = time.thread_time_ns()
        try:
            return inner(self, *args, **kwargs)
        finally:
            acc[0] += time.thread_time_ns() - t

    cls.observe = observe


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--level", default="L1", choices=("L0", "L1", "mix"))
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--baseline", metavar="BACKWARD_PY", help="a backward.py to compare against")
    p.add_argument("--describe", action="store_true", help="compute the statistics too")
    args = p.parse_args(argv)

    net, batches, _ = overhead._setup()
    import mindspore as ms
    from mindspore import Tensor, nn

    import models  # examples/, on sys.path after overhead._setup()
    from msprobe.capture import calls, backward  # noqa: F401
    from msprobe.capture.cells import cell
    from msprobe.engine import runtime
    from msprobe.mindspore import PrecisionDebugger

    optimizer = nn.Adam(net.trainable_params(), learning_rate=3e-3)
    loss_fn = models.LMCrossEntropy()
    marks = {}

    def forward_fn(data, label):
        loss = loss_fn(net(data), label)
        marks["forward"] = (time.perf_counter(), time.thread_time())
        return loss

    grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters)

    def train_step(data, label):
        marks["start"] = (time.perf_counter(), time.thread_time())
        loss, grads = grad_fn(data, label)
        marks["backward"] = (time.perf_counter(), time.thread_time())
        optimizer(grads)
        return loss

    if not args.describe:
        runtime.Runtime._describe_and_queue = lambda *a, **k: None
        runtime.Runtime.record_items = lambda *a, **k: None  # gradients of node hooks (one call each)
    variants = _variants(args.baseline)
    observed = [0]
    for cls in variants.values():
        if cls is not None:
            _timed_observe(cls, observed)
    config = overhead.write_config(tempfile.mkdtemp(prefix="msprobe_bwd_split_"),
                                   {"task": "statistics", "level": args.level})
    debugger = PrecisionDebugger(config_path=config)
    rows = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in range(args.rounds + 2):  # 2 warm-up rounds
        for name, cls in variants.items():
            data, label = (Tensor(a) for a in batches[r % len(batches)])
            if cls is not None:
                calls.BackwardProbe = cell.BackwardProbe = cls
                debugger.start(net)
            observed[0] = 0
            train_step(data, label).asnumpy()
            if cls is not None:
                debugger.stop()
                debugger.step()
            if r < 2:
                continue
            (s, sc), (f, fc), (b, bc) = marks["start"], marks["forward"], marks["backward"]
            row = rows[name]
            for key, value in (("fw", f - s), ("fw cpu", fc - sc), ("bw", b - f), ("bw cpu", bc - fc),
                               ("observe", observed[0] / 1e9)):
                row[key].append(value * 1e3)
    medians = {name: {k: statistics.median(v) for k, v in row.items()} for name, row in rows.items()}
    print(f"level {args.level}, TinyLM, median of {args.rounds} rounds, ms per step (excess over off)"
          + ("" if args.describe else "; statistics not computed"))
    for name, row in medians.items():
        print(f"{name:11s} " + "  ".join(f"{k} {v:6.1f} ({v - medians['off'][k]:+5.1f})"
                                         for k, v in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
