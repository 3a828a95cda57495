"""Per-step cost of start(net) / stop() / step() on the TinyLM benchmark, in one process.

    PYTHONPATH=. .venv/bin/python benchmarks/startstop_split.py L1 [blocks] [block_steps]

Alternates blocks: ``block_steps`` tool-off steps (any capture left installed for a next dumped
step is removed first, so they run MindSpore's own objects), then ``block_steps`` consecutive dumped
steps. Prints median wall ms (and process CPU ms) of start/train/stop/step over the dumped steps
after warm-up: ``first`` = a block's first dumped step (it installs the capture), ``parked`` = the
dumped steps after it (a block's last one also removes the capture at its stop(): the next step is
dumped, but this script then removes it for the tool-off block), and the tool-off train step.
"""
import statistics
import sys
import tempfile
import time

sys.path.insert(0, "benchmarks")
import overhead  # noqa: E402

level = sys.argv[1]
blocks = int(sys.argv[2]) if len(sys.argv) > 2 else 8
block_steps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
net, batches, train_step = overhead._setup()
cfg = overhead.write_config(tempfile.mkdtemp(), {"task": "statistics", "level": level})
from msprobe.mindspore import PrecisionDebugger  # noqa: E402

dbg = PrecisionDebugger(config_path=cfg)
parts = ("start", "train", "stop", "step")
wall = {"first": {k: [] for k in parts}, "parked": {k: [] for k in parts}}
cpu = {"first": {k: [] for k in parts}, "parked": {k: [] for k in parts}}
off, i = [], 0
for block in range(blocks + 1):  # block 0: warm-up
    release = getattr(dbg.service, "_release_capture", None)
    if release is not None:
        release()
    for _ in range(block_steps):
        x, y = batches[i % len(batches)]
        i += 1
        t0 = time.perf_counter()
        train_step(x, y).asnumpy()
        if block:
            off.append((time.perf_counter() - t0) * 1e3)
    for k in range(block_steps):
        x, y = batches[i % len(batches)]
        i += 1
        w, c = [time.perf_counter()], [time.process_time()]
        dbg.start(net)
        w.append(time.perf_counter()); c.append(time.process_time())
        train_step(x, y).asnumpy()
        w.append(time.perf_counter()); c.append(time.process_time())
        dbg.stop()
        w.append(time.perf_counter()); c.append(time.process_time())
        dbg.step()
        w.append(time.perf_counter()); c.append(time.process_time())
        if not block:
            continue
        group = "parked" if k else "first"
        for j, name in enumerate(parts):
            wall[group][name].append((w[j + 1] - w[j]) * 1e3)
            cpu[group][name].append((c[j + 1] - c[j]) * 1e3)


def med(d):
    return {k: round(statistics.median(v), 2) for k, v in d.items() if v}


print(level, "off train", round(statistics.median(off), 2))
for group in ("first", "parked"):
    print(f"  {group:6s} wall", med(wall[group]), " cpu", med(cpu[group]))
