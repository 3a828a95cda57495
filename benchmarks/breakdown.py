"""Where the overhead of one level goes: hooks alone, forward data, backward data (statistics).

    .venv/bin/python benchmarks/breakdown.py --level L1          # 15 rounds
    .venv/bin/python benchmarks/breakdown.py --level L0 --rounds 25 --json out.json
    .venv/bin/python benchmarks/breakdown.py --model large --rounds 6   # d_model 512, d_ff 2048

One process, ``ms.set_device("CPU"); ms.runtime.launch_blocking()`` (as ``overhead.py``). Variants run
in turn, two training steps each, for ``--rounds`` rounds (so slow drift of the machine's load hits
them alike); reported: median wall, process-CPU and training-thread CPU ms per step and the excess
over ``off``, the training thread's CPU inside the flush's reading (``materialize``), the excess
outside it, and the process's minor page faults per step:

* ``off``: the bare training step;
* ``hooks only``: the level installed with a ``list`` that selects nothing (``start(net)``, all
  hooks in place and running, nothing recorded; at L1 a list that matches no API also leaves the API
  wrappers out, so this row is the Cell and Primitive part);
* ``forward``: ``data_mode: ["forward"]``;
* ``backward``: ``data_mode: ["backward"]`` (gradients, and at L0 parameter gradients);
* ``all``: the default.

``forward + backward - all`` is the part both share (hooks, stacks, start/stop, flush batches).
Training-thread CPU includes MindSpore's wait for its pool (``ThreadPool::ParallelLaunch`` yields the
CPU in a loop until the pool's share of a kernel is done), so on a loaded machine it moves with the
scheduler's placement of the threads as much as with the tool's work.
"""
from __future__ import annotations

import argparse
import json
import resource
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overhead  # noqa: E402

VARIANTS = {  # name -> (data_mode, list)
    "hooks only": (["all"], ["Cell.selects.nothing"]),
    "forward": (["forward"], []),
    "backward": (["backward"], []),
    "all": (["all"], []),
}


def _debugger(level: str, data_mode: list, names: list):
    from msprobe.mindspore import PrecisionDebugger

    directory = tempfile.mkdtemp(prefix="msprobe_breakdown_")
    config = {"task": "statistics", "dump_path": os.path.join(directory, "dump"), "level": level,
              "statistics": {"scope": [], "list": names, "data_mode": data_mode,
                             "summary_mode": "statistics"}}
    path = os.path.join(directory, "config.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    return PrecisionDebugger(config_path=path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--level", default="L1", choices=("L0", "L1", "mix"))
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--json", metavar="OUT")
    p.add_argument("--model", choices=sorted(overhead.MODELS), default="tiny",
                   help="benchmark LM size (overhead.py's --model)")
    args = p.parse_args(argv)

    net, batches, train_step = overhead._setup(args.model)
    from msprobe.engine import runtime

    in_flush = [0.0]
    materialize = runtime.materialize

    def timed(*a, **k):  # training-thread CPU inside the flush's reading
        c = time.thread_time()
        try:
            return materialize(*a, **k)
        finally:
            in_flush[0] += time.thread_time() - c

    runtime.materialize = timed
    debuggers = {"off": None}
    debuggers.update({name: _debugger(args.level, dm, names) for name, (dm, names) in VARIANTS.items()})

    from models import dumped_step  # examples/, on sys.path after overhead._setup()

    def step(debugger, i: int) -> None:
        dumped_step(net, train_step, batches[i % len(batches)], debugger).asnumpy()

    wall = {k: [] for k in debuggers}
    cpu = {k: [] for k in debuggers}
    thread = {k: [] for k in debuggers}
    flush = {k: [] for k in debuggers}
    faults = {k: [] for k in debuggers}
    for i in range(2):  # warm-up: kernels compiled, plans built
        for debugger in debuggers.values():
            step(debugger, i)
    for _ in range(args.rounds):
        for name, debugger in debuggers.items():
            in_flush[0] = 0.0
            mf = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t, c, th = time.perf_counter(), time.process_time(), time.thread_time()
            for i in range(2):
                step(debugger, i)
            wall[name].append((time.perf_counter() - t) / 2)
            cpu[name].append((time.process_time() - c) / 2)
            thread[name].append((time.thread_time() - th) / 2)
            flush[name].append(in_flush[0] / 2)
            faults[name].append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - mf) / 2)

    print(overhead.HEADER)
    print(f"level {args.level}, {overhead.describe_model(args.model)}, statistics; median of {args.rounds} "
          f"rounds x 2 steps per variant; loadavg {os.getloadavg()[0]:.1f}")
    print("thread = training-thread CPU; flush = its part inside the flush's reading (materialize); "
          "faults = minor page faults of the process")
    print(f"{'variant':12s} {'wall ms':>8s} {'excess':>7s} {'cpu ms':>8s} {'excess':>7s} {'thread':>8s} "
          f"{'excess':>7s} {'flush':>6s} {'excess-flush':>12s} {'faults':>7s}")
    off_w, off_c = statistics.median(wall["off"]), statistics.median(cpu["off"])
    off_t = statistics.median(thread["off"])
    rows = {}
    for name in debuggers:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        th, fl = statistics.median(thread[name]), statistics.median(flush[name])
        mf = statistics.median(faults[name])
        rows[name] = {"wall_ms": 1e3 * w, "wall_excess_ms": 1e3 * (w - off_w),
                      "cpu_ms": 1e3 * c, "cpu_excess_ms": 1e3 * (c - off_c),
                      "thread_ms": 1e3 * th, "thread_excess_ms": 1e3 * (th - off_t), "flush_ms": 1e3 * fl, "minor_faults": mf}
        print(f"{name:12s} {1e3 * w:8.1f} {1e3 * (w - off_w):+7.1f} {1e3 * c:8.1f} {1e3 * (c - off_c):+7.1f} "
              f"{1e3 * th:8.1f} {1e3 * (th - off_t):+7.1f} {1e3 * fl:6.1f} {1e3 * (th - off_t - fl):+12.1f} {mf:7.0f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"header": overhead.HEADER, "level": args.level, "rounds": args.rounds,
                       "results": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
