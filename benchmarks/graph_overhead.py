"""Per-step overhead of GRAPH_MODE L0 (statistics) on CPU: LeNet on digits (examples/models.py).

    .venv/bin/python benchmarks/graph_overhead.py [--pairs 3] [--steps 30]
    .venv/bin/python benchmarks/graph_overhead.py --threads [--net transformer] [--rounds 15]

The probes are compiled into the graph, so tool-off and tool-on cannot share a process: each run is a
fresh ``tests/scripts/graph_worker.py`` process (``value_and_grad`` + SGD loop, batch 32), runs
alternate off/on. Per run: median wall time and median CPU time of the process (all its threads,
``time.process_time``) of steps 3.. (the first steps compile); tool-on steps include
``start``/``stop``/``step`` (writing the step's JSON). Reported: medians and the median of the
per-pair ratios, wall and CPU (on a shared machine the CPU ratio is the steadier one).

``--threads``: one process, two copies of the network (same seed), one instrumented, trained in
alternating blocks of 20 steps (each compiles its own graph; the tool-off copy never sees the
tool); per step: wall time and the CPU time of each thread (``/proc/self/task``, by thread name:
``python`` is the main thread, which runs ``start``/``stop``/``step``; MindSpore's
``frontend_queue``/``ActorThread_*``/``KernelThread_*`` run the graphs, and the probes in them).
``--net``: a network of ``tests/matrix_nets.py`` (``transformer``, ``mha``, ``lstm``, ...) instead of
LeNet.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "scripts", "graph_worker.py")


def run(tool: str, steps: int, dump: str) -> tuple:
    """``(wall ms, CPU ms)`` per step of one worker run (medians of steps 3..)."""
    out = subprocess.run([sys.executable, WORKER, "graph", tool, dump, "--steps", str(steps)],
                         capture_output=True, text=True, timeout=600, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return tuple(statistics.median(result[key][3:]) * 1e3 for key in ("times", "cpu"))


def _thread_cpu() -> dict:
    """CPU seconds used so far by this process's threads, summed by thread name."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def threads(net_name: str, rounds: int, block: int = 20) -> None:
    """The ``--threads`` measurement (module docstring)."""
    import contextlib
    import io
    from collections import defaultdict

    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor, nn

    from examples.models import LeNet, configure_cpu, load_digits_dataset, set_seed
    from msprobe.mindspore import PrecisionDebugger

    configure_cpu(True)
    ms.set_context(mode=ms.GRAPH_MODE)
    if net_name == "lenet":
        batches = [(Tensor(x), Tensor(y)) for x, y in load_digits_dataset(batch_size=32)]
        make, loss_fn = LeNet, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    else:
        from matrix_nets import BY_NAME
        spec = BY_NAME[net_name]
        batches = [spec.inputs(np.random.RandomState(0))]
        make, loss_fn = spec.cls, spec.loss

    def setup():
        set_seed(1234)
        net = make()
        opt = nn.SGD(net.trainable_params(), learning_rate=0.05)

        def forward(x, y):  # a named function: graph compilation parses it from its source
            return loss_fn(net(x), y)

        return net, opt, ms.value_and_grad(forward, None, opt.parameters)

    tmp = tempfile.mkdtemp()
    debugger = PrecisionDebugger(dump_path=tmp, task="statistics", level="L0")
    runs = {"off": setup(), "on": setup()}
    cpu = {name: defaultdict(float) for name in runs}
    wall, steps = defaultdict(float), defaultdict(int)
    with contextlib.redirect_stdout(io.StringIO()):  # "dump.json is at ..." of every step
        for r in range(rounds + 1):  # round 0 compiles
            for name, (net, opt, grad_fn) in runs.items():
                before, t0 = _thread_cpu(), time.perf_counter()
                for i in range(block):
                    x, y = batches[i % len(batches)]
                    if name == "on":
                        debugger.start(net)
                    loss, grads = grad_fn(x, y)
                    opt(grads)
                    float(loss.asnumpy())
                    if name == "on":
                        debugger.stop()
                        debugger.step()
                t1, after = time.perf_counter(), _thread_cpu()
                if r:
                    wall[name] += t1 - t0
                    steps[name] += block
                    for thread, seconds in after.items():
                        cpu[name][thread] += seconds - before.get(thread, 0.0)
    for name in runs:
        n = steps[name]
        per = sorted(((v / n * 1e3, k) for k, v in cpu[name].items()), reverse=True)
        print(f"{name}: wall {wall[name] / n * 1e3:.2f} ms/step; CPU {sum(v for v, _ in per):.2f} ms/step = "
              + ", ".join(f"{k} {v:.2f}" for v, k in per if v >= 0.02))
    total = {name: sum(cpu[name].values()) / steps[name] for name in runs}
    print(f"{net_name}: ratio wall {wall['on'] / wall['off']:.2f}x, CPU {total['on'] / total['off']:.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", action="store_true", help="one process, per-thread CPU split (see above)")
    ap.add_argument("--net", default="lenet", help="with --threads: lenet or a tests/matrix_nets.py network")
    ap.add_argument("--rounds", type=int, default=15, help="with --threads: alternating blocks per copy")
    args = ap.parse_args()
    if args.threads:
        return threads(args.net, args.rounds)
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            off = run("off", args.steps, os.path.join(tmp, f"off{i}"))
            on = run("on", args.steps, os.path.join(tmp, f"on{i}"))
            pairs.append((off, on))
            print(f"pair {i}: off {off[0]:.2f} ms/step ({off[1]:.2f} ms CPU), on {on[0]:.2f} ms/step "
                  f"({on[1]:.2f} ms CPU), ratio {on[0] / off[0]:.2f} (CPU {on[1] / off[1]:.2f})", flush=True)
    med = statistics.median
    print(f"GRAPH_MODE L0 statistics (LeNet, 7 Cells, 9 Cell calls/step): off {med(p[0][0] for p in pairs):.2f} "
          f"ms/step, on {med(p[1][0] for p in pairs):.2f} ms/step, ratio {med(p[1][0] / p[0][0] for p in pairs):.2f}x; "
          f"CPU off {med(p[0][1] for p in pairs):.2f} ms/step, on {med(p[1][1] for p in pairs):.2f} ms/step, "
          f"ratio {med(p[1][1] / p[0][1] for p in pairs):.2f}x")


if __name__ == "__main__":
    main()
