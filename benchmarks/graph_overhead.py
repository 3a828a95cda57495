"""Per-step overhead of GRAPH_MODE L0 (statistics) on CPU: LeNet on digits (examples/models.py).

    .venv/bin/python benchmarks/graph_overhead.py [--pairs 3] [--steps 30]

The probes are compiled into the graph, so tool-off and tool-on cannot share a process: each run is a
fresh ``tests/scripts/graph_worker.py`` process (``value_and_grad`` + SGD loop, batch 32), runs
alternate off/on. Per run: median wall time of steps 3.. (the first steps compile); tool-on steps
include ``start``/``stop``/``step`` (writing the step's JSON). Reported: medians and the median of
the per-pair ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "scripts", "graph_worker.py")


def run(tool: str, steps: int, dump: str) -> float:
    out = subprocess.run([sys.executable, WORKER, "graph", tool, dump, "--steps", str(steps)],
                         capture_output=True, text=True, timeout=600, check=True)
    times = json.loads(out.stdout.strip().splitlines()[-1])["times"]
    return statistics.median(times[3:]) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    offs, ons, ratios = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            off = run("off", args.steps, os.path.join(tmp, f"off{i}"))
            on = run("on", args.steps, os.path.join(tmp, f"on{i}"))
            offs.append(off)
            ons.append(on)
            ratios.append(on / off)
            print(f"pair {i}: off {off:.2f} ms/step, on {on:.2f} ms/step, ratio {on / off:.2f}", flush=True)
    print(f"GRAPH_MODE L0 statistics (LeNet, 7 Cells, 9 Cell calls/step): off {statistics.median(offs):.2f} "
          f"ms/step, on {statistics.median(ons):.2f} ms/step, ratio {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
