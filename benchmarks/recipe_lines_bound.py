"""What the journal lines of a GRAPH_MODE LeNet L0 step's recipe drain cost, and what byte templates
could still remove: the lines of one recipe drain (``Runtime._queue_lines``, statistics filled) are
encoded the way the flush does (``flush.encode_batch``, C) and the way a byte template would
(``orjson`` of each leaf, joined with fixed chunks); the making of the lines is timed in the same
steps (thread CPU, minimum and median over the steps): ``made`` = ``_Recipe.queue`` (or, in a tree
before the compiled lines, ``_Recipe.records`` plus ``Runtime.queue_graph_records``) without the
statistics (``_read_host_copies``) and the queueing (``_queue_lines``).

    .venv/bin/python benchmarks/recipe_lines_bound.py [--steps 200] [--dump-dir DIR]

What a template path cannot remove: the statistics of the probes' copies, the journal write, the
replay into the writer's live state (which needs the resolved lines) and the step's documents.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def slots_in_order(value, out: list) -> list:
    """The tensor slots of a journal line's value, in the order its encoding shows their leaves."""
    if type(value) is dict:
        for v in value.values():
            slots_in_order(v, out)
    elif type(value) is list or type(value) is tuple:
        for v in value:
            slots_in_order(v, out)
    elif hasattr(value, "leaf"):
        out.append(value)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--dump-dir", default=None)
    args = ap.parse_args()
    import orjson

    from graph_split import dumped_step, lenet_l0
    from msprobe.capture.cells import graph_cell
    from msprobe.engine import flush, runtime

    clock = time.thread_time_ns
    caught: list = []
    times = {"made": [], "encode": [], "template": [], "lines": [], "slots": []}
    spent = {"inner": 0}

    def timed(owner, name: str, outer: bool):
        original = getattr(owner, name, None)
        if original is None:
            return

        def call(*a):
            t = clock()
            try:
                return original(*a)
            finally:
                spent["outer" if outer else "inner"] += clock() - t
        setattr(owner, name, call)

    for owner, name, outer in ((graph_cell._Recipe, "queue", True), (graph_cell._Recipe, "records", True),
                               (runtime.Runtime, "queue_graph_records", True),
                               (runtime.Runtime, "_read_host_copies", False)):
        timed(owner, name, outer)
    original_qlines = runtime.Runtime._queue_lines

    def qlines(self, writer, lines, *a):
        caught.append(list(lines))
        t = clock()
        try:
            return original_qlines(self, writer, lines, *a)
        finally:
            spent["inner"] += clock() - t

    runtime.Runtime._queue_lines = qlines
    setup = lenet_l0(args.dump_dir)
    warm = 20
    with contextlib.redirect_stdout(io.StringIO()):
        for i in range(args.steps + warm):
            if i == warm:
                for v in times.values():
                    v.clear()
            caught.clear()
            spent.update(outer=0, inner=0)
            dumped_step(setup, setup[1][i % len(setup[1])])
            if i < warm or not caught:
                continue
            times["made"].append(spent["outer"] - spent["inner"])
            lines = max(caught, key=len)
            slots = [s for line in lines for s in slots_in_order(line, [])]
            t = clock()
            text, _, _ = flush.encode_batch(lines)
            times["encode"].append(clock() - t)
            chunks = [b"x"] * (len(slots) + 1)  # the fixed text between the leaves
            dumps = orjson.dumps
            t = clock()
            parts = [chunks[0]]
            for slot, chunk in zip(slots, chunks[1:]):
                parts.append(dumps(slot.leaf))
                parts.append(chunk)
            b"".join(parts)
            times["template"].append(clock() - t)
            times["lines"].append(len(lines) * 1000)
            times["slots"].append(len(slots) * 1000)
    print(f"load average {os.getloadavg()[0]:.1f}; per recipe drain, thread CPU us (min / median):")
    for key, values in times.items():
        print(f"  {key:12s} {min(values) / 1e3:8.1f} {statistics.median(values) / 1e3:8.1f}")


if __name__ == "__main__":
    main()
