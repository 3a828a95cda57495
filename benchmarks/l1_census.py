"""Census of the recorded API and Primitive calls of dumped steps by the path each takes: which
calls the compiled per-call path records whole, which fall back to Python and why, and the training
thread's CPU time per class.

    .venv-mindformers/bin/python benchmarks/l1_census.py [--model llama] [--level L1] [--steps 3]
    .venv/bin/python benchmarks/l1_census.py --model tiny
    .venv-mindformers/bin/python benchmarks/l1_census.py --steps 40 --probe-objects

The model, batches and train step are those of ``benchmarks/llama_split.py`` (``--model llama``: the
mindformers ``LlamaForCausalLM`` of ``tests/scripts/thirdparty_worker.py``; ``tiny``: the TinyLM of
``benchmarks/overhead.py``), ``ms.set_device("CPU"); ms.runtime.launch_blocking()``. After 2 dumped
warm-up steps, ``--steps`` dumped steps are counted.

Each recorded call goes through a Python shim around the recorder (``CallRecorder.fast_record`` and
``CallRecorder.call``), which times it (training-thread CPU, ``time.thread_time_ns``) less the
original's own time, and notes which parts of the recorder ran:

* forward path: ``C`` (``hotpath.ext.Recorder`` queued the call itself), ``C+finish`` (the compiled
  recorder handed the output to ``CallRecorder._finish``: an output it does not describe, such as a
  dict or a namedtuple; the output's kind is given), ``C+python`` (its inputs could not be described in C:
  ``CallRecorder.fast_call``), ``C+general`` (a recomputed forward or a failed dump: ``_call``),
  ``general`` (not a fast-path API: in-place, compiled region, collective);
* backward observation: ``no gradient`` (none recorded), ``C`` (the compiled recorder, or
  ``observe_plain``, hooked it), or the Python branch of ``BackwardProbe.observe`` that did
  (``single``, ``alias``, ``walk``, ``no hook``);
* values described by the Python fallback (``describe_other``) inside the compiled describer, by type.

The figures of trees whose recorder makes a ``BackwardProbe`` for every call include the shim's wrappers of
``BackwardProbe.__init__`` and ``observe`` (≈1 µs each): compare trees with ``--probe-objects``, which runs
both ways in one process. Gradient hooks firing in the backward (``Runtime.record_items``, ``record_item`` and the Python
closures' ``_record``) are timed per class of the call that registered them. The shim costs ≈1–2 µs
per call, so per-call figures are upper bounds; the counts are exact.
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
sys.path.insert(0, HERE)


class Census:
    """What the shim and the patched recorder parts note per call and per class."""

    def __init__(self):
        self.counting = False
        self.variant = ""                # prefix of the class names (--probe-objects: which way this step ran)
        self.frames: list = []           # the open calls' notes (calls do not nest: one at most)
        self.by_class = collections.defaultdict(lambda: {"calls": 0, "ns": [], "apis": collections.Counter(), "observe_ns": [],
                                                          "bwd_ns": 0, "bwd_calls": 0})
        self.entry_class: dict = {}      # backward entry -> class of its call
        self.fallback = collections.Counter()
        self.flush_ns = 0                # Runtime.flush, wherever it runs (subtracted from the calls')
        self.flush_in_calls = 0          # the part of it that ran inside recorded calls and hooks
        self.hook_depth = 0

    def note(self, key: str, value=True) -> None:
        if self.frames:
            self.frames[-1][key] = value


def _kind(value) -> str:
    """A short name of a call's output kind."""
    kind = type(value)
    if kind in (tuple, list):
        inner = sorted({type(v).__name__ for v in value})
        return f"{kind.__name__}[{','.join(inner)}]"
    return kind.__name__


def install(census: Census):
    """Patch the recorder's parts before the debugger makes its :class:`CallRecorder`."""
    from msprobe.capture import backward, calls
    from msprobe.engine import runtime as runtime_module
    from msprobe.tensors import hotpath

    clock = time.thread_time_ns
    CallRecorder, BackwardProbe, Runtime = calls.CallRecorder, backward.BackwardProbe, runtime_module.Runtime

    def noting(owner, name, key, value_of=None):
        inner = getattr(owner, name)

        def patched(*args, **kwargs):
            census.note(key, True if value_of is None else value_of(args, kwargs))
            return inner(*args, **kwargs)
        setattr(owner, name, patched)

    # _finish(self, api, fwd, body, slots, edges, args, kwargs, out, probe, raised)
    noting(CallRecorder, "_finish", "finish", lambda a, k: "raised" if a[10] else _kind(a[8]))
    noting(CallRecorder, "fast_call", "python")
    noting(CallRecorder, "_call", "general")
    for name, key in (("_hook_single", "single"), ("_hook_alias_at", "alias"), ("_hook_walk", "walk")):
        noting(BackwardProbe, name, "observe", lambda a, k, key=key: key)
    observe_name = "observe_general" if hasattr(BackwardProbe, "observe_general") else "observe"  # (older trees)
    observe = getattr(BackwardProbe, observe_name)

    def observe_patched(self, args, out, mark=None):
        census.note("observe", "no hook")  # replaced by the branch that hooks, if any
        t = clock()
        try:
            return observe(self, args, out, mark)
        finally:
            census.note("observe_ns", clock() - t)
    setattr(BackwardProbe, observe_name, observe_patched)
    if hotpath.ext is not None:
        plain = hotpath.ext.observe_plain

        def observe_plain(probe, args, out):
            done = plain(probe, args, out)
            census.note("plain", bool(done))
            return done
        hotpath.ext.observe_plain = observe_plain
    fallback = runtime_module.describe_other

    def describe_other(value, depth, slots, snapshot):
        census.fallback[type(value).__name__] += census.counting
        return fallback(value, depth, slots, snapshot)
    runtime_module.describe_other = describe_other

    def timed_backward(name):
        inner = getattr(Runtime, name)

        def patched(self, entry, *args, **kwargs):
            census.hook_depth += 1
            t, flushed = clock(), census.flush_ns
            try:
                return inner(self, entry, *args, **kwargs)
            finally:
                census.hook_depth -= 1
                cls = census.entry_class.get(entry)
                if cls is not None and census.counting and not census.hook_depth:
                    row = census.by_class[cls]
                    row["bwd_ns"] += clock() - t - (census.flush_ns - flushed)
                    row["bwd_calls"] += 1
                    census.flush_in_calls += census.flush_ns - flushed
        setattr(Runtime, name, patched)
    flush = Runtime.flush

    def flush_patched(self, *args, **kwargs):
        t = clock()
        try:
            return flush(self, *args, **kwargs)
        finally:
            census.flush_ns += clock() - t
    Runtime.flush = flush_patched
    timed_backward("record_items")
    timed_backward("record_item")
    probe_init = BackwardProbe.__init__

    def probe_made(self, runtime, entry, want_input, want_output):
        probe_init(self, runtime, entry, want_input, want_output)
        census.note("entry", entry)
    BackwardProbe.__init__ = probe_made

    def shim(real, general: bool, runtime):
        def record(api, original, args, kwargs, inplace=False, **more):
            notes = {"original": 0}
            observed = getattr(real, "observed", 0)  # calls the compiled recorder observed itself

            def timed_original(*a, **k):
                t = clock()
                try:
                    return original(*a, **k)
                finally:
                    notes["original"] += clock() - t
            census.frames.append(notes)
            t, flushed = clock(), census.flush_ns
            try:
                return real(api, timed_original, args, kwargs, inplace, **more)
            finally:
                spent = clock() - t - notes["original"] - (census.flush_ns - flushed)
                census.frames.pop()
                if getattr(real, "observed", 0) != observed:  # no BackwardProbe: its entry from the counter
                    notes["plain"] = True
                    notes["entry"] = f"{api}.{runtime.counters[api] - 1}.backward"
                cls = census.variant + _class_of(notes, general)
                counted = notes.get("counted")  # a call of recorder.call that took fast_record: counted there
                if census.frames:
                    census.frames[-1]["counted"] = True
                if census.counting and not counted:
                    census.flush_in_calls += census.flush_ns - flushed
                    row = census.by_class[cls]
                    row["calls"] += 1
                    row["ns"].append(spent)
                    row["observe_ns"].append(notes.get("observe_ns", 0))
                    row["apis"][api] += 1
                if "entry" in notes:
                    census.entry_class[notes["entry"]] = cls
        return record

    init = CallRecorder.__init__

    def recorder_made(self, runtime):
        init(self, runtime)
        self.fast_record = shim(self.fast_record, False, runtime)
        self.call = shim(self.call, True, runtime)
    CallRecorder.__init__ = recorder_made


def _class_of(notes: dict, general: bool) -> str:
    if general or notes.get("general") and not notes.get("finish"):
        forward = "general" if general else "C+general"
    elif notes.get("python"):
        forward = "C+python"
    elif notes.get("finish"):
        forward = f"C+finish({notes['finish']})"
    else:
        forward = "C"
    if "entry" not in notes:
        backward = "no gradient"
    elif notes.get("plain"):
        backward = "C"
    else:
        backward = notes.get("observe", "not observed")
    return f"forward {forward}, backward {backward}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama", choices=("llama", "tiny"))
    p.add_argument("--level", default="L1", choices=("L1", "mix"))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--apis", type=int, default=6, help="APIs named per class")
    p.add_argument("--probe-objects", action="store_true",
                   help="every other step, the compiled recorder makes a BackwardProbe object for every call under "
                        "a gradient and calls its observe (observe_here off): both ways per class, side by side")
    args = p.parse_args(argv)

    import llama_split

    sys.path.insert(0, llama_split.WORKER_DIR)
    out = tempfile.mkdtemp(prefix="msprobe_l1_census_")
    os.chdir(out)  # importing mindformers writes ./output/log
    import mindspore as ms

    ms.set_device("CPU")
    ms.runtime.launch_blocking()
    census = Census()
    install(census)
    net, opt, batches, loss_of = llama_split._model(args.model)
    grad_fn = ms.value_and_grad(loss_of, None, opt.parameters)
    from msprobe.mindspore import PrecisionDebugger

    debugger = PrecisionDebugger(dump_path=os.path.join(out, "dump"), task="statistics", level=args.level)
    clock = time.thread_time_ns
    step_ns = []
    compiled = debugger.service.recorder.fast_record
    compiled = getattr(compiled, "__closure__", None) and compiled.__closure__  # the shim's cells
    recorder = next((c.cell_contents for c in compiled or () if hasattr(c.cell_contents, "observe_here")), None)
    rounds = args.steps * (2 if args.probe_objects else 1)
    for i in range(rounds + 2):
        census.counting = i >= 2
        if args.probe_objects and recorder is not None:
            recorder.observe_here = bool(i % 2)
            census.variant = "[observed here] " if i % 2 else "[probe objects] "
        t = clock()
        debugger.start(net)
        loss, grads = grad_fn(*batches[i % len(batches)])
        opt(grads)
        debugger.stop()
        debugger.step()
        if census.counting:
            step_ns.append(clock() - t)
        loss.asnumpy()
    debugger.service.close()
    steps = args.steps
    if recorder is not None:
        recorder.observe_here = True
    total_calls = sum(row["calls"] for row in census.by_class.values())
    print(f"{args.model} {args.level}: {total_calls / rounds:.0f} recorded calls per step, dumped step "
          f"{statistics.median(step_ns) / 1e6:.1f} ms training-thread CPU (median of {rounds}); loadavg "
          f"{os.getloadavg()[0]:.2f}")
    print("per step: calls, forward tool ms (less the original), µs/call median (of it in BackwardProbe.observe_general), "
          "gradient hooks ms (calls)")
    rows = sorted(census.by_class.items(), key=lambda kv: -sum(kv[1]["ns"]))
    for cls, row in rows:
        ns = row["ns"]
        print(f"  {row['calls'] / steps:6.0f}  {sum(ns) / steps / 1e6:7.2f} ms  {statistics.median(ns) / 1e3:6.1f} µs"
              f"  (observe {sum(row['observe_ns']) / steps / 1e6:5.2f} ms, {statistics.median(row['observe_ns']) / 1e3:5.1f} µs)"
              f"  bwd {row['bwd_ns'] / steps / 1e6:6.2f} ms ({row['bwd_calls'] / steps:.0f})  {cls}")
        top = ", ".join(f"{api} {n // steps}" for api, n in row["apis"].most_common(args.apis))
        print(f"          {top}")
    if census.fallback:
        print("values described by the Python fallback per step: " +
              ", ".join(f"{k} {v // steps}" for k, v in census.fallback.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
