"""Cost of one hooked API call (``ops.relu`` on a float32 tensor) vs tensor size, L1 statistics.

    .venv/bin/python benchmarks/per_call_cost.py           # 7 repeats per size
    .venv/bin/python benchmarks/per_call_cost.py --quick   # 3 repeats
    .venv/bin/python benchmarks/per_call_cost.py --json out.json
    .venv/bin/python benchmarks/per_call_cost.py --pure-python   # without the compiled per-call path

Runs with ``ms.set_device("CPU"); ms.runtime.launch_blocking()`` (synchronous launch; the default
asynchronous PyNative pipeline is ~30x slower and very noisy on a 2-core machine).

Split of the cost per call (all medians over repeats; each repeat = one ``start()``/``stop()``/
``step()`` of N calls and one of 4N calls, see ``step us``; the ``N`` column is the short step's):

* ``base``: ``ops.relu(x)`` without the tool;
* ``hook``: extra wall time of the call while the dump runs = time of N hooked calls / N - base
  (wrapper, counters, entry name, stack capture, describing input/output, queueing).  The automatic
  flush thresholds of :mod:`msprobe.engine.runtime` (``FLUSH_SLOTS``/``FLUSH_BYTES``/``FLUSH_SECONDS``)
  are raised *in this process only*, so no flush happens inside the timed calls;
* ``flush``: ``Runtime.flush()`` called explicitly after the N calls, / N; split into ``stats`` (the
  ``materialize`` step: host view + statistics of input and output, timed by wrapping
  ``msprobe.engine.runtime.materialize``) and ``journal`` (the rest: JSON encoding + append);
* ``stop+step``: ``stop()`` + ``step()`` (replay of the journal into dump.json/stack.json/
  construct.json, close), per call;
* ``fixed``: hook + flush + stop+step, the whole cost of one recorded call; ``fixed cpu`` is the same
  in CPU time of the calling thread (``time.thread_time``), much less sensitive to other processes
  competing for the cores than wall time (``base cpu`` is the call's own CPU time);
* ``step us``: what a step costs whatever its number of calls (``start()``, and the parts of
  ``flush()`` and ``stop()`` + ``step()`` that do not grow with the calls: installing and removing the
  wrappers, writing the files). Each repeat runs one step of N calls and one of 4N calls; every
  per-call figure above (except ``base``) is the slope between the two (cost of 4N - cost of N) / 3N,
  ``step us`` the rest, so a per-step cost is not spread over the calls of a short step;
* GB/s: bytes whose statistics were computed (input + output = 2 * n * 4 bytes per call) / stats time;
  ``ref GB/s`` is ``msprobe.tensors.stats.compute_stats`` alone on the same host array, and ``np f32``
  is plain numpy ``max``/``min``/``sum``/``dot`` in float32 (a speed-of-light reference, not exact).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HEADER = ("MindSpore CPU, ms.set_device('CPU') + ms.runtime.launch_blocking() (synchronous launch; "
          "the default async PyNative pipeline is ~30x slower and very noisy on 2 cores)")
SIZES = [10 ** 3, 10 ** 4, 10 ** 5, 10 ** 6, 10 ** 7]


def calls_for(n: int) -> int:
    return max(3, min(200, int(2e7 // n)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int)
    p.add_argument("--json", metavar="OUT")
    p.add_argument("--sizes", help="comma-separated element counts (default: 1e3 ... 1e7)")
    p.add_argument("--pure-python", action="store_true",
                   help="MSPROBE_PURE_PYTHON=1: the Python per-call path instead of msprobe.tensors._hotpath")
    args = p.parse_args(argv)
    if args.pure_python:
        os.environ["MSPROBE_PURE_PYTHON"] = "1"
    repeats = args.repeats or (3 if args.quick else 7)

    import numpy as np
    import mindspore as ms
    from mindspore import Tensor, ops

    ms.set_device("CPU")
    ms.runtime.launch_blocking()

    import msprobe.engine.runtime as rtmod
    from msprobe.tensors import stats
    from msprobe.mindspore import PrecisionDebugger

    rtmod.FLUSH_SLOTS = 10 ** 12
    rtmod.FLUSH_BYTES = 1 << 62
    rtmod.FLUSH_SECONDS = 1e12
    rtmod.FLUSH_DEADLINE = 1e6  # no background flush inside the timed calls either
    timer = {"stats": 0.0}
    original_materialize = rtmod.materialize

    def timed_materialize(*a, **k):
        t = time.perf_counter()
        try:
            return original_materialize(*a, **k)
        finally:
            timer["stats"] += time.perf_counter() - t

    rtmod.materialize = timed_materialize

    tmp = tempfile.mkdtemp(prefix="msprobe_percall_")
    cfg = {"task": "statistics", "dump_path": os.path.join(tmp, "dump"), "rank": [], "step": [],
           "level": "L1", "extra_info": True, "async_dump": False,
           "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}}
    cfg_path = os.path.join(tmp, "config.json")
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    dbg = PrecisionDebugger(config_path=cfg_path)
    rt = dbg.service.runtime

    print(HEADER)
    try:
        from msprobe.tensors import hotpath

        compiled = hotpath.ext is not None
    except ImportError:  # a tree from before the compiled per-call path
        compiled = False

    print(f"ops.relu(float32 x), L1 statistics, no model; {repeats} repeats per size; "
          f"cpu_count={os.cpu_count()}, loadavg={os.getloadavg()[0]:.2f}; compiled per-call path: "
          f"{'yes' if compiled else 'no'}")
    fmt = "{:>9} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8}"
    print(fmt.format("elements", "N", "base us", "hook us", "flush us", "stats us", "journal", "stop+step",
                     "fixed us", "base cpu", "fixed cpu", "step us", "start us", "GB/s", "ref GB/s", "np f32"))
    results = []
    rng = np.random.default_rng(0)
    warm = Tensor(rng.standard_normal(SIZES[0]).astype(np.float32))
    for _ in range(3):  # global warm-up: first stack rendering, first journal, first dump.json
        dbg.start()
        for _ in range(calls_for(SIZES[0])):
            ops.relu(warm)
        dbg.stop()
        dbg.step()
    def cycle(count: int) -> dict:
        """Seconds (totals, not per call) of one dumped step of ``count`` calls of ``ops.relu(x)``."""
        t = time.perf_counter()
        dbg.start()
        begun = time.perf_counter()
        c = time.thread_time()
        for _ in range(count):
            ops.relu(x)
        hooked = time.perf_counter() - begun
        timer["stats"] = 0.0
        t2 = time.perf_counter()
        rt.flush()
        flush = time.perf_counter() - t2
        st = timer["stats"]
        t3 = time.perf_counter()
        dbg.stop()
        dbg.step()
        stopstep = time.perf_counter() - t3
        cpu = time.thread_time() - c  # hooked calls + flush + stop + step
        return {"start": begun - t, "hooked": hooked, "flush": flush, "stats": st, "stopstep": stopstep,
                "cpu": cpu}

    for n in ([int(float(v)) for v in args.sizes.split(",")] if args.sizes else SIZES):
        host = rng.standard_normal(n).astype(np.float32)
        x = Tensor(host)
        calls = calls_for(n)
        for _ in range(3):  # warm-up: kernel, and one full tool cycle
            ops.relu(x).asnumpy()
        dbg.start()
        ops.relu(x)
        dbg.stop()
        dbg.step()
        rows = {k: [] for k in ("base", "hook", "flush", "stats", "journal", "stopstep", "ref", "npf32",
                                "fixed", "base_cpu", "fixed_cpu", "step", "start")}
        for _ in range(repeats):
            t, c = time.perf_counter(), time.thread_time()
            for _ in range(calls):
                ops.relu(x)
            base = (time.perf_counter() - t) / calls
            base_cpu = (time.thread_time() - c) / calls
            short, long = cycle(calls), cycle(4 * calls)
            per_call = {k: (long[k] - short[k]) / (3 * calls) for k in short}
            per_step = {k: short[k] - per_call[k] * calls for k in short}

            arr = x.asnumpy()
            t = time.perf_counter()
            stats.compute_stats(arr)
            ref = time.perf_counter() - t
            t = time.perf_counter()
            arr.max(), arr.min(), arr.sum(), float(np.dot(arr, arr))
            npf32 = time.perf_counter() - t

            hook = per_call["hooked"] - base
            rows["base"].append(base)
            rows["hook"].append(hook)
            rows["flush"].append(per_call["flush"])
            rows["stats"].append(per_call["stats"])
            rows["journal"].append(per_call["flush"] - per_call["stats"])
            rows["stopstep"].append(per_call["stopstep"])
            rows["ref"].append(ref)
            rows["npf32"].append(npf32)
            rows["fixed"].append(hook + per_call["flush"] + per_call["stopstep"])
            rows["base_cpu"].append(base_cpu)
            rows["fixed_cpu"].append(per_call["cpu"] - base_cpu)
            rows["step"].append(per_step["start"] + per_step["flush"] + per_step["stopstep"])
            rows["start"].append(per_step["start"])
        med = {k: statistics.median(v) for k, v in rows.items()}
        stat_bytes = 2 * n * 4
        gbps = stat_bytes / med["stats"] / 1e9 if med["stats"] > 0 else float("nan")
        ref_gbps = n * 4 / med["ref"] / 1e9
        np_gbps = n * 4 / med["npf32"] / 1e9
        us = {k: v * 1e6 for k, v in med.items()}
        results.append({"elements": n, "calls": [calls, 4 * calls], "us": us, "stats_GBps": gbps,
                        "compute_stats_GBps": ref_gbps, "numpy_f32_GBps": np_gbps})
        print(fmt.format(f"{n:.0e}", calls, f"{us['base']:.1f}", f"{us['hook']:.1f}", f"{us['flush']:.1f}",
                         f"{us['stats']:.1f}", f"{us['journal']:.1f}", f"{us['stopstep']:.1f}",
                         f"{us['fixed']:.1f}", f"{us['base_cpu']:.1f}", f"{us['fixed_cpu']:.1f}",
                         f"{us['step']:.0f}", f"{us['start']:.0f}",
                         f"{gbps:.2f}", f"{ref_gbps:.2f}", f"{np_gbps:.2f}"), flush=True)
    dbg.service.close()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"header": HEADER, "repeats": repeats, "compiled": compiled,
                       "results": results}, f, indent=1)
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
