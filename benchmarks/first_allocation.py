"""What the first allocation after a TinyLM training step costs (``overhead.py``'s benchmark LM,
synchronous launch, no tool): the first ``orjson.dumps`` call against the second and other first calls,
and the first C ``malloc``/``free`` by size.

    PYTHONPATH=. .venv/bin/python benchmarks/first_allocation.py [--steps 30]

After a training step, in turn: ``json.dumps`` of a small dict, ``orjson.dumps({})`` twice; after
another, an ``ops.add`` on two elements then ``orjson.dumps({})``; after another, ``malloc(4096)``
(ctypes) then ``orjson.dumps({})``; and after one more step per size in :data:`SIZES`, ``malloc(size)``
then ``malloc(4096)``. Prints the median training-thread CPU (``time.thread_time_ns``) of each call in
microseconds and the load average.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import overhead  # noqa: E402


#: bytes of the first C allocation after a step (glibc serves up to 1008 from its small bins)
SIZES = (64, 512, 1100, 4096, 200000)


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
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]

    def big_malloc():
        libc.free(libc.malloc(4096))

    rows = {k: [] for k in ("json first", "orjson first", "orjson second", "orjson after ops.add",
                            "malloc(4096) then orjson", "orjson after it")}
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
        for size in SIZES:
            train_step(x, y).asnumpy()
            first = cpu_us(lambda: libc.free(libc.malloc(size)))
            then = cpu_us(big_malloc)
            if i >= 3:
                rows.setdefault(f"malloc({size}) first", []).append(first)
                rows.setdefault(f"malloc({size}), then 4096", []).append(then)
        if i >= 3:
            for key, value in zip(rows, cells + (after_op,) + after_malloc):
                rows[key].append(value)
    print(f"load average {os.getloadavg()[0]:.1f}; thread CPU per call after a training step "
          f"(median of {args.steps}, us):")
    for key, values in rows.items():
        print(f"  {key:26s} {statistics.median(values):8.1f}")


if __name__ == "__main__":
    main()
