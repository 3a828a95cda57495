"""Training-thread CPU per dumped step inside the tool's L0 functions, without a profiler.

    PYTHONPATH=. .venv/bin/python benchmarks/l0_split.py [--level L0] [--watch] [--rounds 20]

cProfile charges its own per-call cost to every Python call, which inflates the tool's many small
functions several times over (e.g. ``consumer_edges``: 1.7 % of a profiled step, i.e. ~1.3 ms, but
0.19 ms per step when its recorded calls are replayed in a loop). This script wraps a fixed list of
functions instead: each wrapper adds ``time.thread_time()`` around the call (inclusive: a function
called inside another is in both rows) and costs ~1 us per call, so rows with many calls are a little
high. One process, ``ms.set_device("CPU"); ms.runtime.launch_blocking()`` (``overhead.py``'s TinyLM
step); each round runs one tool-off step then one dumped step (``start(net)`` / train step /
``stop()`` / ``step()``); printed: medians over ``--rounds`` rounds after 3 warm-up rounds.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import overhead  # noqa: E402


def _timed(fn, label: str, spent: collections.Counter):
    def timed(*args, **kwargs):
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.thread_time() - start
    return timed


def instrument(spent: collections.Counter) -> None:
    """Wrap the functions measured (module attributes and methods, as the tool looks them up)."""
    from msprobe.capture import backward
    from msprobe.capture.cells import cell
    from msprobe.engine import filters, runtime, stacks

    targets = [
        (cell, "watermark", "pre: watermark (view op)"),
        (cell, "first_grad_input", "pre: first_grad_input"),
        (cell, "grad_enabled", "pre: grad_enabled"),
        (stacks.StackTable, "current", "pre: stack key"),
        (filters.Selector, "selects", "selector.selects"),
        (runtime.Runtime, "queue_cell_lines", "queue_cell_lines (pre+post)"),
        (runtime.Runtime, "_describe_parameters", "post: parameters"),
        (runtime.Runtime, "_added_to_batch", "_added_to_batch"),
        (cell, "_own_parameters", "post: _own_parameters"),
        (backward.BackwardProbe, "observe", "post: observe"),
        (backward, "consumer_edges", "post: consumer_edges"),
        (backward.BackwardProbe, "_hook_tensor", "post: tensor hooks"),
        (backward.BackwardProbe, "_record_items", "bw: items"),
        (backward.BackwardProbe, "_slot_value", "bw: parts (sums, items)"),
        (backward, "_sum", "bw: sums"),
        (runtime.Runtime, "record_param_grad", "bw: parameter gradients"),
        (runtime.Runtime, "flush_quietly", "stop: flush"),
        (runtime, "materialize", "stop: statistics (materialize)"),
        (runtime, "_append_lines", "stop: journal"),
        (runtime.Runtime, "_write_step", "stop: step files"),
        (runtime.Runtime, "_reset_step", "step: reset (hooks removed)"),
    ]
    for owner, name, label in targets:
        setattr(owner, name, _timed(getattr(owner, name), label, spent))
    for factory, label in (("_pre_hook", "pre-hooks"), ("_post_hook", "forward hooks")):
        make = getattr(cell.CellCapture, factory)

        def wrapped(self, *args, _make=make, _label=label, **kwargs):
            return _timed(_make(self, *args, **kwargs), _label, spent)
        setattr(cell.CellCapture, factory, wrapped)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--level", default="L0")
    p.add_argument("--watch", action="store_true", help="watch mode (default settings)")
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args(argv)
    net, batches, train_step = overhead._setup()
    spec = {"task": "statistics", "level": args.level}
    if args.watch:
        spec["watch"] = {}
    from msprobe.mindspore import PrecisionDebugger

    dbg = PrecisionDebugger(config_path=overhead.write_config(tempfile.mkdtemp(prefix="msprobe_split_"), spec))
    spent: collections.Counter = collections.Counter()
    instrument(spent)
    x, y = batches[0]

    def dumped() -> dict:
        spent.clear()
        marks = [time.thread_time()]
        dbg.start(net)
        marks.append(time.thread_time())
        loss = train_step(x, y)
        marks.append(time.thread_time())
        dbg.stop()
        marks.append(time.thread_time())
        dbg.step()
        marks.append(time.thread_time())
        loss.asnumpy()
        row = dict(spent)
        row.update({name: marks[i + 1] - marks[i] for i, name in enumerate(("start()", "train step", "stop()", "step()"))})
        return row

    def tool_off() -> float:
        start = time.thread_time()
        train_step(x, y).asnumpy()
        return time.thread_time() - start

    for _ in range(3):
        tool_off()
        dumped()
    offs, rows = [], []
    for _ in range(args.rounds):
        offs.append(tool_off())
        rows.append(dumped())
    print(overhead.HEADER)
    print(f"level {args.level}{' watch' if args.watch else ''}: training-thread CPU ms per step, median of "
          f"{args.rounds} rounds; loadavg {os.getloadavg()[0]:.2f}")
    print(f"  {'tool-off train step':34s} {1e3 * statistics.median(offs):7.2f}")
    for key in sorted({k for row in rows for k in row}):
        print(f"  {key:34s} {1e3 * statistics.median([row.get(key, 0.0) for row in rows]):7.2f}")
    dbg.service.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
