"""Memory of watch mode over a long run: is it bounded by the history size, or does it grow with steps?

    .venv/bin/python benchmarks/watch_memory.py                 # 500 steps, off / watch-L0 / watch-L1
    .venv/bin/python benchmarks/watch_memory.py --steps 200 --only watch-L1 --json out.json
    .venv/bin/python benchmarks/watch_memory.py --steps 300 --only off,L1,watch-L1   # plain L1 dump beside

Method: one fresh process per configuration trains the TinyLM of ``benchmarks/overhead.py`` (same
model, data and synchronous launch) for ``--steps`` steps, with ``start(net)``/``stop()``/``step()``
around every step when the tool is on (watch mode stays on for the whole run, history 1024 records).
Every ``--every`` steps the process notes its resident set size (``VmRSS`` of ``/proc/self/status``).
Reported per configuration: peak RSS (``ru_maxrss``), RSS after the first ``--settle`` steps (when
kernels are compiled and the history is full), RSS at the end, and the growth between the two per
100 steps. Bounded memory shows as a growth near zero (what the allocator returns varies by a few MB).
The tool-off process is the baseline for the ratio of peaks.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import overhead  # noqa: E402  (the same workload and config writer)

#: name -> config (None: tool off); plain L0/L1 dumps (every step written) for comparison
CONFIGS = {"off": None, **{name: overhead.CONFIGS[name][1] for name in ("watch-L0", "watch-L1", "L0", "L1")}}
DEFAULT = "off,watch-L0,watch-L1"


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def worker(name: str, steps: int, every: int, directory: str) -> dict:
    net, batches, train_step = overhead._setup()
    dbg = None
    if CONFIGS[name] is not None:
        from msprobe.mindspore import PrecisionDebugger

        dbg = PrecisionDebugger(config_path=overhead.write_config(directory, CONFIGS[name]))
    samples = []
    for i in range(steps):
        x, y = batches[i % len(batches)]
        if dbg is not None:
            dbg.start(net)
        loss = train_step(x, y)
        if dbg is not None:
            dbg.stop()
            dbg.step()
        loss.asnumpy()
        if (i + 1) % every == 0:
            samples.append((i + 1, round(_rss_mb(), 1)))
    written = sum(len(files) for _, _, files in os.walk(os.path.join(directory, "dump")))
    return {"samples": samples, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "files_written": written}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--settle", type=int, default=100, help="steps before the growth is measured")
    parser.add_argument("--only", default=DEFAULT, help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        with tempfile.TemporaryDirectory() as d:
            print(json.dumps(worker(args.worker, args.steps, args.every, d)))
        return
    results = {}
    for name in args.only.split(","):
        out = subprocess.run([sys.executable, __file__, "--worker", name, "--steps", str(args.steps),
                              "--every", str(args.every)], check=True, capture_output=True, text=True)
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    base = results.get("off", {}).get("peak_mb")
    print(f"{'config':<10} {'peak MB':>8} {'x off':>6} {'RSS@' + str(args.settle):>8} {'RSS@end':>8} "
          f"{'MB/100 steps':>13} {'files':>6}")
    for name, r in results.items():
        settled = next(mb for step, mb in r["samples"] if step >= args.settle)
        end_step, end = r["samples"][-1]
        growth = (end - settled) / max(end_step - args.settle, 1) * 100
        ratio = f"{r['peak_mb'] / base:.3f}" if base else "-"
        print(f"{name:<10} {r['peak_mb']:>8.1f} {ratio:>6} {settled:>8.1f} {end:>8.1f} {growth:>13.2f} "
              f"{r['files_written']:>6}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
