"""Tensor mode: what the copies before a compiled region (the optimizer's update) cost the training thread.

    .venv/bin/python benchmarks/protect_split.py --model large --rounds 4
    .venv/bin/python benchmarks/protect_split.py --model tiny --rounds 8

One process (the benchmark LM of ``benchmarks/overhead.py``, synchronous launch, L1 ``tensor``).
Before a compiled region runs, the ``.npy`` files not written yet that read tensors' memory in place
are copied (:meth:`msprobe.engine.tensor_files.FileQueue.protect`). Rounds of ``--steps`` steps
alternate three variants: ``off`` (no tool), ``copy all`` (every such file copied, as for a ``jit``
function) and ``region's memory`` (only the files reading the storage of the region Cell's
Parameters or of its tensor arguments, what a Cell's compiled ``construct`` gets). Per step: wall ms,
training-thread CPU ms, the part of it inside ``protect`` and the MB it copied (medians over rounds).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overhead  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(overhead.MODELS), default="large")
    p.add_argument("--steps", type=int, default=2, help="steps per round")
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args(argv)

    net, batches, train_step = overhead._setup(args.model)
    from msprobe.capture import jit
    from msprobe.engine import tensor_files
    from msprobe.mindspore import PrecisionDebugger

    tmp = tempfile.mkdtemp(prefix="msprobe_protect_split_")
    dbg = PrecisionDebugger(config_path=overhead.write_config(tmp, {"task": "tensor", "level": "L1"}))
    region_writes = jit._cell_writes
    protect, copy = tensor_files.FileQueue.protect, tensor_files.FileQueue._copy
    spent = [0.0, 0]  # thread CPU seconds inside protect, bytes copied

    def timed_protect(self, written=None):
        c = time.thread_time()
        try:
            return protect(self, written)
        finally:
            spent[0] += time.thread_time() - c

    def counted_copy(self, arrays):
        spent[1] += sum(a.nbytes for a in arrays)
        return copy(self, arrays)

    tensor_files.FileQueue.protect = timed_protect
    tensor_files.FileQueue._copy = counted_copy
    step = overhead.step_runner(net, batches, train_step, dbg)

    variants = {"off": None, "copy all": lambda obj, a, k: True, "region's memory": region_writes}
    rows = {name: [] for name in variants}
    for _ in range(2):
        step(True)
    for _ in range(args.rounds):
        for name, writes in variants.items():
            if writes is None:
                dbg.service._release_capture()
            else:
                jit._cell_writes = writes
            spent[0], spent[1] = 0.0, 0
            w, c = time.perf_counter(), time.thread_time()
            for _ in range(args.steps):
                step(writes is not None)
            n = args.steps
            rows[name].append(((time.perf_counter() - w) / n, (time.thread_time() - c) / n,
                               spent[0] / n, spent[1] / n))
    jit._cell_writes = region_writes
    print(f"{overhead.describe_model(args.model)}; L1 tensor; median of {args.rounds} rounds x {args.steps} "
          f"steps; loadavg {os.getloadavg()[0]:.1f}")
    print(f"{'variant':16s} {'wall ms':>8s} {'thread ms':>9s} {'protect ms':>10s} {'copied MB':>9s}")
    for name, values in rows.items():
        w, c, t, b = (statistics.median(v) for v in zip(*values))
        print(f"{name:16s} {1e3 * w:8.1f} {1e3 * c:9.1f} {1e3 * t:10.2f} {b / 1e6:9.1f}")
    dbg.service.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
