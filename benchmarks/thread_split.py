"""Where the CPU of a dumped step goes, per thread: inside the flush's reading and outside it.

    .venv/bin/python benchmarks/thread_split.py --model large            # L1 statistics, 4 rounds
    .venv/bin/python benchmarks/thread_split.py --level mix --steps 3 --rounds 6

One process (the benchmark LM of ``benchmarks/overhead.py``, synchronous launch). After two
tool-on warm-up steps it alternates rounds of ``--steps`` tool-on and tool-off steps and prints, per
round and thread (the training thread ``MAIN``, MindSpore's ``KernelThread_*``/``ActorThread_*`` pool,
its queues, the tool's threads), from Linux's ``/proc/self/task/*/schedstat`` (nanoseconds):

* ``cpu``: time on a CPU per step, and how much of it fell inside the flush's reading
  (``msprobe.engine.runtime.materialize``: statistics, CRC-32, host arrays);
* ``runq-wait``: time runnable but waiting for a CPU (other processes, or the process's own threads
  on the same core);
* ``slices``: times the thread was put on a CPU (context switches in, voluntary or not);
* ``sleeps``: voluntary context switches (``/proc/self/task/*/status``: the thread blocked, e.g. a
  pool worker that stopped spinning and waits on its condition variable to be woken for the next
  kernel); a ``sched_yield`` that hands the CPU over counts as involuntary.

It answers: does MindSpore's pool spin while the tool holds the training thread (its ``cpu in flush``),
how much of the tool-on excess lies outside the flush (``MAIN`` cpu on minus off, minus in flush), and
whether the context switches differ between tool-on and tool-off rounds. Summed over a round, so the
10 ms tick of ``/proc/*/stat`` does not matter.
"""
from __future__ import annotations

import argparse
import collections
import gc
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import overhead  # noqa: E402


def schedstat() -> dict:
    """``{tid: (ns on CPU, ns waiting on a run queue, times run)}`` of this process's threads."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as f:
                out[tid] = tuple(int(x) for x in f.read().split()[:3])
        except OSError:  # the thread ended
            continue
    return out


def sleeps() -> dict:
    """``{tid: voluntary context switches}`` of this process's threads."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        out[tid] = int(line.split()[1])
        except OSError:
            continue
    return out


def thread_names() -> dict:
    """``{tid: name}``; the training (main) thread is ``MAIN``."""
    names = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
                names[tid] = "MAIN" if tid == str(os.getpid()) else f.read().strip()
        except OSError:
            continue
    return names


def add_delta(acc: dict, before: dict, after: dict) -> None:
    for tid, now in after.items():
        then = before.get(tid, (0, 0, 0))
        row = acc[tid]
        for j in range(3):
            row[j] += now[j] - then[j]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(overhead.MODELS), default="large")
    p.add_argument("--level", default="L1")
    p.add_argument("--steps", type=int, default=4, help="steps per round")
    p.add_argument("--rounds", type=int, default=2, help="on/off round pairs")
    args = p.parse_args(argv)

    net, batches, train_step = overhead._setup(args.model)
    tmp = tempfile.mkdtemp(prefix="msprobe_thread_split_")
    from msprobe.engine import runtime
    from msprobe.mindspore import PrecisionDebugger

    dbg = PrecisionDebugger(config_path=overhead.write_config(tmp, {"task": "statistics", "level": args.level}))
    inside = collections.defaultdict(lambda: [0, 0, 0])
    flush_wall = [0.0]
    measuring = [False]
    materialize = runtime.materialize

    def timed(*a, **k):
        if not measuring[0]:
            return materialize(*a, **k)
        before, w = schedstat(), time.perf_counter()
        try:
            return materialize(*a, **k)
        finally:
            flush_wall[0] += time.perf_counter() - w
            add_delta(inside, before, schedstat())

    runtime.materialize = timed
    step = overhead.step_runner(net, batches, train_step, dbg)

    for _ in range(2):
        step(True)
    n = args.steps
    print(f"{overhead.describe_model(args.model)}; {args.level} statistics; per step, ms")
    for phase in ("on", "off") * args.rounds:
        on = phase == "on"
        if not on:
            dbg.service._release_capture()  # an off round runs MindSpore's own objects
        inside.clear()
        flush_wall[0] = 0.0
        total = collections.defaultdict(lambda: [0, 0, 0])
        gc.collect()
        measuring[0] = on
        slept, before, w = sleeps(), schedstat(), time.perf_counter()
        for _ in range(n):
            step(on)
        wall = time.perf_counter() - w
        add_delta(total, before, schedstat())
        slept = {tid: v - slept.get(tid, 0) for tid, v in sleeps().items()}
        measuring[0] = False
        names = thread_names()
        print(f"{phase:3s}: step wall {1000 * wall / n:.0f}, flush wall {1000 * flush_wall[0] / n:.0f}, "
              f"loadavg {os.getloadavg()[0]:.1f}")
        for tid in sorted(total, key=lambda t: -total[t][0]):
            a, b = total[tid], inside.get(tid, (0, 0, 0))
            if a[0] < 1e6:
                continue
            print(f"   {names.get(tid, tid):16s} cpu {a[0] / n / 1e6:7.1f} (in flush {b[0] / n / 1e6:6.1f})"
                  f"  runq-wait {a[1] / n / 1e6:7.1f} (in flush {b[1] / n / 1e6:6.1f})"
                  f"  slices {a[2] / n:7.0f} (in flush {b[2] / n:5.0f})  sleeps {slept.get(tid, 0) / n:6.0f}")
    dbg.service.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
