"""Main-thread CPU of a GRAPH_MODE step of LeNet at level mix (or another level), whose training step
MindSpore compiles into one recorded call (``Jit.after_grad``), for the msprobe of a given tree:
``start()`` + the training step + ``stop()`` + ``step()``, thread CPU (``time.thread_time``) per step.

    .venv/bin/python benchmarks/graph_region_split.py --root TREE [--steps 200] [--level mix]

Two trees cannot share a process (one ``msprobe`` package per process), so compare them by running this
script alternately for each tree, several rounds (the figures of a round: median and 10th/90th
percentiles of the steps after the first 20, and the load average). Uses
:func:`graph_split.lenet_l0` and :func:`graph_split.dumped_step` of this tree.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import graph_split  # noqa: E402  (puts this tree's root on sys.path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True, help="the tree whose msprobe is measured")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--level", default="mix")
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.root))  # before msprobe is first imported
    setup = graph_split.lenet_l0(None, args.level)
    batches, warm, spent = setup[1], 20, []
    with contextlib.redirect_stdout(io.StringIO()):  # "dump.json is at ..." of every step
        for i in range(args.steps + warm):
            parts = graph_split.dumped_step(setup, batches[i % len(batches)])
            if i >= warm:
                spent.append(sum(parts) * 1e3)
    import msprobe

    deciles = statistics.quantiles(spent, n=10)
    print(json.dumps({"root": args.root, "msprobe": os.path.dirname(msprobe.__file__), "level": args.level,
                      "steps": args.steps, "median_ms": round(statistics.median(spent), 3),
                      "p10_ms": round(deciles[0], 3), "p90_ms": round(deciles[-1], 3),
                      "load": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
