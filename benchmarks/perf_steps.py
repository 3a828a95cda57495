"""Kernel-level profile of tool-on against tool-off steps, per thread and per function.

    # record (two processes, the same steps; perf's counting runs only around the timed steps):
    .venv/bin/python benchmarks/perf_steps.py record --model large --steps 8 --out /tmp/ps
    # compare the training thread's samples of both (perf script output is read, not perf.data):
    .venv/bin/python benchmarks/perf_steps.py diff /tmp/ps

``record`` runs ``perf record -e cpu-clock -g`` (no hardware counters are needed; ``--dwarf`` unwinds
the native stacks, ~15 MB per step) around a worker process per variant (``off``: the bare training
step of ``overhead.py``'s LM; ``on``: the same step dumped at ``--level`` statistics). The worker
runs three warm-up steps with perf disabled, then enables it through perf's control FIFO for
``--steps`` steps, and prints wall, process CPU and minor page faults per step.

``diff`` prints, for the training thread (the process's first thread), the samples per step of each
shared object and leaf function in both runs and their difference, and — with ``--dwarf`` stacks —
the samples whose stack holds one of :data:`MARKERS` (MindSpore's ``ThreadPool::ParallelLaunch``,
``sched_yield``, its backward ``RunGrad``, its contiguous copies, the tool's statistics kernel).
Sample counts are CPU time on a core; they do not include time waiting for one.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

#: stack frames counted by ``diff`` (substring of the function name -> label)
MARKERS = {
    "ThreadPool::ParallelLaunch": "MindSpore ParallelLaunch (a kernel split over the pool)",
    "sched_yield": "sched_yield (waiting in a yield loop)",
    "PyNativeExecutor::RunGrad": "backward (RunGrad)",
    "CopyCustomizeCall": "MindSpore contiguous copies (Copy op)",
    "LaunchContiguousImpl": "MindSpore contiguous kernel",
    "avx512_f4": "tool statistics kernel",
    "record_call": "inside the tool's compiled call recorder",
}


def _worker(args) -> int:
    import resource

    sys.path.insert(0, HERE)
    import overhead

    net, batches, train_step = overhead._setup(args.model)
    on = args.variant == "on"
    dbg = None
    if on:
        from msprobe.mindspore import PrecisionDebugger

        tmp = tempfile.mkdtemp(prefix="msprobe_perf_steps_")
        dbg = PrecisionDebugger(config_path=overhead.write_config(tmp, {"task": "statistics",
                                                                         "level": args.level}))
    run = overhead.step_runner(net, batches, train_step, dbg)

    def step() -> None:
        run(on)

    for _ in range(3):
        step()
    ctl = os.environ.get("MSPROBE_PERF_CTL")
    fd = os.open(ctl, os.O_WRONLY) if ctl else None
    if fd is not None:
        os.write(fd, b"enable\n")
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.steps):
        step()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if fd is not None:
        os.write(fd, b"disable\n")
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    n = args.steps
    print(f"{args.variant}: step wall {1e3 * wall / n:.0f} ms, process CPU {1e3 * cpu / n:.0f} ms, "
          f"minor faults {faults / n:.0f}, loadavg {os.getloadavg()[0]:.1f}", flush=True)
    return 0


def _record(args) -> int:
    os.makedirs(args.out, exist_ok=True)
    meta = os.path.join(args.out, "meta.txt")
    if os.path.exists(meta):
        os.remove(meta)
    for variant in ("off", "on"):
        ctl = os.path.join(args.out, f"ctl.{variant}")
        if os.path.exists(ctl):
            os.remove(ctl)
        os.mkfifo(ctl)
        data = os.path.join(args.out, f"perf.{variant}.data")
        graph = ["--call-graph", "dwarf,16384", "-F", "1000"] if args.dwarf else ["-g", "-F", "4000"]
        cmd = ["perf", "record", "-e", "cpu-clock", *graph, "-D", "-1", "--control", f"fifo:{ctl}",
               "-o", data, sys.executable, os.path.abspath(__file__), "worker", variant,
               "--model", args.model, "--level", args.level, "--steps", str(args.steps)]
        subprocess.run(cmd, env=dict(os.environ, MSPROBE_PERF_CTL=ctl), check=True)
        with open(os.path.join(args.out, f"script.{variant}.txt"), "w", encoding="utf-8") as out:
            subprocess.run(["perf", "script", "-i", data, "-F", "tid,ip,sym,dso"], stdout=out,
                           stderr=subprocess.DEVNULL, check=True)
        with open(os.path.join(args.out, "meta.txt"), "a", encoding="utf-8") as f:
            f.write(f"{variant} steps={args.steps} freq={1000 if args.dwarf else 4000}\n")
    return 0


_FRAME = re.compile(r"[0-9a-f]+ (.*) \((.*)\)$")


def read_samples(path: str) -> list:
    """``[(tid, [(function, shared object), ...leaf first])]`` from ``perf script -F tid,ip,sym,dso``."""
    samples, tid, frames = [], None, []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            text = line.strip()
            if not text:
                if tid is not None:
                    samples.append((tid, frames))
                tid, frames = None, []
            elif text.isdigit():
                tid, frames = text, []
            else:
                m = _FRAME.match(text)
                if m:
                    frames.append((re.sub(r"0x[0-9a-f]+", "ADDR", m.group(1)), os.path.basename(m.group(2))))
    if tid is not None:
        samples.append((tid, frames))
    return samples


def _main_thread_counts(path: str):
    samples = read_samples(path)
    main = min((t for t, _ in samples), key=int)  # the process's first thread: the training thread
    dsos, leaves, marks = collections.Counter(), collections.Counter(), collections.Counter()
    for tid, frames in samples:
        if tid != main or not frames:
            continue
        dsos[frames[0][1]] += 1
        leaves[frames[0]] += 1
        names = " ".join(f for f, _ in frames)
        for marker in MARKERS:
            if marker in names:
                marks[marker] += 1
    return dsos, leaves, marks


def _diff(args) -> int:
    meta = {}
    with open(os.path.join(args.dir, "meta.txt"), encoding="utf-8") as f:
        for line in f:
            variant, steps, freq = line.split()
            meta[variant] = int(steps.split("=")[1]) * int(freq.split("=")[1]) / 1000.0  # samples per ms
    off = _main_thread_counts(os.path.join(args.dir, "script.off.txt"))
    on = _main_thread_counts(os.path.join(args.dir, "script.on.txt"))
    print("training thread, CPU ms per step from samples: off, on, on - off")
    for title, a, b in (("shared object", off[0], on[0]), ("leaf function", off[1], on[1])):
        print(f"-- {title}")
        rows = {k: (a[k] / meta["off"], b[k] / meta["on"]) for k in set(a) | set(b)}
        for k, (x, y) in sorted(rows.items(), key=lambda kv: -abs(kv[1][1] - kv[1][0]))[:args.top]:
            name = k if isinstance(k, str) else f"{k[0]} ({k[1]})"
            print(f"{x:8.1f} {y:8.1f} {y - x:+8.1f}  {name[:110]}")
    print("-- stacks holding (needs --dwarf)")
    for marker, label in MARKERS.items():
        x, y = off[2][marker] / meta["off"], on[2][marker] / meta["on"]
        print(f"{x:8.1f} {y:8.1f} {y - x:+8.1f}  {label}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("record", "worker"):
        q = sub.add_parser(name)
        if name == "worker":
            q.add_argument("variant", choices=("off", "on"))
        else:
            q.add_argument("--out", required=True, help="directory for perf data and scripts")
            q.add_argument("--dwarf", action="store_true", help="unwind native stacks (DWARF)")
        q.add_argument("--model", default="large", choices=("tiny", "large"))
        q.add_argument("--level", default="L1")
        q.add_argument("--steps", type=int, default=8)
    d = sub.add_parser("diff")
    d.add_argument("dir")
    d.add_argument("--top", type=int, default=15)
    args = p.parse_args(argv)
    return {"record": _record, "worker": _worker, "diff": _diff}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
