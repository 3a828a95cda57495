"""The fixed cost of a dumped step (``start()``, the training step, ``stop()``, ``step()``) with the
parameter-gradient hooks kept registered between dumped steps, against registering and removing them
every step, in one process.

    PYTHONPATH=. .venv/bin/python benchmarks/fixedcost_split.py [--level L0] [--rounds 40] [--block 4] [--idle]

``overhead.py``'s TinyLM step (synchronous launch), one debugger dumping every step. Each round runs
one block of ``--block`` steps per variant (order reversed every other round, so a drift of the
machine's load hits them alike):

* ``off``: the parked capture (and its parameter hooks) removed, then tool-off steps;
* ``kept``: dumped steps as the tool runs them;
* ``per step``: dumped steps whose parameter-gradient hooks are removed after each ``step()``
  (timed as part of it) and so registered again at the next step's first Cell call under a gradient:
  what the tool did before they were kept.

A dumped block's first step (which installs the capture again after the other variants) is left
out. Printed: per variant and phase the median training-thread CPU ms (``time.thread_time``) over the
steps kept (``hook params``: the part of ``train`` spent in ``CellCapture._hook_parameters``), the
excess over ``off``, the quartiles of the whole step, and the load average.
``--idle``: the config's ``list`` selects nothing (every hook installed and running; only the
``construct.json`` edges are recorded).
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

PHASES = ("start", "train", "hook params", "stop", "step", "total")
VARIANTS = ("off", "kept", "per step")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--level", default="L0")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--block", type=int, default=4)
    p.add_argument("--idle", action="store_true")
    args = p.parse_args(argv)
    net, batches, train_step = overhead._setup()
    spec = {"task": "statistics", "level": args.level}
    if args.idle:
        spec["list"] = ["Cell.selects.nothing"]
    from msprobe.mindspore import PrecisionDebugger

    dbg = PrecisionDebugger(config_path=overhead.write_config(tempfile.mkdtemp(prefix="msprobe_fixed_"), spec))
    service, clock = dbg.service, time.thread_time
    from msprobe.capture.cells import cell

    spent = [0.0]  # thread CPU inside CellCapture._hook_parameters (in the training step)
    hook_parameters = cell.CellCapture._hook_parameters

    def timed_hook_parameters(self):
        t0 = clock()
        try:
            return hook_parameters(self)
        finally:
            spent[0] += clock() - t0

    cell.CellCapture._hook_parameters = timed_hook_parameters
    rows = {v: [] for v in VARIANTS}
    counter = [0]

    def block(variant: str, keep: bool) -> None:
        if variant == "off":
            service._release_capture()
        for k in range(args.block):
            x, y = batches[counter[0] % len(batches)]
            counter[0] += 1
            on = variant != "off"
            spent[0] = 0.0
            t = [clock()]
            if on:
                dbg.start(net)
            t.append(clock())
            train_step(x, y).asnumpy()
            t.append(clock())
            if on:
                dbg.stop()
            t.append(clock())
            if on:
                dbg.step()
                if variant == "per step":
                    service._param_hooks.remove()
            t.append(clock())
            if keep and (k or not on):
                rows[variant].append(dict(zip(PHASES, (t[1] - t[0], t[2] - t[1], spent[0], t[3] - t[2],
                                                        t[4] - t[3], t[4] - t[0]))))

    overhead.alternate_blocks(block, VARIANTS, args.rounds)
    print(overhead.HEADER)
    print(f"level {args.level}{' --idle' if args.idle else ''}: training-thread CPU ms per step, median of "
          f"{args.rounds} rounds x {args.block - 1} steps (excess over off); loadavg "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"  {'variant':10s}" + "".join(f"{ph:>17s}" for ph in PHASES) + "   total q1-q3")
    base = {ph: statistics.median(r[ph] for r in rows["off"]) for ph in PHASES}
    for v in VARIANTS:
        cells = []
        for ph in PHASES:
            m = statistics.median(r[ph] for r in rows[v])
            cells.append(f"{1e3 * m:7.2f} ({1e3 * (m - base[ph]):+6.2f})")
        q = statistics.quantiles([r["total"] for r in rows[v]], n=4)
        print(f"  {v:10s}" + "".join(f"{c:>17s}" for c in cells) + f"   {1e3 * q[0]:.2f}-{1e3 * q[2]:.2f}")
    dbg.service.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
