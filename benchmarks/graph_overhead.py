"""Per-step overhead of GRAPH_MODE L0 (statistics) on CPU: LeNet on digits (examples/models.py).

    .venv/bin/python benchmarks/graph_overhead.py [--rounds 15] [--pairs 3] [--steps 30] [--dump-dir DIR]
    .venv/bin/python benchmarks/graph_overhead.py --mode in-process [--net transformer]

Two figures, each printed on a line of its own (``--mode`` picks one):

* ``in one process`` (the steadier one): one process, two copies of the network (same seed), one
  instrumented, trained in alternating blocks of 20 steps (each compiles its own graph; the tool-off
  copy never sees the tool), round 0 compiles; wall time per step and the CPU time of each thread
  (``/proc/self/task``, by thread name: ``python`` is the main thread, which runs
  ``start``/``stop``/``step``; MindSpore's ``frontend_queue``/``ActorThread_*``/``KernelThread_*`` run
  the graphs, and the probes in them). Ratios: of the totals, and the median and range of the
  per-round ratios (how noisy the machine was).
* ``separate processes``: the probes are compiled into the graph, so here tool-off and tool-on runs
  are fresh ``tests/scripts/graph_worker.py`` processes (``value_and_grad`` + SGD loop, batch 32),
  alternating off/on; per run the median wall and CPU time (all threads, ``time.process_time``) of
  steps 3.. (the first steps compile). Each process lands on a differently loaded machine and
  allocator state, so on a shared machine the per-pair ratios scatter widely (measured 0.78-3.30x
  in one run of 3 pairs): use the in-process figure to compare versions.

Tool-on steps include ``start``/``stop``/``step`` (writing the step's JSON). ``--dump-dir``: where the
dumps go (default: the temporary directory; on a file system where creating a file costs more, each
step pays ~10 such operations: step directory, journal, three documents). ``--net`` (in-process
only): a network of ``tests/matrix_nets.py`` (``transformer``, ``mha``, ``lstm``, ...) instead of LeNet.
``--dormant`` (in-process only): the instrumented copy's steps are all left out of the step list, so
its graph holds the probes but no step is dumped (the cost of the probes while the dump is off).
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


def threads(net_name: str, rounds: int, dump_dir: str | None, block: int = 20, dormant: bool = False) -> None:
    """The in-process measurement (module docstring)."""
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

    tmp = tempfile.mkdtemp(prefix="msprobe_graph_bench_", dir=dump_dir)
    # dormant: a step list no step reaches, so every start(net) is of a step that is not dumped
    debugger = PrecisionDebugger(dump_path=tmp, task="statistics", level="L0", step=[10 ** 6] if dormant else None)
    runs = {"off": setup(), "on": setup()}
    cpu = {name: defaultdict(float) for name in runs}
    wall, steps = defaultdict(float), defaultdict(int)
    rounds_wall: dict = defaultdict(list)  # per round: seconds per block
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
                    rounds_wall[name].append(t1 - t0)
                    steps[name] += block
                    for thread, seconds in after.items():
                        cpu[name][thread] += seconds - before.get(thread, 0.0)
    for name in runs:
        n = steps[name]
        per = sorted(((v / n * 1e3, k) for k, v in cpu[name].items()), reverse=True)
        print(f"{name}: wall {wall[name] / n * 1e3:.2f} ms/step; CPU {sum(v for v, _ in per):.2f} ms/step = "
              + ", ".join(f"{k} {v:.2f}" for v, k in per if v >= 0.02))
    total = {name: sum(cpu[name].values()) / steps[name] for name in runs}
    per_round = sorted(on / off for on, off in zip(rounds_wall["on"], rounds_wall["off"]))
    print(f"dumps written under {os.path.dirname(tmp)} (--dump-dir)")
    print(f"in one process ({net_name}, {rounds} rounds of {block} steps per copy): ratio wall "
          f"{wall['on'] / wall['off']:.2f}x, CPU {total['on'] / total['off']:.2f}x; per-round wall ratio median "
          f"{statistics.median(per_round):.2f}x (range {per_round[0]:.2f}-{per_round[-1]:.2f})", flush=True)


def processes(pairs_wanted: int, steps: int, dump_dir: str | None) -> None:
    """The separate-process measurement (module docstring)."""
    pairs = []
    with tempfile.TemporaryDirectory(prefix="msprobe_graph_bench_", dir=dump_dir) as tmp:
        for i in range(pairs_wanted):
            off = run("off", steps, os.path.join(tmp, f"off{i}"))
            on = run("on", steps, os.path.join(tmp, f"on{i}"))
            pairs.append((off, on))
            print(f"pair {i}: off {off[0]:.2f} ms/step ({off[1]:.2f} ms CPU), on {on[0]:.2f} ms/step "
                  f"({on[1]:.2f} ms CPU), ratio {on[0] / off[0]:.2f} (CPU {on[1] / off[1]:.2f})", flush=True)
        print(f"dumps written under {os.path.dirname(tmp)} (--dump-dir)")
    med = statistics.median
    print(f"separate processes (LeNet, 7 Cells, 9 Cell calls/step, {len(pairs)} pairs): off "
          f"{med(p[0][0] for p in pairs):.2f} ms/step, on {med(p[1][0] for p in pairs):.2f} ms/step, ratio "
          f"{med(p[1][0] / p[0][0] for p in pairs):.2f}x; CPU off {med(p[0][1] for p in pairs):.2f} ms/step, on "
          f"{med(p[1][1] for p in pairs):.2f} ms/step, ratio {med(p[1][1] / p[0][1] for p in pairs):.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["both", "in-process", "processes"], default="both")
    ap.add_argument("--pairs", type=int, default=3, help="separate processes: off/on pairs")
    ap.add_argument("--steps", type=int, default=30, help="separate processes: steps per run")
    ap.add_argument("--threads", action="store_true", help="the same as --mode in-process")
    ap.add_argument("--net", default="lenet", help="in-process: lenet or a tests/matrix_nets.py network")
    ap.add_argument("--rounds", type=int, default=15, help="in-process: alternating blocks per copy")
    ap.add_argument("--dormant", action="store_true",
                    help="in-process: no step of the instrumented copy is dumped (its probes are dormant)")
    ap.add_argument("--dump-dir", default=None, help="where the dumps go (default: the temporary directory)")
    args = ap.parse_args()
    mode = "in-process" if args.threads else args.mode
    if mode == "in-process":
        return threads(args.net, args.rounds, args.dump_dir, dormant=args.dormant)
    if mode == "both":  # in a child: GRAPH_MODE is process-wide, and its threads stay
        cmd = [sys.executable, os.path.abspath(__file__), "--mode", "in-process", "--net", args.net,
               "--rounds", str(args.rounds)] + (["--dump-dir", args.dump_dir] if args.dump_dir else [])
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=True)
        print("\n".join(line for line in out.stdout.splitlines() if not line.startswith("msprobe")), flush=True)
    processes(args.pairs, args.steps, args.dump_dir)


if __name__ == "__main__":
    main()
