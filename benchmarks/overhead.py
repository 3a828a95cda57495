"""Per-step overhead of msprobe on the TinyLM training example (MindSpore 2.10, CPU, PyNative).

    .venv/bin/python benchmarks/overhead.py            # full: 5 alternating pairs x 4 steps per run
    .venv/bin/python benchmarks/overhead.py --quick    # 3 pairs x 3 steps (indicative only)
    .venv/bin/python benchmarks/overhead.py --json out.json --only L1,L0
    .venv/bin/python benchmarks/overhead.py --isolation process   # a fresh process per run (slow)
    .venv/bin/python benchmarks/overhead.py --launch default      # MindSpore's asynchronous launch
    .venv/bin/python benchmarks/overhead.py --model large --only L1   # d_model 512, d_ff 2048, seq 128

Every benchmark process calls ``ms.set_device("CPU"); ms.runtime.launch_blocking()``: on a 2-core
machine MindSpore's default asynchronous PyNative pipeline is ~30x slower than synchronous launch and
very noisy, so the numbers below are for synchronous launch (what the examples use too) unless
``--launch default`` is given.

Method
------
* Workload: ``examples/models.py`` TinyLM (vocab from stdlib source, d_model 64, 4 heads, 2 layers,
  seq_len 32, batch 8), Adam, ``make_train_step``; a "step" is ``start(net)`` / train step /
  ``stop()`` / ``step()`` for the tool-on phase and the bare train step for the tool-off phase,
  with ``loss.asnumpy()`` at the end of each step.
* One *run* = ``--steps`` consecutive training steps; its value is wall time / steps (and process
  CPU time / steps).  Runs alternate off, on, off, on, ... (``--pairs`` pairs), after warm-up of both
  phases (the first steps compile kernels; the first tool-on step also builds the API list).
* Reported: median per-step ms of the off runs, of the on runs, and the ratio = median of the
  per-pair ratios on_i / off_i (robust to slow drift of machine load, which is large here: other
  jobs share the 2 cores).  ``cpu ratio`` is the same with process CPU time (all threads), which is
  much less sensitive to other processes competing for the cores. ``thr ratio``: CPU time of the
  training thread alone (``time.thread_time``), i.e. without the tool's background threads
  (``msprobe-flush``, the ``.npy`` writer ``msprobe-files``) and MindSpore's own threads.
* Isolation (default ``--isolation config``): one fresh subprocess per configuration, alternating
  internally; the ``PrecisionDebugger`` is constructed only at the first 'on' phase and the 'off'
  phases never call it.  This is valid because an 'off' run starts by removing the capture the
  previous 'on' run left installed for its next dumped step (``DumpService._release_capture``; a
  dump range's last ``stop()`` does the same), so an 'off' phase runs MindSpore's own objects; each
  'on' run thus pays one full install and then runs ``--steps - 1`` steps on the parked capture.  It avoids
  the ~4 s import/setup and ~2 s kernel compile per run that a subprocess per run costs, and — more
  important for stability — compares on/off within the same process (same allocator state, thread
  pool, kernel caches).  ``--isolation process`` runs every off/on run in its own fresh subprocess
  (the strict variant).  Trial on this machine (L1, 3 pairs x 3 steps, load average ~5 from other
  jobs): process isolation took 54 s with pair ratios 5.77/4.25/3.30 (median 4.25x); config
  isolation took 18 s with 4.27/3.59/3.87 (median 3.87x): same answer within noise, tighter spread,
  3x cheaper, so the default fits 8 configurations x 5 pairs into ~3 minutes.
* Peak RSS: separate fresh subprocesses that run only tool-off or only tool-on (L1 statistics with
  ``start(net)``) for the same number of steps, alternating; ratio of ``ru_maxrss`` medians.
* Dump entries per step = median number of entries in ``dump.json["data"]`` over the dumped steps;
  MB written per step = median bytes under one ``step{N}/{rank}/`` directory (JSON and ``.npy``).
* The physical floor: ``tensorMB`` = bytes of the tensors recorded per step (shape x dtype size of every
  tensor record in dump.json); ``readMB`` = bytes the flush reads per step, counted in the last warm-up
  step: each distinct memory of a flushed batch once (address and size), as the flush reads it — a
  gradient and the tensor it arrives as are one memory, so readMB < tensorMB; ``floor`` = (off ms +
  readMB / read bandwidth) / off ms, the ratio if the tool cost nothing but one read of each memory
  (bandwidth: ``numpy.add.reduce`` over 100 MB, fastest of 7, measured at the start). ``flush ms``:
  training-thread CPU time per step in the flush's reading (``materialize``: statistics, CRC-32,
  host arrays), median of the on runs, with the GB/s at which it read readMB: how far the tool is
  above the floor inside the flush, and (thr ratio minus it) outside. Tensor-mode rows add the cost of writing their ``.npy`` files
  once: files per step x the per-file cost (create, write, rename) + tensorMB / page-cache write
  bandwidth, both measured by :func:`file_write_cost` before the first such row and again after it;
  the floor uses the cheaper of the two. Both are printed because the kernel's cost of a file varies
  ~10x with the machine's state (measured on the 2-core ext4 VM: 30-45 us per 64 KiB file when idle,
  300-800 us while the page cache grows into guest memory the host has reclaimed, or when the inode
  allocator of an ext4 without journal skips many inodes deleted in the last ~30 s, e.g. an earlier
  run's dump just removed: ``recently_deleted`` in a kernel profile). Watch rows write nothing
  in clean steps but read every tensor of their level: their tensorMB comes from one extra one-step
  run of the plain level (``FLOOR_FROM``).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLES = os.path.join(ROOT, "examples")

HEADER = ("MindSpore CPU, ms.set_device('CPU') + ms.runtime.launch_blocking() (synchronous launch; "
          "the default async PyNative pipeline is ~30x slower and very noisy on 2 cores)")

# name -> (description, config.json content (dump_path filled in), how start() is called)
CONFIGS = {
    "constructed": ("debugger constructed, start(net)/stop/step called, step list [1000] (not dumped)",
                    {"task": "statistics", "level": "L1", "step": [1000]}, "model"),
    "L1-list1": ("L1, list ['Functional.softmax'] (one API), start(net)",
                 {"task": "statistics", "level": "L1", "list": ["Functional.softmax"]}, "model"),
    "L0": ("L0, start(net)", {"task": "statistics", "level": "L0"}, "model"),
    "L1-nomodel": ("L1, start() without model (APIs only)", {"task": "statistics", "level": "L1"}, "none"),
    "L1": ("L1 with Primitives, start(net)", {"task": "statistics", "level": "L1"}, "model"),
    "mix": ("mix, start(net)", {"task": "statistics", "level": "mix"}, "model"),
    "L1-md5": ("L1 summary_mode md5, start(net)",
               {"task": "statistics", "level": "L1", "summary_mode": "md5"}, "model"),
    "L1-tensor": ("L1 task tensor, start(net)", {"task": "tensor", "level": "L1"}, "model"),
    "watch-L0": ("watch mode (history 1024), L0, start(net)",
                 {"task": "statistics", "level": "L0", "watch": {}}, "model"),
    "watch-L1": ("watch mode (history 1024), L1 with Primitives, start(net)",
                 {"task": "statistics", "level": "L1", "watch": {}}, "model"),
}

#: watch rows write nothing in clean steps, yet read every tensor the plain level records: their floor uses
#: the bytes that level's dump records per step (measured by one extra one-step run of that level)
FLOOR_FROM = {"watch-L0": "L0", "watch-L1": "L1"}


def write_config(directory: str, spec: dict) -> str:
    task = spec["task"]
    section = {"scope": [], "list": list(spec.get("list", [])), "data_mode": ["all"]}
    if task == "statistics":
        section["summary_mode"] = spec.get("summary_mode", "statistics")
    cfg = {"task": task, "dump_path": os.path.join(directory, "dump"), "rank": [],
           "step": spec.get("step", []), "level": spec["level"], "extra_info": True,
           "async_dump": False, task: section}
    if "watch" in spec:
        cfg["watch"] = spec["watch"]
    path = os.path.join(directory, "config.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=1)
    return path


# ------------------------------------------------------------------------------------- worker
#: ``--model`` -> TinyLM arguments and batch size (the MLP of each block is 4 x d_model wide)
MODELS = {
    "tiny": {"d_model": 64, "n_heads": 4, "n_layers": 2, "seq_len": 32, "batch": 8},
    "large": {"d_model": 512, "n_heads": 8, "n_layers": 2, "seq_len": 128, "batch": 8},
    #: the size the performance targets were first stated for (d_model 192, 3 layers)
    "mid": {"d_model": 192, "n_heads": 4, "n_layers": 3, "seq_len": 32, "batch": 8},
}


def describe_model(model: str) -> str:
    m = MODELS[model]
    return (f"TinyLM(d_model={m['d_model']}, d_ff={4 * m['d_model']}, n_heads={m['n_heads']}, "
            f"n_layers={m['n_layers']}, seq_len={m['seq_len']}), batch {m['batch']}, Adam")


def _setup(model: str = "tiny", launch: str = "blocking"):
    """The benchmark LM, its batches and train step. ``launch``: ``"blocking"`` calls
    ``ms.runtime.launch_blocking()`` (synchronous launch), ``"default"`` keeps MindSpore's default
    asynchronous launch."""
    sys.path.insert(0, EXAMPLES)
    import mindspore as ms
    from mindspore import nn

    ms.set_device("CPU")
    if launch == "blocking":
        ms.runtime.launch_blocking()
    import models

    m = MODELS[model]
    models.set_seed(0)
    vocab, batches = models.load_text_corpus(seq_len=m["seq_len"], batch_size=m["batch"])
    net = models.TinyLM(len(vocab), d_model=m["d_model"], n_heads=m["n_heads"], n_layers=m["n_layers"],
                        seq_len=m["seq_len"])
    net.set_train(True)
    optimizer = nn.Adam(net.trainable_params(), learning_rate=3e-3)
    train_step = models.make_train_step(net, models.LMCrossEntropy(), optimizer)
    return net, batches, train_step


def step_runner(net, batches, train_step, debugger):
    """``step(on: bool)``: one training step on the next batch, dumped by ``debugger``
    (``start(net)``/``stop()``/``step()``) when ``on``; waits for the loss."""
    count = [0]

    def step(on: bool) -> None:
        x, y = batches[count[0] % len(batches)]
        count[0] += 1
        if on:
            debugger.start(net)
        loss = train_step(x, y)
        if on:
            debugger.stop()
            debugger.step()
        loss.asnumpy()

    return step


#: bytes per element of dump.json dtype names (for the bytes of tensors a step records)
_ITEMSIZE = {"Float64": 8, "Int64": 8, "UInt64": 8, "Complex64": 8, "Complex128": 16, "Float32": 4,
             "Int32": 4, "UInt32": 4, "Float16": 2, "BFloat16": 2, "Int16": 2, "UInt16": 2, "Int8": 1,
             "UInt8": 1, "Bool": 1}


def alternate_blocks(block, variants, rounds: int) -> None:
    """Run ``block(variant, keep)`` once per variant as warm-up (``keep`` False), then ``rounds``
    rounds of one block per variant (``keep`` True), the order reversed every other round so a drift
    of the machine's load hits the variants alike; the steps' "dump.json is at ..." lines are dropped."""
    with contextlib.redirect_stdout(io.StringIO()):
        for v in variants:
            block(v, False)
        for r in range(rounds):
            for v in (variants if r % 2 else variants[::-1]):
                block(v, True)


def _tensor_bytes(value) -> int:
    """Bytes of the tensor data behind every tensor record in ``value`` (each read once by the tool)."""
    if isinstance(value, dict):
        if "dtype" in value and "shape" in value and "type" in value:
            n = 1
            for d in value["shape"]:
                n *= d
            return n * _ITEMSIZE.get(value["dtype"], 4)
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, list):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def memory_bandwidth(mb: int = 100, repeats: int = 7) -> float:
    """Read bandwidth of this machine, bytes/s: the fastest of ``repeats`` ``numpy.add.reduce`` passes
    over ``mb`` MB of float32 (one read of each byte, as the statistics need at the least)."""
    import numpy as np

    a = np.ones(mb * (1 << 20) // 4, np.float32)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        np.add.reduce(a)
        best = min(best, time.perf_counter() - t)
    return a.nbytes / best


def file_write_cost(directory: str, repeats: int = 3) -> tuple:
    """``(seconds per file, bytes/s)`` of writing ``.npy`` files into ``directory`` the way tensor mode
    does (:func:`msprobe.format.npy.save_npy_batch`): the fastest of ``repeats`` batches of 400 files
    of 1 KB (the per-file cost: create, write, link or rename) and of 16 files of 8 MB (page-cache write
    bandwidth, after the per-file cost is taken out). The small files are left in ``directory``
    (deleting 1200 files would make the next files' creation slower for ~30 s on an ext4 without
    journal: its inode allocator skips each inode deleted in the last ~30 s, ~80 % of a file's CPU
    after thousands were deleted nearby; the caller removes ``directory`` at the end, and keeps the
    tensor row's dump until this has measured the cost after the row)."""
    import numpy as np

    from msprobe.format.npy import save_npy_batch

    def best(n, nbytes):
        rows = np.ones((n, nbytes // 4), np.float32)  # one array per file, as a step's files mostly are
        fastest = float("inf")
        for rep in range(repeats):
            folder = tempfile.mkdtemp(prefix="write_cost_", dir=directory)
            t = time.perf_counter()
            save_npy_batch([(os.path.join(folder, f"{i}.npy"), rows[i]) for i in range(n)])
            fastest = min(fastest, time.perf_counter() - t)
            if nbytes > 1 << 20:  # few files: their page cache is given back at once
                shutil.rmtree(folder, ignore_errors=True)
        return fastest

    per_file = best(400, 1 << 10) / 400
    big = best(16, 8 << 20)
    return per_file, 16 * (8 << 20) / max(big - 16 * per_file, 1e-9)


def _dump_stats(dump_path: str) -> dict:
    """Entries per dumped step (median), bytes written per dumped step, and bytes of the tensors
    recorded per step (median)."""
    entries, sizes, tensor_bytes, npy_files = [], [], [], []
    if os.path.isdir(dump_path):
        units = [os.path.join(dump_path, s, r) for s in sorted(os.listdir(dump_path)) if s.startswith("step")
                 for r in sorted(os.listdir(os.path.join(dump_path, s)))]  # step{N}/{rank or proc} dirs
        for full in units:
            total = npy = 0
            for root, _, files in os.walk(full):
                for name in files:
                    npy += name.endswith(".npy")
                    p = os.path.join(root, name)
                    total += os.path.getsize(p)
                    if name == "dump.json":
                        with open(p, encoding="utf-8") as f:
                            data = json.load(f).get("data", {})
                        entries.append(len(data))
                        tensor_bytes.append(_tensor_bytes(data))
            sizes.append(total)
            npy_files.append(npy)
    return {"npy_files_per_step": statistics.median(npy_files) if npy_files else 0,
            "entries_per_step": statistics.median(entries) if entries else 0,
            "mb_per_step": (statistics.median(sizes) / 1e6) if sizes else 0.0,
            "dumped_steps": len(sizes),
            "tensor_bytes_per_step": statistics.median(tensor_bytes) if tensor_bytes else 0}


def worker(args) -> dict:
    """One process: alternate off/on runs of one configuration (or only one phase)."""
    import gc
    import resource

    spec = json.loads(args.worker)
    net, batches, train_step = _setup(spec.get("model", "tiny"), spec.get("launch", "blocking"))
    phases = spec["phases"]  # e.g. ["off", "on", "off", "on"] or ["on"]
    steps, warmup = spec["steps"], spec["warmup"]
    config_path = spec.get("config_path")
    start_mode = spec.get("start", "model")
    state = {"dbg": None, "i": 0}
    flush = {"cpu": 0.0, "wall": 0.0, "count_bytes": False, "bytes": 0}

    def one_step(on: bool):
        x, y = batches[state["i"] % len(batches)]
        state["i"] += 1
        dbg = state["dbg"]
        if on:
            dbg.start(net) if start_mode == "model" else dbg.start()
        loss = train_step(x, y)
        if on:
            dbg.stop()
            dbg.step()
        loss.asnumpy()

    def ensure_debugger():
        if state["dbg"] is None:
            from msprobe.mindspore import PrecisionDebugger

            state["dbg"] = PrecisionDebugger(config_path=config_path)
            _time_flushes(flush)

    def unpark():
        # the capture stays installed between consecutive dumped steps: an off run must run
        # MindSpore's own objects (the next on run installs it again, in its timing)
        dbg = state["dbg"]
        release = getattr(dbg.service, "_release_capture", None) if dbg is not None else None
        if release is not None:
            release()

    kinds = sorted(set(phases))
    for kind in kinds:  # warm-up of every phase that will be measured
        if kind == "on":
            ensure_debugger()
        else:
            unpark()
        for n in range(warmup):
            flush["count_bytes"] = kind == "on" and n == warmup - 1  # the last warm-up step's reads
            one_step(kind == "on")
        flush["count_bytes"] = False
    read_bytes = flush["bytes"]
    runs = []
    for kind in phases:
        if kind == "off":
            unpark()
        gc.collect()
        flush.update(cpu=0.0, wall=0.0)
        w0, c0, t0 = time.perf_counter(), time.process_time(), time.thread_time()
        for _ in range(steps):
            one_step(kind == "on")
        w1, c1, t1 = time.perf_counter(), time.process_time(), time.thread_time()
        runs.append({"phase": kind, "wall_ms": 1000 * (w1 - w0) / steps, "cpu_ms": 1000 * (c1 - c0) / steps,
                     "thread_ms": 1000 * (t1 - t0) / steps, "flush_cpu_ms": 1000 * flush["cpu"] / steps,
                     "flush_wall_ms": 1000 * flush["wall"] / steps})
    if state["dbg"] is not None:
        state["dbg"].service.close()
    out = {"runs": runs, "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "read_bytes_per_step": read_bytes}
    if config_path:
        with open(config_path, encoding="utf-8") as f:
            out.update(_dump_stats(json.load(f)["dump_path"]))
    return out


def _time_flushes(acc: dict) -> None:
    """Add each flush's statistics reading (``materialize``: its thread's CPU time and wall time, s)
    to ``acc["cpu"]``/``acc["wall"]``; while ``acc["count_bytes"]`` is true also add the bytes it
    reads to ``acc["bytes"]``: each distinct memory once per batch, as the flush reads it (a
    gradient and the tensor it arrives as are one memory), where dump.json's tensorMB counts every
    record."""
    from msprobe.engine import runtime

    materialize = runtime.materialize

    def timed(slots, *args, **kwargs):
        if acc["count_bytes"]:
            acc["bytes"] += _distinct_bytes(slots)
        w, c = time.perf_counter(), time.thread_time()
        try:
            return materialize(slots, *args, **kwargs)
        finally:
            acc["cpu"] += time.thread_time() - c
            acc["wall"] += time.perf_counter() - w

    runtime.materialize = timed


def _distinct_bytes(slots) -> int:
    """Bytes a flush reads for a batch's tensor slots: a contiguous tensor's memory once however many
    tensor objects view it (keyed by address and size), a non-contiguous view once per tensor object
    (the flush copies it in C order)."""
    seen = {}
    for slot in slots:
        value = slot.tensor
        if value is None:
            continue
        try:
            if hasattr(value, "ctypes"):  # numpy.ndarray (a Parameter's host snapshot)
                key = (value.ctypes.data, value.nbytes)
            elif value.is_contiguous():
                key = (value.data_ptr(), value.nbytes)
            else:
                key = id(value)
        except Exception:  # not readable in place (e.g. another device): its own memory
            key = id(value)
        seen[key] = getattr(value, "nbytes", 0)
    return sum(seen.values())


#: the ``--model``/``--launch`` of this benchmark run, added to every worker's spec
WORKLOAD = {"model": "tiny", "launch": "blocking"}


def run_worker(spec: dict, timeout: float = 600) -> dict:
    spec = dict(WORKLOAD, **spec)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
    env = dict(os.environ, GLOG_v="3", PYTHONWARNINGS="ignore")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


# ------------------------------------------------------------------------------------- driver
def _summarise(runs_off, runs_on, key):
    offs = [r[key] for r in runs_off]
    ons = [r[key] for r in runs_on]
    ratios = [b / a for a, b in zip(offs, ons)]
    return statistics.median(offs), statistics.median(ons), statistics.median(ratios), ratios


def bench_config(name: str, pairs: int, steps: int, warmup: int, isolation: str, leave=None) -> dict:
    """One row. ``leave``: a list to which the row's temporary directory is appended instead of being
    removed here (the caller removes it after measuring the file cost: deleting a tensor row's ~20k
    files makes the files created in the next ~30 s slower, see :func:`file_write_cost`)."""
    desc, cfg, start = CONFIGS[name]
    tmp = tempfile.mkdtemp(prefix=f"msprobe_bench_{name}_")
    try:
        config_path = write_config(tmp, cfg)
        if isolation == "config":
            res = run_worker({"phases": ["off", "on"] * pairs, "steps": steps, "warmup": warmup,
                              "config_path": config_path, "start": start})
            runs = res["runs"]
            dump = res
        else:
            runs, read = [], []
            for _ in range(pairs):
                for phase in ("off", "on"):
                    r = run_worker({"phases": [phase], "steps": steps, "warmup": warmup,
                                    "config_path": config_path if phase == "on" else None, "start": start})
                    runs += r["runs"]
                    read.append(r.get("read_bytes_per_step", 0))
            dump = dict(_dump_stats(os.path.join(tmp, "dump")), read_bytes_per_step=max(read))
        off = [r for r in runs if r["phase"] == "off"]
        on = [r for r in runs if r["phase"] == "on"]
        off_ms, on_ms, ratio, ratios = _summarise(off, on, "wall_ms")
        coff, con, cratio, _ = _summarise(off, on, "cpu_ms")
        toff, ton, tratio, _ = _summarise(off, on, "thread_ms")
        flush_cpu = statistics.median(r["flush_cpu_ms"] for r in on)
        flush_wall = statistics.median(r["flush_wall_ms"] for r in on)
        return {"config": name, "description": desc, "off_ms": off_ms, "on_ms": on_ms, "ratio": ratio,
                "pair_ratios": ratios, "cpu_off_ms": coff, "cpu_on_ms": con, "cpu_ratio": cratio,
                "thread_off_ms": toff, "thread_on_ms": ton, "thread_ratio": tratio,
                "entries_per_step": dump.get("entries_per_step", 0),
                "mb_per_step": dump.get("mb_per_step", 0.0),
                "tensor_bytes_per_step": dump.get("tensor_bytes_per_step", 0),
                "read_bytes_per_step": dump.get("read_bytes_per_step", 0),
                "flush_cpu_ms": flush_cpu, "flush_wall_ms": flush_wall,
                "npy_files_per_step": dump.get("npy_files_per_step", 0), "runs": runs}
    finally:
        if leave is None:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            leave.append(tmp)


def recorded_bytes(name: str, warmup: int) -> float:
    """Bytes of the tensors configuration ``name`` records in one step (one short run of it alone)."""
    desc, cfg, start = CONFIGS[name]
    tmp = tempfile.mkdtemp(prefix=f"msprobe_bench_bytes_{name}_")
    try:
        res = run_worker({"phases": ["on"], "steps": 1, "warmup": warmup,
                          "config_path": write_config(tmp, cfg), "start": start})
        return res.get("tensor_bytes_per_step", 0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_rss(pairs: int, steps: int, warmup: int) -> dict:
    tmp = tempfile.mkdtemp(prefix="msprobe_bench_rss_")
    try:
        config_path = write_config(tmp, CONFIGS["L1"][1])
        off, on = [], []
        for _ in range(pairs):
            off.append(run_worker({"phases": ["off"], "steps": steps, "warmup": warmup})["maxrss_mb"])
            on.append(run_worker({"phases": ["on"], "steps": steps, "warmup": warmup,
                                  "config_path": config_path, "start": "model"})["maxrss_mb"])
        return {"config": "peak-RSS", "description": "peak RSS (ru_maxrss, MB), L1 statistics vs off",
                "off_mb": statistics.median(off), "on_mb": statistics.median(on),
                "ratio": statistics.median(on) / statistics.median(off), "off_all": off, "on_all": on}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _flush_column(r: dict) -> str:
    """``flush ms (GB/s)``: the flush's reading per step and the rate at which it read ``readMB``."""
    rate = r["read_bytes_per_step"] / (r["flush_cpu_ms"] / 1000) / 1e9 if r["flush_cpu_ms"] else 0.0
    return f"{r['flush_cpu_ms']:.1f} ({rate:.1f})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 pairs x 3 steps instead of 5 x 4")
    p.add_argument("--pairs", type=int, help="alternating off/on pairs (default 5, quick 3)")
    p.add_argument("--steps", type=int, help="training steps per run (default 4, quick 3)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps per phase")
    p.add_argument("--only", help="comma-separated config names (" + ", ".join(CONFIGS) + ", rss)")
    p.add_argument("--isolation", choices=("config", "process"), default="config")
    p.add_argument("--json", metavar="OUT", help="save results as JSON")
    p.add_argument("--model", choices=sorted(MODELS), default="tiny",
                   help="benchmark LM size: tiny (default), mid (d_model 192, 3 layers) or large (d_model 512, d_ff 2048, seq 128)")
    p.add_argument("--launch", choices=("blocking", "default"), default="blocking",
                   help="blocking: ms.runtime.launch_blocking() (default); default: MindSpore's "
                        "asynchronous launch")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(args)), flush=True)
        return 0
    pairs = args.pairs or (3 if args.quick else 5)
    steps = args.steps or (3 if args.quick else 4)
    names = args.only.split(",") if args.only else list(CONFIGS) + ["rss"]
    WORKLOAD.update(model=args.model, launch=args.launch)
    print(HEADER if args.launch == "blocking" else
          "MindSpore CPU, ms.set_device('CPU'), MindSpore's default (asynchronous) launch")
    print(f"{describe_model(args.model)}; {pairs} alternating "
          f"off/on pairs x {steps} steps/run, warm-up {args.warmup} steps/phase, isolation={args.isolation}; "
          f"cpu_count={os.cpu_count()}, loadavg={os.getloadavg()[0]:.2f}", flush=True)
    results = []
    t0 = time.perf_counter()
    bandwidth = memory_bandwidth()
    print(f"memory read bandwidth {bandwidth / 1e9:.1f} GB/s (numpy add.reduce of 100 MB, fastest of 7); "
          "floor = off ms + (readMB / bandwidth): one read of each distinct memory the flush reads "
          "(readMB; tensorMB counts every tensor record of dump.json); flush ms: training-thread CPU "
          "per step in the flush's reading (statistics), median of the on runs, and its GB/s of readMB")
    fmt = "{:<12} {:>9} {:>9} {:>7} {:>9} {:>9} {:>8} {:>9} {:>9} {:>7} {:>7} {:>14}  {}"
    print(fmt.format("config", "off ms", "on ms", "ratio", "cpu ratio", "thr ratio", "entries", "MB/step",
                     "tensorMB", "readMB", "floor", "flush ms", "pair ratios"))
    write_cost = None  # measured before and after the first tensor-mode row
    cost_dir = tempfile.mkdtemp(prefix="msprobe_bench_write_cost_")
    before = (file_write_cost(cost_dir) if any(CONFIGS.get(n, ("", {}))[1].get("task") == "tensor" for n in names)
              else None)
    leave: list = []  # the rows' dumps, removed at the end (not before the file cost after the row)
    for name in names:
        if name == "rss":
            continue
        r = bench_config(name, pairs, steps, args.warmup, args.isolation, leave)
        results.append(r)
        if not r["tensor_bytes_per_step"] and name in FLOOR_FROM:
            r["tensor_bytes_per_step"] = recorded_bytes(FLOOR_FROM[name], args.warmup)
        floor_ms = 1000 * (r["read_bytes_per_step"] or r["tensor_bytes_per_step"]) / bandwidth
        if r["npy_files_per_step"]:  # tensor mode: the files cannot cost less than writing them once
            if write_cost is None:
                after = file_write_cost(cost_dir)
                first = before or after
                write_cost = (min(first[0], after[0]), max(first[1], after[1]))
                print(f"  (tensor files: {first[0] * 1e6:.0f} us per file created before the row, "
                      f"{after[0] * 1e6:.0f} us after it; page-cache write {first[1] / 1e9:.1f} / "
                      f"{after[1] / 1e9:.1f} GB/s; their floor adds files x per-file cost + "
                      f"tensorMB / write bandwidth)", flush=True)
            floor_ms += 1000 * (r["npy_files_per_step"] * write_cost[0]
                                + r["tensor_bytes_per_step"] / write_cost[1])
        r["floor_ratio"] = (r["off_ms"] + floor_ms) / r["off_ms"] if r["off_ms"] else None
        print(fmt.format(name, f"{r['off_ms']:.1f}", f"{r['on_ms']:.1f}", f"{r['ratio']:.2f}x",
                         f"{r['cpu_ratio']:.2f}x", f"{r['thread_ratio']:.2f}x", f"{r['entries_per_step']:.0f}", f"{r['mb_per_step']:.2f}",
                         f"{r['tensor_bytes_per_step'] / 1e6:.2f}", f"{r['read_bytes_per_step'] / 1e6:.2f}",
                         f"{r['floor_ratio']:.3f}x", _flush_column(r),
                         " ".join(f"{x:.2f}" for x in r["pair_ratios"])), flush=True)
    if "rss" in names:
        r = bench_rss(max(2, pairs // 2), steps, args.warmup)
        results.append(r)
        print(f"{'peak-RSS':<12} off {r['off_mb']:.0f} MB, on (L1 statistics) {r['on_mb']:.0f} MB, "
              f"ratio {r['ratio']:.2f}x  (off {r['off_all']}, on {r['on_all']})", flush=True)
    for tmp in leave + [cost_dir]:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"total benchmark time {time.perf_counter() - t0:.0f} s; loadavg now {os.getloadavg()[0]:.2f}")
    for r in results:
        print(f"  {r['config']:<12} {r['description']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"header": HEADER, "model": describe_model(args.model), "launch": args.launch,
                       "bandwidth_bytes_per_s": bandwidth, "pairs": pairs, "steps": steps,
                       "warmup": args.warmup,
                       "isolation": args.isolation, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
