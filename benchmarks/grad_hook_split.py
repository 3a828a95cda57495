"""Training-thread CPU time of the gradient hooks a dumped step fires, two ways in one process: the tool
(``on``), and the same hooks recording nothing (``no-items``: ``Runtime.record_items`` and ``record_item``
do nothing), so the difference is what queuing a hook's gradients costs, and ``no-items`` what is left:
MindSpore's dispatch of the hook and the hook building its items.

    .venv-mindformers/bin/python benchmarks/grad_hook_split.py [--model llama] [--steps 40]
    .venv/bin/python benchmarks/grad_hook_split.py --model tiny

The model, batches and train step are those of ``benchmarks/llama_split.py``; ``ms.set_device("CPU");
ms.runtime.launch_blocking()``. Dumped L1 steps alternate the ways step by step after 2 warm-up
steps of each. Every autograd-node hook MindSpore runs goes through its Python ``_HookUtils.run_hook``,
which a shim times here (``time.thread_time_ns``, the same shim both ways): the hook's own time, less
any flush that runs inside it (``Runtime.flush`` timed by a second shim), summed per step and per call.
A shim costs ≈1 µs, the same both ways; tensor hooks (an argument returned itself) are not timed.
Medians over the steps, with quartiles of the step-by-step differences against ``on``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama", choices=("llama", "tiny"))
    p.add_argument("--steps", type=int, default=40, help="dumped steps of each way")
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.join(ROOT, "tests", "scripts"))
    out = tempfile.mkdtemp(prefix="msprobe_grad_hook_split_")
    os.chdir(out)  # importing mindformers writes ./output/log
    import mindspore as ms

    ms.set_device("CPU")
    ms.runtime.launch_blocking()
    import llama_split
    from mindspore.common import hook_handle

    from msprobe.engine.runtime import Runtime
    from msprobe.mindspore import PrecisionDebugger

    net, opt, batches, loss_of = llama_split._model(args.model)
    grad_fn = ms.value_and_grad(loss_of, None, opt.parameters)
    debugger = PrecisionDebugger(dump_path=os.path.join(out, "dump"), task="statistics", level="L1")
    clock = time.thread_time_ns
    acc = {"ns": 0, "calls": 0, "flush": 0}
    run_hook, flush = hook_handle._HookUtils.run_hook, Runtime.flush

    def timed_run_hook(hook_dict, hook_args):
        acc["calls"] += 1
        before, t = acc["flush"], clock()
        try:
            return run_hook(hook_dict, hook_args)
        finally:
            acc["ns"] += clock() - t - (acc["flush"] - before)

    def timed_flush(self, *a, **k):
        t = clock()
        try:
            return flush(self, *a, **k)
        finally:
            acc["flush"] += clock() - t

    hook_handle._HookUtils.run_hook = staticmethod(timed_run_hook)
    Runtime.flush = timed_flush
    real = {name: Runtime.__dict__[name] for name in ("record_items", "record_item")}

    def noop(*_a, **_k):
        return None

    ways = {"on": {}, "no-items": {"record_items": noop, "record_item": noop}}
    rows: dict = {name: [] for name in ways}
    names = list(ways)
    for i in range(len(names) * (args.steps + 2)):
        name = names[(i + i // len(names)) % len(names)]  # each way first in turn
        for attr, value in real.items():
            setattr(Runtime, attr, ways[name].get(attr, value))
        acc.update(ns=0, calls=0, flush=0)
        debugger.start(net)
        loss, grads = grad_fn(*batches[i % len(batches)])
        opt(grads)
        debugger.stop()
        debugger.step()
        loss.asnumpy()
        if i >= 2 * len(names):
            rows[name].append((acc["ns"] / 1e6, acc["calls"]))
    for attr, value in real.items():
        setattr(Runtime, attr, value)
    debugger.service.close()
    print(f"{args.model} L1, gradient hooks (autograd-node hooks through run_hook), training-thread CPU per step, "
          f"{args.steps} steps each way; loadavg {os.getloadavg()[0]:.2f}")
    for name, row in rows.items():
        ms_ = [r[0] for r in row]
        calls = statistics.median(r[1] for r in row)
        q = statistics.quantiles(ms_, n=4)
        print(f"  {name:13s} {statistics.median(ms_):6.2f} ms per step (quartiles {q[0]:.2f} / {q[2]:.2f}), "
              f"{calls:.0f} hooks, {1e3 * statistics.median(ms_) / calls:5.1f} µs per hook")
    for name in names[1:]:
        diff = sorted(b[0] - a[0] for a, b in zip(rows["on"], rows[name]))
        q = statistics.quantiles(diff, n=4)
        print(f"  {name} - on, step by step: median {statistics.median(diff):+.2f} ms "
              f"(quartiles {q[0]:+.2f} / {q[2]:+.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
