"""The Cells' backward observation with and without the compiled attempt a Cell's earlier calls declined.

    PYTHONPATH=. .venv/bin/python benchmarks/cell_observe_split.py [--rounds 30] [--watch] [--level L0]

One process, ``overhead.py``'s TinyLM step (``ms.set_device("CPU"); ms.runtime.launch_blocking()``),
one debugger dumping every step (statistics). Variants, in blocks of 4 steps (the first step of a
block left out) after one warm-up block each, the order reversed every other round so a drift of the
machine's load hits them alike (``overhead.alternate_blocks``):

* ``off``: the step without the tool;
* ``try each call``: ``BackwardProbe.observe`` tries the compiled common case
  (``hotpath.ext.observe_plain``) at every Cell call, whatever the Cell's earlier calls did (what the
  tool did before);
* ``remembered``: the tool as it is (a Cell whose call declined it goes to ``observe_general`` directly).

``BackwardProbe.observe`` is wrapped in every variant (thread CPU of its calls, ~1 us added per
call). Printed per variant: medians and quartiles of the step's wall and training-thread CPU time
(``time.thread_time``), the CPU spent in ``observe`` per step, the ratios of the medians to ``off``,
and the load average at the start and the end.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import overhead  # noqa: E402

VARIANTS = ("off", "try each call", "remembered")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--level", default="L0")
    p.add_argument("--watch", action="store_true", help="watch mode (default settings)")
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args(argv)

    from msprobe.capture.backward import BackwardProbe
    from msprobe.mindspore import PrecisionDebugger

    load_before = os.getloadavg()
    net, batches, train_step = overhead._setup()
    spec = {"task": "statistics", "level": args.level}
    if args.watch:
        spec["watch"] = {}
    dbg = PrecisionDebugger(config_path=overhead.write_config(tempfile.mkdtemp(prefix="msprobe_observe_"), spec))
    original = BackwardProbe.observe
    variant = ["remembered"]
    spent = [0]

    def observe(self, call_args, out, mark=None, plain=True):
        t = time.thread_time_ns()
        try:
            return original(self, call_args, out, mark, plain or variant[0] == "try each call")
        finally:
            spent[0] += time.thread_time_ns() - t

    BackwardProbe.observe = observe
    step = overhead.step_runner(net, batches, train_step, dbg)

    def one(name: str) -> tuple:
        variant[0] = name
        spent[0] = 0
        wall, cpu = time.perf_counter(), time.thread_time()
        step(name != "off")
        return time.perf_counter() - wall, time.thread_time() - cpu, spent[0] / 1e9

    rows = {v: [] for v in VARIANTS}

    def block(v: str, keep: bool) -> None:
        for k in range(4):
            m = one(v)
            if keep and k:
                rows[v].append(m)

    try:
        overhead.alternate_blocks(block, VARIANTS, args.rounds)
    finally:
        BackwardProbe.observe = original
        dbg.service.close()
    print(overhead.HEADER)
    print(f"level {args.level}{' watch' if args.watch else ''}, {args.rounds} rounds x 3 steps per variant; "
          f"load average {load_before[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")

    def quart(v, i):
        q1, q2, q3 = statistics.quantiles([1e3 * m[i] for m in rows[v]], n=4)
        return q2, q1, q3

    for v in VARIANTS:
        (w, w1, w3), (c, c1, c3), (o, o1, o3) = quart(v, 0), quart(v, 1), quart(v, 2)
        print(f"  {v:14s} wall {w:7.2f} ms [{w1:6.2f}, {w3:6.2f}]   CPU {c:7.2f} ms [{c1:6.2f}, {c3:6.2f}]   "
              f"observe CPU {o:5.2f} ms [{o1:5.2f}, {o3:5.2f}]")
    off_w, off_c = quart("off", 0)[0], quart("off", 1)[0]
    for v in VARIANTS[1:]:
        print(f"  {v:14s} ratio wall {quart(v, 0)[0] / off_w:.3f}x  CPU {quart(v, 1)[0] / off_c:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
