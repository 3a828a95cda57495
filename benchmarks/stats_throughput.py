"""Throughput of ``compute_stats`` (compiled kernel vs NumPy) against NumPy's copy bandwidth.

    .venv/bin/python benchmarks/stats_throughput.py            # 1e3..1e7 elements, 8 dtypes
    .venv/bin/python benchmarks/stats_throughput.py --quick    # fewer repeats, fewer dtypes
    .venv/bin/python benchmarks/stats_throughput.py --json out.json

For every size and dtype, on one host array of random values (already in memory, as at a flush):

* ``copyto``: ``np.copyto(out, x)`` into a preallocated array: input bytes / time. It reads the
  data once (and writes it once), the physical floor any statistics pass has to pay;
* ``kernel``: ``compute_stats(x)`` with the compiled kernel as the dump runs it (threads for
  tensors of 2**21 elements or more, as many as ``msprobe.tensors.scan.free_cpus()`` finds free);
  ``1t`` and ``Nt``: ``scan(x)`` forced to 1 thread and to ``msprobe.tensors.scan.THREADS`` threads;
* ``numpy``: ``compute_stats(x, backend="numpy")``, the fallback used when the kernel is not built
  (the same chunked NumPy arithmetic as before the kernel existed).

``--cold``: instead, the flush's access pattern read from memory rather than cache, 1 thread against
all of them, beside the bandwidth ``benchmarks/overhead.py`` takes for its floor (:func:`cold_read`).

Each cell is input GB/s = bytes / wall time of the fastest repeat (the machine is shared by other
processes: the fastest repeat is the least disturbed one); ``cpu`` is the CPU time of the process
(all threads) per call in that repeat, beside its wall time. bfloat16 arrays are MindSpore's own
``asnumpy()`` bfloat16 arrays (read as their uint16 bits). The machine is shared: read the figures
of one run side by side, not across runs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from msprobe.tensors import scan as stats_scan  # noqa: E402
from msprobe.tensors.stats import compute_stats  # noqa: E402

SIZES = [10 ** 3, 10 ** 4, 10 ** 5, 10 ** 6, 10 ** 7]
DTYPES = ["float32", "float16", "bfloat16", "float64", "int32", "int64", "uint8", "bool"]
QUICK_DTYPES = ["float32", "float16", "bfloat16", "int64"]


def make_array(dtype: str, n: int) -> np.ndarray:
    values = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 100
    if dtype == "bfloat16":
        import mindspore as ms

        return ms.Tensor(values).astype(ms.bfloat16).asnumpy()
    if dtype == "bool":
        return values > 0
    return values.astype(dtype)


def timed(fn, repeats: int, calls: int):
    """(wall, CPU) seconds per call of the fastest of ``repeats`` runs of ``calls`` calls."""
    fn()
    runs = []
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append(((time.perf_counter() - w0) / calls, (time.process_time() - c0) / calls))
    return min(runs)


def cold_read(total_mb: int = 640, repeats: int = 5) -> None:
    """Print the read bandwidth of a flush's access pattern from memory, not cache: float32 tensors of
    2**21 and 2**20 elements (8 and 4 MB, the larger LM's largest), ``total_mb`` MB in all, each
    scanned once by the kernel with 1 thread and with ``THREADS`` threads for those of 2**21
    elements or more (as the dump does when :func:`msprobe.tensors.scan.free_cpus` finds a core free),
    after reading a 1.2 GB array that pushes them out of the caches (reading, not writing, so no dirty
    lines are written back meanwhile). Beside it ``numpy.add.reduce`` over 100 MB, fastest of 7 (the
    bandwidth ``benchmarks/overhead.py`` takes for its floor: a buffer read again and again, which
    a large last-level cache partly holds) and over the 1.2 GB array once."""
    big = 1 << 21
    sizes = [big, big // 2] * max(1, (total_mb << 20) // (12 << 20))
    tensors = [np.ones(n, np.float32) for n in sizes]
    nbytes = sum(t.nbytes for t in tensors)
    evict = np.ones((1200 << 20) // 4, np.float32)
    hundred = np.ones((100 << 20) // 4, np.float32)
    probe = timed(lambda: np.add.reduce(hundred), 7, 1)[0]
    w0 = time.perf_counter()
    np.add.reduce(evict)
    once = time.perf_counter() - w0
    print(f"numpy add.reduce: 100 MB fastest of 7 {hundred.nbytes / probe / 1e9:.1f} GB/s, "
          f"1.2 GB once {evict.nbytes / once / 1e9:.1f} GB/s; loadavg {os.getloadavg()[0]:.1f}")
    for threads in (1, stats_scan.THREADS) * 2:
        walls, cpus = [], []
        for _ in range(repeats):
            np.add.reduce(evict)
            c0, w0 = time.process_time(), time.perf_counter()
            for t in tensors:
                stats_scan.scan(t, backend="kernel", threads=threads if t.size >= big else 1)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        walls.sort()
        print(f"{len(tensors)} tensors, {nbytes / 1e6:.0f} MB from memory, {threads} thread(s) for 2**21: "
              f"fastest {nbytes / walls[0] / 1e9:.1f} GB/s, median {nbytes / walls[len(walls) // 2] / 1e9:.1f} "
              f"GB/s, CPU {nbytes / min(cpus) / 1e9:.1f} GB/s of process CPU", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int)
    p.add_argument("--json", metavar="OUT")
    p.add_argument("--cold", action="store_true",
                   help="only the flush's pattern read from memory, 1 vs all threads (see cold_read)")
    args = p.parse_args(argv)
    if args.cold:
        cold_read(repeats=args.repeats or 5)
        return 0
    repeats = args.repeats or (3 if args.quick else 7)
    dtypes = QUICK_DTYPES if args.quick else DTYPES
    kernel = stats_scan.KERNEL_AVAILABLE
    print(f"kernel built: {kernel}; THREADS: {stats_scan.THREADS}; loadavg {os.getloadavg()[0]:.1f}; "
          f"GB/s = input bytes / wall time (fastest of {repeats}); cpu = process CPU time per call")
    header = f"{'dtype':9} {'n':>9} {'copyto':>8} {'kernel':>8} {'1t':>7} {str(stats_scan.THREADS) + 't':>7} " \
             f"{'numpy':>8}   {'kernel wall/cpu us':>19} {'numpy wall/cpu us':>19}"
    print(header)
    rows = []
    for dtype in dtypes:
        for n in SIZES:
            arr = make_array(dtype, n)
            out = np.empty_like(arr)
            calls = max(1, int(2e6 // n))
            runs = {"copyto": timed(lambda: np.copyto(out, arr), repeats, calls),
                    "numpy": timed(lambda: compute_stats(arr, backend="numpy"), repeats, calls)}
            if kernel:
                runs["kernel"] = timed(lambda: compute_stats(arr, backend="kernel"), repeats, calls)
                bits = arr.view(np.uint16) if dtype == "bfloat16" else arr
                for threads in (1, stats_scan.THREADS):
                    runs[f"{threads}t"] = timed(lambda: stats_scan.scan(
                        bits, bfloat16=dtype == "bfloat16", backend="kernel", threads=threads), repeats, calls)
            gbs = {k: arr.nbytes / wall / 1e9 for k, (wall, _) in runs.items()}
            row = {"dtype": dtype, "n": n, "bytes": arr.nbytes,
                   **{f"{k} GB/s": round(v, 2) for k, v in gbs.items()},
                   **{f"{k} wall us": round(w * 1e6, 2) for k, (w, _) in runs.items()},
                   **{f"{k} cpu us": round(c * 1e6, 2) for k, (_, c) in runs.items()}}
            rows.append(row)
            kw, kc = runs.get("kernel", (float("nan"), float("nan")))
            nw, nc = runs["numpy"]
            nan = float("nan")
            print(f"{dtype:9} {n:>9.0e} {gbs['copyto']:>8.2f} {gbs.get('kernel', nan):>8.2f} "
                  f"{gbs.get('1t', nan):>7.2f} {gbs.get(f'{stats_scan.THREADS}t', nan):>7.2f} {gbs['numpy']:>8.2f}   "
                  f"{kw * 1e6:>9.1f}/{kc * 1e6:<9.1f} {nw * 1e6:>9.1f}/{nc * 1e6:<9.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"threads": stats_scan.THREADS, "kernel": kernel, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
