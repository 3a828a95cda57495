"""What reading the model's Parameters at a step's first ``start()`` costs
(:mod:`msprobe.mindspore.step_windows`: the device wait and the read of the smallest Parameters that
let the second window of a step tell a forgotten ``step()``), in one process.

    PYTHONPATH=. .venv/bin/python benchmarks/step_windows_split.py [--level L0] [--rounds 40] [--block 4]

``overhead.py``'s TinyLM step (synchronous launch), one debugger dumping every step (one window per
step, the usual loop). Each round runs one block of ``--block`` steps per variant (order reversed
every other round):

* ``read``: ``start()`` as the tool runs it (waits for the device, reads the Parameters);
* ``skip``: ``StepWindows.window_starts`` replaced by one that only counts the window: what a step
  with one window cost when the Parameters were read only from its second window on.

A block's first step is left out. Printed: per variant the median training-thread CPU ms
(``time.thread_time``) of ``start()`` and of the whole step, with quartiles, the excess of ``read``
over ``skip``, and the load average.
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

VARIANTS = ("read", "skip")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--level", default="L0")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--block", type=int, default=4)
    args = p.parse_args(argv)
    net, batches, train_step = overhead._setup()
    from msprobe.mindspore import PrecisionDebugger
    from msprobe.mindspore.step_windows import StepWindows

    dbg = PrecisionDebugger(config_path=overhead.write_config(
        tempfile.mkdtemp(prefix="msprobe_windows_"), {"task": "statistics", "level": args.level}))
    clock, reading = time.thread_time, StepWindows.window_starts

    def counting(self, step, models, wait):
        if step != self._step:
            self.reset()
            self._step = step
        self._windows += 1

    rows = {v: {"start": [], "step": []} for v in VARIANTS}
    counter = [0]

    def block(variant: str, keep: bool) -> None:
        StepWindows.window_starts = reading if variant == "read" else counting
        for k in range(args.block):
            x, y = batches[counter[0] % len(batches)]
            counter[0] += 1
            t0 = clock()
            dbg.start(net)
            t1 = clock()
            train_step(x, y).asnumpy()
            dbg.stop()
            dbg.step()
            t2 = clock()
            if keep and k:
                rows[variant]["start"].append(t1 - t0)
                rows[variant]["step"].append(t2 - t0)

    overhead.alternate_blocks(block, VARIANTS, args.rounds)
    StepWindows.window_starts = reading
    print(overhead.HEADER)
    print(f"level {args.level}: training-thread CPU ms per step, median of {args.rounds} rounds x "
          f"{args.block - 1} steps; loadavg {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    medians = {}
    for v in VARIANTS:
        line = []
        for phase, values in rows[v].items():
            q = statistics.quantiles(values, n=4)
            medians[v, phase] = statistics.median(values)
            line.append(f"{phase} {1e3 * medians[v, phase]:.3f} (q1-q3 {1e3 * q[0]:.3f}-{1e3 * q[2]:.3f})")
        print(f"  {v:5s} " + ", ".join(line))
    print("  read - skip: " + ", ".join(f"{phase} {1e3 * (medians['read', phase] - medians['skip', phase]):+.3f}"
                                        for phase in rows["read"]))
    dbg.service.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
