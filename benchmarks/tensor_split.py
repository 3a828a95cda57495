"""Where an L1 ``tensor`` step's excess goes: training thread, ``msprobe-files`` thread, waits.

    .venv/bin/python benchmarks/tensor_split.py [--rounds 8] [--steps 3]

One process, ``overhead.py``'s TinyLM step (``ms.set_device("CPU"); ms.runtime.launch_blocking()``),
rounds of ``--steps`` steps of each variant in turn (tool off, tool on, ``--variants``; order reversed
every other round, so a drift of the machine's load hits them alike). Per step, medians over the rounds (and the spread, min-max):

* ``wall``, ``process cpu`` (every thread), ``training cpu`` (``time.thread_time`` of the training
  thread), ``writer cpu`` (the ``msprobe-files`` thread, from ``/proc/self/task/<tid>/schedstat``);
* on the training thread, CPU and wall inside the tool's parts: ``materialize`` (the flush's reading:
  statistics and host arrays), ``FileQueue.submit`` (wall above CPU: waiting for room in the queue),
  ``FileQueue.protect`` (copies before an in-place operation or a compiled region, and waiting for
  the chunks being written that may read the memory about to change), ``FileQueue.drain``
  (``stop()``/``step()``: waiting for the writer thread, or chunks written on the training thread in
  the ``drain-writes`` variant), and the files the training thread wrote itself;
* ``us/file``: the writer thread's CPU per file it wrote (creating, writing, linking each ``.npy``).

``--variants`` adds tool-on variants, each run once per round beside ``off`` and ``on``:
``wait-all`` (:meth:`FileQueue.protect` also waits until no chunk reading a tensor's memory is being
written, as it did before it waited only for the chunks that may read the memory about to change),
``drain-writes`` (:meth:`FileQueue.drain` writes chunks beside the writer thread, as it did before it
only waited for that thread),
``nosave`` (the tensor task's per-call path with no ``.npy`` named or written: what the step costs
the training thread without the files, against the statistics task's compiled path),
``slots<N>`` (a flush every ``N`` pending tensors instead of ``runtime.FLUSH_SLOTS``: the writer thread
starts earlier in the step); ``+`` joins them (``drain-writes+slots128``).

The dump directory is created under ``--dir`` (default: the system's temporary directory) and removed
at the end, after the measurement (``--keep``: left, for runs back to back). Where that directory lies
matters: on an ext4 without journal the inode allocator skips every inode deleted in the last ~30 s
in the block group of the file's directory, so a file costs 40 us of CPU in a quiet directory and
0.3-0.7 ms beside one where thousands of files were just deleted (``/tmp`` of a machine running test
suites, or this benchmark's own previous run).
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import overhead  # noqa: E402


def _thread_cpu(name: str) -> float:
    """Seconds on a CPU of the live thread called ``name`` (0 when there is none)."""
    for t in threading.enumerate():
        if t.name == name and t.native_id is not None:
            try:
                with open(f"/proc/self/task/{t.native_id}/schedstat", encoding="ascii") as f:
                    return int(f.read().split()[0]) / 1e9
            except OSError:
                return 0.0
    return 0.0


class Meter:
    """Training-thread CPU and wall time inside wrapped functions, by name (outermost call only per
    name; nested different names are counted in each)."""

    def __init__(self):
        self.cpu: dict = {}
        self.wall: dict = {}
        self.count: dict = {}
        self.main = threading.get_ident()
        self.depth: dict = {}

    def wrap(self, owner, attr: str, name: str):
        original = getattr(owner, attr)

        def timed(*args, **kwargs):
            if threading.get_ident() != self.main or self.depth.get(name):
                return original(*args, **kwargs)
            self.depth[name] = 1
            c, w = time.thread_time(), time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.cpu[name] = self.cpu.get(name, 0.0) + time.thread_time() - c
                self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w
                self.count[name] = self.count.get(name, 0) + 1
                self.depth[name] = 0

        setattr(owner, attr, timed)

    def reset(self):
        self.cpu.clear()
        self.wall.clear()
        self.count.clear()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=3, help="steps per variant and round")
    p.add_argument("--dir", help="parent directory of the dump (default: the system's temporary directory)")
    p.add_argument("--keep", action="store_true", help="leave the dump (deleting it slows the next run's files)")
    p.add_argument("--variants", default="", help="comma-separated: wait-all, drain-writes, nosave, slots<N>, "
                                                 "joined by + (drain-writes+slots128)")
    args = p.parse_args(argv)

    net, batches, train_step = overhead._setup("tiny")
    from msprobe.engine import runtime, tensor_files
    from msprobe.format import npy
    from msprobe.mindspore import PrecisionDebugger

    tmp = tempfile.mkdtemp(prefix="msprobe_tensor_split_", dir=args.dir)
    dbg = PrecisionDebugger(config_path=overhead.write_config(tmp, {"task": "tensor", "level": "L1"}))
    queue_class = tensor_files.FileQueue
    protect, drain = queue_class.protect, queue_class.drain
    queue_class._protect_impl, queue_class._drain_impl = protect, drain  # the variant's, set per run
    queue_class.protect = lambda queue, written=None: queue._protect_impl(written)
    queue_class.drain = lambda queue: queue._drain_impl()
    meter = Meter()
    meter.wrap(runtime, "materialize", "materialize")
    meter.wrap(tensor_files.FileQueue, "submit", "submit")
    meter.wrap(tensor_files.FileQueue, "protect", "protect")
    meter.wrap(tensor_files.FileQueue, "drain", "drain")
    files = {"main": 0, "all": 0}
    save = tensor_files.save_npy_batch

    def counted(items, *a, **k):
        files["all"] += len(items)
        if threading.get_ident() == meter.main:
            files["main"] += len(items)
        return save(items, *a, **k)

    tensor_files.save_npy_batch = counted

    def protect_wait_all(queue, written=None):
        protect(queue, written)
        with queue._cond:
            while queue._writing_views:
                queue._cond.wait()

    def drain_writes(queue):
        while True:
            if queue._work():
                continue
            with queue._cond:
                if not queue._unfinished and not queue._active:
                    return
                if not queue._has_work():
                    queue._cond.wait(0.5)

    patches = {"wait-all": {"protect": protect_wait_all}, "drain-writes": {"drain": drain_writes}}
    flush_slots = runtime.FLUSH_SLOTS

    def apply(variant: str) -> None:
        parts = variant.split("+")
        chosen = {}
        for part in parts:
            chosen.update(patches.get(part, {}))
        for name, original in (("protect", protect), ("drain", drain)):  # the meter wraps the dispatchers
            setattr(queue_class, f"_{name}_impl", chosen.get(name, original))
        runtime.FLUSH_SLOTS = next((int(part[5:]) for part in parts if part.startswith("slots")), flush_slots)
        rt = dbg.service.runtime
        if "nosave" in parts:
            rt._saves = lambda entry: False  # noqa: E731 - no entry names a file
        else:
            rt.__dict__.pop("_saves", None)
    variants = ["off", "on"] + [v for v in args.variants.split(",") if v]
    step = overhead.step_runner(net, batches, train_step, dbg)
    for _ in range(3):
        step(True)
    rows: dict = {v: [] for v in variants}
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for phase in order:
            on = phase != "off"
            apply(phase)
            if not on:
                dbg.service._release_capture()  # an off run runs MindSpore's own objects
            gc.collect()
            meter.reset()
            files.update(main=0, all=0)
            n = args.steps
            w, c, t, wr = time.perf_counter(), time.process_time(), time.thread_time(), _thread_cpu("msprobe-files")
            for _ in range(n):
                step(on)
            row = {"wall": time.perf_counter() - w, "process cpu": time.process_time() - c,
                   "training cpu": time.thread_time() - t,
                   "writer cpu": _thread_cpu("msprobe-files") - wr}
            for name in ("materialize", "submit", "protect", "drain"):
                row[f"{name} cpu"] = meter.cpu.get(name, 0.0)
                row[f"{name} wall"] = meter.wall.get(name, 0.0)
                row[f"{name} calls"] = meter.count.get(name, 0)
            row = {k: 1000 * v / n for k, v in row.items()}
            row["files"] = files["all"] / n
            row["files by training"] = files["main"] / n
            writer_files = files["all"] - files["main"]
            row["us/file (writer)"] = (1e6 * (row["writer cpu"] / 1000 * n) / writer_files
                                       if writer_files else 0.0)
            rows[phase].append(row)
    dbg.service.close()
    print(f"{overhead.describe_model('tiny')}; L1 tensor; {args.rounds} rounds x {args.steps} steps; "
          f"ms per step, median [min-max]; loadavg {os.getloadavg()[0]:.2f}")
    print(f"  {'':22s} " + " ".join(f"{v:>25s}" for v in variants))
    for key in rows["on"][0]:
        def fmt(phase):
            vals = [row[key] for row in rows[phase]]
            return f"{statistics.median(vals):8.1f} [{min(vals):6.1f}-{max(vals):6.1f}]"
        print(f"  {key:22s} " + " ".join(f"{fmt(v):>25s}" for v in variants))
    if args.keep:
        print(f"dump left in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
