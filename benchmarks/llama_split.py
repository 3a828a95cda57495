"""Where msprobe's cost goes on a mindformers ``LlamaForCausalLM`` step (or the benchmark LM's):
training-thread CPU per dumped step, split by phase and by tool function, in one process.

    .venv-mindformers/bin/python benchmarks/llama_split.py [--level L1] [--rounds 12]
    .venv/bin/python benchmarks/llama_split.py --model tiny --no-timers --baseline REV

The model, batches and train step are those of ``benchmarks/llama_overhead.py``
(``tests/scripts/thirdparty_worker.py llama``), or with ``--model tiny`` the TinyLM, batches and Adam
step of ``benchmarks/overhead.py``; ``ms.set_device("CPU"); ms.runtime.launch_blocking()``.
Tool-off and dumped steps alternate for ``--rounds`` rounds after 2 warm-up rounds; the phases are the
forward (``value_and_grad`` until the network returns the loss), the backward (until ``value_and_grad``
returns), the optimizer, and ``start``/``stop``/``step``. Per tool function (``--timers``), the
training thread's CPU time inside it, less that of the timed functions it calls: a timer costs ≈1 µs per call, so the
dumped step is slower than without them by about the calls counted (the compiled recorder calls
``Runtime._added_to_batch`` and ``Runtime.record_items`` as Python methods, so it calls their timers
too), so compare variants with ``--no-timers``. Medians over the rounds, ms.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER_DIR = os.path.join(ROOT, "tests", "scripts")

#: "module:Class.method" timed by default
TIMERS = ("msprobe.capture.backward:BackwardProbe.observe",
          "msprobe.engine.runtime:Runtime.record_items",
          "msprobe.engine.runtime:Runtime.record_item",
          "msprobe.engine.runtime:Runtime.flush",
          "msprobe.engine.runtime:_host_snapshot",
          "msprobe.capture.calls:CallRecorder._finish",
          "msprobe.capture.calls:CallRecorder._call",
          "msprobe.capture.calls:CallRecorder.fast_call",
          "msprobe.engine.runtime:Runtime._added_to_batch",
          "msprobe.capture.backward:BackwardProbe.__init__",
          "msprobe.format.naming:backward_of",
          "msprobe.engine.stacks:StackTable.of_caller")


def _timed(inner, acc: dict, key: str, nested: list):
    """``inner`` wrapped: the training thread's CPU time inside it, less that of the timed functions it calls,
    added to ``acc[key]`` with a call count."""
    clock = time.thread_time_ns

    def timed(*args, **kwargs):
        nested.append(0)
        t = clock()
        try:
            return inner(*args, **kwargs)
        finally:
            spent = clock() - t
            inside = nested.pop()
            if nested:
                nested[-1] += spent
            cell = acc[key]
            cell[0] += spent - inside
            cell[1] += 1

    return timed


def _module_at(rev: str, path: str):
    """The module at ``path`` as git revision ``rev`` of this repository has it, imported under another name."""
    import subprocess
    import types

    source = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:{path}"], check=True, capture_output=True,
                            text=True).stdout
    module = types.ModuleType(f"baseline_{os.path.basename(path)[:-3]}")
    exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)
    return module


def _model(model: str):
    """(net, optimizer, batches, loss_of(*batch)) of ``--model``: each batch a tuple of Tensors."""
    import mindspore as ms

    if model == "llama":
        import thirdparty_worker  # noqa: E402

        net, opt = thirdparty_worker.build("momentum", "llama")
        return net, opt, [(ms.Tensor(t),) for t in thirdparty_worker.token_batches(4)], net
    sys.path.insert(0, HERE)
    import overhead  # noqa: E402

    net, text, _ = overhead._setup("tiny")
    import models  # noqa: E402 (examples/, put on the path by overhead._setup)

    opt = ms.nn.Adam(net.trainable_params(), learning_rate=3e-3)  # overhead.py's optimizer
    criterion = models.LMCrossEntropy()
    return net, opt, [tuple(ms.Tensor(v) for v in b) for b in text[:4]], lambda x, y: criterion(net(x), y)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--level", default="L1", choices=("L0", "L1", "mix"))
    p.add_argument("--model", default="llama", choices=("llama", "tiny"))
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--timers", default=",".join(TIMERS), help="comma-separated module:Class.method")
    p.add_argument("--no-timers", action="store_true")
    p.add_argument("--baseline", metavar="REV",
                   help="adds the variant 'baseline': BackwardProbe.observe, Runtime.record_items and "
                        "Runtime._added_to_batch as git revision REV has them (the rest of the tool as it is now)")
    p.add_argument("--variants", default="on",
                   help="comma-separated dumped-step variants, run in rotation with the tool-off step: on (the "
                        "tool), no-observe (BackwardProbe.observe does nothing: no gradient hooks), no-items "
                        "(gradient hooks fire, Runtime.record_items and record_item record nothing), copy-parameters "
                        "(a recorded call's Parameters host-copied for the flush instead of read at once), "
                        "scan-at-start (the coverage scan for names bound before start() runs at every start(), "
                        "not only when the capture is installed), probe-objects (the compiled recorder makes a "
                        "BackwardProbe for every call under a gradient and calls its observe, instead of hooking "
                        "the common case itself)")
    args = p.parse_args(argv)

    sys.path.insert(0, WORKER_DIR)
    out = tempfile.mkdtemp(prefix="msprobe_llama_split_")
    os.chdir(out)  # importing mindformers writes ./output/log
    import importlib

    import mindspore as ms

    ms.set_device("CPU")
    ms.runtime.launch_blocking()

    acc = collections.defaultdict(lambda: [0, 0])
    nested: list = []
    timed_keys = {}  # (owner, attribute) -> the timer's key
    if not args.no_timers:
        for spec in args.timers.split(","):
            module, _, qual = spec.partition(":")
            cls, _, meth = qual.rpartition(".")
            owner = importlib.import_module(module)
            for part in cls.split(".") if cls else ():
                owner = getattr(owner, part)
            setattr(owner, meth, _timed(getattr(owner, meth), acc, qual, nested))
            timed_keys[owner, meth] = qual

    net, opt, batches, loss_of = _model(args.model)
    marks = {}

    def forward_fn(*batch):
        loss = loss_of(*batch)
        marks["forward"] = time.thread_time()
        return loss

    grad_fn = ms.value_and_grad(forward_fn, None, opt.parameters)
    from msprobe.mindspore import PrecisionDebugger

    debugger = PrecisionDebugger(dump_path=os.path.join(out, "dump"), task="statistics", level=args.level)
    rows = collections.defaultdict(lambda: collections.defaultdict(list))
    clock = time.thread_time
    from msprobe.capture.backward import BackwardProbe
    from msprobe.engine.runtime import Runtime

    def noop(*_a, **_k):
        return None

    patches = {"on": {}, "no-observe": {(BackwardProbe, "observe"): noop},
               "no-items": {(Runtime, "record_items"): noop, (Runtime, "record_item"): noop}}
    compiled = debugger.service.recorder.fast_record
    if hasattr(compiled, "observe_here"):  # the compiled recorder: every call through a BackwardProbe object
        patches["probe-objects"] = {(compiled, "observe_here"): False}
    variants = args.variants.split(",")
    if args.baseline:
        old = {name: _module_at(args.baseline, path) for name, path in
               (("backward", "msprobe/capture/backward.py"), ("runtime", "msprobe/engine/runtime.py"))}
        patches["baseline"] = {(BackwardProbe, "observe"): old["backward"].BackwardProbe.observe,
                               (Runtime, "record_items"): old["runtime"].Runtime.record_items,
                               (Runtime, "_added_to_batch"): old["runtime"].Runtime._added_to_batch}
        variants.append("baseline")
    real = {target: getattr(*target) for patched in patches.values() for target in patched}
    for patched in patches.values():  # a variant's own version of a timed function is timed too
        for target, value in patched.items():
            if target in timed_keys:
                patched[target] = _timed(value, acc, timed_keys[target], nested)
    for r in range(args.rounds + 2):
        for name in ["off"] + (variants if r % 2 else variants[::-1]):  # each variant first after "off" in turn
            on = name != "off"
            for (owner, attr), value in real.items():
                setattr(owner, attr, value)
            for (owner, attr), value in patches.get(name, {}).items():
                setattr(owner, attr, value)
            tokens = batches[r % len(batches)]
            acc.clear()
            t0 = clock()
            if name == "scan-at-start":
                debugger.service._stale_found = None
            if on:
                debugger.start(net)
                if name == "copy-parameters":
                    debugger.service.runtime._parameters_now = False
            t1 = clock()
            loss, grads = grad_fn(*tokens)
            t2 = clock()
            opt(grads)
            t3 = clock()
            if on:
                debugger.stop()
            t4 = clock()
            if on:
                debugger.step()
            t5 = clock()
            loss.asnumpy()
            if r < 2:
                continue
            row = rows[name]
            f = marks["forward"]
            for key, value in (("start", t1 - t0), ("forward", f - t1), ("backward", t2 - f), ("optimizer", t3 - t2),
                               ("stop", t4 - t3), ("step", t5 - t4), ("total", t5 - t0)):
                row[key].append(value * 1e3)
            if on:
                for key, (ns, calls) in acc.items():
                    row[key].append(ns / 1e6)
                    row[key + " calls"].append(calls)
    debugger.service.close()
    off = {k: statistics.median(v) for k, v in rows["off"].items()}
    print(f"{args.model} {args.level}, training-thread CPU ms per step, median of {args.rounds} rounds; "
          f"loadavg {os.getloadavg()[0]:.2f}")
    for name in variants:
        on = {k: statistics.median(v) for k, v in rows[name].items()}
        print(name)
        for key in ("start", "forward", "backward", "optimizer", "stop", "step", "total"):
            paired = statistics.median(b - a for a, b in zip(rows["off"][key], rows[name][key]))
            print(f"  {key:10s} off {off[key]:7.2f} (minimum {min(rows['off'][key]):7.2f})  on {on[key]:7.2f}  excess {on[key] - off[key]:+7.2f}"
                  f"  (median of the rounds' excess {paired:+7.2f}; minimum {min(rows[name][key]):7.2f})")
        if name != "on" and "on" in rows:  # this variant against the tool as it is, round by round
            for key in ("start", "forward", "backward", "total"):
                diff = sorted(b - a for a, b in zip(rows["on"][key], rows[name][key]))
                q = statistics.quantiles(diff, n=4) if len(diff) > 1 else diff * 3
                print(f"  {key:10s} {name} - on, median of the rounds {statistics.median(diff):+7.2f} "
                      f"(quartiles {q[0]:+.2f} / {q[2]:+.2f})")
        for key in sorted(k for k in on if k not in off and not k.endswith(" calls")):
            calls = on.get(key + " calls", 0)
            print(f"  {key:40s} {on[key]:7.2f} ms  {calls:6.0f} calls  {1e3 * on[key] / max(calls, 1):6.1f} µs/call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
