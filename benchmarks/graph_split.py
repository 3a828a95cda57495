"""Where the main thread's time goes in a GRAPH_MODE L0 step of LeNet (examples/models.py): thread CPU
(``time.thread_time``) of ``start()``/the training step/``stop()``/``step()`` and of the tool's
functions inside them, per step.

    .venv/bin/python benchmarks/graph_split.py [--steps 300] [--dump-dir DIR]

The functions listed in :data:`PARTS` are wrapped (each call adds ~1 us of its own) and their thread
CPU summed; nested functions are counted in their callers too, so the lines overlap. The first 20
steps (compilation, the drain recipes) are left out. Prints the load average with the figures.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: (module, class or None, function names) wrapped
PARTS = (
    ("msprobe.mindspore.service", "DumpService", ("_start", "_install", "_stop")),
    ("msprobe.engine.runtime", "Runtime", ("open_step", "write_files", "flush_quietly", "end_step",
                                           "close_writer", "queue_graph_records", "queue_graph_lines",
                                           "_read_host_copies", "_queue_lines", "parameter_leaves")),
    ("msprobe.engine.writer", "StepWriter", ("__init__", "append", "write", "close")),
    ("msprobe.capture.cells.graph_cell", "GraphDump", ("wait", "begin_step", "end_step")),
    ("msprobe.capture.cells.graph_cell", "GraphCellCapture", ("drain", "take_reports", "snapshot_parameters",
                                                                "_drain_key")),
    ("msprobe.capture.cells.graph_cell", "_Recipe", ("queue",)),
    ("msprobe.engine.step_files", None, ("write_step",)),
    ("msprobe.engine.runtime", None, ("encode_batch", "replay_batch", "materialize")),
    ("msprobe.engine.writer", None, ("atomic_write_documents",)),
    ("msprobe.read.report", None, ("step_reports", "without_empty_backward")),
    ("msprobe.engine.writer", "StepWriter", ("replayed",)),
)


def wrap(owner, name: str, label: str, spent: dict, calls: dict) -> None:
    """Replace ``owner.name`` by a function adding its thread CPU (ns) to ``spent[label]`` (nothing
    when the tree measured has no such function: the script also measures older trees)."""
    original = getattr(owner, name, None)
    if original is None:
        return
    clock = time.thread_time_ns

    def timed(*args, **kwargs):
        t = clock()
        try:
            return original(*args, **kwargs)
        finally:
            spent[label] += clock() - t
            calls[label] += 1

    setattr(owner, name, timed)


def wrap_parts(parts) -> tuple:
    """Wrap every function of ``parts`` (``(module, class or None, names)`` rows, as :data:`PARTS`)
    with :func:`wrap`; returns ``(spent, calls)``: label -> thread CPU ns, label -> calls."""
    import importlib

    spent, calls = collections.defaultdict(int), collections.defaultdict(int)
    for module, cls, names in parts:
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        for name in names:
            wrap(owner, name, f"{cls or module.rsplit('.', 1)[-1]}.{name}", spent, calls)
    return spent, calls


def lenet_l0(dump_dir: str | None, level: str = "L0"):
    """``(net, batches, grad_fn, opt, debugger)``: LeNet in GRAPH_MODE on the digits (batch 32), its
    ``value_and_grad`` and SGD, and a statistics debugger at ``level`` writing under ``dump_dir``."""
    import mindspore as ms
    from mindspore import Tensor, nn

    from examples.models import LeNet, configure_cpu, load_digits_dataset, set_seed
    from msprobe.mindspore import PrecisionDebugger

    configure_cpu(True)
    ms.set_context(mode=ms.GRAPH_MODE)
    batches = [(Tensor(x), Tensor(y)) for x, y in load_digits_dataset(batch_size=32)]
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    set_seed(1234)
    net = LeNet()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)

    def forward(x, y):  # a named function: graph compilation parses it from its source
        return loss_fn(net(x), y)

    debugger = PrecisionDebugger(dump_path=tempfile.mkdtemp(prefix="msprobe_graph_", dir=dump_dir),
                                 task="statistics", level=level)
    return net, batches, ms.value_and_grad(forward, None, opt.parameters), opt, debugger


def dumped_step(setup: tuple, batch: tuple) -> tuple:
    """One dumped training step of :func:`lenet_l0`'s ``setup`` on ``batch`` ``(x, y)``: main-thread
    CPU seconds of ``start()``, the training step, ``stop()``, ``step()``."""
    net, _, grad_fn, opt, debugger = setup
    clock = time.thread_time
    t0 = clock()
    debugger.start(net)
    t1 = clock()
    loss, grads = grad_fn(*batch)
    opt(grads)
    float(loss.asnumpy())
    t2 = clock()
    debugger.stop()
    t3 = clock()
    debugger.step()
    return t1 - t0, t2 - t1, t3 - t2, clock() - t3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--dump-dir", default=None)
    args = ap.parse_args()
    spent, calls = wrap_parts(PARTS)
    setup = lenet_l0(args.dump_dir)
    batches = setup[1]
    parts = {k: [] for k in ("start", "train", "stop", "step")}
    warm = 20
    with contextlib.redirect_stdout(io.StringIO()):  # "dump.json is at ..." of every step
        for i in range(args.steps + warm):
            if i == warm:
                spent.clear()
                calls.clear()
            times = dumped_step(setup, batches[i % len(batches)])
            if i >= warm:
                for key, seconds in zip(parts, times):
                    parts[key].append(seconds * 1e3)
    n = args.steps
    print(f"load average {os.getloadavg()[0]:.1f}; main-thread CPU per step (mean ms): " + ", ".join(
        f"{k} {statistics.mean(v):.3f}" for k, v in parts.items())
        + f"; tool (start+stop+step) {sum(statistics.mean(parts[k]) for k in ('start', 'stop', 'step')):.3f}")
    for label, ns in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {label:40s} {ns / n / 1e6:7.3f} ms/step ({calls[label] / n:.1f} calls)")


if __name__ == "__main__":
    main()
