"""Scale of ``msprobe compare``: two 100,000-entry statistics dumps, time and peak memory.

    python benchmarks/compare_scale.py [--entries 100000] [--keep DIR]

Writes two dumps in msprobe's format (``step0/rank0/dump.json`` + ``stack.json`` + ``construct.json``)
with 100,000 entries each (APIs with two tensor inputs and one output: 300,000 records per side),
the golden one with relative noise 1e-6 on every statistic and one extra call in the target halfway
(so alignment has work to do), then runs ``msprobe compare`` on them in a fresh process and reports
its wall time, CPU time (the wall time on a busy machine is mostly waiting for a core: the 1-minute
load average before and after is recorded too) and peak resident memory (``ru_maxrss`` of that
process; imports included; the golden side is read by a spawned worker process meanwhile, whose
CPU time and peak memory are reported separately). Results go to
``benchmarks/results/compare_scale.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
APIS = ["Functional.relu", "Functional.matmul", "Tensor.__add__", "Mint.mul", "Functional.softmax",
        "Functional.layer_norm", "Tensor.__mul__", "Functional.gelu"]


def _leaf(rng, shape, noise=0.0):
    def v(x):
        return x * (1 + noise * rng.uniform(-1, 1))
    mx, mn = rng.uniform(0.5, 3), rng.uniform(-3, -0.5)
    return {"type": "mindspore.Tensor", "dtype": "Float32", "shape": shape, "Max": v(mx), "Min": v(mn),
            "Mean": v(rng.uniform(-0.1, 0.1)), "Norm": v(rng.uniform(10, 100))}


def write_dump(path: str, entries: int, seed: int, noise: float, extra_at: int = -1) -> None:
    rng = random.Random(seed)
    counts, data, construct = {}, {}, {}
    for i in range(entries):
        if i == extra_at:
            data["Functional.dropout.0.forward"] = {"input_args": [_leaf(random.Random(1), [32, 64])],
                                                    "input_kwargs": {}, "output": [_leaf(random.Random(2), [32, 64])]}
        api = APIS[i % len(APIS)]
        n = counts[api] = counts.get(api, -1) + 1
        shape = [32, 64]
        data[f"{api}.{n}.forward"] = {"input_args": [_leaf(rng, shape, noise), _leaf(rng, shape, noise)],
                                      "input_kwargs": {}, "output": [_leaf(rng, shape, noise)]}
        construct[f"{api}.{n}.forward"] = None
    os.makedirs(path, exist_ok=True)
    header = {"task": "statistics", "level": "L1", "framework": "mindspore", "dump_data_dir": None,
              "schema": "msprobe-mindspore/1"}
    with open(os.path.join(path, "dump.json"), "w") as f:
        json.dump({**header, "data": data}, f, separators=(",", ":"))
    frames = ["File train.py, line 10, in step, \n loss = net(x)"]
    with open(os.path.join(path, "stack.json"), "w") as f:
        json.dump({"0": [list(data)[:100], frames]}, f)
    with open(os.path.join(path, "construct.json"), "w") as f:
        json.dump({}, f)


_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
t0, c0 = time.perf_counter(), time.process_time()
from msprobe.compare import compare_to_files
summary = compare_to_files(sys.argv[2], sys.argv[3], sys.argv[4])
elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
children = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"seconds": elapsed, "cpu_seconds": cpu,
                  "worker_cpu_seconds": children.ru_utime + children.ru_stime,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "worker_peak_rss_mb": children.ru_maxrss / 1024,
                  "records": summary["results"][0]["records"],
                  "entries_by_match": summary["results"][0]["entries_by_match"]}))
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--keep", default=None, help="write the dumps here and keep them")
    args = parser.parse_args(argv)
    work = args.keep or tempfile.mkdtemp(prefix="msprobe_compare_scale_")
    target = os.path.join(work, "target", "step0", "rank0")
    golden = os.path.join(work, "golden", "step0", "rank0")
    t0 = time.perf_counter()
    write_dump(target, args.entries, seed=0, noise=0.0, extra_at=args.entries // 2)
    write_dump(golden, args.entries, seed=0, noise=1e-6)
    made = time.perf_counter() - t0
    size_mb = os.path.getsize(os.path.join(target, "dump.json")) / 2**20
    load_before = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, "-c", _CHILD, ROOT, os.path.dirname(os.path.dirname(target)),
                           os.path.dirname(os.path.dirname(golden)), os.path.join(work, "out")],
                          capture_output=True, text=True)
    if proc.returncode:
        print(proc.stderr)
        return 1
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(entries=args.entries, dump_json_mb=round(size_mb, 1), generate_seconds=round(made, 1),
                  python=sys.version.split()[0], cpus=os.cpu_count(),
                  load_average_1min=[round(load_before, 1), round(os.getloadavg()[0], 1)])
    print(json.dumps(result, indent=2))
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    if args.entries == 100_000:
        with open(os.path.join(HERE, "results", "compare_scale.json"), "w") as f:
            json.dump(result, f, indent=2)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
