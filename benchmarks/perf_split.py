"""Where a dumped step's CPU time goes, by shared object and by C function: ``perf record -e cpu-clock``
of the measured steps only, tool off and tool on, in two processes; samples per step side by side.

    .venv/bin/python benchmarks/perf_split.py --model tiny --level L1 --steps 40
    .venv-mindformers/bin/python benchmarks/perf_split.py --model llama --steps 30
    .venv/bin/python benchmarks/perf_split.py --model tiny --level L1 --task tensor --steps 20

Each process builds the model of ``benchmarks/llama_split.py`` (``--model``), runs 4 warm-up steps (dumped
ones for ``on``), then the measured steps with perf's events enabled (``perf record --control``, started
disabled), every thread of the process counted; the tables split the training thread's samples (the
process's main thread) by shared object and function. Python code shows as the interpreter's functions
(``_PyEval_EvalFrameDefault``...), the tool's compiled code as ``_hotpath``/``_stats_kernel``, MindSpore as
its libraries: the rows to read are the differences per step, ms at the sampling rate (``--freq`` Hz of
CPU time). Needs ``perf`` (software event ``cpu-clock``: no hardware counters needed).
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _steps(args) -> None:
    """The measured process: warm-up, then ``--steps`` steps with perf enabled through its control fifo."""
    import time

    import llama_split

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "scripts"))
    out = tempfile.mkdtemp(prefix="msprobe_perf_split_")
    os.chdir(out)
    import mindspore as ms

    ms.set_device("CPU")
    ms.runtime.launch_blocking()
    net, opt, batches, loss_of = llama_split._model(args.model)
    grad_fn = ms.value_and_grad(loss_of, None, opt.parameters)
    debugger = None
    if args.mode == "on":
        from msprobe.mindspore import PrecisionDebugger

        debugger = PrecisionDebugger(dump_path=os.path.join(out, "dump"), task=args.task, level=args.level)

    def step(i):
        if debugger is not None:
            debugger.start(net)
        loss, grads = grad_fn(*batches[i % len(batches)])
        opt(grads)
        if debugger is not None:
            debugger.stop()
            debugger.step()
        loss.asnumpy()

    for i in range(4):
        step(i)
    with open(args.ctl, "w") as ctl, open(args.ack) as ack:
        ctl.write("enable\n")
        ctl.flush()
        ack.readline()
        t = time.thread_time()
        for i in range(args.steps):
            step(i)
        spent = time.thread_time() - t
        ctl.write("disable\n")
        ctl.flush()
        ack.readline()
    print(f"training-thread CPU {1e3 * spent / args.steps:.2f} ms per step; thread {os.getpid()}")
    if debugger is not None:
        debugger.service.close()


def _record(args, mode: str, work: str) -> tuple:
    ctl, ack, data = (os.path.join(work, f"{mode}.{n}") for n in ("ctl", "ack", "data"))
    for fifo in (ctl, ack):
        os.mkfifo(fifo)
    cmd = ["perf", "record", "-e", "cpu-clock", "-F", str(args.freq), "-D", "-1", "-o", data] + (["-g"] if args.callers else []) + [
           f"--control=fifo:{ctl},{ack}", "--", sys.executable, os.path.abspath(__file__), "--child", mode,
           "--model", args.model, "--level", args.level, "--task", args.task, "--steps", str(args.steps), "--ctl", ctl, "--ack", ack]
    run = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    line = [text for text in run.stdout.splitlines() if text.startswith("training-thread")]
    if run.returncode or not line:
        sys.exit(f"perf_split: {mode} run failed:\n{run.stderr[-3000:]}")
    main_thread = line[0].rsplit(" ", 1)[1]
    report = subprocess.run(["perf", "report", "-i", data, "--stdio", "-F", "sample,pid,dso,sym", "--sort",
                             "pid,dso,sym", "-g", "none"], capture_output=True, text=True).stdout
    threads, by_dso, by_sym = collections.Counter(), collections.Counter(), collections.Counter()
    for text in report.splitlines():  # samples, tid:comm, dso, [.] or [k], symbol
        parts = text.split()
        if len(parts) < 4 or text.startswith("#") or not parts[0].isdigit():
            continue
        samples, (tid, _, comm), dso, sym = int(parts[0]), parts[1].partition(":"), parts[2], " ".join(parts[4:])
        training = tid == main_thread
        threads["training thread" if training else comm] += samples
        if training:
            by_dso[dso] += samples
            by_sym[f"{dso} {sym}"] += samples
    return line[0].rsplit(";", 1)[0], threads, by_dso, by_sym


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", choices=("llama", "tiny"))
    p.add_argument("--level", default="L1", choices=("L0", "L1", "mix"))
    p.add_argument("--task", default="statistics", choices=("statistics", "tensor"))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--freq", type=int, default=4000, help="samples per second of CPU time")
    p.add_argument("--top", type=int, default=25, help="C functions listed")
    p.add_argument("--callers", action="store_true",
                   help="record call chains too (perf record -g) and keep the data: the directory is printed, "
                        "read it with perf report -i DIR/on.data --no-children -G")
    p.add_argument("--child", choices=("off", "on"), dest="mode", help=argparse.SUPPRESS)
    p.add_argument("--ctl", help=argparse.SUPPRESS)
    p.add_argument("--ack", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.mode:
        _steps(args)
        return 0
    work = tempfile.mkdtemp(prefix="msprobe_perf_split_")
    runs = {mode: _record(args, mode, work) for mode in ("off", "on")}
    per_step = 1e3 / args.freq / args.steps  # ms of CPU per sample per step
    if args.callers:
        print(f"perf data (with call chains): {work}/off.data, {work}/on.data")
    print(f"{args.model} {args.level}, {args.steps} steps, CPU ms per step (perf cpu-clock); "
          f"loadavg {os.getloadavg()[0]:.2f}")
    for mode in ("off", "on"):
        print(f"  {mode}: {runs[mode][0]}; sampled {per_step * sum(runs[mode][1].values()):.2f} ms per step")
    for title, index, top in (("thread", 1, 12), ("training thread: shared object", 2, 25),
                              ("training thread: C function", 3, args.top)):
        off, on = runs["off"][index], runs["on"][index]
        keys = sorted(set(off) | set(on), key=lambda k: -(on[k] - off[k]))[:top]
        print(f"{title:60s} {'off':>8s} {'on':>8s} {'on-off':>8s}")
        for key in keys:
            print(f"  {key[:58]:58s} {per_step * off[key]:8.2f} {per_step * on[key]:8.2f} "
                  f"{per_step * (on[key] - off[key]):+8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
