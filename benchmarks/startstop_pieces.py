"""Where the training thread's CPU goes inside ``start()``/``stop()``/``step()`` of a TinyLM step
(``overhead.py``'s benchmark LM, synchronous launch), per step: thread CPU (``time.thread_time``) of
the three calls and of the tool's functions inside them.

    PYTHONPATH=. .venv/bin/python benchmarks/startstop_pieces.py [--level L0] [--idle] [--steps 200]

``--idle``: the config's ``list`` selects nothing (every hook installed and running; only the
``construct.json`` edges are recorded). ``--prepay``: between the training step and ``stop()``, one
``malloc(4096)``/``free`` through ctypes (timed apart as ``prepay``): the first allocation of 1 KB or
more after a training step consolidates glibc's fast bins of the chunks MindSpore freed in it, a cost
that otherwise lands on the first such allocation inside ``stop()``. The functions in :data:`PARTS` are wrapped as in
``graph_split.py`` (each call adds ~1 us; nested functions count in their callers too). The first
10 steps are left out. Prints the load average with the figures.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import overhead  # noqa: E402
from graph_split import wrap_parts  # noqa: E402

#: (module, class or None, function names) wrapped
PARTS = (
    ("msprobe.mindspore.service", "DumpService", ("_start", "_install", "_stop", "step")),
    ("msprobe.engine.runtime", "Runtime", ("open_step", "write_files", "flush_quietly", "end_step",
                                           "close_writer", "_reset_step", "begin_capture", "end_capture")),
    ("msprobe.engine.writer", "StepWriter", ("__init__", "append", "write", "close")),
    ("msprobe.capture.cells.cell", "CellCapture", ("install", "_remove", "_hook_parameters")),
    ("msprobe.engine.step_files", None, ("write_step",)),
    ("msprobe.engine.runtime", None, ("encode_batch", "materialize")),
    ("msprobe.engine.flush", None, ("release_tensors",)),
    ("msprobe.engine.messages", None, ("announce",)),
    ("msprobe.read.report", None, ("step_reports", "without_empty_backward")),
    ("msprobe.engine.layout", None, ("clear_for",)),
    ("msprobe.engine.writer", None, ("atomic_write_documents",)),
    ("os", None, ("makedirs", "listdir", "mkdir")),
    ("msprobe.engine.writer", "StepWriter", ("_header_line", "replayed", "release_live_state")),
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--level", default="L0")
    ap.add_argument("--idle", action="store_true")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--prepay", action="store_true")
    args = ap.parse_args()
    spent, calls = wrap_parts(PARTS)
    net, batches, train_step = overhead._setup()
    spec = {"task": "statistics", "level": args.level}
    if args.idle:
        spec["list"] = ["Cell.selects.nothing"]
    from msprobe.mindspore import PrecisionDebugger

    dbg = PrecisionDebugger(config_path=overhead.write_config(tempfile.mkdtemp(prefix="msprobe_ss_"), spec))
    parts = {k: [] for k in ("start", "train", "prepay", "stop", "step")}
    import ctypes

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    clock, warm = time.thread_time, 10
    with contextlib.redirect_stdout(io.StringIO()):  # "dump.json is at ..." of every step
        for i in range(args.steps + warm):
            if i == warm:
                spent.clear()
                calls.clear()
            x, y = batches[i % len(batches)]
            t = [clock()]
            dbg.start(net)
            t.append(clock())
            train_step(x, y).asnumpy()
            t.append(clock())
            if args.prepay:
                libc.free(libc.malloc(4096))
            t.append(clock())
            dbg.stop()
            t.append(clock())
            dbg.step()
            t.append(clock())
            if i >= warm:
                for j, key in enumerate(parts):
                    parts[key].append((t[j + 1] - t[j]) * 1e3)
    n = args.steps
    print(f"{args.level}{' idle' if args.idle else ''}{' prepay' if args.prepay else ''} load average {os.getloadavg()[0]:.1f}; training-thread "
          "CPU per step (median ms): " + ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in parts.items()))
    for label, ns in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {label:36s} {ns / n / 1e6:7.3f} ms/step ({calls[label] / n:.1f} calls)")
    dbg.service.close()


if __name__ == "__main__":
    main()
