"""What the first ``orjson.dumps`` call after a TinyLM training step costs (``overhead.py``'s benchmark
LM, synchronous launch, no tool), against the second call and against other first calls.

    PYTHONPATH=. .venv/bin/python benchmarks/orjson_cold.py [--steps 30]

After each training step, in turn: ``json.dumps`` of a small dict, ``orjson.dumps({})`` twice, and
``orjson.dumps({})`` once more after a MindSpore ``ops.add`` on two elements. Prints the median
training-thread CPU (``time.thread_time_ns``) of each call in microseconds and the load average.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import overhead  # noqa: E402


def cpu_us(fn) -> float:
    """Thread CPU of one call of ``fn`` in microseconds."""
    t = time.thread_time_ns()
    fn()
    return (time.thread_time_ns() - t) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    import mindspore as ms
    import orjson
    from mindspore import ops

    net, batches, train_step = overhead._setup()
    small = ms.Tensor([1.0, 2.0])
    import ctypes
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]

    def big_malloc():
        libc.free(libc.malloc(4096))

    rows = {k: [] for k in ("json first", "orjson first", "orjson second", "orjson after ops.add",
                            "malloc(4096) first", "orjson after it")}
    for i in range(args.steps + 3):
        x, y = batches[i % len(batches)]
        train_step(x, y).asnumpy()
        cells = (cpu_us(lambda: json.dumps({"c": "x", "p": None})), cpu_us(lambda: orjson.dumps({})),
                 cpu_us(lambda: orjson.dumps({})))
        train_step(x, y).asnumpy()
        ops.add(small, small).asnumpy()
        after_op = cpu_us(lambda: orjson.dumps({}))
        train_step(x, y).asnumpy()
        after_malloc = (cpu_us(big_malloc), cpu_us(lambda: orjson.dumps({})))
        if i >= 3:
            for key, value in zip(rows, cells + (after_op,) + after_malloc):
                rows[key].append(value)
    print(f"load average {os.getloadavg()[0]:.1f}; thread CPU per call after a training step "
          f"(median of {args.steps}, us):")
    for key, values in rows.items():
        print(f"  {key:22s} {statistics.median(values):8.1f}")


if __name__ == "__main__":
    main()
