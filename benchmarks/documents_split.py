"""CPU time of writing a step's JSON documents (``dump.json``, ``stack.json``, ``construct.json``) into a
fresh step directory, the way ``StepWriter.write`` does, alternating two ways in one process.

    .venv/bin/python benchmarks/documents_split.py [STEP_DIR] [--rounds 40] [--steps 25] [--dump-dir DIR]
    .venv/bin/python benchmarks/documents_split.py --lenet [--rounds 31] [--dump-dir DIR]

``STEP_DIR``: a dumped step directory whose three documents are written again (default: documents of
the sizes of a LeNet GRAPH_MODE L0 step, 8.8 KB, 0.3 KB and 0.6 KB). Per round, ``--steps`` fresh
``step{N}/rank0`` directories (made outside the timing) get the three documents with each way:

* ``named``: per document a temporary ``{name}.tmp{pid}`` written, then renamed over its name;
* ``batch``: :func:`msprobe.format.journal.atomic_write_documents` (one call of the compiled file
  helper: unnamed files linked under their names, one directory descriptor).

Prints the median and mean thread CPU (``time.thread_time``) per step's three documents, and the
median of the per-round ratios, with the load average. ``--lenet``: the same two ways inside whole
GRAPH_MODE L0 steps of LeNet (``StepWriter.write`` switched between them every block of 20 steps):
main-thread CPU of ``stop()`` and of ``start()``+``stop()``+``step()``, medians of the blocks and of
the paired differences.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from msprobe.format.journal import atomic_write_documents, encode_json  # noqa: E402

NAMES = ("dump.json", "stack.json", "construct.json")


def documents(step_dir: str | None) -> list:
    """``[(name, object)]`` of the three documents."""
    if step_dir:
        out = []
        for name in NAMES:
            with open(os.path.join(step_dir, name), encoding="utf-8") as f:
                out.append((name, json.load(f)))
        return out
    leaf = {"type": "mindspore.Tensor", "dtype": "Float32", "shape": [32, 6, 28, 28], "Max": 1.2345678,
            "Min": -1.2345678, "Mean": 0.012345678, "Norm": 12.345678}
    data = {f"Cell.net.layer{i}.Dense.forward.0": {"input_args": [leaf], "input_kwargs": {}, "output": [leaf]}
            for i in range(27)}
    return [("dump.json", {"task": "statistics", "level": "L0", "data": data}),
            ("stack.json", {"0": []}), ("construct.json", {f"Cell.net.layer{i}.Dense.forward.0": None
                                                             for i in range(12)})]


def named(directory: str, docs: list, non_finite: bool = False) -> None:
    """The per-document temporary file and rename."""
    for name, obj in docs:
        path = os.path.join(directory, name)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(encode_json(obj, non_finite))
        os.replace(tmp, path)


def batch(directory: str, docs: list) -> None:
    atomic_write_documents([(os.path.join(directory, name), obj, False) for name, obj in docs])


def lenet(rounds: int, dump_dir: str | None, block: int = 20) -> None:
    """The ``--lenet`` measurement (module docstring)."""
    import contextlib
    import io

    import msprobe.engine.writer as writer_module
    from graph_split import dumped_step, lenet_l0

    def one_by_one(batch):
        for path, obj, non_finite in batch:
            named(os.path.dirname(path), [(os.path.basename(path), obj)], non_finite)

    setup = lenet_l0(dump_dir)
    ways = {"named": one_by_one, "batch": atomic_write_documents}
    stop, tool = {k: [] for k in ways}, {k: [] for k in ways}
    with contextlib.redirect_stdout(io.StringIO()):
        for r in range(rounds + 1):  # round 0 compiles
            for name, way in (ways.items() if r % 2 else reversed(list(ways.items()))):
                writer_module.atomic_write_documents = way
                in_stop = in_tool = 0.0
                for i in range(block):
                    start, _, stop_, step = dumped_step(setup, setup[1][i % len(setup[1])])
                    in_stop += stop_
                    in_tool += start + stop_ + step
                if r:
                    stop[name].append(in_stop / block * 1e3)
                    tool[name].append(in_tool / block * 1e3)
    writer_module.atomic_write_documents = atomic_write_documents
    med = statistics.median
    for name in ways:
        print(f"{name}: stop() {med(stop[name]):.3f} ms, start+stop+step {med(tool[name]):.3f} ms of main-thread "
              "CPU per step (medians of the blocks)")
    print(f"batch - named, median of the paired blocks: stop() {med(b - a for a, b in zip(stop['named'], stop['batch'])):+.3f}"
          f" ms, start+stop+step {med(b - a for a, b in zip(tool['named'], tool['batch'])):+.3f} ms; "
          f"load average {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("step_dir", nargs="?")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--dump-dir", default=None)
    ap.add_argument("--lenet", action="store_true", help="inside GRAPH_MODE LeNet steps (module docstring)")
    args = ap.parse_args()
    if args.lenet:
        return lenet(args.rounds, args.dump_dir)
    docs = documents(args.step_dir)
    root = tempfile.mkdtemp(prefix="msprobe_documents_", dir=args.dump_dir)
    ways = {"named": named, "batch": batch}
    per_step = {k: [] for k in ways}
    ratios = []
    n = 0
    for r in range(args.rounds + 1):  # round 0 warms up
        spent = {}
        for name, way in (ways.items() if r % 2 else reversed(list(ways.items()))):
            dirs = []
            for _ in range(args.steps):
                d = os.path.join(root, f"step{n}", "rank0")
                n += 1
                os.makedirs(d)
                dirs.append(d)
            t = time.thread_time()
            for d in dirs:
                way(d, docs)
            spent[name] = (time.thread_time() - t) / args.steps
            if r:
                per_step[name].append(spent[name] * 1e6)
        if r:
            ratios.append(spent["batch"] / spent["named"])
    for name, values in per_step.items():
        print(f"{name}: median {statistics.median(values):.1f} us, mean {statistics.mean(values):.1f} us "
              "of thread CPU per step's three documents")
    print(f"batch / named: median of {len(ratios)} rounds {statistics.median(ratios):.2f}; "
          f"load average {os.getloadavg()[0]:.1f}; written under {root}")


if __name__ == "__main__":
    main()
