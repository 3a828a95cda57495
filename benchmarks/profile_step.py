"""cProfile of TinyLM training steps under msprobe (default: L1 statistics with ``start(net)``).

    .venv/bin/python benchmarks/profile_step.py [--level L1] [--steps 3] [--top 25] [--out prof.pstats]
    .venv/bin/python benchmarks/profile_step.py --pyinstrument   # sampling profiler (pip install pyinstrument)
    .venv/bin/python benchmarks/profile_step.py --watch          # watch mode (history 1024) at --level

Runs with ``ms.set_device("CPU"); ms.runtime.launch_blocking()``. After 2 warm-up steps, profiles
``--steps`` full steps (``start(net)`` / train step / ``stop()`` / ``step()``) and prints

* the top functions by own time (tottime) over everything, with % of the profiled wall time;
* msprobe functions by cumulative time (file:function, % of profiled time), i.e. the hotspots of the
  tool itself;
* per msprobe file: own time summed.

cProfile adds per-call overhead to Python functions, so Python-heavy code (the tool) looks somewhat
more expensive than it is; use the percentages for ranking.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import overhead  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--level", default="L1")
    p.add_argument("--task", default="statistics")
    p.add_argument("--no-model", action="store_true")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out")
    p.add_argument("--watch", action="store_true", help="watch mode (default settings) at --level")
    p.add_argument("--pyinstrument", action="store_true",
                   help="sampling profile (pyinstrument, less distortion than cProfile); prints its tree")
    args = p.parse_args(argv)

    net, batches, train_step = overhead._setup()
    tmp = tempfile.mkdtemp(prefix="msprobe_prof_")
    spec = {"task": args.task, "level": args.level}
    if args.watch:
        spec["watch"] = {}
    cfg_path = overhead.write_config(tmp, spec)
    from msprobe.mindspore import PrecisionDebugger

    dbg = PrecisionDebugger(config_path=cfg_path)
    i = 0

    def step():
        nonlocal i
        x, y = batches[i % len(batches)]
        i += 1
        dbg.start() if args.no_model else dbg.start(net)
        loss = train_step(x, y)
        dbg.stop()
        dbg.step()
        loss.asnumpy()

    for _ in range(2):
        step()
    if args.pyinstrument:
        from pyinstrument import Profiler

        prof = Profiler(interval=0.0005)
        prof.start()
        for _ in range(args.steps):
            step()
        prof.stop()
        print(overhead.HEADER)
        print(prof.output_text(unicode=False, color=False, show_all=False))
        dbg.service.close()
        return 0
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    for _ in range(args.steps):
        step()
    prof.disable()
    wall = time.perf_counter() - t
    if args.out:
        prof.dump_stats(args.out)
    st = pstats.Stats(prof)
    total = wall
    print(overhead.HEADER)
    print(f"level {args.level}{' watch' if args.watch else ''}, task {args.task}, start({'' if args.no_model else 'net'}); "
          f"{args.steps} profiled steps, {1000 * wall / args.steps:.0f} ms/step under cProfile")
    rows = []
    for (fname, line, func), (cc, nc, tt, ct, _callers) in st.stats.items():
        rows.append((fname, line, func, nc, tt, ct))

    def short(fname):
        if "/msprobe/" in fname:
            return "msprobe/" + fname.split("/msprobe/", 1)[1]
        if "site-packages/" in fname:
            return fname.split("site-packages/", 1)[1]
        return fname

    print(f"\nTop {args.top} by own time (all code):")
    print(f"{'own %':>6} {'cum %':>6} {'calls/step':>10}  function")
    for fname, line, func, nc, tt, ct in sorted(rows, key=lambda r: -r[4])[:args.top]:
        print(f"{100 * tt / total:6.1f} {100 * ct / total:6.1f} {nc / args.steps:10.0f}  {short(fname)}:{line}:{func}")
    print("\nmsprobe functions by cumulative time:")
    print(f"{'cum %':>6} {'own %':>6} {'calls/step':>10}  function")
    ms_rows = [r for r in rows if "/msprobe/" in r[0]]
    for fname, line, func, nc, tt, ct in sorted(ms_rows, key=lambda r: -r[5])[:args.top]:
        print(f"{100 * ct / total:6.1f} {100 * tt / total:6.1f} {nc / args.steps:10.0f}  {short(fname)}:{line}:{func}")
    per_file = defaultdict(float)
    for fname, line, func, nc, tt, ct in ms_rows:
        per_file[short(fname)] += tt
    print("\nmsprobe own time per file:")
    for f, tt in sorted(per_file.items(), key=lambda kv: -kv[1]):
        print(f"{100 * tt / total:6.1f}%  {f}")
    dbg.service.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
