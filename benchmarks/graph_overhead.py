"""Per-step overhead of GRAPH_MODE L0 (statistics) on CPU: LeNet on digits (examples/models.py).

    .venv/bin/python benchmarks/graph_overhead.py [--pairs 3] [--steps 30]

The probes are compiled into the graph, so tool-off and tool-on cannot share a process: each run is a
fresh ``tests/scripts/graph_worker.py`` process (``value_and_grad`` + SGD loop, batch 32), runs
alternate off/on. Per run: median wall time and median CPU time of the process (all its threads,
``time.process_time``) of steps 3.. (the first steps compile); tool-on steps include
``start``/``stop``/``step`` (writing the step's JSON). Reported: medians and the median of the
per-pair ratios, wall and CPU (on a shared machine the CPU ratio is the steadier one).
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


def run(tool: str, steps: int, dump: str) -> tuple:
    """``(wall ms, CPU ms)`` per step of one worker run (medians of steps 3..)."""
    out = subprocess.run([sys.executable, WORKER, "graph", tool, dump, "--steps", str(steps)],
                         capture_output=True, text=True, timeout=600, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return tuple(statistics.median(result[key][3:]) * 1e3 for key in ("times", "cpu"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            off = run("off", args.steps, os.path.join(tmp, f"off{i}"))
            on = run("on", args.steps, os.path.join(tmp, f"on{i}"))
            pairs.append((off, on))
            print(f"pair {i}: off {off[0]:.2f} ms/step ({off[1]:.2f} ms CPU), on {on[0]:.2f} ms/step "
                  f"({on[1]:.2f} ms CPU), ratio {on[0] / off[0]:.2f} (CPU {on[1] / off[1]:.2f})", flush=True)
    med = statistics.median
    print(f"GRAPH_MODE L0 statistics (LeNet, 7 Cells, 9 Cell calls/step): off {med(p[0][0] for p in pairs):.2f} "
          f"ms/step, on {med(p[1][0] for p in pairs):.2f} ms/step, ratio {med(p[1][0] / p[0][0] for p in pairs):.2f}x; "
          f"CPU off {med(p[0][1] for p in pairs):.2f} ms/step, on {med(p[1][1] for p in pairs):.2f} ms/step, "
          f"ratio {med(p[1][1] / p[0][1] for p in pairs):.2f}x")


if __name__ == "__main__":
    main()
